// Symbolic shapes: Variables, sints, tensors with symbolic dims, kernels compiled once for every value, and TinyJit
// replaying with new values. Every symbolic result is compared with the same computation on concrete shapes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "scoped_env.hpp"
#include "test_util.hpp"
#include "tg/schedule.hpp"
#include "tg/jit.hpp"
#include "tg/tensor.hpp"

using namespace tg;
using tg::test::error_of;

namespace {
std::vector<float> seq(size_t n, float scale = 0.01f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = std::sin(float(i) * 1.7f) * scale * float(i % 13 + 1);
  return v;
}
void check_close(const std::vector<float>& a, const std::vector<float>& b, float tol = 1e-5f) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); i++) CHECK(std::fabs(a[i] - b[i]) <= tol * (1 + std::fabs(b[i])));
}
struct CompileCounter {
  size_t n = 0;
  CompileCounter() {
    set_kernel_compile_hook([this](const UOpRef&, const std::string&) { n++; });
  }
  ~CompileCounter() { set_kernel_compile_hook(nullptr); }
};
}  // namespace

TEST_CASE("Variable and sint") {
  Variable pos("start_pos", 0, 127);
  sint p = pos.bind(5);
  CHECK(!p.is_int());
  CHECK(p.value() == 5);
  CHECK(p.min() == 0);
  CHECK(p.max() == 127);
  sint q = p + 1;
  CHECK(q.value() == 6);
  CHECK(q.max() == 128);
  CHECK(q.str() == "start_pos+1");
  CHECK((q - p).is_int());
  CHECK((q - p).value() == 1);
  CHECK(sint(3) * sint(4) == sint(12));
  CHECK(error_of([&] { pos.bind(128); }).find("[Variable::bind] start_pos = 128 is outside its bounds [0, 127]") != std::string::npos);
  CHECK(error_of([&] { pos.bind(-1); }).find("outside its bounds") != std::string::npos);
  CHECK(error_of([&] { Variable("n", -1, 3); }).find("must not be negative") != std::string::npos);
  CHECK(error_of([&] { (void)sint(pos).value(); }).find("start_pos has no value") != std::string::npos);
}

TEST_CASE("a symbolic tensor's shape") {
  Variable n("n", 1, 16);
  Tensor x = Tensor::from_vector(seq(4 * 16), {4, 16});
  Tensor s = x.shrink({{0, 4}, {0, n.bind(3)}});
  CHECK(s.is_symbolic());
  CHECK(s.max_shape() == Shape{4, 16});
  CHECK(shape_str(s.sym_shape()) == "(4, n)");
  CHECK(s.ndim() == 2);
  CHECK(error_of([&] { (void)s.shape(); }).find("[shape] the tensor has the symbolic shape (4, n)") != std::string::npos);
  CHECK(s.to_vector<float>().size() == 12);
  CHECK(!x.is_symbolic());
  // out of bounds for some values of the variable
  CHECK(error_of([&] { (void)x.shrink({{0, 4}, {0, n.bind(3) + 1}}); }).find("[shrink] range [0, n+1) is out of bounds") != std::string::npos);
  // a symbolic dim cannot merge with another
  CHECK(error_of([&] { (void)s.reshape({sint(4) * n.bind(3)}); }).find("[reshape] cannot reshape (4, n)") != std::string::npos);
  // an unbound variable cannot be realised
  Tensor u = x.shrink({{0, 4}, {0, sint(n)}});
  CHECK(error_of([&] { (void)u.contiguous().to_vector<float>(); }).find("variable n has no value") != std::string::npos);
}

TEST_CASE("every op family gives the concrete result on a symbolic tensor") {
  Variable nv("n", 1, 24);
  std::vector<float> xd = seq(3 * 24), kd = seq(24 * 8, 0.03f), qd = seq(2 * 8, 0.05f);
  Tensor x = Tensor::from_vector(xd, {3, 24}), kv = Tensor::from_vector(kd, {24, 8}), q = Tensor::from_vector(qd, {2, 8});
  for (int64_t v : {1, 2, 7, 24}) {
    CAPTURE(v);
    sint n = nv.bind(v);
    Tensor xs = x.shrink({{0, 3}, {0, n}}), xc = x.shrink({{0, 3}, {0, v}});
    Tensor ks = kv.shrink({{0, n}, {0, 8}}), kc = kv.shrink({{0, v}, {0, 8}});
    // elementwise, unary, casts, comparisons and where
    check_close(Tensor(xs * 2.0 + 1.0).exp().to_vector<float>(), Tensor(xc * 2.0 + 1.0).exp().to_vector<float>());
    check_close(Tensor(xs > 0.0).where(xs, Tensor(-1.0)).to_vector<float>(), Tensor(xc > 0.0).where(xc, Tensor(-1.0)).to_vector<float>());
    check_close(Tensor(xs + xs.cast(dtypes::int32).cast(dtypes::float32)).to_vector<float>(),
                Tensor(xc + xc.cast(dtypes::int32).cast(dtypes::float32)).to_vector<float>());
    // reductions over the symbolic axis and over the other one
    check_close(xs.sum(1).to_vector<float>(), xc.sum(1).to_vector<float>());
    check_close(xs.sum(0).to_vector<float>(), xc.sum(0).to_vector<float>());
    check_close(xs.max(1).to_vector<float>(), xc.max(1).to_vector<float>());
    check_close(xs.mean(1).to_vector<float>(), xc.mean(1).to_vector<float>());
    check_close(xs.softmax(1).to_vector<float>(), xc.softmax(1).to_vector<float>());
    // movement: permute, reshape around the symbolic dim, expand to it, pad another dim, shrink at a symbolic offset
    check_close(xs.permute({1, 0}).contiguous().to_vector<float>(), xc.permute({1, 0}).contiguous().to_vector<float>());
    check_close(xs.reshape({sint(3), n, sint(1)}).to_vector<float>(), xc.reshape({3, v, 1}).to_vector<float>());
    Tensor col = Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3, 1});
    check_close(Tensor(col.expand({sint(3), n}) + xs).to_vector<float>(), Tensor(col.expand({3, v}) + xc).to_vector<float>());
    check_close(Tensor::full({sint(2), n}, 0.5).to_vector<float>(), Tensor::full({2, v}, 0.5).to_vector<float>());
    check_close(x.shrink({{0, 3}, {n - 1, n}}).to_vector<float>(), x.shrink({{0, 3}, {v - 1, v}}).to_vector<float>());
    // matmul with the symbolic dim outside (scores) and contracted (attention), as a KV cache is read
    Tensor ss = q.matmul(ks.T()), sc = q.matmul(kc.T());
    check_close(ss.to_vector<float>(), sc.to_vector<float>());
    check_close(ss.softmax(-1).matmul(ks).to_vector<float>(), sc.softmax(-1).matmul(kc).to_vector<float>());
    // pad another dim and the symbolic one (its extent grows by the amounts), with a value
    check_close(xs.pad({{1, 0}, {0, 2}}).to_vector<float>(), xc.pad({{1, 0}, {0, 2}}).to_vector<float>());
    check_close(xs.pad({{0, 0}, {2, 1}}, 3.0).to_vector<float>(), xc.pad({{0, 0}, {2, 1}}, 3.0).to_vector<float>());
    // cat along the symbolic dim (a KV cache grown by one row) and along the other one; pad by a sint
    Tensor row = Tensor::from_vector(std::vector<float>{0.5f, -1.f, 2.f}, {3, 1});
    check_close(cat({xs, row}, 1).to_vector<float>(), cat({xc, row}, 1).to_vector<float>());
    check_close(cat({row, xs, xs}, 1).to_vector<float>(), cat({row, xc, xc}, 1).to_vector<float>());
    check_close(cat({xs, xs * 2.0}, 0).to_vector<float>(), cat({xc, xc * 2.0}, 0).to_vector<float>());
    check_close(row.pad({{sint(0), sint(0)}, {n, sint(1)}}).to_vector<float>(), row.pad({{0, 0}, {v, 1}}).to_vector<float>());
    // attention over a symbolic key/value length, with a mask of the same symbolic shape
    Tensor q4 = q.reshape({1, 2, 8}), k4 = ks.reshape({sint(1), n, sint(8)}), kc4 = kc.reshape({1, v, 8});
    Tensor ms = Tensor(Tensor::full({sint(2), n}, 1.0) > 0.0), mc = Tensor(Tensor::full({2, v}, 1.0) > 0.0);
    check_close(q4.scaled_dot_product_attention(k4, k4, ms).to_vector<float>(),
                q4.scaled_dot_product_attention(kc4, kc4, mc).to_vector<float>());
    check_close(q4.scaled_dot_product_attention(k4, k4).to_vector<float>(), q4.scaled_dot_product_attention(kc4, kc4).to_vector<float>());
    // a value: the variable itself
    CHECK(Tensor::from_sint(n + 1).item<int32_t>() == int32_t(v + 1));
  }
}

TEST_CASE("a graph realised for many values compiles each kernel once") {
  Variable nv("n", 1, 64);
  Tensor kv = Tensor::from_vector(seq(64 * 16), {64, 16}), q = Tensor::from_vector(seq(16, 0.1f), {1, 16});
  std::vector<std::vector<float>> got;
  size_t first = 0, all = 0;
  {
    CompileCounter cc;
    for (int64_t v = 1; v <= 40; v++) {
      Tensor k = kv.shrink({{0, nv.bind(v)}, {0, 16}});
      got.push_back(q.matmul(k.T()).softmax(-1).matmul(k).to_vector<float>());
      if (v == 1) first = cc.n;
    }
    all = cc.n;
  }
  CHECK(first > 0);
  CHECK(all == first);
  for (int64_t v = 1; v <= 40; v += 13) {
    Tensor kc = kv.shrink({{0, v}, {0, 16}});
    check_close(got[size_t(v - 1)], q.matmul(kc.T()).softmax(-1).matmul(kc).to_vector<float>());
  }
}

TEST_CASE("TinyJit replays a decode loop with a new variable value each step") {
  constexpr int64_t kMax = 100, kDim = 8;
  Variable pos("pos", 0, kMax - 1);
  Tensor cache = Tensor::zeros({kMax, kDim}).contiguous().realize();
  std::vector<float> keys = seq(size_t(kMax * kDim), 0.05f);
  // the step: write this token's key into the cache at pos (a masked assign over the cache), then attend over 0..pos
  auto step = [&](const std::vector<Tensor>& in, const std::vector<sint>& vars) {
    const sint& p = vars[0];
    Tensor rows = Tensor::arange(kMax).reshape({kMax, 1});
    Tensor here = Tensor(rows == Tensor::from_sint(p));
    cache.assign(here.where(in[1].reshape({1, kDim}).expand({kMax, kDim}), cache)).realize();
    Tensor k = cache.shrink({{0, p + 1}, {0, kDim}});
    Tensor out = in[0].matmul(k.T()).softmax(-1).matmul(k);
    return std::vector<Tensor>{out.contiguous()};
  };
  TinyJit jit(step);
  // the reference on the host (an eager run on concrete shapes would compile ~3 kernels for each of the 100 lengths:
  // ~95 s on PoCL with an empty cache)
  CompileCounter cc;
  size_t replay_compiles = 0;
  for (int64_t t = 0; t < kMax; t++) {
    CAPTURE(t);
    std::vector<float> kt(keys.begin() + t * kDim, keys.begin() + (t + 1) * kDim);
    std::vector<float> q = seq(kDim, 0.1f * float(t % 5 + 1));
    Tensor qt = Tensor::from_vector(q, {1, kDim}).realize();
    Tensor kin = Tensor::from_vector(kt, {kDim}).realize();
    size_t before = cc.n;
    std::vector<float> got = jit({qt, kin}, {pos.bind(t)})[0].to_vector<float>();
    if (t >= 3) replay_compiles += cc.n - before;
    std::vector<double> score(size_t(t + 1));
    double mx = -1e300, den = 0;
    for (int64_t j = 0; j <= t; j++) {
      double d = 0;
      for (int64_t c = 0; c < kDim; c++) d += double(q[size_t(c)]) * double(keys[size_t(j * kDim + c)]);
      score[size_t(j)] = d;
      mx = std::max(mx, d);
    }
    for (double& e : score) den += (e = std::exp(e - mx));
    std::vector<float> want(kDim, 0.f);
    for (int64_t c = 0; c < kDim; c++) {
      double acc = 0;
      for (int64_t j = 0; j <= t; j++) acc += score[size_t(j)] / den * double(keys[size_t(j * kDim + c)]);
      want[size_t(c)] = float(acc);
    }
    check_close(got, want);
  }
  CHECK(jit.replaying());
  CHECK(jit.captured_kernels() > 0);
  CHECK(replay_compiles == 0);
  CHECK(error_of([&] { (void)jit({Tensor::zeros({1, kDim}).realize(), Tensor::zeros({kDim}).realize()}, {sint(3)}); })
            .find("must be a bound Variable") != std::string::npos);
}

TEST_CASE("BEAM searches a kernel with a variable (at the middle of its bounds); the winner is right for every value") {
  char dir[] = "/tmp/tg_variable_beamXXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  {
    ScopedEnv cd("TG_CACHE_DIR", dir), beam("BEAM", "1"), budget("BEAM_BUDGET", "10");
    Variable nv("n", 1, 48);
    Tensor kv = Tensor::from_vector(seq(48 * 32), {48, 32}), q = Tensor::from_vector(seq(4 * 32, 0.1f), {4, 32});
    for (int64_t v : {5, 48, 1}) {
      CAPTURE(v);
      Tensor k = kv.shrink({{0, nv.bind(v)}, {0, 32}});
      std::vector<float> got = q.matmul(k.T()).softmax(-1).to_vector<float>();
      std::vector<float> kd = kv.shrink({{0, v}, {0, 32}}).to_vector<float>(), qd = q.to_vector<float>();
      std::vector<float> want;  // on the host
      for (int i = 0; i < 4; i++) {
        std::vector<double> row(static_cast<size_t>(v));
        double mx = -1e30, sum = 0;
        for (int64_t j = 0; j < v; j++) {
          double s = 0;
          for (int x = 0; x < 32; x++) s += double(qd[size_t(i * 32 + x)]) * double(kd[size_t(j * 32 + x)]);
          row[size_t(j)] = s;
          mx = std::max(mx, s);
        }
        for (double& r : row) sum += (r = std::exp(r - mx));
        for (double r : row) want.push_back(float(r / sum));
      }
      check_close(got, want, 1e-5f);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a one-hot sum is an indexed load: index_select and gather on float and uint8 rows run no reduce") {
  auto reduces = [](const Tensor& t) {
    size_t n = 0;
    Schedule s = create_schedule(std::vector<UOpRef>{t.uop()});
    for (auto& it : s.items)
      for (const UOp* u : toposort(it.ast.get())) n += u->op == Ops::REDUCE;
    return n;
  };
  std::vector<float> xf = seq(50 * 6);
  std::vector<uint8_t> xu(50 * 6);
  for (size_t i = 0; i < xu.size(); i++) xu[i] = uint8_t(i * 7 % 251);
  Tensor f = Tensor::from_vector(xf, {50, 6}), u = Tensor::from_vector(xu, {50, 6});
  std::vector<int32_t> iv{3, 49, 0, 7, -1, 3};  // -1 counts from the end, as torch
  Tensor idx = Tensor::from_vector(iv);
  Tensor fs = f.index_select(0, idx), us = u.index_select(0, idx);
  CHECK(reduces(fs) == 0);
  CHECK(reduces(us) == 0);
  std::vector<float> gf = fs.to_vector<float>();
  std::vector<uint8_t> gu = us.to_vector<uint8_t>();
  for (size_t r = 0; r < iv.size(); r++)
    for (size_t c = 0; c < 6; c++) {
      size_t row = size_t(iv[r] < 0 ? iv[r] + 50 : iv[r]);
      CHECK(gf[r * 6 + c] == xf[row * 6 + c]);
      CHECK(gu[r * 6 + c] == xu[row * 6 + c]);
    }
  // an index out of range reads no memory past the rows: the indexed load's kernel checks it and the run raises
  // (issue 24: checked in the kernel, on every device)
  Tensor far = Tensor::from_vector(std::vector<int32_t>{2, 50});
  CHECK(reduces(f.gather(0, far.reshape({2, 1}).expand({2, 6}))) == 0);
  std::string err;
  try {
    (void)f.gather(0, far.reshape({2, 1}).expand({2, 6})).to_vector<float>();
  } catch (const Error& e) {
    err = e.what();
  }
  CHECK(err.find("[gather] index 50 is out of range for an axis of size 50") != std::string::npos);
}

TEST_CASE("an assign into a view of a buffer writes those elements in place: a KV cache's rows at a symbolic position") {
  const int64_t M = 16, D = 8;
  Tensor cache = Tensor::zeros({M, D}).contiguous();
  cache.realize();
  // concrete rows 2..4, permuted view: one kernel that stores 2 x 8 elements, the rest of the buffer kept
  Tensor rows = Tensor::from_vector(seq(2 * D, 1.f), {2, D});
  rows.realize();
  size_t k0 = kernels_run();
  Tensor view = cache.shrink({{2, 4}, {0, D}}).permute({1, 0});
  view.assign(rows.permute({1, 0}));
  view.realize();
  CHECK(kernels_run() - k0 == 1);
  auto c = cache.to_vector<float>(), r = rows.to_vector<float>();
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < D; j++) CHECK(c[size_t(i * D + j)] == (i >= 2 && i < 4 ? r[size_t((i - 2) * D + j)] : 0.f));
  CHECK(view.to_vector<float>()[1] == r[size_t(D)]);  // the assigned view reads the buffer through its view
  // a decode loop: row `pos` written each step through a shrink at a Variable, replayed by TinyJit, one kernel each
  Variable pos("pos", 0, M - 1);
  TinyJit jit([&](const std::vector<Tensor>& in, const std::vector<sint>& vars) -> std::vector<Tensor> {
    Tensor row = cache.shrink({{vars[0], vars[0] + 1}, {sint(0), sint(D)}});
    row.assign(Tensor(in[0] * 2));
    row.realize();
    return {Tensor(cache.sum(1)).contiguous()};
  });
  for (int64_t p = 5; p < 9; p++) {
    Tensor x = Tensor::full({1, D}, double(p));
    x.realize();
    auto sums = jit({x}, {pos.bind(p)})[0].to_vector<float>();
    CHECK(sums[size_t(p)] == float(2 * p * D));
    if (p > 5) CHECK(sums[size_t(p - 1)] == float(2 * (p - 1) * D));  // the row before kept
    CHECK(sums[0] == 0.f);
  }
  c = cache.to_vector<float>();
  for (int64_t j = 0; j < D; j++) CHECK(c[size_t(8 * D + j)] == 16.f);
  // a view that addresses an element twice (an expand) or pads is still materialised first: the buffer unchanged
  Tensor before = Tensor(cache * 1).contiguous();
  before.realize();
  Tensor e = cache.shrink({{0, 1}, {0, D}}).expand({3, D});
  e.assign(Tensor::ones({3, D}));
  e.realize();
  CHECK(cache.to_vector<float>() == before.to_vector<float>());
}
