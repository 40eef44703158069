// The torch comparison runner: registers every table case as a doctest test case of its own, and the suite's main.
#define DOCTEST_CONFIG_IMPLEMENT
#include <ostream>  // clang 14 + libstdc++ 12: doctest needs the complete type

#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "tg/schedule.hpp"
#include "../nvrtc_check.hpp"

namespace tt {

Values perm_rows(int64_t n) {
  return [n](const tg::Shape& s, std::mt19937& g) {
    int64_t k = s.empty() ? 1 : s.back(), rows = 1;
    for (size_t i = 0; i + 1 < s.size(); i++) rows *= s[i];
    std::vector<double> out;
    for (int64_t r = 0; r < rows; r++) {
      std::vector<int64_t> p(static_cast<size_t>(n));
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), g);
      for (int64_t j = 0; j < k; j++) out.push_back(double(p[size_t(j)]));
    }
    return out;
  };
}

namespace {

torch::ScalarType torch_type(tg::DType d) {
  using namespace tg;
  if (d == dtypes::float32) return torch::kFloat;
  if (d == dtypes::float64) return torch::kDouble;
  if (d == dtypes::int64) return torch::kLong;
  if (d == dtypes::int32) return torch::kInt;
  if (d == dtypes::int8) return torch::kChar;
  if (d == dtypes::uint8) return torch::kByte;
  if (d == dtypes::int16) return torch::kShort;
  if (d == dtypes::bool_) return torch::kBool;
  throw std::runtime_error("no torch type for " + d.name());
}

std::vector<double> draw(const In& in, std::mt19937& g) {
  if (in.gen) return in.gen(in.shape, g);
  int64_t n = 1;
  for (int64_t d : in.shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    if (tg::dtypes::is_bool(in.dtype)) x = double(g() & 1);
    else if (tg::dtypes::is_int(in.dtype))
      x = double(std::uniform_int_distribution<int64_t>(int64_t(in.lo), int64_t(in.hi))(g));
    else {
      x = std::uniform_real_distribution<double>(in.lo, in.hi)(g);
      if (in.dtype == tg::dtypes::float32) x = double(float(x));
      if (in.dtype == tg::dtypes::float16) x = double(tg::half_bits_to_float(tg::float_to_half_bits(float(x))));
    }
  }
  return v;
}

// The same values as a tg tensor and a torch tensor. A float16 input is a float16 buffer in tg and the same values
// in float32 in torch (libtorch 1.13 has no CPU kernels for most float16 ops): torch's result, computed in float32,
// is rounded once to float16 to be the reference.
std::pair<tg::Tensor, torch::Tensor> make(const In& in, const std::vector<double>& v) {
  std::vector<int64_t> sizes(in.shape.begin(), in.shape.end());
  bool half = in.dtype == tg::dtypes::float16;
  torch::Tensor th = torch::tensor(v, torch::kDouble).reshape(sizes).to(half ? torch::kFloat : torch_type(in.dtype)).contiguous();
  tg::Tensor t;
  using namespace tg;
  auto mk = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> c;
    for (double x : v) c.push_back(T(x));
    return tg::Tensor::from_vector(c, {int64_t(c.size())}).reshape(in.shape);
  };
  if (half) {
    std::vector<uint16_t> bits;
    for (double x : v) bits.push_back(tg::float_to_half_bits(float(x)));
    t = tg::Tensor::from_blob(bits.data(), in.shape, dtypes::float16);
  } else if (in.dtype == dtypes::float32) t = mk(float{});
  else if (in.dtype == dtypes::float64) t = mk(double{});
  else if (in.dtype == dtypes::int64) t = mk(int64_t{});
  else if (in.dtype == dtypes::int32) t = mk(int32_t{});
  else if (in.dtype == dtypes::int8) t = mk(int8_t{});
  else if (in.dtype == dtypes::uint8) t = mk(uint8_t{});
  else if (in.dtype == dtypes::int16) t = mk(int16_t{});
  else if (in.dtype == dtypes::bool_) t = mk(bool{});
  else throw std::runtime_error("no input maker for " + in.dtype.name());
  if (in.grad && tg::dtypes::is_float(in.dtype)) th.requires_grad_(true);
  return {t, th};
}

std::vector<double> torch_values(const torch::Tensor& t, bool round_half = false) {
  torch::Tensor d = t.detach();
  if (round_half) d = d.to(torch::kHalf);
  d = d.to(torch::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}
// Compares element by element; returns "" when close, else a description of the worst element.
std::string compare(const std::vector<double>& a, const std::vector<double>& b, double rtol, double atol, bool exact) {
  if (a.size() != b.size()) return "sizes differ: " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  double scale = 1;
  for (double x : b)
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
  double worst = 0;
  size_t wi = 0;
  bool bad = false;
  for (size_t i = 0; i < a.size(); i++) {
    double x = a[i], y = b[i];
    if (std::isnan(x) && std::isnan(y)) continue;
    if (std::isinf(y) || std::isinf(x)) {
      if (x != y) return "element " + std::to_string(i) + ": " + std::to_string(x) + " vs torch " + std::to_string(y);
      continue;
    }
    double err = std::fabs(x - y), lim = exact ? 0 : atol * scale + rtol * std::fabs(y);
    if (std::isnan(x) || std::isnan(y) || err > lim) {
      bad = true;
      double r = lim > 0 ? err / lim : (std::isnan(err) ? 1e300 : err * 1e300);
      if (std::isnan(r) || r > worst) {
        worst = std::isnan(r) ? 1e300 : r;
        wi = i;
      }
    }
  }
  if (!bad) return "";
  std::ostringstream os;
  os.precision(9);
  os << "element " << wi << ": " << a[wi] << " vs torch " << b[wi] << " (|diff| " << std::fabs(a[wi] - b[wi])
     << ", scale " << scale << ")";
  return os.str();
}

std::string shape_of(const torch::Tensor& t) {
  std::vector<int64_t> s(t.sizes().begin(), t.sizes().end());
  return tg::shape_str(s);
}

std::string dims_of(const tg::Shape& s) {
  if (s.empty()) return "scalar";
  std::string out;
  for (size_t i = 0; i < s.size(); i++) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

// "tan (float32 3x5)", "where (bool 3x4; float32 3x4; float32 4)": op, then each input's dtype and shape.
std::string full_name(const Case& c) {
  if (c.ins.empty()) return c.name;
  std::string s = c.name + " (";
  for (size_t i = 0; i < c.ins.size(); i++) s += (i ? "; " : "") + c.ins[i].dtype.name() + " " + dims_of(c.ins[i].shape);
  return s + ")" + (c.second ? " +2nd order" : "");
}

// A float16 result (every float input float16) is compared with torch's float32 result rounded to float16.
bool half_case(const Case& c) {
  bool half = false, wide = false;
  for (auto& in : c.ins) {
    half |= in.dtype == tg::dtypes::float16;
    wide |= in.dtype == tg::dtypes::float32 || in.dtype == tg::dtypes::float64;
  }
  return half && !wide;
}

std::vector<double> random_seed_values(size_t n, std::mt19937& g) {
  std::vector<double> sv(n);
  std::normal_distribution<double> nd;
  for (auto& x : sv) x = double(float(nd(g)));
  return sv;
}

void run_case(const Case& c) {
  std::mt19937 g(uint32_t(std::hash<std::string>{}(full_name(c))));
  std::vector<tg::Tensor> tx;
  std::vector<torch::Tensor> hx;
  for (auto& in : c.ins) {
    auto [t, h] = make(in, draw(in, g));
    tx.push_back(t);
    hx.push_back(h);
  }
  bool half = half_case(c);
  double rtol = half ? std::max(c.rtol, kHalfTol) : c.rtol, atol = half ? std::max(c.atol, kHalfTol) : c.atol;
  double grtol = half ? std::max(c.grtol, kHalfTol) : c.grtol, gatol = half ? std::max(c.gatol, kHalfTol) : c.gatol;
  torch::Tensor ho = c.th_fn(hx);
  tg::Tensor to;
  try {
    to = c.tg_fn(tx);
  } catch (const std::exception& e) {
    FAIL_CHECK("tg threw: " << std::string(e.what()));
    return;
  }
  std::vector<int64_t> hs(ho.sizes().begin(), ho.sizes().end());
  CHECK_MESSAGE(to.shape() == hs, "shape " << tg::shape_str(to.shape()) << " vs torch " << shape_of(ho));
  if (to.shape() != hs) return;
  bool tf = tg::dtypes::is_float(to.dtype()), hf = ho.is_floating_point();
  bool tb = tg::dtypes::is_bool(to.dtype()), hb = ho.scalar_type() == torch::kBool;
  CHECK_MESSAGE((tf == hf && tb == hb), "dtype " << to.dtype().name() << " vs torch " << ho.scalar_type());
  if (half && tf) CHECK_MESSAGE(to.dtype() == tg::dtypes::float16, "float16 inputs gave a " << to.dtype().name() << " result");
  // backward inputs
  std::vector<size_t> gi;
  for (size_t i = 0; i < c.ins.size(); i++)
    if (c.ins[i].grad && tg::dtypes::is_float(c.ins[i].dtype)) gi.push_back(i);
  bool do_bw = c.backward && tf && hf && !gi.empty() && ho.requires_grad();
  bool do_bw2 = do_bw && c.second;
  std::vector<tg::Tensor> tgrads, tgrads2;
  torch::Tensor seed_h;
  std::vector<std::vector<double>> seed2;
  if (do_bw) {
    tg::DType sd = half ? tg::dtypes::float16 : tg::dtypes::float32;
    auto [st, sh] = make(In{to.shape(), sd, 0, 0, false, {}}, random_seed_values(size_t(ho.numel()), g));
    seed_h = sh.to(ho.scalar_type());
    std::vector<tg::Tensor> wrt;
    for (size_t i : gi) wrt.push_back(tx[i]);
    try {
      tg::Tensor seed = st.cast(to.dtype());
      tgrads = to.gradient(wrt, &seed);
      if (do_bw2) {  // s = sum_k sum(grad_k * seed2_k), differentiated again
        tg::Tensor s;
        for (size_t k = 0; k < gi.size(); k++) {
          seed2.push_back(random_seed_values(size_t(hx[gi[k]].numel()), g));
          auto [s2, unused] = make(In{tx[gi[k]].shape(), tx[gi[k]].dtype(), 0, 0, false, {}}, seed2.back());
          tg::Tensor term = tg::Tensor(tgrads[k] * s2).sum();
          s = k == 0 ? term : tg::Tensor(s + term);
        }
        tgrads2 = s.gradient(wrt);
      }
    } catch (const std::exception& e) {
      FAIL_CHECK("tg gradient threw: " << std::string(e.what()));
      return;
    }
  }
  std::vector<tg::Tensor*> all{&to};
  for (auto& t : tgrads) all.push_back(&t);
  for (auto& t : tgrads2) all.push_back(&t);
  tg::Tensor::realize_all(all);
  bool exact = !tf;
  std::string err = compare(to.to_doubles(), torch_values(ho, half && hf), rtol, atol, exact);
  CHECK_MESSAGE(err.empty(), "forward: " << err);
  if (!do_bw) return;
  std::vector<torch::Tensor> hin;
  for (size_t i : gi) hin.push_back(hx[i]);
  auto hg = torch::autograd::grad({ho}, hin, {seed_h}, /*retain_graph=*/do_bw2, /*create_graph=*/do_bw2, /*allow_unused=*/true);
  for (size_t k = 0; k < gi.size(); k++) {
    torch::Tensor h = hg[k].defined() ? hg[k] : torch::zeros_like(hx[gi[k]]);
    std::string e = compare(tgrads[k].to_doubles(), torch_values(h, half), grtol, gatol, false);
    CHECK_MESSAGE(e.empty(), "gradient of input " << gi[k] << ": " << e);
  }
  if (!do_bw2) return;
  torch::Tensor s = torch::zeros({}, torch::kDouble);
  for (size_t k = 0; k < gi.size(); k++)
    if (hg[k].defined()) {
      auto s2 = torch::tensor(seed2[k], torch::kDouble).reshape(hx[gi[k]].sizes()).to(hx[gi[k]].scalar_type());
      s = s + (hg[k] * s2).sum();
    }
  std::vector<torch::Tensor> hg2(gi.size());
  if (s.requires_grad()) hg2 = torch::autograd::grad({s}, hin, {}, false, false, /*allow_unused=*/true);
  for (size_t k = 0; k < gi.size(); k++) {
    torch::Tensor h = hg2[k].defined() ? hg2[k] : torch::zeros_like(hx[gi[k]]);
    std::string e = compare(tgrads2[k].to_doubles(), torch_values(h), grtol, gatol, false);
    CHECK_MESSAGE(e.empty(), "second-order gradient of input " << gi[k] << ": " << e);
  }
}

// ---------------------------------------------------------------- one doctest test case per table case

struct Registry {
  std::vector<Case> cases;
  std::vector<std::string> names;  // doctest keeps the name pointers: filled once, never resized after
  std::unordered_map<std::string, size_t> index;
  std::vector<double> ms;
};
Registry& registry() {
  static Registry r;
  return r;
}

void run_current() {
  Registry& r = registry();
  const doctest::detail::TestCase* tc = doctest::getContextOptions()->currentTest;
  size_t i = r.index.at(tc->m_name);
  auto a = std::chrono::steady_clock::now();
  try {
    run_case(r.cases[i]);
  } catch (const std::exception& e) {
    FAIL_CHECK("threw: " << std::string(e.what()));
  }
  r.ms[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
}

void register_cases() {
  Registry& r = registry();
  for (auto* table : {math_cases, movement_cases, reduce_cases, nn_cases, loss_linalg_cases, big_cases, coverage_cases, api_cases})
    for (auto& c : table()) r.cases.push_back(std::move(c));
  for (auto& c : r.cases) {
    std::string n = full_name(c);
    if (!r.index.emplace(n, r.names.size()).second) throw std::runtime_error("two torch cases are named '" + n + "'");
    r.names.push_back(n);
  }
  r.ms.assign(r.cases.size(), -1);
  static const doctest::detail::TestSuite suite = [] {
    doctest::detail::TestSuite s;
    s.m_test_suite = "torch";
    return s;
  }();
  for (size_t i = 0; i < r.cases.size(); i++)
    doctest::detail::regTest(doctest::detail::TestCase(run_current, r.cases[i].where.file_name(), r.cases[i].where.line(), suite) *
                             r.names[i].c_str());
}

// Total time of the cases that ran and the slowest few (to keep the suite's run time in view).
void print_times() {
  Registry& r = registry();
  std::vector<size_t> ran;
  double total = 0;
  for (size_t i = 0; i < r.ms.size(); i++)
    if (r.ms[i] >= 0) {
      ran.push_back(i);
      total += r.ms[i];
    }
  std::sort(ran.begin(), ran.end(), [&](size_t a, size_t b) { return r.ms[a] > r.ms[b]; });
  std::printf("torch cases: %zu ran in %.1f s; slowest:", ran.size(), total / 1000);
  for (size_t k = 0; k < std::min<size_t>(5, ran.size()); k++) std::printf(" %s %.0f ms;", r.names[ran[k]].c_str(), r.ms[ran[k]]);
  std::printf("\n");
}

}  // namespace
}  // namespace tt

int main(int argc, char** argv) {
  // As tests/main.cpp: TG_NVRTC_CHECK=1 also renders every kernel for CUDA and compiles it with NVRTC.
  bool nvrtc = false;
  try {
    nvrtc = tg::test::nvrtc_check_from_env();
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "TG_NVRTC_CHECK: %s\n", e.what());
    return 1;
  }
  torch::manual_seed(0);
  tt::register_cases();
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  int rc = ctx.run();
  if (!ctx.shouldExit()) tt::print_times();
  return tg::test::nvrtc_check_exit(nvrtc, rc);
}
