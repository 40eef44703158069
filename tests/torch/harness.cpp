// The torch comparison runner and the TEST_CASEs that run each case table.
#include "harness.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "tg/schedule.hpp"

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
    }
  }
  return v;
}

// The same values as a tg tensor and a torch tensor.
std::pair<tg::Tensor, torch::Tensor> make(const In& in, const std::vector<double>& v) {
  std::vector<int64_t> sizes(in.shape.begin(), in.shape.end());
  torch::Tensor th = torch::tensor(v, torch::kDouble).reshape(sizes).to(torch_type(in.dtype)).contiguous();
  tg::Tensor t;
  using namespace tg;
  auto mk = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> c;
    for (double x : v) c.push_back(T(x));
    return tg::Tensor::from_vector(c, {int64_t(c.size())}).reshape(in.shape);
  };
  if (in.dtype == dtypes::float32) t = mk(float{});
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

std::vector<double> torch_values(const torch::Tensor& t) {
  torch::Tensor d = t.detach().to(torch::kDouble).contiguous();
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

void run_case(const Case& c) {
  std::mt19937 g(uint32_t(std::hash<std::string>{}(c.name)));
  std::vector<tg::Tensor> tx;
  std::vector<torch::Tensor> hx;
  for (auto& in : c.ins) {
    auto [t, h] = make(in, draw(in, g));
    tx.push_back(t);
    hx.push_back(h);
  }
  torch::Tensor ho = c.th_fn(hx);
  tg::Tensor to;
  try {
    to = c.tg_fn(tx);
  } catch (const std::exception& e) {
    FAIL_CHECK(c.name << ": tg threw: " << std::string(e.what()));
    return;
  }
  std::vector<int64_t> hs(ho.sizes().begin(), ho.sizes().end());
  CHECK_MESSAGE(to.shape() == hs, c.name << ": shape " << tg::shape_str(to.shape()) << " vs torch " << shape_of(ho));
  if (to.shape() != hs) return;
  bool tf = tg::dtypes::is_float(to.dtype()), hf = ho.is_floating_point();
  bool tb = tg::dtypes::is_bool(to.dtype()), hb = ho.scalar_type() == torch::kBool;
  CHECK_MESSAGE((tf == hf && tb == hb), c.name << ": dtype " << to.dtype().name() << " vs torch " << ho.scalar_type());
  // backward inputs
  std::vector<size_t> gi;
  for (size_t i = 0; i < c.ins.size(); i++)
    if (c.ins[i].grad && tg::dtypes::is_float(c.ins[i].dtype)) gi.push_back(i);
  bool do_bw = c.backward && tf && hf && !gi.empty() && ho.requires_grad();
  std::vector<tg::Tensor> tgrads;
  torch::Tensor seed_h;
  if (do_bw) {
    std::vector<double> sv(static_cast<size_t>(ho.numel()));
    std::normal_distribution<double> nd;
    for (auto& x : sv) x = double(float(nd(g)));
    auto [st, sh] = make(In{to.shape(), tg::dtypes::float32, 0, 0, false, {}}, sv);
    seed_h = sh.to(ho.scalar_type());
    std::vector<tg::Tensor> wrt;
    for (size_t i : gi) wrt.push_back(tx[i]);
    try {
      tg::Tensor seed = st.cast(to.dtype());
      tgrads = to.gradient(wrt, &seed);
    } catch (const std::exception& e) {
      FAIL_CHECK(c.name << ": tg gradient threw: " << std::string(e.what()));
      return;
    }
  }
  std::vector<tg::Tensor*> all{&to};
  for (auto& t : tgrads) all.push_back(&t);
  tg::Tensor::realize_all(all);
  bool exact = !tf;
  std::string err = compare(to.to_doubles(), torch_values(ho), c.rtol, c.atol, exact);
  CHECK_MESSAGE(err.empty(), c.name << " forward: " << err);
  if (!do_bw) return;
  std::vector<torch::Tensor> hin;
  for (size_t i : gi) hin.push_back(hx[i]);
  auto hg = torch::autograd::grad({ho}, hin, {seed_h}, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t k = 0; k < gi.size(); k++) {
    torch::Tensor h = hg[k].defined() ? hg[k] : torch::zeros_like(hx[gi[k]]);
    std::string e = compare(tgrads[k].to_doubles(), torch_values(h), c.grtol, c.gatol, false);
    CHECK_MESSAGE(e.empty(), c.name << " gradient of input " << gi[k] << ": " << e);
  }
}

}  // namespace

void run(const std::vector<Case>& cases) {
  torch::manual_seed(0);
  double slowest = 0;
  std::string slow_name;
  auto t0 = std::chrono::steady_clock::now();
  for (auto& c : cases) {
    auto a = std::chrono::steady_clock::now();
    try {
      run_case(c);
    } catch (const std::exception& e) {
      FAIL_CHECK(c.name << ": threw: " << std::string(e.what()));
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
    if (ms > slowest) {
      slowest = ms;
      slow_name = c.name;
    }
  }
  double total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(cases.size() << " cases in " << total << " ms; slowest " << slow_name << " " << slowest << " ms");
}

}  // namespace tt

TEST_CASE("math and activation ops match torch, forward and backward") { tt::run(tt::math_cases()); }
TEST_CASE("movement and indexing ops match torch, forward and backward") { tt::run(tt::movement_cases()); }
TEST_CASE("reductions and scans match torch, forward and backward") { tt::run(tt::reduce_cases()); }
TEST_CASE("nn functional ops match torch, forward and backward") { tt::run(tt::nn_cases()); }
TEST_CASE("losses and linear algebra match torch, forward and backward") { tt::run(tt::loss_linalg_cases()); }
TEST_CASE("larger shapes (conv, pool, matmul, long scans and sorts) match torch") { tt::run(tt::big_cases()); }
