// Printing tensors (to_string, operator<<), in torch's layout: nested brackets, one row per line, one width for
// every element, "..." for the middle of long dims once a tensor has more than kSummarizeAbove elements.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "tg/tensor.hpp"

namespace tg {

namespace {

constexpr int64_t kSummarizeAbove = 1000;  // torch's threshold
constexpr int64_t kEdgeItems = 3;          // elements kept at each end of a summarised dim

// The positions printed along one dim: all of them, or the first and last kEdgeItems with -1 for "...".
std::vector<int64_t> shown(int64_t n, bool summarize) {
  std::vector<int64_t> r;
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; i++) r.push_back(i);
    r.push_back(-1);
    for (int64_t i = n - kEdgeItems; i < n; i++) r.push_back(i);
  } else {
    for (int64_t i = 0; i < n; i++) r.push_back(i);
  }
  return r;
}

std::string printf_str(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Float elements as torch chooses: "1." when every shown value is integral, 4 decimals, or 4-digit scientific
// when the magnitudes span more than 1000x or leave [1e-4, 1e8).
std::vector<std::string> format_floats(const std::vector<double>& v) {
  bool integral = true, any = false;
  double lo = 0, hi = 0;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    if (x != std::nearbyint(x)) integral = false;
    double a = std::fabs(x);
    if (a == 0) continue;
    lo = any ? std::min(lo, a) : a;
    hi = any ? std::max(hi, a) : a;
    any = true;
  }
  bool sci = any && (hi >= 1e8 || (!integral && (lo < 1e-4 || hi / lo > 1000)));
  const char* fmt = sci ? "%.4e" : integral ? "%.0f." : "%.4f";
  std::vector<std::string> out;
  for (double x : v) {
    if (std::isnan(x)) out.push_back("nan");
    else if (std::isinf(x)) out.push_back(x > 0 ? "inf" : "-inf");
    else out.push_back(printf_str(fmt, x == 0 ? 0.0 : x));  // no "-0."
  }
  return out;
}

// The elements at the printed positions, formatted, in row-major order of those positions.
std::vector<std::string> format_elements(const Tensor& t, const std::vector<int64_t>& flat) {
  DType d = dtypes::strong(t.dtype());
  std::vector<std::string> out;
  if (dtypes::is_bool(d)) {
    auto v = t.to_vector<bool>();
    for (int64_t i : flat) out.push_back(v[size_t(i)] ? "True" : "False");
  } else if (d == dtypes::uint64) {
    auto v = t.to_vector<uint64_t>();
    for (int64_t i : flat) out.push_back(std::to_string(v[size_t(i)]));
  } else if (dtypes::is_int(d)) {
    auto v = t.cast(dtypes::int64).to_vector<int64_t>();
    for (int64_t i : flat) out.push_back(std::to_string(v[size_t(i)]));
  } else {
    auto all = t.to_doubles();
    std::vector<double> v;
    for (int64_t i : flat) v.push_back(all[size_t(i)]);
    out = format_floats(v);
  }
  return out;
}

}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  const Shape& shape = t.shape();
  const int nd = t.ndim();
  std::string suffix = ", shape=" + shape_str(shape) + ", dtype=" + dtypes::strong(t.dtype()).name() + ", device=" + t.device() + ")";
  if (t.numel() == 0) return "tensor([]" + suffix;
  const bool summarize = t.numel() > kSummarizeAbove;
  std::vector<std::vector<int64_t>> pos;
  for (int64_t n : shape) pos.push_back(shown(n, summarize));

  // Flat indices of the printed elements (odometer over the printed positions, skipping the "..." markers).
  std::vector<int64_t> strides(size_t(nd), 1), flat;
  for (int i = nd - 2; i >= 0; i--) strides[size_t(i)] = strides[size_t(i) + 1] * shape[size_t(i) + 1];
  std::vector<size_t> at(size_t(nd), 0);
  for (bool done = false; !done;) {
    bool ellipsis = false;
    int64_t f = 0;
    for (int i = 0; i < nd; i++) {
      int64_t p = pos[size_t(i)][at[size_t(i)]];
      if (p < 0) ellipsis = true;
      f += p * strides[size_t(i)];
    }
    if (!ellipsis) flat.push_back(f);
    done = true;
    for (int i = nd - 1; i >= 0; i--) {
      if (++at[size_t(i)] < pos[size_t(i)].size()) {
        done = false;
        break;
      }
      at[size_t(i)] = 0;
    }
  }
  std::vector<std::string> el = format_elements(t, flat);
  size_t width = 0;
  for (const auto& s : el) width = std::max(width, s.size());
  auto padded = [&](size_t i) { return std::string(width - el[i].size(), ' ') + el[i]; };
  if (nd == 0) return "tensor(" + el[0] + suffix;

  // Nested brackets, written with an explicit stack of (dim, position index) frames.
  const std::string prefix = "tensor(";
  std::string out = prefix;
  size_t next = 0;  // the next element of el
  struct Frame {
    int dim;
    size_t k;  // index into pos[dim]
  };
  std::vector<Frame> st{{0, 0}};
  out += "[";
  while (!st.empty()) {
    Frame& fr = st.back();
    const auto& ps = pos[size_t(fr.dim)];
    if (fr.k == ps.size()) {
      out += "]";
      st.pop_back();
      if (!st.empty()) st.back().k++;
      continue;
    }
    if (fr.k > 0) {  // separator before this entry: ", " in the last dim, a line break (blank lines above 2-d) else
      if (fr.dim == nd - 1) out += ", ";
      else out += "," + std::string(size_t(nd - fr.dim - 1), '\n') + std::string(prefix.size() + size_t(fr.dim) + 1, ' ');
    }
    if (ps[fr.k] < 0) {
      out += "...";
      fr.k++;
    } else if (fr.dim == nd - 1) {
      out += padded(next++);
      fr.k++;
    } else {
      out += "[";
      st.push_back({fr.dim + 1, 0});
    }
  }
  return out + suffix;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << to_string(t); }

}  // namespace tg
