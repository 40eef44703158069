// Kernel optimisations: shift_to legality, the heuristic's choices, and that every opt list computes the same
// values as the plain loops (explicit opts through lower_kernel, run on the CPU device).
#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "scoped_env.hpp"
#include "test_util.hpp"
#include "tg/codegen.hpp"
#include "tg/device.hpp"
#include "tg/nn/state.hpp"
#include "tg/opt.hpp"
#include "tg/render.hpp"
#include "tg/schedule.hpp"
#include "tg/symbolic.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {

// These tests read the direct convolution's kernels: WINO=0 keeps the Winograd cost model, which decides by the
// host's vector width, out of them (the Winograd tests set WINO=1 themselves).
const ScopedEnv kDirectConvolutions("WINO", "0");

using Kern = test::LastKernel;  // the last kernel of a tensor's schedule and its buffers
using test::last_kernel;

// Compile and run a lowered kernel on the kernel's buffers; the output buffer's floats.
std::vector<float> run_compiled(const Kern& k, const CompiledKernel& ck) {
  Device& dev = get_device("CPU");
  auto prog = dev.get_program(ck.src, ck.name);
  std::vector<void*> ptrs;
  for (auto& b : k.bufs) ptrs.push_back(b->ptr());
  std::vector<int64_t> vars(ck.var_names.size(), 0);
  LaunchDims dims;
  dims.n_vars = int(vars.size());
  if (ck.core_var >= 0) dims.core_var = ck.core_var, dims.global[0] = ck.threads;
  prog->run(ptrs.data(), vars.data(), dims);
  std::vector<float> out(k.bufs[0]->nbytes() / 4);
  k.bufs[0]->copyout(out.data(), out.size() * 4);
  return out;
}

// Lower with explicit opts, compile, run on fresh copies of the inputs; the output buffer's floats.
std::vector<float> run_with(const Kern& k, const std::vector<Opt>& opts, int threads_cfg = 2) {
  LowerOptions lo;
  lo.opts = &opts;
  lo.config.threads = threads_cfg;
  static int n = 0;
  return run_compiled(k, lower_kernel(k.ast, "opt_k" + std::to_string(n++), get_device("CPU").renderer(), lo));
}

// The CPU device with its machine model's lowering options, its vector width (at least 4) and the LLVM type of one
// vector of floats.
struct HostLowering {
  Device& dev = get_device("CPU");
  LowerOptions lo;
  int64_t w;
  std::string vec;
  HostLowering() {
    lo.config = opt_config(dev);
    w = std::max(4, lo.config.vector_width);
    vec = "<" + std::to_string(w) + " x float>";
  }
};

// How often `what` occurs in s (overlapping occurrences each count).
size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) n++;
  return n;
}

Tensor randn(Shape s, uint64_t seed) {
  std::mt19937 g{uint32_t(seed)};
  std::normal_distribution<float> d;
  int64_t n = 1;
  for (auto x : s) n *= x;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return Tensor::from_vector(v, s);
}

// The schedule of the weight gradient of x.conv2d(w) summed against g (random values of these shapes, seeds from
// `seed`), and the AVX2 machine model the tile tests use (8 floats x 16 registers).
Schedule weight_grad_schedule(const Shape& xs, const Shape& ws, const Shape& gs, uint64_t seed) {
  Tensor x = randn(xs, seed), w = randn(ws, seed + 1), g = randn(gs, seed + 2);
  x.realize(), w.realize(), g.realize();
  UOpRef root = (x.conv2d(w) * g).sum().gradient({w})[0].uop();
  return create_schedule(std::span<const UOpRef>(&root, 1));
}
OptConfig avx2_config() {
  OptConfig avx2{1, 8};
  avx2.vector_registers = 16;
  return avx2;
}

void check_close(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); i++) REQUIRE(std::abs(a[i] - b[i]) <= tol * (1 + std::abs(b[i])));
}

// whether the opts upcast output axis `axis` by `amt`
bool has_upcast(const std::vector<Opt>& opts, int axis, int64_t amt) {
  return std::any_of(opts.begin(), opts.end(), [&](const Opt& o) { return o.op == OptOp::UPCAST && o.axis == axis && o.amt == amt; });
}

// The first reduce kernel of y's schedule: (its innermost output axis's size, the store's stride along it).
std::pair<int64_t, int64_t> reduce_kernel_axis(const Tensor& y) {
  UOpRef root = y.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  for (auto& it : s.items) {
    bool red = false;
    const UOp* st = nullptr;
    for (const UOp* u : toposort(it.ast.get())) {
      red |= u->op == Ops::REDUCE;
      if (u->op == Ops::STORE && u->src(0)->op == Ops::INDEX) st = u->src(0)->src(1);
    }
    if (!red || !st) continue;
    auto axes = kernel_axes(it.ast);
    const UOp* inner = nullptr;
    for (const UOp* r : axes)
      if (range_type(r) == AxisType::Loop || range_type(r) == AxisType::Global) inner = r;
    REQUIRE(inner);
    return std::pair{inner->src(0)->const_int(), index_coef(st, inner).value_or(-1)};
  }
  FAIL("no reduce kernel");
  return std::pair<int64_t, int64_t>{0, 0};
}

}  // namespace

TEST_CASE("apply_opt refuses opts that do not apply, naming the opt and the reason") {
  Tensor a = randn({6, 10}, 1), b = randn({10, 7}, 2);
  a.realize(), b.realize();
  Kern k = last_kernel(a.matmul(b));
  UOpRef ast = k.ast;
  CHECK(kernel_axes(ast).size() == 3);  // two output axes, one reduce axis
  auto msg = [&](Opt o) {
    try {
      apply_opt(ast, o);
    } catch (const OptError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(msg({OptOp::UPCAST, 0, 4}).find("not divisible by 4") != std::string::npos);
  CHECK(msg({OptOp::UPCAST, 3, 2}).find("has 3 axes") != std::string::npos);
  CHECK(msg({OptOp::UNROLL, 0, 2}).find("needs a reduce axis") != std::string::npos);
  CHECK(msg({OptOp::UPCAST, 2, 2}).find("needs an output axis") != std::string::npos);
  CHECK(msg({OptOp::UPCAST, 0, 1}).find("at least 2") != std::string::npos);
  UOpRef t = apply_opt(ast, {OptOp::THREAD, 0, 2});
  CHECK_THROWS_AS(apply_opt(t, {OptOp::THREAD, 1, 7}), OptError);  // already split across threads
}

TEST_CASE("a kernel of thousands of shifted views is not copied by UPCAST (its body would grow 16-fold)") {
  Tensor x = Tensor::arange(4096).cast(dtypes::float32).realize();
  auto shifted_sum = [&](int k) {
    Tensor y = x;
    for (int i = 1; i <= k; i++) y = y + x.pad({{i, 0}}).shrink({{0, 4096}});
    return y;
  };
  auto opts = hand_coded_optimizations(last_kernel(shifted_sum(300)).ast, OptConfig{2, 16});
  // threads only (300 gated loads and adds per element, about 20 us: each thread's part is worth a split)
  CHECK(opts == std::vector<Opt>{Opt{OptOp::THREAD, 0, 2}});
  // the same shifts over and over: 64 distinct reads, 3,000 adds
  Tensor s = Tensor::arange(64).cast(dtypes::float32).realize(), y = s;
  for (int i = 1; i <= 3000; i++) y = y + s.pad({{i % 64, 0}}).shrink({{0, 64}});
  CHECK(hand_coded_optimizations(last_kernel(y).ast, OptConfig{2, 16}).empty());
  auto few = hand_coded_optimizations(last_kernel(shifted_sum(20)).ast, OptConfig{2, 16});
  CHECK(std::count_if(few.begin(), few.end(), [](const Opt& o) { return o.op == OptOp::UPCAST; }) >= 1);
}

TEST_CASE("a small matrix applied along the stored axis: vectors along its rows, not lanes summed across") {
  // y[n, j] = sum_k t[n, k] M[j, k], M 8 x 8 (256 bytes, Winograd's transform along the tiles' rows): the store is
  // contiguous along j, M's lanes along j gather (8 apart) but are the same for every row n, and t streams 128 KiB
  // past them: vectors of the 8 rows of M. Beside a t of 4 rows (128 bytes, nothing streamed) M is no such table:
  // the reduce takes lanes along k, as for any gathered load.
  Tensor t = randn({4096, 8}, 47), m = randn({8, 8}, 48);
  Tensor::realize_all({&t, &m});
  Tensor y = (t.unsqueeze(1) * m.reshape({1, 8, 8})).sum(2);
  auto opts = hand_coded_optimizations(last_kernel(y).ast, OptConfig{2, 16});
  REQUIRE(!opts.empty());
  CHECK(opts[0] == Opt{OptOp::UPCAST, 1, 8});
  CHECK(std::none_of(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::UNROLL; }));
  std::vector<float> yv = y.to_vector<float>(), tv = t.to_vector<float>(), mv = m.to_vector<float>();
  for (size_t n : {0, 1, 2047, 4095})
    for (size_t j = 0; j < 8; j++) {
      double s = 0;
      for (size_t k = 0; k < 8; k++) s += double(tv[n * 8 + k]) * mv[j * 8 + k];
      CHECK(yv[n * 8 + j] == doctest::Approx(s).epsilon(1e-5));
    }
  Tensor t2 = randn({4, 8}, 49);
  t2.realize();
  auto few = hand_coded_optimizations(last_kernel((t2.unsqueeze(1) * m.reshape({1, 8, 8})).sum(2)).ast, OptConfig{2, 16});
  REQUIRE(!few.empty());
  CHECK(few[0] == Opt{OptOp::UNROLL, 2, 8});
}

TEST_CASE("the heuristic gives a matmul a register tile, vectorised along the contiguous axis, and threads") {
  Tensor a = randn({64, 48}, 3), b = randn({48, 96}, 4);
  a.realize(), b.realize();
  Kern k = last_kernel(a.matmul(b));
  auto opts = hand_coded_optimizations(k.ast, OptConfig{2, 16});
  REQUIRE(opts.size() == 3);  // 0.6 MFLOP (about 6 us on one core): too little to split across threads
  CHECK(opts[0] == Opt{OptOp::UPCAST, 1, 16});  // the store's contiguous axis, one AVX-512 vector
  CHECK(opts[1] == Opt{OptOp::UPCAST, 0, 8});   // rows share the B loads
  CHECK(opts[2] == Opt{OptOp::UPCAST, 1, 2});   // two vectors share each A broadcast: 16 accumulator registers
  CHECK(hand_coded_optimizations(k.ast, OptConfig{1, 16}) == opts);
  // 4x the rows and columns (9.4 MFLOP): the same tile, and its rows split across the threads
  Tensor a4 = randn({256, 48}, 3), b4 = randn({48, 384}, 4);
  a4.realize(), b4.realize();
  auto o4 = hand_coded_optimizations(last_kernel(a4.matmul(b4)).ast, OptConfig{2, 16});
  REQUIRE(o4.size() == 4);
  CHECK(std::vector<Opt>(o4.begin(), o4.begin() + 3) == opts);
  CHECK(o4[3] == Opt{OptOp::THREAD, 0, 2});
  // AVX2 (8 floats x 16 registers) with an FMA that 8 chains keep busy: 8 accumulator registers of the 16, 2 rows x 4
  // vectors (each of A's broadcasts is an instruction of its own: 2 + 4 loads per 8 FMAs, against 8 + 1 for 8 rows x
  // 1 vector)
  OptConfig avx2{2, 8};
  avx2.vector_registers = 16;
  avx2.fma_chains = 8;
  auto o2 = hand_coded_optimizations(k.ast, avx2);
  REQUIRE(o2.size() == 3);
  CHECK(o2[0] == Opt{OptOp::UPCAST, 1, 8});
  CHECK(o2[1] == Opt{OptOp::UPCAST, 0, 2});
  CHECK(o2[2] == Opt{OptOp::UPCAST, 1, 4});
  // the default 4-cycle, 2-pipe FMA needs 10 chains: 3 rows x 4 vectors, the 64 rows padded to 66 (1/32 of them
  // recomputed, within the sixteenth allowed where the 8 accumulators of 2 x 4 leave the pipes idle)
  OptConfig zen_avx2 = avx2;
  zen_avx2.fma_chains = 10;
  CHECK(hand_coded_optimizations(k.ast, zen_avx2) ==
        std::vector<Opt>{{OptOp::UPCAST, 1, 8}, {OptOp::PADTO, 0, 3}, {OptOp::UPCAST, 0, 3}, {OptOp::UPCAST, 1, 4}});
  // the next-best tiles, for BEAM's seeds: distinct, the first being the heuristic's
  auto alts = hand_coded_alternatives(k.ast, avx2, 4);
  REQUIRE(alts.size() == 4);
  CHECK(alts[0] == o2);
  for (size_t i = 1; i < alts.size(); i++)
    for (size_t j = 0; j < i; j++) CHECK(alts[i] != alts[j]);
  CHECK(hand_coded_alternatives(k.ast, avx2, 100).size() < 100);  // as many as the kernel has
  // a 2048 matmul: B (16 MiB) would be streamed whole by both threads per row tile: its columns are split instead
  Kern big = [] {
    ScopedEnv plain("PACKED_MATMUL", "0");  // the plain kernel (not B packed into panels)
    return last_kernel(Tensor::rand({2048, 2048}).matmul(Tensor::rand({2048, 2048})));
  }();
  auto bo = hand_coded_optimizations(big.ast, OptConfig{2, 16});
  REQUIRE(!bo.empty());
  CHECK(bo.back() == Opt{OptOp::THREAD, 1, 2});
  // B packed into panels of 32 columns: a tile 32 columns wide reads each panel row whole per k step, so B streams
  // like A: AVX2 takes 3 rows x 4 vectors (3 broadcasts + 4 loads per 12 FMAs; the 10 FMA chains of OptConfig's
  // default 4-cycle, 2-pipe FMA need 12 accumulators) over 8 rows x 1 vector (8 + 1 per 8); 256 rows padded to 258
  Tensor pa = Tensor::rand({256, 512}), pb = Tensor::rand({512, 2048});
  pa.realize(), pb.realize();
  UOpRef root = pa.matmul(pb).uop();
  Schedule ps = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(ps.items.size() == 3);  // pack B, the product in panels, back to row-major
  Kern packed{ps.items[1].ast, ps.items[1].bufs};
  auto po = hand_coded_optimizations(packed.ast, zen_avx2);
  std::map<int, int64_t> tile;
  for (const Opt& o : po)
    if (o.op == OptOp::UPCAST) tile[o.axis] = tile.count(o.axis) ? tile[o.axis] * o.amt : o.amt;
  std::vector<int64_t> amounts;
  for (auto& [ax, a] : tile) amounts.push_back(a);
  std::sort(amounts.begin(), amounts.end());
  CHECK(amounts == std::vector<int64_t>{3, 32});
  CHECK(std::count(po.begin(), po.end(), Opt{OptOp::PADTO, 1, 3}) == 1);
  // AVX-512 keeps 8 rows x 2 vectors there
  amounts.clear(), tile.clear();
  for (const Opt& o : hand_coded_optimizations(packed.ast, OptConfig{2, 16}))
    if (o.op == OptOp::UPCAST) tile[o.axis] = tile.count(o.axis) ? tile[o.axis] * o.amt : o.amt;
  for (auto& [ax, a] : tile) amounts.push_back(a);
  std::sort(amounts.begin(), amounts.end());
  CHECK(amounts == std::vector<int64_t>{8, 32});
}

TEST_CASE("a large CPU matmul packs B into 32-column panels: the same values as the plain kernel, plain gradients") {
  Tensor a = randn({256, 512}, 5), b = randn({512, 2048}, 6);  // B: 4 MiB
  a.realize(), b.realize();
  size_t before = kernels_run();
  Tensor c = a.matmul(b);
  c.realize();
  CHECK(kernels_run() - before == 3);  // pack B, the product in panels, back to row-major
  std::vector<float> plain;
  {
    ScopedEnv off("PACKED_MATMUL", "0");
    size_t b0 = kernels_run();
    plain = a.matmul(b).to_vector<float>();
    CHECK(kernels_run() - b0 == 1);
  }
  CHECK(c.to_vector<float>() == plain);  // the sum over k in the same order
  // gradients: those of the plain product (packed again by the scheduler where large)
  Tensor g = randn({256, 2048}, 7);
  auto grads = [&](bool packed) {
    ScopedEnv env("PACKED_MATMUL", packed ? "1" : "0");
    Tensor x = a.detach(), y = b.detach();
    x.requires_grad_(), y.requires_grad_();
    Tensor(x.matmul(y) * g).sum().backward();
    return std::make_pair(x.grad().to_vector<float>(), y.grad().to_vector<float>());
  };
  auto [pa, pb] = grads(true);
  auto [qa, qb] = grads(false);
  // sums of 2048 (dA) and 256 (dB) unit-scale products, in another order than the plain gradient's lanes: K * eps
  check_close(pa, qa, 2048 * 1.2e-7f);
  check_close(pb, qb, 256 * 1.2e-7f);
  // a small B (here 16 KiB) is not packed
  Tensor s1 = randn({256, 64}, 8), s2 = randn({64, 64}, 9);
  size_t b1 = kernels_run();
  s1.matmul(s2).realize();
  CHECK(kernels_run() - b1 == 1);
}

TEST_CASE("an operand shared by 32+ rows is copied once: B of A @ B^T columns-innermost (attention's scores), a float16 V as float32") {
  // q (2, 4, 64, 32) against keys (2, 1, 128, 32) shared by 4 heads: each key row meets 256 query rows. B is read
  // along its rows (contiguous in k, 32 floats apart in n): copied once with n innermost, then one product kernel
  const int64_t K = 32;
  Tensor q = randn({2, 4, 64, K}, 31), k = randn({2, 1, 128, K}, 32);
  q.realize(), k.realize();
  size_t before = kernels_run();
  Tensor s = q.matmul(k.transpose(-1, -2));
  s.realize();
  CHECK(kernels_run() - before == 2);  // B copied, the product
  std::vector<float> got = s.to_vector<float>(), qv = q.to_vector<float>(), kv = k.to_vector<float>(), plain;
  {
    ScopedEnv off("PACKED_MATMUL", "0");
    size_t b0 = kernels_run();
    plain = q.matmul(k.transpose(-1, -2)).to_vector<float>();
    CHECK(kernels_run() - b0 == 1);
  }
  REQUIRE(got.size() == size_t(2 * 4 * 64 * 128));
  for (int64_t b = 0; b < 2; b++)
    for (int64_t h = 0; h < 4; h++)
      for (int64_t i = 0; i < 64; i++)
        for (int64_t j = 0; j < 128; j++) {
          double want = 0, mag = 0;
          for (int64_t t = 0; t < K; t++) {
            double p = double(qv[size_t(((b * 4 + h) * 64 + i) * K + t)]) * double(kv[size_t((b * 128 + j) * K + t)]);
            want += p, mag += std::abs(p);
          }
          const size_t at = size_t(((b * 4 + h) * 64 + i) * 128 + j);
          REQUIRE(std::abs(got[at] - want) <= double(K) * 1.2e-7 * mag);
          REQUIRE(std::abs(plain[at] - want) <= double(K) * 1.2e-7 * mag);
        }
  // a decode step's 4 query rows per key row, and a B already contiguous along n (A @ B), keep the one kernel
  Tensor q1 = randn({2, 4, 1, K}, 33), kt = randn({2, 1, K, 128}, 34);
  q1.realize(), kt.realize();
  size_t b1 = kernels_run();
  q1.matmul(k.transpose(-1, -2)).realize();
  CHECK(kernels_run() - b1 == 1);
  size_t b2 = kernels_run();
  q.matmul(kt).realize();
  CHECK(kernels_run() - b2 == 1);
  // attn @ V with V float16 (a KV cache's values), contiguous along n: converted to float32 once, then the product;
  // the values within K eps of the plain kernel's (the same products, their sums in the two kernels' orders)
  Tensor v16 = randn({2, 1, 128, K}, 35).cast(dtypes::float16).realize();
  Tensor p = randn({2, 4, 64, 128}, 36).realize();
  size_t b3 = kernels_run();
  std::vector<float> pv = p.matmul(v16.cast(dtypes::float32)).to_vector<float>(), pv_plain;
  CHECK(kernels_run() - b3 == 2);  // V converted, the product
  {
    ScopedEnv off("PACKED_MATMUL", "0");
    size_t b4 = kernels_run();
    pv_plain = p.matmul(v16.cast(dtypes::float32)).to_vector<float>();
    CHECK(kernels_run() - b4 == 1);
  }
  check_close(pv, pv_plain, 128 * 1.2e-7f);
}

namespace {

// The register tiles (sorted amounts per axis) of an opt list.
std::vector<int64_t> tile_of(const std::vector<Opt>& opts) {
  std::map<int, int64_t> t;
  for (const Opt& o : opts)
    if (o.op == OptOp::UPCAST) t[o.axis] = t.count(o.axis) ? t[o.axis] * o.amt : o.amt;
  std::vector<int64_t> v;
  for (auto& [ax, amt] : t) v.push_back(amt);
  std::sort(v.begin(), v.end());
  return v;
}

// The packed product's kernel (the second of pack B, the product in panels, back to row-major) of (m, k) x (k, n).
UOpRef packed_kernel(int64_t m, int64_t k, int64_t n) {
  Tensor a = Tensor::rand({m, k}), b = Tensor::rand({k, n});
  a.realize(), b.realize();
  UOpRef root = a.matmul(b).uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(s.items.size() == 3);
  return split_ranges(graph_rewrite(s.items[1].ast, symbolic(), nullptr, false, "s"));
}

}  // namespace

TEST_CASE("the AVX2 tile holds the FMA chains the machine model's FMA needs: 3 rows x 4 vectors, not 2 x 4") {
  // (384, 256) x (256, 2048): B of 2 MiB, past half of any L2 seen, packed; 384 rows = 3 x 128. OptConfig's FMA is
  // (4 + 1) x 2 = 10 chains (Zen 3/4/5's ymm FMA: 4 cycles, 2 per cycle): 12 accumulators, where half the 16 ymm (8,
  // 2 x 4: 0.87x OpenBLAS on Zen 5 at N=1536, against 1.00x for 3 x 4) leave the pipes 2 short.
  OptConfig avx2{1, 8};
  avx2.vector_registers = 16;
  REQUIRE(avx2.fma_chains == 10);
  UOpRef k = packed_kernel(384, 256, 2048);
  auto o = hand_coded_optimizations(k, avx2);
  CHECK(tile_of(o) == std::vector<int64_t>{3, 32});
  CHECK(std::none_of(o.begin(), o.end(), [](const Opt& x) { return x.op == OptOp::PADTO; }));  // 3 divides 384
  // Haswell's 5-cycle FMA (12 chains) too; an FMA that 8 chains keep busy ((3 + 1) x 2) keeps half the registers
  avx2.fma_chains = 12;
  CHECK(tile_of(hand_coded_optimizations(k, avx2)) == std::vector<int64_t>{3, 32});
  avx2.fma_chains = 8;
  CHECK(tile_of(hand_coded_optimizations(k, avx2)) == std::vector<int64_t>{2, 32});
  avx2.fma_chains = 10;
  // AVX-512's 16 of 32 zmm are chains enough for any FMA seen (Zen 5's zmm in LLVM's model: 4 cycles x 1 = 5 chains;
  // Skylake-SP's 4 x 2 = 10): its 8 x 2 tile stays
  OptConfig avx512{1, 16};
  for (int chains : {5, 10}) {
    avx512.fma_chains = chains;
    CHECK(tile_of(hand_coded_optimizations(k, avx512)) == std::vector<int64_t>{8, 32});
  }
  // BEAM's seeds: the heuristic's first, then others from the wide space, none past 12 accumulator registers
  auto alts = hand_coded_alternatives(k, avx2, 4);
  REQUIRE(alts.size() >= 2);
  CHECK(alts[0] == hand_coded_optimizations(k, avx2));
  for (const auto& a : alts) {
    int64_t floats = 1;
    for (int64_t x : tile_of(a)) floats *= x;
    CHECK(floats <= 12 * 8);
  }
}

TEST_CASE("an AVX2 conv tile fits the registers: 3 rows x 4 vectors, not 3 x 2 columns x 2 vectors that spill") {
  // beautiful_mnist's 3x3 convolutions at batch 512 (channels-last: output axes n, oh, ow, co; vectors along co). A
  // tile whose broadcasts feed several vectors holds all of them: 3 rows x 2 columns x 2 vectors is 12 accumulators
  // + 6 broadcasts + 1 = 19 of AVX2's 16 registers (LLVM spills 6 of them per 12 FMAs: 2x the time with
  // TG_CPU=haswell); 3 x 4 vectors is 12 + 3 + 1. Each broadcast is an instruction of its own below AVX-512, so 3 x 4
  // (3 + 4 loads per 12 FMAs) ranks over 3 rows x 4 columns x 1 vector (12 + 1), which fits the registers too.
  auto conv_tile = [](int64_t c, int64_t hw, const OptConfig& cfg) {
    Tensor x = randn({512, c, hw, hw}, 21), w = randn({64, c, 3, 3}, 22);
    x.realize(), w.realize();
    UOpRef root = x.conv2d(w).uop();
    Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
    for (auto& it : s.items) {
      auto axes = kernel_axes(it.ast);
      if (axes.size() != 7 || range_type(axes[0]) == AxisType::Reduce) continue;
      std::map<int, int64_t> t;  // per output axis: its tile amount (PADTO counted apart)
      int pads = 0;
      for (const Opt& o : hand_coded_optimizations(it.ast, cfg)) {
        if (o.op == OptOp::UPCAST) t[o.axis] = t.count(o.axis) ? t[o.axis] * o.amt : o.amt;
        pads += o.op == OptOp::PADTO;
      }
      return std::pair{t, pads};
    }
    FAIL("no convolution kernel");
    return std::pair{std::map<int, int64_t>{}, 0};
  };
  OptConfig avx2{1, 8};
  avx2.vector_registers = 16;
  // 32 -> 64 channels, 10x10 -> 8x8: rows of 3 from the batch (512 padded to 513), 4 vectors of co
  auto [t8, pads8] = conv_tile(32, 10, avx2);
  CHECK(t8 == std::map<int, int64_t>{{0, 3}, {3, 32}});
  CHECK(pads8 == 1);
  // 64 -> 64, 8x8 -> 6x6: 3 columns x 4 vectors, not 3 x 2 rows x 2 vectors
  auto [t6, pads6] = conv_tile(64, 8, avx2);
  CHECK(t6 == std::map<int, int64_t>{{2, 3}, {3, 32}});
  CHECK(pads6 == 0);
  // AVX-512 (32 zmm, FMAs taking broadcasts from memory) keeps its 4 columns x 4 vectors
  CHECK(conv_tile(32, 10, OptConfig{1, 16}).first == std::map<int, int64_t>{{2, 4}, {3, 64}});
  // the weight gradient (output axes: batch part, co, kh, kw, ci; vectors along ci): 3 output channels (64 padded to
  // 66) x 4 vectors, 3 broadcasts + 4 vector loads per 12 FMAs, not 3 kernel columns x 4 vectors (1 broadcast + 12
  // vector loads: a column's vectors are loads of their own), nor 4 output channels x 3 columns x 1 vector (12 + 4
  // broadcasts + 3 vectors held). The padding's 3% of the work costs less than the loads it saves: with
  // TG_CPU=haswell mnist's r_128_64_3_3_32 took 7.0-7.2 ms against 8.2-8.4 as 3 columns (Zen 5, alone, 2 threads).
  Tensor x = randn({512, 32, 10, 10}, 21), w = randn({64, 32, 3, 3}, 22);
  x.realize(), w.realize();
  Tensor g = randn({512, 64, 8, 8}, 23);
  g.realize();
  Tensor dw = (x.conv2d(w) * g).sum().gradient({w})[0];
  UOpRef root = dw.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  bool found = false;
  for (auto& it : s.items) {
    auto axes = kernel_axes(it.ast);
    if (axes.size() != 8 || axes[1]->src(0)->const_int() != 64) continue;
    std::map<int, int64_t> t;
    std::vector<Opt> pads;
    for (const Opt& o : hand_coded_optimizations(it.ast, avx2)) {
      if (o.op == OptOp::UPCAST) t[o.axis] = t.count(o.axis) ? t[o.axis] * o.amt : o.amt;
      if (o.op == OptOp::PADTO) pads.push_back(o);
    }
    CHECK(t == std::map<int, int64_t>{{1, 3}, {4, 32}});
    CHECK(pads == std::vector<Opt>{{OptOp::PADTO, 1, 3}});
    found = true;
  }
  CHECK(found);
}

TEST_CASE("an AVX2 weight-gradient tile takes no more cache lines a trip than its FMAs hide and enough FMA chains: 3 channels x 4 vectors") {
  // beautiful_mnist's second convolution (32 -> 32 channels, 24x24, 5x5) at batch 512: its weight gradient (output
  // axes: batch part, co, kh, kw, ci; vectors along ci; the innermost reduce loop walks the output column, the input
  // and the gradient channels-last, 128 bytes a position apart). Both tiles below take 0.75 loads an accumulation;
  // 2 output channels x 4 vectors reads 2 lines of the input and 1 of the gradient a trip (192 bytes: 6 cycles of a
  // 32-byte L2 fill against 4 cycles of 8 FMAs at 2 a cycle), 4 x 2 vectors 1 + 1 (4 cycles). With TG_CPU=haswell on
  // Zen 5: 74 -> 60-63.5 ms a step. Both have 8 accumulators, short of the 12 chains Haswell's FMA needs: 3 output
  // channels (32 padded to 33) x 4 vectors holds 12 and reads 2 + 1 lines a trip (6 cycles of L2 for 6 of FMAs):
  // 62.8-67.6 -> 58.1-60.3 ms alone. AVX-512 (16 zmm FMAs a trip of the same 3 lines) keeps its 8 x 2 vectors.
  Schedule s = weight_grad_schedule({512, 32, 24, 24}, {32, 32, 5, 5}, {512, 32, 20, 20}, 81);
  OptConfig avx2 = avx2_config();
  avx2.fma_chains = 12, avx2.fma_per_cycle = 2;  // Haswell's machine model (5 cycles x 2 a cycle)
  OptConfig avx512{1, 16};
  avx512.fma_chains = 5, avx512.fma_per_cycle = 1;  // Zen 5's (4 cycles x 1 a cycle)
  int found = 0;
  for (auto& it : s.items) {
    auto axes = kernel_axes(it.ast);
    if (axes.size() != 8 || range_type(axes[0]) == AxisType::Reduce || axes[2]->src(0)->const_int() != 5) continue;
    auto tile = [&](const OptConfig& cfg) {
      std::map<int, int64_t> t;
      for (const Opt& o : hand_coded_optimizations(it.ast, cfg))
        if (o.op == OptOp::UPCAST) t[o.axis] = t.count(o.axis) ? t[o.axis] * o.amt : o.amt;
      return t;
    };
    CHECK(tile(avx2) == std::map<int, int64_t>{{1, 3}, {4, 32}});
    const auto o = hand_coded_optimizations(it.ast, avx2);
    CHECK(std::count(o.begin(), o.end(), Opt{OptOp::PADTO, 1, 3}) == 1);
    CHECK(tile(avx512) == std::map<int, int64_t>{{1, 8}, {4, 32}});
    found++;
  }
  CHECK(found == 1);
}

TEST_CASE("a 5x5 weight gradient over one input channel unrolls the 5 columns and takes lanes along its reduce axis") {
  // beautiful_mnist's first convolution (1 -> 32 channels, 28x28, 5x5) at batch 512: its weight gradient's store
  // axis is the kernel's 5 columns. Under AVX2 (w = 8) 5 is at least w/2, and the axis was taken whole as one partial
  // vector (4 + 1): 5 columns x 8 output channels of scalars, 3.6x the AVX-512 kernel's time. Now, as on AVX-512 (5
  // < w/2), the columns are copies and the reduce axis the loads are contiguous in (the output row) gets the lanes.
  Schedule s = weight_grad_schedule({512, 1, 28, 28}, {32, 1, 5, 5}, {512, 32, 24, 24}, 71);
  const OptConfig avx2 = avx2_config();
  int found = 0;
  for (auto& it : s.items) {
    auto axes = kernel_axes(it.ast);
    auto size_of = [](const UOp* r) { return r->src(0)->op == Ops::CONST ? r->src(0)->const_int() : int64_t(0); };
    const bool five = std::any_of(axes.begin(), axes.end(), [&](const UOp* r) {
      return range_type(r) != AxisType::Reduce && size_of(r) == 5;
    });
    // the partial sums (the other kernel adds them up over one reduce axis)
    if (!five || std::count_if(axes.begin(), axes.end(), [](const UOp* r) { return range_type(r) == AxisType::Reduce; }) < 2)
      continue;
    found++;
    for (const OptConfig& cfg : {avx2, OptConfig{1, 16}}) {
      INFO("vector width " << cfg.vector_width);
      std::vector<Opt> opts = hand_coded_optimizations(it.ast, cfg);
      auto has = [&](OptOp op, auto pred) {
        return std::any_of(opts.begin(), opts.end(), [&](const Opt& o) { return o.op == op && pred(o); });
      };
      // the 5 columns as copies; lanes of 8 along the 24-wide output row, a reduce axis here (16 does not divide 24)
      CHECK(has(OptOp::UPCAST, [&](const Opt& o) { return o.amt == 5 && size_of(axes[size_t(o.axis)]) == 5; }));
      CHECK(has(OptOp::UNROLL, [&](const Opt& o) { return o.amt == 8 && size_of(axes[size_t(o.axis)]) == 24; }));
    }
  }
  CHECK(found == 1);
}

TEST_CASE("rows of 3 that do not divide a long axis are padded (PADTO): 1024 rows in 342 tiles, the same values") {
  OptConfig avx2{2, 8};
  avx2.vector_registers = 16;
  // the heuristic: 1024 rows of A rounded up to 1026 (2 recomputed, 0.2%), then the 3-row tile
  UOpRef k = packed_kernel(1024, 256, 2048);
  auto o = hand_coded_optimizations(k, avx2);
  CHECK(tile_of(o) == std::vector<int64_t>{3, 32});
  auto pad = std::find(o.begin(), o.end(), Opt{OptOp::PADTO, 1, 3});
  REQUIRE(pad != o.end());
  CHECK(*(pad + 1) == Opt{OptOp::UPCAST, 1, 3});
  // B read in place (256 x 256, not packed): 3 rows x 4 vectors too, not 6 x 2 (fewer loads in the load model, but a
  // 32 x 256^3 batched matmul ran 20.7 ms with it against 12.2 ms for main's 8 x 1)
  Tensor p = randn({256, 256}, 14), q = randn({256, 256}, 15);
  p.realize(), q.realize();
  auto plain_tile = hand_coded_optimizations(last_kernel(p.matmul(q)).ast, avx2);
  CHECK(tile_of(plain_tile) == std::vector<int64_t>{3, 32});
  // a short axis is padded only where the tile without it is short of FMA chains: 64 rows (2 of 66 recomputed, past
  // 1/64, within 1/16) with the default 10 chains, not where 8 accumulators keep the FMA busy
  Tensor a = randn({64, 48}, 3), b = randn({48, 96}, 4);
  a.realize(), b.realize();
  Kern sk = last_kernel(a.matmul(b));
  auto padded = [](const std::vector<Opt>& o) { return std::any_of(o.begin(), o.end(), [](const Opt& x) { return x.op == OptOp::PADTO; }); };
  CHECK(padded(hand_coded_optimizations(sk.ast, avx2)));
  OptConfig avx2_8 = avx2;
  avx2_8.fma_chains = 8;
  CHECK(!padded(hand_coded_optimizations(sk.ast, avx2_8)));
  // rows of 3 would recompute past 1/16 of a 16-row axis (2 of 18): never padded
  Tensor a16 = randn({16, 48}, 3);
  a16.realize();
  CHECK(!padded(hand_coded_optimizations(last_kernel(a16.matmul(b)).ast, avx2)));
  // the padded kernel computes the plain loops' values exactly (each element's sum in the same order), with threads
  // over the padded axis too
  Tensor x = randn({130, 64}, 11), y = randn({64, 64}, 12);
  x.realize(), y.realize();
  Kern mm = last_kernel(x.matmul(y));
  std::vector<float> plain = run_with(mm, {});
  using O = Opt;
  for (auto opts : std::vector<std::vector<Opt>>{
           {O{OptOp::UPCAST, 1, 8}, O{OptOp::PADTO, 0, 3}, O{OptOp::UPCAST, 0, 3}, O{OptOp::UPCAST, 1, 4}},
           {O{OptOp::UPCAST, 1, 8}, O{OptOp::PADTO, 0, 3}, O{OptOp::UPCAST, 0, 3}, O{OptOp::THREAD, 0, 2}},
           {O{OptOp::PADTO, 0, 4}, O{OptOp::UPCAST, 0, 4}, O{OptOp::THREAD, 1, 2}}}) {
    CAPTURE(opts.size());
    CHECK(run_with(mm, opts) == plain);
  }
  // refused: an axis the amount divides, a reduce axis
  auto msg = [](const UOpRef& ast, Opt op) {
    try {
      apply_opt(ast, op);
    } catch (const OptError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(msg(mm.ast, {OptOp::PADTO, 1, 8}).find("already a multiple of 8") != std::string::npos);
  CHECK(msg(mm.ast, {OptOp::PADTO, 2, 3}).find("needs an output axis") != std::string::npos);
  // an in-place update (its kernel reads the buffer it stores through another parameter): the padding's copies
  // store nothing, so the last row is updated once
  Tensor w = randn({130, 64}, 13), w2 = randn({130, 64}, 13);
  w.realize(), w2.realize();
  w.assign(Tensor(w * 2 + x.matmul(y)));
  Kern inplace = last_kernel(w);
  REQUIRE(!inplace.bufs.empty());
  CHECK(std::count(inplace.bufs.begin(), inplace.bufs.end(), inplace.bufs[0]) == 2);  // it stores what it reads
  std::vector<float> want = Tensor(w2 * 2 + x.matmul(y)).to_vector<float>();
  check_close(run_with(inplace, {O{OptOp::UPCAST, 1, 8}, O{OptOp::PADTO, 0, 3}, O{OptOp::UPCAST, 0, 3}}), want, 64 * 1.2e-7f);
}

TEST_CASE("B is packed from half the machine model's per-core L2 on (the other half holds A's rows and C)") {
  // With 256 rows of A, a B of K x n floats just past half the L2 the CPU device reads (sysfs; 2 MiB when unknown),
  // and one at half: the first is packed (3 kernels), the second read in place (1). Both are below 4 MiB, from which
  // B is packed with 32 rows and more; with fewer than 256 rows the smaller B is read in place.
  int64_t l2 = get_device("CPU").machine().l2_bytes;
  if (l2 <= 0) l2 = int64_t(2) << 20;
  const int64_t K = 256, half_n = l2 / 2 / (K * 4);
  REQUIRE(half_n % 32 == 0);
  struct Case {
    int64_t m, n;
    size_t kernels;
  };
  for (const Case& tc : {Case{256, half_n + 32, 3}, Case{256, half_n, 1}, Case{128, half_n + 32, 1}}) {
    const int64_t m = tc.m, n = tc.n;  // not a structured binding: clang before 16 cannot capture one
    const size_t kernels = tc.kernels;
    CAPTURE(m);
    CAPTURE(n);
    Tensor a = randn({m, K}, 31), b = randn({K, n}, 32);
    a.realize(), b.realize();
    size_t before = kernels_run();
    Tensor c = a.matmul(b);
    c.realize();
    CHECK(kernels_run() - before == kernels);
    ScopedEnv off("PACKED_MATMUL", "0");
    CHECK(c.to_vector<float>() == a.matmul(b).to_vector<float>());  // the sum over k in the same order
  }
}

TEST_CASE("a panelled matmul whose A is past 8 L2s runs in M blocks of at most 4 L2s (each panel meets one block)") {
  // (8192, 1024) x (1024, 2048): A is 32 MiB, past 8 of any L2 seen; each block of mc rows (mc x 1024 floats within 4
  // L2s) meets every panel before the next block: the product's output axes are (blocks, panels, mc, 32)
  int64_t l2 = get_device("CPU").machine().l2_bytes;
  if (l2 <= 0) l2 = int64_t(2) << 20;
  auto product_axes = [](int64_t m, int64_t k, int64_t n) {
    UOpRef root = Tensor::rand({m, k}).matmul(Tensor::rand({k, n})).uop();
    Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
    for (auto& it : s.items) {
      bool red = false;
      for (const UOp* u : toposort(it.ast.get())) red |= u->op == Ops::REDUCE;
      if (!red) continue;
      std::vector<int64_t> out;
      for (const UOp* r : kernel_axes(it.ast))
        if (range_type(r) != AxisType::Reduce) out.push_back(r->src(0)->const_int());
      return out;
    }
    FAIL("no product kernel");
    return std::vector<int64_t>{};
  };
  auto big = product_axes(8192, 1024, 2048);
  REQUIRE(big.size() == 4);
  CHECK(big[0] >= 2);
  CHECK(big[1] == 2048 / 32);
  CHECK(big[0] * big[2] == 8192);
  CHECK(big[2] % 8 == 0);
  CHECK(big[2] * 1024 * 4 <= 4 * l2);
  CHECK(big[3] == 32);
  // A of 4 MiB (at most 8 L2s): one block, the panels outermost
  CHECK(product_axes(1024, 1024, 2048) == std::vector<int64_t>{2048 / 32, 1024, 32});
}

TEST_CASE("a prompt-sized matmul (32+ rows of A) packs B too: a quantised weight is dequantised straight into the panels") {
  // x (rows, 512) times a q8_0 weight (2048, 512) transposed: B is 4 MiB of float32. From 4 row tiles of 8 on, the
  // plain kernel would stream B from memory once per tile; one pass of the packing kernel reads the blocks instead.
  std::mt19937 gen{21};
  std::vector<uint8_t> blocks(size_t(2048 * 16 * 34));
  for (size_t i = 0; i < blocks.size(); i++) blocks[i] = uint8_t(gen());
  for (size_t b = 0; b < blocks.size(); b += 34) blocks[b] = 0, blocks[b + 1] = 0x1c;  // f16 scale 2^-8
  Tensor w = Tensor::from_vector(blocks, {2048, 16, 34}).realize();
  auto product = [&](const Tensor& x) { return x.matmul(nn::ggml_dequantize(w, "q8_0").reshape({2048, 512}).T()); };
  ScopedEnv float_products("INT_DOT", "0");  // 8 rows: the float product (INT_DOT quantises x: codegen_tests)
  for (int64_t rows : {64, 32, 8}) {
    CAPTURE(rows);
    Tensor x = randn({rows, 512}, 22);
    x.realize();
    size_t before = kernels_run();
    std::vector<float> got = product(x).to_vector<float>();
    size_t n = kernels_run() - before;
    std::vector<float> plain;
    size_t n_plain = 0;
    {
      ScopedEnv off("PACKED_MATMUL", "0");
      size_t b0 = kernels_run();
      plain = product(x).to_vector<float>();
      n_plain = kernels_run() - b0;
    }
    // both against a float64 sum on the host (the packed kernel sums k in order, the plain one in 32 lanes)
    std::vector<float> xs = x.to_vector<float>(), want(size_t(rows * 2048));
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < 2048; j++) {
        double acc = 0;
        for (int64_t k = 0; k < 512; k++)
          acc += double(xs[size_t(i * 512 + k)]) * double(int8_t(blocks[size_t((j * 16 + k / 32) * 34 + 2 + k % 32)])) / 256.0;
        want[size_t(i * 2048 + j)] = float(acc);
      }
    check_close(got, want, 512 * 1.2e-7f);
    check_close(plain, want, 512 * 1.2e-7f);
    if (rows >= 32) {
      CHECK(n == 3);  // dequantise the blocks into the panels, the product in panels, back to row-major
      CHECK(n_plain == 2);  // the weight dequantised to a float32 (2048, 512) buffer, the plain product
    } else {
      // fewer rows than a packed product takes (a short prompt): the weight stays fused, decoded from its blocks
      // inside the product's one kernel (no float32 copy of it: 4 bytes a weight written and read back)
      CHECK(n == 1);
      CHECK(n_plain == 1);
    }
  }
  // a model's activations (batch 1, T, D): the product's axes of size 1 are dropped by the rule, the same kernels
  Tensor x2 = randn({64, 512}, 23), x3 = x2.reshape({1, 64, 512}).contiguous();
  std::vector<float> flat = product(x2).to_vector<float>();
  x3.realize();
  size_t before = kernels_run();
  std::vector<float> batched = product(x3).to_vector<float>();
  CHECK(kernels_run() - before == 3);
  CHECK(batched == flat);
}

TEST_CASE("a panelled matmul whose panel is past half the L2 sums K in slices: q4_0 and q8_0 weights, ragged rows") {
  // x (m, K) times a quantised weight (n, K) transposed, K = L2 / 128 floats: a whole panel (K x 32 floats) is the
  // L2, so K is summed in 2 slices of panels that take half of it each (k_block). Rows not a multiple of the 8-row
  // tile; values against a float64 sum of the dequantised weight on the host (x times (q - 8) d, or q d). The float
  // GEMM's path (INT_GEMM=0; with VNNI these products are int8 GEMMs, tests/codegen_tests.cpp).
  ScopedEnv float_gemm("INT_GEMM", "0");
  int64_t l2 = get_device("CPU").machine().l2_bytes;
  if (l2 <= 0) l2 = int64_t(2) << 20;
  const int64_t K = l2 / 128, n = 160, nb = K / 32;
  std::mt19937 gen{41};
  for (const auto& case_ : {std::pair<std::string, int64_t>{"q4_0", 18}, {"q8_0", 34}}) {
    const std::string type = case_.first;  // not a structured binding: clang (C++20) refuses those in a lambda
    const int64_t bytes = case_.second;
    CAPTURE(type);
    std::vector<uint8_t> blocks(size_t(n * nb * bytes));
    for (auto& b : blocks) b = uint8_t(gen());
    for (size_t b = 0; b < blocks.size(); b += size_t(bytes)) blocks[b] = 0, blocks[b + 1] = uint8_t(0x1c + gen() % 3);
    auto weight = [&](int64_t j, int64_t k) {  // the dequantised weight, its block's float16 scale
      const uint8_t* blk = &blocks[size_t((j * nb + k / 32) * bytes)];
      const double d = (1 + 0.25 * (blk[1] - 0x1c)) / 256;  // float16 0x1c00, 0x1d00, 0x1e00: 1, 1.25, 1.5 x 2^-8
      const int64_t i = k % 32;
      if (type == "q8_0") return double(int8_t(blk[2 + i])) * d;
      return double(i < 16 ? (blk[2 + i] & 15) - 8 : (blk[2 + i - 16] >> 4) - 8) * d;
    };
    Tensor w = Tensor::from_vector(blocks, {n, nb, bytes}).realize();
    for (int64_t m : {40, 33}) {
      CAPTURE(m);
      Tensor x = randn({m, K}, 42);
      x.realize();
      size_t before = kernels_run();
      Tensor y = x.matmul(nn::ggml_dequantize(w, type).reshape({n, K}).T());
      UOpRef root = y.uop();
      Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
      std::vector<int64_t> reduce_out;  // the reduce kernels' first output axes: the slices' products, their sum
      for (auto& it : s.items) {
        bool red = false;
        for (const UOp* u : toposort(it.ast.get())) red |= u->op == Ops::REDUCE;
        for (const UOp* r : kernel_axes(it.ast))
          if (red && range_type(r) != AxisType::Reduce) {
            reduce_out.push_back(r->src(0)->const_int());
            break;
          }
      }
      CHECK(reduce_out.size() == 2);
      if (!reduce_out.empty()) CHECK(reduce_out[0] == 2);  // the slices outermost
      std::vector<float> got = y.to_vector<float>();
      CHECK(kernels_run() - before == 3);  // dequantise into the panels, the 2 slices' products, their sum
      std::vector<float> xs = x.to_vector<float>(), want(size_t(m * n));
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          double acc = 0;
          for (int64_t k = 0; k < K; k++) acc += double(xs[size_t(i * K + k)]) * weight(j, k);
          want[size_t(i * n + j)] = float(acc);
        }
      check_close(got, want, float(K) * 1.2e-7f);  // K float32 products summed: K eps of the unit-scale terms
    }
  }
}

TEST_CASE("the panelled matmul is a scheduler rule: the README's broadcast-and-sum product and a gradient's product get it") {
  // pm_layout matches the reduce of a product of two broadcasts, however it was written (issue 16: this form got
  // the plain kernel while a.matmul(b) was packed by a branch of Tensor::matmul)
  const int64_t N = 1024;  // B of 4 MiB
  Tensor a = randn({N, N}, 11), b = randn({N, N}, 12);
  a.realize(), b.realize();
  size_t before = kernels_run();
  Tensor c = Tensor(a.reshape({N, 1, N}) * b.T().reshape({1, N, N})).sum(2);
  c.realize();
  CHECK(kernels_run() - before == 3);  // pack B, the product in panels, back to row-major
  std::vector<float> plain;
  {
    ScopedEnv off("PACKED_MATMUL", "0");  // a knob of the scheduler: part of its cache key
    size_t b0 = kernels_run();
    plain = Tensor(Tensor(a.reshape({N, 1, N}) * b.T().reshape({1, N, N})).sum(2)).to_vector<float>();
    CHECK(kernels_run() - b0 == 1);
  }
  CHECK(c.to_vector<float>() == plain);  // the sum over k in the same order
  CHECK(a.matmul(b).to_vector<float>() == plain);
  // d/dA of sum(A @ B * G) is G @ B^T: a reduce over the product's middle axis, packed as well
  Tensor g = randn({N, N}, 13);
  Tensor x = a.detach();
  x.requires_grad_();
  Tensor(x.matmul(b) * g).sum().backward();
  size_t b2 = kernels_run();
  Tensor ga = x.grad().contiguous();
  ga.realize();
  CHECK(kernels_run() - b2 >= 3);
  std::vector<float> want;
  {
    ScopedEnv off("PACKED_MATMUL", "0");
    want = g.matmul(b.T()).to_vector<float>();
  }
  check_close(ga.to_vector<float>(), want, N * 1.2e-7f);
}

TEST_CASE("a convolution's layout is a scheduler rule: channels-last on the CPU, one input copy for forward and weight gradient") {
  // Tensor::conv writes every convolution as window view * weight, summed; pm_layout stores a many-channel input
  // channels-last on the CPU (CHANNELS_LAST=0: NCHW with the padded input materialised, as on a GPU). The weight
  // gradient autograd builds reads the same view of the input, so the two share its copy (issue 16)
  Tensor x = randn({2, 16, 9, 9}, 21), w = randn({8, 16, 3, 3}, 22), g = randn({2, 8, 9, 9}, 23);
  x.realize(), w.realize(), g.realize();
  auto conv_and_grad = [&] {
    Tensor y = x.conv2d(w, std::nullopt, 1, 1);
    Tensor gw = Tensor(y * g).sum().gradient({w})[0];
    size_t k0 = kernels_run();
    std::vector<Tensor*> both{&y, &gw};
    Tensor::realize_all(both);
    return std::tuple{kernels_run() - k0, y.to_vector<float>(), gw.to_vector<float>()};
  };
  auto [kl, yl, gl] = conv_and_grad();
  size_t kn;
  std::vector<float> yn, gn;
  {
    ScopedEnv off("CHANNELS_LAST", "0");  // a knob of the scheduler: part of its cache key
    std::tie(kn, yn, gn) = conv_and_grad();
  }
  // NCHW: the padded input, the convolution, the weight gradient
  CHECK(kn == 3);
  // channels-last: the padded input and the weight copied once each, the convolution, the result back in NCHW, the
  // gradient's copy, the weight gradient (8 before these rules: the input was copied twice)
  if (get_device(default_device()).renderer().grid_limits().threads == 0) CHECK(kl == 6);
  check_close(yl, yn, 1e-5f);
  check_close(gl, gn, 1e-5f);
  // torch's values for a few taps: y[0, 0, 4, 4] = sum over c, a, b of x[0, c, 3 + a, 3 + b] w[0, c, a, b]
  auto xv = x.to_vector<float>(), wv = w.to_vector<float>();
  double s = 0;
  for (int c = 0; c < 16; c++)
    for (int a = 0; a < 3; a++)
      for (int b = 0; b < 3; b++) s += double(xv[size_t((c * 9 + 3 + a) * 9 + 3 + b)]) * double(wv[size_t((c * 3 + a) * 3 + b)]);
  CHECK(std::abs(yl[size_t(4 * 9 + 4)] - s) <= 1e-5 * (1 + std::abs(s)));
}

TEST_CASE("under NoGrad a convolution gets the layout stage's rules too: its DETACH nodes are gradient markers") {
  // NoGrad wraps each new tensor's node in a DETACH; the scheduler drops them with the other gradient markers, so
  // an inference's conv2d is channels-last on the CPU as a training step's forward (it was NCHW: mnist-sized 5x5
  // convolution 12.1 ms against 9.3 on Zen 5)
  Tensor x = randn({2, 16, 9, 9}, 24), w = randn({8, 16, 3, 3}, 25);
  x.realize(), w.realize();
  w.requires_grad_();
  auto conv = [&](bool no_grad) {
    std::optional<NoGrad> ng;
    if (no_grad) ng.emplace();
    Tensor y = x.conv2d(w, std::nullopt, 1, 1);
    size_t k0 = kernels_run();
    y.realize();
    return std::pair{kernels_run() - k0, y.to_vector<float>()};
  };
  auto [k_plain, y_plain] = conv(false);
  auto [k_no_grad, y_no_grad] = conv(true);
  size_t k_nchw;
  {
    ScopedEnv off("CHANNELS_LAST", "0");
    k_nchw = conv(true).first;
  }
  CHECK(k_no_grad == k_plain);
  if (get_device(default_device()).renderer().grid_limits().threads == 0) CHECK(k_no_grad != k_nchw);
  check_close(y_no_grad, y_plain, 0.0f);
}

TEST_CASE("a convolution's output gradient copied into two layouts is computed channels-last, not NCHW and copied") {
  // The gradient of relu(conv(x)) * g is a computed value (g where the output was positive) that the weight gradient
  // reads channels-last and the input gradient padded and channels-last: the realize map stored it in NCHW, then
  // both copies read it (mnist's E_512_32_20_20, its stores 1600 bytes apart, then E_512_20_20_32). It is computed
  // into the channels-last copy now, which the padded copy reads: one kernel fewer, the same values exactly.
  Tensor x = randn({2, 16, 9, 9}, 24), w = randn({16, 16, 3, 3}, 25), g = randn({2, 16, 9, 9}, 26);
  x.realize(), w.realize(), g.realize();
  auto grads = [&] {
    Tensor loss = Tensor(x.conv2d(w, std::nullopt, 1, 1).relu() * g).sum();
    auto gs = loss.gradient({x, w});
    size_t k0 = kernels_run();
    std::vector<Tensor*> both{&gs[0], &gs[1]};
    Tensor::realize_all(both);
    return std::tuple{kernels_run() - k0, gs[0].to_vector<float>(), gs[1].to_vector<float>()};
  };
  auto [ks, gxs, gws] = grads();
  size_t kn;
  std::vector<float> gxn, gwn;
  {
    ScopedEnv off("SHARE_LAYOUTS", "0");  // a knob of the scheduler: part of its cache key
    std::tie(kn, gxn, gwn) = grads();
  }
  if (get_device(default_device()).renderer().grid_limits().threads == 0) CHECK(ks + 1 == kn);
  CHECK(gxs == gxn);
  CHECK(gws == gwn);
}

TEST_CASE("a value computed from a channels-last convolution is stored channels-last too: its pool's stores run along the channels") {
  // relu(conv) is stored channels-last by the layout rules; the max pool over it, read twice (its mean and the
  // difference), is materialised. It took the NCHW order, so the pool's kernel loaded vectors along the channels
  // and stored them 9 elements apart, and the readers gathered it (mnist's pools and batch norms at 7-17 GB/s).
  // It follows the layout of what it is computed from now (FOLLOW_LAYOUTS=0: NCHW); the same values exactly.
  Tensor x = randn({2, 16, 6, 6}, 27), w = randn({16, 16, 3, 3}, 28);
  x.realize(), w.realize();
  auto out = [&] {
    Tensor p = x.conv2d(w, std::nullopt, 1, 1).relu().max_pool2d(2);
    return p - p.mean({0, 2, 3}, true);
  };
  // the store's step along the 16 channels in the max pool's kernel
  auto pool_store_step = [&] {
    UOpRef root = out().uop();
    Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
    for (auto& it : s.items) {
      bool max = false;
      const UOp* st = nullptr;
      for (const UOp* u : toposort(it.ast.get())) {
        max |= u->op == Ops::REDUCE && Ops(std::get<int64_t>(u->arg)) == Ops::MAX;
        if (u->op == Ops::STORE && u->src(0)->op == Ops::INDEX) st = u->src(0)->src(1);
      }
      if (!max || !st) continue;
      for (const UOp* r : kernel_axes(it.ast))
        if (r->src(0)->const_int() == 16) return index_coef(st, r).value_or(-1);
    }
    FAIL("no max pool kernel");
    return int64_t(0);
  };
  std::vector<float> yl = out().to_vector<float>(), yn;
  int64_t nchw = 0;
  {
    ScopedEnv off("FOLLOW_LAYOUTS", "0");  // a knob of the scheduler: part of its cache key
    yn = out().to_vector<float>();
    nchw = pool_store_step();
  }
  CHECK(nchw == 9);
  if (get_device(default_device()).renderer().grid_limits().threads == 0) CHECK(pool_store_step() == 1);
  CHECK(yl == yn);
}

// The strides along the axes of the given sizes of the stores of y's schedule's kernels, one list a kernel (in
// schedule order; an axis the kernel does not have, or a store not linear in it: -1).
std::vector<std::vector<int64_t>> store_strides(const Tensor& y, const std::vector<int64_t>& sizes) {
  UOpRef root = y.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  std::vector<std::vector<int64_t>> out;
  for (auto& it : s.items) {
    const UOp* st = nullptr;
    for (const UOp* u : toposort(it.ast.get()))
      if (u->op == Ops::STORE && u->src(0)->op == Ops::INDEX) st = u->src(0)->src(1);
    if (!st) continue;
    std::vector<int64_t> k;
    for (int64_t n : sizes) {
      int64_t c = -1;
      for (const UOp* r : kernel_axes(it.ast))
        if (r->src(0)->const_int() == n && c < 0) c = index_coef(st, r).value_or(-1);
      k.push_back(c);
    }
    out.push_back(k);
  }
  return out;
}

TEST_CASE("a value read across planes 64 KiB apart is stored a cache line further apart a plane; read along, row-major") {
  // u's 8 planes are 128 x 128 floats, 64 KiB: row-major, all of them fall in the same cache sets, and a sum over
  // the 8 (its innermost loop walks across the planes) evicts its own lines (the Winograd input gradient read its
  // 64 planes 576 KiB apart at 19 GFLOPS). Stored 16 floats further apart a plane (PAD_PLANES=0: not) it gives the
  // same values; a sum over the rows reads each plane along itself and keeps u row-major.
  Tensor x = randn({8, 128, 128}, 41);
  x.realize();
  auto u = [&] { return (x * 2.0f + 1.0f).contiguous(); };
  const bool serial = get_device(default_device()).renderer().grid_limits().threads == 0;
  auto across = [&] {
    Tensor v = u();
    return v.sum(0) * v.max(0);
  };
  std::vector<float> padded = across().to_vector<float>(), plain;
  // u's kernel stores its 8 planes 16384 + 16 floats apart (the reader sums over them: its store has no stride
  // along the 8)
  auto ks = store_strides(across(), {8, 128});
  REQUIRE(ks.size() == 2);
  CHECK(ks[0] == std::vector<int64_t>{serial ? 16384 + 16 : 16384, 128});
  CHECK(ks[1] == std::vector<int64_t>{0, 128});
  {
    ScopedEnv off("PAD_PLANES", "0");  // a knob of the scheduler: part of its cache key
    plain = across().to_vector<float>();
    CHECK(store_strides(across(), {8, 128})[0] == std::vector<int64_t>{16384, 128});
  }
  CHECK(padded == plain);
  std::vector<float> xv = x.to_vector<float>();
  for (size_t i = 0; i < 128 * 128; i++) {
    float s = 0, m = -INFINITY;
    for (size_t p = 0; p < 8; p++) s += xv[p * 128 * 128 + i] * 2.0f + 1.0f, m = std::max(m, xv[p * 128 * 128 + i] * 2.0f + 1.0f);
    REQUIRE(padded[i] == doctest::Approx(s * m).epsilon(1e-5));
  }
  // read along its planes (a sum over each plane's rows, and its columns): row-major
  auto along = [&] {
    Tensor v = u();
    return v.sum(1) + v.sum(2);
  };
  CHECK(store_strides(along(), {8, 128})[0] == std::vector<int64_t>{16384, 128});
}

// Whether some kernel of y's schedule stores with stride `coef` along one of its axes
bool stores_with_stride(const Tensor& y, int64_t coef) {
  UOpRef root = y.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  for (auto& it : s.items)
    for (const UOp* u : toposort(it.ast.get()))
      if (u->op == Ops::STORE && u->src(0)->op == Ops::INDEX)
        for (const UOp* r : kernel_axes(it.ast))
          if (index_coef(u->src(0)->src(1), r).value_or(0) == coef) return true;
  return false;
}

TEST_CASE("a value read through a reshape that interleaves its planes is stored with padded planes") {
  // u's 16 planes are 128 x 128 floats (64 KiB). Its reader interleaves them into 512 x 512, element (4r + i, 4c + j)
  // from plane (i, j), as Winograd's output (m, m, Cout, N, ty, tx) becomes the image: the reshape merges axes that
  // are not contiguous in u, and along each output row the reader walks 4 planes inside every column. u is stored
  // 16 floats further apart a plane (PAD_PLANES=0: row-major), to the same values.
  Tensor x = randn({4, 4, 128, 128}, 46);
  x.realize();
  auto inter = [&] { return (x * 2.0f + 1.0f).contiguous().permute({2, 0, 3, 1}).reshape({512, 512}) + 1.0f; };
  const bool serial = get_device(default_device()).renderer().grid_limits().threads == 0;
  std::vector<float> padded = inter().to_vector<float>(), plain;
  CHECK(stores_with_stride(inter(), 16384 + 16) == serial);
  {
    ScopedEnv off("PAD_PLANES", "0");
    plain = inter().to_vector<float>();
    CHECK_FALSE(stores_with_stride(inter(), 16384 + 16));
  }
  CHECK(padded == plain);
  std::vector<float> xv = x.to_vector<float>();
  for (size_t r : {0, 37, 127})
    for (size_t c : {0, 5, 127})
      for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < 4; j++)
          REQUIRE(padded[(4 * r + i) * 512 + 4 * c + j] == xv[((i * 4 + j) * 128 + r) * 128 + c] * 2.0f + 1.0f + 1.0f);
}

TEST_CASE("WINO=1: the input gradient's Winograd domain is stored with padded planes, to the direct conv's values") {
  // 64 images of 8 channels, 28 x 28, 5 x 5: the domain is (8, 8, 8 channels, 64 x 36 tiles), planes of 8 x 2304
  // floats (72 KiB) that the input gradient's transform reads across (B d B^T's adjoint, 64 planes an output tile)
  Tensor x = randn({64, 8, 28, 28}, 43), w = randn({8, 8, 5, 5}, 44), seed = randn({64, 8, 24, 24}, 45);
  Tensor::realize_all({&x, &w, &seed});
  auto dx = [&] { return x.conv2d(w).gradient({x}, &seed)[0]; };
  std::vector<float> direct, wino;
  {
    ScopedEnv e("WINO", "0");
    direct = dx().to_vector<float>();
  }
  ScopedEnv e("WINO", "1");
  wino = dx().to_vector<float>();
  // some kernel stores the domain's (8, 8) planes 8 x 2304 + 16 floats apart
  if (get_device(default_device()).renderer().grid_limits().threads == 0) CHECK(stores_with_stride(dx(), 8 * 2304 + 16));
  float scale = 0;
  for (float v : direct) scale = std::max(scale, std::fabs(v));
  REQUIRE(direct.size() == wino.size());
  for (size_t i = 0; i < direct.size(); i++) REQUIRE(std::fabs(direct[i] - wino[i]) <= 1e-5f * scale);
}

TEST_CASE("a depthwise convolution is channels-last on the CPU: vectors along the channels, NCHW's values") {
  // groups = input channels (one per group), 2 output channels per group: pm_layout sums it in (N, *o, *k, G, Co/G)
  // order from channels-last copies, so the kernel's innermost output axis is the 16 channels, which its store is
  // contiguous in (in NCHW it is the output row). The values are NCHW's and the direct sum's.
  const int64_t G = 8, H = 7, W = 9;
  Tensor x = randn({1, G, H, W}, 31), w = randn({2 * G, 1, 3, 3}, 32);
  x.realize(), w.realize();
  auto conv = [&] { return x.conv2d(w, std::nullopt, 1, 1, 1, G); };
  std::vector<float> yl = conv().to_vector<float>(), yn;
  std::pair<int64_t, int64_t> nchw;
  {
    ScopedEnv off("CHANNELS_LAST", "0");
    yn = conv().to_vector<float>();
    nchw = reduce_kernel_axis(conv());
  }
  CHECK(nchw == std::pair<int64_t, int64_t>{W, 1});  // NCHW: along the output row
  if (get_device(default_device()).renderer().grid_limits().threads == 0)
    CHECK(reduce_kernel_axis(conv()) == std::pair<int64_t, int64_t>{2 * G, 1});  // channels-last: along the channels
  check_close(yl, yn, 1e-6f);
  auto xv = x.to_vector<float>(), wv = w.to_vector<float>();
  for (int64_t co : {0, 5, 15})
    for (auto [h, ww] : {std::pair<int64_t, int64_t>{0, 0}, {3, 4}, {6, 8}}) {
      double s = 0;
      for (int64_t a = 0; a < 3; a++)
        for (int64_t b = 0; b < 3; b++) {
          int64_t ih = h + a - 1, iw = ww + b - 1;
          if (ih >= 0 && ih < H && iw >= 0 && iw < W)
            s += double(xv[size_t(((co / 2) * H + ih) * W + iw)]) * double(wv[size_t(co * 9 + a * 3 + b)]);
        }
      CHECK(std::abs(yl[size_t((co * H + h) * W + ww)] - s) <= 1e-5 * (1 + std::abs(s)));
    }
}

TEST_CASE("a stem convolution with 3 input and 8 output channels is channels-last on the CPU: vectors along the channels") {
  // PaddleOCR cls's stem (3x3, stride 2, 3 -> 8 channels): in NCHW its vectors ran along the output row, whose
  // stride-2 window loads gather (r_8_24_96, 79 us of cls's ~800); channels-last it is a matmul over 27 taps with the
  // 8 output channels as the vector (9.5 us). The values are NCHW's and the direct sum's.
  const int64_t H = 10, W = 14;
  Tensor x = randn({1, 3, H, W}, 41), w = randn({8, 3, 3, 3}, 42);
  x.realize(), w.realize();
  auto conv = [&] { return x.conv2d(w, std::nullopt, 2, 1); };
  std::vector<float> yl = conv().to_vector<float>(), yn;
  std::pair<int64_t, int64_t> nchw;
  {
    ScopedEnv off("CHANNELS_LAST", "0");
    yn = conv().to_vector<float>();
    nchw = reduce_kernel_axis(conv());
  }
  CHECK(nchw == std::pair<int64_t, int64_t>{W / 2, 1});  // NCHW: along the output row
  if (get_device(default_device()).renderer().grid_limits().threads == 0)
    CHECK(reduce_kernel_axis(conv()) == std::pair<int64_t, int64_t>{8, 1});  // channels-last: along the channels
  check_close(yl, yn, 1e-6f);
  auto xv = x.to_vector<float>(), wv = w.to_vector<float>();
  for (int64_t co : {0, 3, 7})
    for (auto [h, ww] : {std::pair<int64_t, int64_t>{0, 0}, {2, 3}, {4, 6}}) {
      double s = 0;
      for (int64_t c = 0; c < 3; c++)
        for (int64_t a = 0; a < 3; a++)
          for (int64_t b = 0; b < 3; b++) {
            int64_t ih = 2 * h + a - 1, iw = 2 * ww + b - 1;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W)
              s += double(xv[size_t((c * H + ih) * W + iw)]) * double(wv[size_t(((co * 3 + c) * 3 + a) * 3 + b)]);
          }
      CHECK(std::abs(yl[size_t((co * (H / 2) + h) * (W / 2) + ww)] - s) <= 1e-5 * (1 + std::abs(s)));
    }
}

TEST_CASE("on the CPU a lone UNROLL stays a Lane loop that LLVM is told to vectorise, with the same sums") {
  Tensor c = randn({12, 64}, 7);
  c.realize();
  Kern rs = last_kernel(c.sum(1));
  std::vector<Opt> opts{{OptOp::UNROLL, 1, 16}};
  LowerOptions lo;
  lo.opts = &opts;
  CompiledKernel ck = lower_kernel(rs.ast, "lane_k", get_device("CPU").renderer(), lo);
  CHECK(ck.src.find("llvm.loop.vectorize.enable") != std::string::npos);
  // also when the REDUCE itself is copied by an UPCAST (x @ W^T: both operands contiguous along the reduce axis)
  std::vector<Opt> tiled{{OptOp::UPCAST, 0, 4}, {OptOp::UNROLL, 1, 16}};
  lo.opts = &tiled;
  CHECK(lower_kernel(rs.ast, "lane_k2", get_device("CPU").renderer(), lo).src.find("llvm.loop.vectorize.enable") !=
        std::string::npos);
  check_close(run_with(rs, tiled), run_with(rs, {}), 1e-5f);
  // The lanes hold the same partial sums the copies would, combined in the same tree: bit-identical.
  std::vector<float> v = c.to_vector<float>(), got = run_with(rs, opts);
  for (int r = 0; r < 12; r++) {
    std::vector<float> part(16, 0.0f);
    for (int k = 0; k < 64; k++) part[size_t(k % 16)] += v[size_t(r * 64 + k)];
    for (size_t w = 16; w > 1; w /= 2)  // halving: lane i with lane i + w/2
      for (size_t i = 0; i < w / 2; i++) part[i] = part[i] + part[i + w / 2];
    CHECK(got[size_t(r)] == part[0]);
  }
}

TEST_CASE("an elementwise kernel of short gated rows takes copies of its outermost ungated axis up to the machine's width") {
  // Rows of 4 floats padded along the axis above them (Winograd's sum of shifted tile gradients stores vectors of 4
  // under 4 gated loads): one short vector a loop trip is mostly branches and loop work, so the batch axis, which
  // no gate depends on, gives copies: 4 on a machine of 16 lanes, 2 on one of 8; the padded axis gives none.
  Tensor x = randn({64, 8, 4}, 31);
  x.realize();
  Kern k = last_kernel(Tensor(x.pad({{0, 0}, {1, 1}, {0, 0}}) * 2.0f));
  auto o16 = hand_coded_optimizations(k.ast, OptConfig{1, 16}), o8 = hand_coded_optimizations(k.ast, OptConfig{1, 8});
  REQUIRE(o16.size() >= 2);
  REQUIRE(o8.size() >= 2);
  CHECK(o16[0] == Opt{OptOp::UPCAST, 2, 4});
  CHECK(o16[1] == Opt{OptOp::UPCAST, 0, 4});
  CHECK(o8[0] == Opt{OptOp::UPCAST, 2, 4});
  CHECK(o8[1] == Opt{OptOp::UPCAST, 0, 2});
  // padded along both outer axes: every axis but the row's is gated, so no copies
  Kern both = last_kernel(Tensor(x.pad({{1, 1}, {1, 1}, {0, 0}}) * 2.0f));
  auto ob = hand_coded_optimizations(both.ast, OptConfig{1, 16});
  REQUIRE(!ob.empty());
  CHECK(ob[0] == Opt{OptOp::UPCAST, 2, 4});
  for (const Opt& o : ob) CHECK(!(o.op == OptOp::UPCAST && o.axis != 2));
  std::vector<float> xv = x.to_vector<float>(), got = run_with(k, o16, 1);
  REQUIRE(got.size() == size_t(64 * 10 * 4));
  for (int64_t n = 0; n < 64; n++)
    for (int64_t r = 0; r < 10; r++)
      for (int64_t b = 0; b < 4; b++)
        CHECK(got[size_t((n * 10 + r) * 4 + b)] == (r >= 1 && r < 9 ? xv[size_t((n * 8 + r - 1) * 4 + b)] * 2.0f : 0.0f));
}

TEST_CASE("on the CPU a padded 24-channel row is vector loads under the pixel's gate, not 24 copies with a branch per load") {
  // A channels-last batch norm + ReLU written into the next depthwise convolution's padding (PaddleOCR cls's
  // E_14_98_24): the per-channel loads are gated by the padding's bounds, which depend on the pixel only. As 24
  // copies each gated load was a branch of its own and the row ran scalar (77 us); the copies are now vectors of
  // 16 and 8 lanes, each gated load one vector LOAD under the pixel's gate (one branch per vector).
  Tensor x = randn({12, 96, 24}, 11), sc = randn({24}, 12), sh = randn({24}, 13);
  x.realize(), sc.realize(), sh.realize();
  Kern k = last_kernel(Tensor(x * sc + sh).relu().pad({{1, 1}, {1, 1}, {0, 0}}));
  auto opts = hand_coded_optimizations(k.ast, OptConfig{1, 16});
  REQUIRE(!opts.empty());
  CHECK(opts[0] == Opt{OptOp::UPCAST, 2, 24});
  LowerOptions lo;
  lo.opts = &opts;
  lo.config = OptConfig{1, 16};
  CompiledKernel ck = lower_kernel(k.ast, "lane_pad", get_device("CPU").renderer(), lo);
  CHECK(ck.src.find("load <16 x float>") != std::string::npos);
  CHECK(ck.src.find("load <8 x float>") != std::string::npos);
  CHECK(ck.src.find("llvm.loop.vectorize") == std::string::npos);  // no Lane loop left to LLVM's vectoriser
  size_t branches = 0;
  for (size_t at = ck.src.find(".load,"); at != std::string::npos; at = ck.src.find(".load,", at + 1)) branches++;
  CHECK(branches <= 6);  // one per vector of each gated load (x, scale, shift), not 3 x 24
  // exact: the same float ops per element as the plain loops
  CHECK(run_with(k, opts, 1) == run_with(k, {}, 1));
  std::vector<float> xv = x.to_vector<float>(), sv = sc.to_vector<float>(), hv = sh.to_vector<float>(), got = run_with(k, opts, 1);
  REQUIRE(got.size() == size_t(14 * 98 * 24));
  for (int64_t y = 0; y < 14; y++)
    for (int64_t xx = 0; xx < 98; xx++)
      for (int64_t c = 0; c < 24; c++) {
        bool in = y >= 1 && y <= 12 && xx >= 1 && xx <= 96;
        float want = in ? std::max(0.0f, xv[size_t(((y - 1) * 96 + xx - 1) * 24 + c)] * sv[size_t(c)] + hv[size_t(c)]) : 0.0f;
        CHECK(got[size_t((y * 98 + xx) * 24 + c)] == want);
      }
}

TEST_CASE("heuristic: a max pool keeps two accumulators an output, and a tile of rows does not share loads hoisted out of every loop") {
  // mnist's batchnorm, relu and max pool in one kernel over channels-last (512, 20, 20, 32): the 32 channels' scale
  // and shift are read once per kernel (hoisted out of every loop), and a float MAX is two accumulators (the maximum
  // and its NaN carrier). The tile was 8 batch rows x 32 channels, ranked as sharing the channel values between the
  // rows, and its 2 x 8 x 2 accumulator registers with the 10 hoisted vectors spilled: 13 GB/s, 3 ms a pass on Zen 5.
  Tensor xl = randn({16, 20, 20, 32}, 91).realize();
  Tensor sc = randn({1, 32, 1, 1}, 92).realize(), sh = randn({1, 32, 1, 1}, 93).realize();
  // stored channels-last, as mnist's pool follows its convolution's layout
  Tensor y = (xl.permute({0, 3, 1, 2}) * sc + sh).relu().max_pool2d(2).permute({0, 2, 3, 1});
  Kern k = last_kernel(y);
  int maxes = 0;
  for (const UOp* u : toposort(k.ast.get())) maxes += u->op == Ops::REDUCE && Ops(std::get<int64_t>(u->arg)) == Ops::MAX;
  REQUIRE(maxes == 1);
  OptConfig avx512{1, 16}, avx2 = avx2_config();
  const std::vector<float> plain = run_with(k, {}, 1);
  for (const OptConfig& cfg : {avx512, avx2}) {
    INFO("vector width " << cfg.vector_width);
    LowerOptions lo;
    lo.config = cfg;
    CompiledKernel ck = lower_kernel(k.ast, "pool_acc" + std::to_string(cfg.vector_width), get_device("CPU").renderer(), lo);
    const std::vector<Opt>& opts = ck.opts;
    int64_t floats = 1;  // the tile's floats an accumulator
    for (const Opt& o : opts)
      if (o.op == OptOp::UPCAST || o.op == OptOp::UNROLL) floats *= o.amt;
    std::string os;
    for (const Opt& o : opts) os += to_string(o) + " ";
    INFO(os << floats << " floats");
    CHECK(floats == 32);  // the channels' vectors, no rows
    CHECK(2 * floats / cfg.vector_width <= cfg.vector_registers / 2);
    CHECK(run_compiled(k, ck) == plain);
  }
}

TEST_CASE("heuristic: a row reduction reading a per-row value is not upcast along the rows (no gathers)") {
  // sum((x - mean)^2) over rows: the output axis strides x by the row length; only the mean is contiguous in it.
  Tensor x = randn({64, 256}, 4);
  x.realize();
  Tensor mean = x.mean(1, true);
  mean.realize();
  Kern k = last_kernel(Tensor(x - mean).square().sum(1));
  auto opts = hand_coded_optimizations(k.ast, OptConfig{2, 16});
  REQUIRE(!opts.empty());
  CHECK(opts[0] == Opt{OptOp::UNROLL, 1, 32});  // vector accumulators along the row instead (two vectors: two chains)
  for (const Opt& o : opts) CHECK(o.op != OptOp::UPCAST);
}

TEST_CASE("heuristic: a memory-bound reduce vectorises the axis its big load is contiguous in, though a small one gathers") {
  // A batchnorm's backward sums over a max pool (mnist's r_256_32): per chunk of the batch and channel, the sum of
  // (x - mean) times the pooled gradient upsampled 2x2. x is channels-last (contiguous along the stored channel), the
  // pooled gradient NCHW (a quarter of the bytes, 16 floats apart along the channel). The channels take vectors
  // (the small load's lanes are gathered), and no register tile over the chunks: the mean, the only load the chunks
  // share, is read outside the reduce loop. Before: no vector (the gather), 8 chunks as 8 scalar streams.
  Tensor x = randn({16, 8, 8, 32}, 71).realize();  // (N, H, W, C)
  Tensor g = randn({16, 32, 4, 4}, 72).realize();  // (N, C, H/2, W/2)
  Tensor mean = randn({32}, 73).realize();
  Tensor up = g.reshape({16, 32, 4, 1, 4, 1}).expand({16, 32, 4, 2, 4, 2}).reshape({16, 32, 8, 8});
  Tensor xc = x.permute({0, 3, 1, 2}) - mean.reshape({1, 32, 1, 1});
  Kern k = last_kernel(Tensor(xc * up).reshape({8, 2, 32, 8, 8}).sum({1, 3, 4}));
  for (int w : {16, 8}) {
    INFO("vector width " << w);
    auto opts = hand_coded_optimizations(k.ast, OptConfig{2, w});
    REQUIRE(!opts.empty());
    CHECK(opts[0] == Opt{OptOp::UPCAST, 1, w == 16 ? 32 : 8});  // the channels: one row of 32, vectors of 8
    for (const Opt& o : opts) CHECK(!(o.op == OptOp::UPCAST && o.axis == 0));  // no tile over the chunks
    CHECK(run_with(k, opts) == run_with(k, {}));  // the same values, exactly (each sum in the same order)
  }
  // a row reduction whose every load gathers along the output axis still takes none (the test above)
  // Where the tile is latency-bound (AVX2's 16 registers), the one vector of 8 channels is one add chain a tile:
  // the channels' other vectors join it (4 chains over the same contiguous loads), still no tile over the chunks.
  OptConfig avx2 = avx2_config();
  avx2.threads = 2;
  auto opts = hand_coded_optimizations(k.ast, avx2);
  std::string os;
  for (const Opt& o : opts) os += to_string(o) + " ";
  INFO(os);
  REQUIRE(opts.size() >= 2);
  CHECK(opts[0] == Opt{OptOp::UPCAST, 1, 8});
  CHECK(opts[1] == Opt{OptOp::UPCAST, 1, 4});
  for (const Opt& o : opts) CHECK(!(o.op == OptOp::UPCAST && o.axis == 0));
  CHECK(run_with(k, opts) == run_with(k, {}));
}

TEST_CASE("heuristic: where latency-bound, a sum over a channels-last batch takes every channel's vector, not one") {
  // A batch norm's mean over channels-last (N, H, W, 32), as tg splits it: chunks of positions x 32 channels. With
  // AVX2's 16 registers a tile of one vector is one add chain waiting on the adder's latency every trip; the 32
  // channels' 4 vectors are 4 chains over the same contiguous rows. AVX-512's one row of 32 is left alone, as is a
  // config with registers enough for the FMA chains (not latency-bound).
  Tensor x = randn({8, 12, 12, 32}, 74).realize();
  Kern k = last_kernel(x.reshape({4, 288, 32}).sum(1));
  OptConfig avx2 = avx2_config();
  auto tile = [](const Kern& kern, const OptConfig& cfg) {  // the channels' floats a tile holds
    int64_t floats = 1;
    for (const Opt& o : hand_coded_optimizations(kern.ast, cfg))
      if (o.op == OptOp::UPCAST && o.axis == 1) floats *= o.amt;
    return floats;
  };
  CHECK(tile(k, avx2) == 32);
  CHECK(tile(k, OptConfig{1, 16}) == 32);
  CHECK(tile(k, OptConfig{1, 8}) == 8);  // 32 registers: not latency-bound
  CHECK(run_with(k, hand_coded_optimizations(k.ast, avx2)) == run_with(k, {}));
  // 64 channels: 4 of their 8 vectors (the machine model's 16 registers hold them with room for the loads)
  Tensor x64 = randn({4, 8, 8, 64}, 75).realize();
  CHECK(tile(last_kernel(x64.reshape({4, 64, 64}).sum(1)), avx2) == 32);
}

TEST_CASE("heuristic: a matmul whose output axis no vector width divides gets copies of an odd divisor") {
  // PaddleOCR rec's classifier: (40, 120) x (120, 6625); 6625 = 5^3 * 53 took no vector and ran scalar (1 GFLOPS).
  // Here 75 = 3 * 25: copies of 25 along the store axis (a vector of 16, one of 8, a scalar), a register tile of rows.
  Tensor a = randn({8, 24}, 6), b = randn({24, 75}, 7);
  a.realize(), b.realize();
  Kern k = last_kernel(a.matmul(b));
  auto opts = hand_coded_optimizations(k.ast, OptConfig{1, 16});
  REQUIRE(!opts.empty());
  CHECK(opts[0] == Opt{OptOp::UPCAST, 1, 25});
  CHECK(run_with(k, opts) == run_with(k, {}));  // the same values, exactly (the same order of the sum)
  // with AVX2's width of 8 the divisor is the largest in 4..16: 15
  auto opts8 = hand_coded_optimizations(k.ast, OptConfig{1, 8});
  REQUIRE(!opts8.empty());
  CHECK(opts8[0] == Opt{OptOp::UPCAST, 1, 15});
  // the softmax's last (elementwise) kernel: along the classes, where its big load is contiguous, not along the
  // rows, where only the per-row max and sum are (and each row of x would be gathered)
  Tensor x = randn({8, 75}, 8);
  x.realize();
  Tensor m = x.max(1, true), s = x.sum(1, true);
  m.realize(), s.realize();
  Kern e = last_kernel((x - m).exp() * s.reciprocal());
  auto eo = hand_coded_optimizations(e.ast, OptConfig{1, 16});
  REQUIRE(!eo.empty());
  CHECK(eo[0] == Opt{OptOp::UPCAST, 1, 25});
  CHECK(run_with(e, eo) == run_with(e, {}));
}

TEST_CASE("heuristic: an elementwise kernel whose store axis takes no vector is vectorised along its loads' axis") {
  // A channels-last (H, W, C) result read back as (C, H+2, W+2), padded for a next convolution: 34 = 32 + 2 rows take
  // no vector of 16, 8 or 4; the read is contiguous along C (its channels were 32 floats apart along a row).
  Tensor x = randn({32, 32, 32}, 5);  // (H, W, C)
  x.realize();
  Tensor y = (x.permute({2, 0, 1}) * 2.0f + 1.0f).pad({{0, 0}, {1, 1}, {1, 1}});
  Kern k = last_kernel(y);
  auto opts = hand_coded_optimizations(k.ast, OptConfig{1, 16});
  REQUIRE(!opts.empty());
  CHECK(opts[0] == Opt{OptOp::UPCAST, 0, 16});  // vectors of 16 channels
  auto want = run_with(k, {});
  CHECK(run_with(k, opts) == want);  // the same values, exactly
  auto x_host = x.to_vector<float>();
  CHECK(want[size_t((5 * 34 + 3) * 34 + 7)] == x_host[size_t((2 * 32 + 6) * 32 + 5)] * 2.0f + 1.0f);
  CHECK(want[size_t((5 * 34 + 0) * 34 + 7)] == 0.0f);  // the padding
}

TEST_CASE("heuristic: a transpose is a tile of whole-vector loads and stores, its lanes shuffled (no loads at a stride)") {
  // out[i][j] = in[j][i]: the store runs along j, the loads along i. Both axes upcast by the vector width; each block
  // of the input row is loaded once as a vector and the store's lanes are taken from the blocks (a 4096^2 transpose
  // read one float per cache line at a 16 KiB stride before, each line 16 times).
  HostLowering h;
  Tensor a = randn({8 * h.w, 6 * h.w}, 71).realize();
  const std::vector<float> host = a.to_vector<float>();
  for (int scaled = 0; scaled < 2; scaled++) {
    CAPTURE(scaled);
    Tensor y = scaled ? a.T() * 2.0f + 1.0f : a.T().contiguous();
    Kern k = last_kernel(y);
    auto opts = hand_coded_optimizations(k.ast, h.lo.config);
    int upcast_axes = 0;
    for (const Opt& o : opts) upcast_axes += o.op == OptOp::UPCAST && o.amt == h.w;
    CHECK(upcast_axes == 2);
    CompiledKernel ck = lower_kernel(k.ast, "transpose_tile", h.dev.renderer(), h.lo);
    CHECK(occurrences(ck.src, "load " + h.vec) >= 1);
    CHECK(occurrences(ck.src, "load float,") == 0);  // no scalar load of the input
    CHECK(occurrences(ck.src, "store " + h.vec) >= 1);
    // each stored row is a row of the block's transpose: log2(w) two-source shuffles a row, shared by the block's
    // rows, not w - 1 single-lane inserts a row (the LLVM renderer's transpose_lane)
    int log2w = 0;
    while ((int64_t(1) << log2w) < h.w) log2w++;
    CHECK(occurrences(ck.src, "shufflevector " + h.vec) >= size_t(h.w * log2w));
    CHECK(occurrences(ck.src, "insertelement " + h.vec) == 0);
    auto got = run_with(k, ck.opts);
    CHECK(got == run_with(k, {}));  // exactly the plain loops' values
    for (int64_t i = 0; i < 6 * h.w; i++)
      for (int64_t j = 0; j < 8 * h.w; j += 7)
        REQUIRE(got[size_t(i * 8 * h.w + j)] == (scaled ? host[size_t(j * 6 * h.w + i)] * 2.0f + 1.0f : host[size_t(j * 6 * h.w + i)]));
    {  // TRANSPOSE_TILE=0: the store's vectors only
      ScopedEnv off("TRANSPOSE_TILE", "0");
      int n = 0;
      for (const Opt& o : hand_coded_optimizations(k.ast, h.lo.config)) n += o.op == OptOp::UPCAST;
      CHECK(n == 1);
    }
  }
  // rows too short for a vector (3): vectors along the loads only, no tile; the values still exact
  Tensor b = randn({3, 4 * h.w}, 72).realize();
  Kern kb = last_kernel(b.T().contiguous());
  auto ob = hand_coded_optimizations(kb.ast, h.lo.config);
  CHECK(std::count_if(ob.begin(), ob.end(), [](const Opt& o) { return o.op == OptOp::UPCAST; }) == 1);
  std::vector<float> bh = b.to_vector<float>(), bt = run_with(kb, ob);
  CHECK(bt[size_t(5 * 3 + 2)] == bh[size_t(2 * 4 * h.w + 5)]);
  CHECK(bt == run_with(kb, {}));
}

TEST_CASE("heuristic: a transpose whose rows are a multiple of 4 KiB apart reads 4 cache lines a tile row") {
  // out[i][j] = in[j][i] with in's rows 1024 floats (4 KiB) apart: they fall in one L1 set, and a tile row of one
  // vector left the rest of its lines (and the neighbours fetched with them) to be read after the whole column of
  // tiles below, evicted by then (a 4096^2 .T, 9 ms; with rows of 64 floats 4-6). The tile's rows along the loads
  // are 4 lines (64 floats) where the store's axis keeps a loop inside; other strides keep rows of one vector.
  auto load_rows = [](const Kern& k, const OptConfig& cfg) {
    int64_t amt = 0;  // the amount of the second UPCAST: the tile's rows along the loads
    int n = 0;
    for (const Opt& o : hand_coded_optimizations(k.ast, cfg))
      if (o.op == OptOp::UPCAST && n++ == 1) amt = o.amt;
    return amt;
  };
  Tensor a = randn({64, 1024}, 91).realize(), b = randn({64, 1000}, 92).realize(), c = randn({16, 1024}, 93).realize();
  Kern ka = last_kernel(a.T().contiguous()), kb = last_kernel(b.T().contiguous()), kc = last_kernel(c.T().contiguous());
  for (int w : {16, 8}) {
    CAPTURE(w);
    const OptConfig cfg{1, w};
    CHECK(load_rows(ka, cfg) == 64);           // 4 lines of floats, the store's 64 rows in vectors of w
    CHECK(load_rows(kb, cfg) == 8);            // rows 4000 bytes apart: a vector's worth (1000 = 8 x 125)
    CHECK(load_rows(kc, cfg) == w);            // the store's axis (16, up to 2w) taken whole: no loop of tiles below
  }
  HostLowering h;
  const std::vector<float> host = a.to_vector<float>();
  auto got = run_with(ka, hand_coded_optimizations(ka.ast, h.lo.config));
  CHECK(got == run_with(ka, {}));  // exactly the plain loops' values
  for (int64_t i = 0; i < 1024; i += 3)
    for (int64_t j = 0; j < 64; j++) REQUIRE(got[size_t(i * 64 + j)] == host[size_t(j * 1024 + i)]);
}

TEST_CASE("heuristic: a transpose tile that would read more page-apart rows than it writes runs the store's blocks outermost") {
  // NCHW -> NHWC with planes of 1024 floats (4 KiB apart): with the channel blocks innermost, as the axes come, the
  // tile reads all 64 planes at once, each a stream of its own to the prefetcher; with them outermost (SWAPs that
  // rotate the channel-block loop first) 16 planes, while the output (pixels 256 bytes apart) stays one stream.
  // Planes closer than a page, a .T whose output rows are pages apart too, and channel blocks that cannot be whole
  // cache lines keep their order.
  auto swaps = [](const std::vector<Opt>& opts) {
    return std::count_if(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::SWAP; });
  };
  Tensor x = randn({16, 64, 32, 32}, 94).realize(), near = randn({16, 64, 30, 32}, 95).realize();
  Tensor odd = randn({16, 24, 32, 32}, 99).realize();
  Tensor sq = randn({1024, 1024}, 96).realize();
  Kern k = last_kernel(x.permute({0, 2, 3, 1}).contiguous());
  for (int w : {16, 8}) {
    CAPTURE(w);
    OptConfig cfg{2, w};
    cfg.l2_bytes = 1 << 20;  // 8 MiB copied: past the two L2s, so the threads split it
    auto opts = hand_coded_optimizations(k.ast, cfg);
    auto th = std::find_if(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::THREAD; });
    REQUIRE(th != opts.end());
    CHECK(swaps(opts) == 3);  // (n, h, w, c-block) -> (c-block, n, h, w)
    CHECK(th->axis == 0);     // the threads split the channel blocks
    // blocks of whole lines: vectors of 8 channels (32 bytes) take two a block
    CHECK(std::count(opts.begin(), opts.end(), Opt{OptOp::UPCAST, 3, 2}) == (w == 8 ? 1 : 0));
    // 24 channels: blocks of 8 that no whole line divides into (3 of them) keep the axes' order
    CHECK(swaps(hand_coded_optimizations(last_kernel(odd.permute({0, 2, 3, 1}).contiguous()).ast, cfg)) == 0);
    CHECK(swaps(hand_coded_optimizations(last_kernel(near.permute({0, 2, 3, 1}).contiguous()).ast, cfg)) == 0);
    CHECK(swaps(hand_coded_optimizations(last_kernel(sq.T().contiguous()).ast, cfg)) == 0);
  }
  HostLowering h;
  auto got = run_with(k, hand_coded_optimizations(k.ast, h.lo.config));
  CHECK(got == run_with(k, {}));  // exactly the plain loops' values
  const std::vector<float> xs = x.to_vector<float>();
  for (int64_t n = 0; n < 16; n += 3)
    for (int64_t c = 0; c < 64; c += 5)
      for (int64_t p = 0; p < 1024; p += 3) REQUIRE(got[size_t((n * 1024 + p) * 64 + c)] == xs[size_t((n * 64 + c) * 1024 + p)]);
}

TEST_CASE("split ranges: a copy's pixel loops merge where its columns take no vector (10 x 10 -> 100), not 32 x 32") {
  // NCHW -> NHWC: the store runs along the channels, the loads along the columns. Columns of 10 take no vector, so
  // the copy had no transpose tile: scalar gathers 100 floats apart. Merged into one loop of 100 (every access reads
  // h and w as one) it takes a tile of channels x 4 pixels; columns of 32 keep their loops (a merged 56 x 56 in tiles
  // of 16 x 16 was slower).
  auto simplified = [](const Kern& k) { return split_ranges(graph_rewrite(k.ast, symbolic(), nullptr, false, "simplify")); };
  Tensor a = randn({4, 32, 10, 10}, 97).realize(), b = randn({4, 32, 32, 32}, 98).realize();
  Kern ka = last_kernel(a.permute({0, 2, 3, 1}).contiguous()), kb = last_kernel(b.permute({0, 2, 3, 1}).contiguous());
  CHECK(kernel_axes(simplified(ka)).size() == 3);
  CHECK(kernel_axes(simplified(kb)).size() == 4);
  auto opts = hand_coded_optimizations(simplified(ka), OptConfig{1, 16});
  CHECK(std::count_if(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::UPCAST; }) == 2);  // the tile
  std::vector<float> got = run_with(ka, opts), xs = a.to_vector<float>();
  CHECK(got == run_with(ka, {}));
  for (int64_t n = 0; n < 4; n++)
    for (int64_t c = 0; c < 32; c++)
      for (int64_t p = 0; p < 100; p++) REQUIRE(got[size_t((n * 100 + p) * 32 + c)] == xs[size_t((n * 32 + c) * 100 + p)]);
}

TEST_CASE("vectorize: ops over a transposed read run on the loaded rows, one transpose for the store (row_op)") {
  // A relu's gradient read back in NCHW order from channels-last activations (mnist's E_512_32_24_24): the store runs
  // along w, the input, the gradient and the bias along c. The compare and select run on whole rows of c (the
  // bias a row too, not a broadcast per lane) and only their result is transposed into the store's lanes: one
  // block-swap network of w log2(w) shuffles per w x w block, where the input and the gradient were transposed each.
  HostLowering h;
  Tensor x = randn({2, 3, h.w, h.w}, 81).realize(), g = randn({2, 3, h.w, h.w}, 82).realize(), b = randn({h.w}, 83).realize();
  Tensor y = ((x + b) > 0.0f).where(g, 0.0f).permute({0, 3, 1, 2}).contiguous();
  Kern k = last_kernel(y);
  auto opts = hand_coded_optimizations(k.ast, h.lo.config);
  int upcast_axes = 0;
  for (const Opt& o : opts) upcast_axes += o.op == OptOp::UPCAST && o.amt == h.w;
  REQUIRE(upcast_axes == 2);  // the transpose tile
  CompiledKernel ck = lower_kernel(k.ast, "row_op", h.dev.renderer(), h.lo);
  int log2w = 0;
  while ((int64_t(1) << log2w) < h.w) log2w++;
  CHECK(occurrences(ck.src, "shufflevector " + h.vec) == size_t(h.w * log2w));  // one network, no broadcasts
  CHECK(occurrences(ck.src, "fcmp ogt " + h.vec) + occurrences(ck.src, "fcmp olt " + h.vec) == size_t(h.w));  // one compare a row
  auto got = run_with(k, ck.opts);
  CHECK(got == run_with(k, {}));  // exactly the plain loops' values
  const std::vector<float> xs = x.to_vector<float>(), gs = g.to_vector<float>(), bs = b.to_vector<float>();
  const int64_t w = h.w;
  for (int64_t n = 0; n < 2; n++)
    for (int64_t c = 0; c < w; c++)
      for (int64_t r = 0; r < 3; r++)
        for (int64_t q = 0; q < w; q++) {
          const size_t at = size_t(((n * 3 + r) * w + q) * w + c);
          REQUIRE(got[size_t(((n * w + c) * 3 + r) * w + q)] == (xs[at] + bs[size_t(c)] > 0.0f ? gs[at] : 0.0f));
        }
}

TEST_CASE("split ranges: a loop read under divisors that divide each other splits by the largest (q4_0's packing)") {
  // The kernel dequantising a q4_0 weight (n, K) into the panels (n/32, K, 32) reads k as k // 32 (the block and its
  // scale), k % 16 (the byte) and k // 16 % 2 (the nibble): k splits by 32, then the inner loop by 16, so each index
  // is affine and the block's scale is invariant in the loops inside the block's (hoisted out of them by LLVM; the
  // kernel 8.4 -> 6.6 ms at 8192 x 2048, Zen 5, 1 thread). The float GEMM's path (INT_GEMM=0).
  ScopedEnv float_gemm("INT_GEMM", "0");
  std::mt19937 gen{51};
  std::vector<uint8_t> blocks(size_t(2048 * 16 * 18));
  for (auto& b : blocks) b = uint8_t(gen());
  for (size_t b = 0; b < blocks.size(); b += 18) blocks[b] = 0, blocks[b + 1] = 0x1c;
  Tensor w = Tensor::from_vector(blocks, {2048, 16, 18}).realize();
  Tensor x = randn({64, 512}, 52);
  x.realize();
  Tensor y = x.matmul(nn::ggml_dequantize(w, "q4_0").reshape({2048, 512}).T());
  UOpRef root = y.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(s.items.size() == 3);  // dequantise into the panels, the product in panels, back to row-major
  std::vector<int64_t> loops;
  UOpRef pack = split_ranges(simplify(s.items[0].ast));
  for (const UOp* r : kernel_axes(pack))
    if (range_type(r) == AxisType::Loop) loops.push_back(r->src(0)->const_int());
  CHECK(loops == std::vector<int64_t>{64, 16, 2, 16, 32});  // panel, block, nibble, byte, column
  // the values: the split is index arithmetic only
  std::vector<float> got = y.to_vector<float>(), xs = x.to_vector<float>();
  for (int64_t i : {0, 37, 63})
    for (int64_t j : {0, 1000, 2047}) {
      double acc = 0;
      for (int64_t k = 0; k < 512; k++) {
        const uint8_t* blk = &blocks[size_t((j * 16 + k / 32) * 18)];
        const int64_t q = k % 32 < 16 ? blk[2 + k % 16] & 15 : blk[2 + k % 16] >> 4;
        acc += double(xs[size_t(i * 512 + k)]) * double(q - 8) / 256.0;
      }
      CHECK(std::abs(got[size_t(i * 2048 + j)] - acc) <= 512 * 1.2e-7 * (1 + std::abs(acc)));
    }
}

TEST_CASE("heuristic: a 2x2 stride-2 convolution's input gradient gets split loops and vectors along the gradient's rows") {
  // dx[n, c, 2i + a, 2j + b] = sum_o g[n, o, i, j] w[o, c, a, b]: the windows do not overlap, so the kernel stores
  // (n, c, h, w) and reads g at (h // 2, w // 2), w at (h % 2, w % 2). Split ranges turn h and w into (i, a) and
  // (j, b) loops with affine indices; the store is contiguous only along b (2 wide, copies), g along j: vectors of j.
  const int64_t N = 2, C = 8, O = 16, H = 16;
  Tensor x = randn({N, C, H, H}, 41).requires_grad_(), w = randn({O, C, 2, 2}, 42), g = randn({N, O, H / 2, H / 2}, 43);
  x.realize(), w.realize(), g.realize();
  Tensor dx = x.conv2d(w, std::nullopt, 2).gradient({x}, &g)[0];
  Kern k = last_kernel(dx);
  UOpRef split = split_ranges(simplify(k.ast));
  size_t loops = 0;
  for (const UOp* r : kernel_axes(split)) loops += range_type(r) == AxisType::Loop;
  CHECK(loops == 6);  // n, c, i, a, j, b
  auto opts = hand_coded_optimizations(split, OptConfig{1, 16});
  CAPTURE(opts.size());
  // j, all 8 of it, upcast first: the expander makes the first upcast the axis its copies are contiguous in, the
  // vectors' (b first: LLVM packed b's 2 copies into <2 x float> FMAs, 3x slower at N=64, 64 -> 128, 56x56)
  REQUIRE(opts.size() >= 2);
  CHECK(opts[0] == Opt{OptOp::UPCAST, 4, 8});
  CHECK(opts[1] == Opt{OptOp::UPCAST, 5, 2});  // b, whole
  std::vector<float> got = run_with(k, opts), plain = run_with(k, {});
  check_close(got, plain, 1e-6f);
  auto xv = dx.to_vector<float>(), gv = g.to_vector<float>(), wv = w.to_vector<float>();
  for (int64_t n = 0; n < N; n++)
    for (int64_t c : {0, 7})
      for (int64_t h : {0, 5, 15})
        for (int64_t ww : {0, 6, 15}) {
          double s = 0;
          for (int64_t o = 0; o < O; o++)
            s += double(gv[size_t(((n * O + o) * (H / 2) + h / 2) * (H / 2) + ww / 2)]) *
                 double(wv[size_t(((o * C + c) * 2 + h % 2) * 2 + ww % 2)]);
          size_t at = size_t(((n * C + c) * H + h) * H + ww);
          CHECK(std::abs(got[at] - s) <= 1e-5 * (1 + std::abs(s)));
          CHECK(std::abs(xv[at] - s) <= 1e-5 * (1 + std::abs(s)));
        }
}

TEST_CASE("heuristic: a stride-2 input gradient's rows of w/2..2w take the whole row as vectors") {
  // 56x56 input, 28x28 windows: j is 28 wide, one vector of 16 and one of 12 (as a 28-wide store axis in step 1),
  // not 7 vectors of 4 (bench/torch_compare conv_dx: 62 -> 32 ms, loaded)
  const int64_t C = 4, O = 8, H = 56;
  Tensor x = randn({2, C, H, H}, 44).requires_grad_(), w = randn({O, C, 2, 2}, 45), g = randn({2, O, H / 2, H / 2}, 46);
  x.realize(), w.realize(), g.realize();
  Kern k = last_kernel(x.conv2d(w, std::nullopt, 2).gradient({x}, &g)[0]);
  UOpRef split = split_ranges(simplify(k.ast));
  auto opts = hand_coded_optimizations(split, OptConfig{1, 16});
  REQUIRE(opts.size() >= 2);
  CHECK(opts[0] == Opt{OptOp::UPCAST, 4, 28});
  CHECK(opts[1] == Opt{OptOp::UPCAST, 5, 2});
  check_close(run_with(k, opts), run_with(k, {}), 1e-6f);
  // AVX2: 28 is past 2w, but no vector of 8 divides it: whole too, 3 vectors and a half (vectors of 4 before: xmm
  // lanes; TG_CPU=haswell bench/torch_compare conv_dx at N=64, 64 -> 128 channels, alternated: 35.1 / 37.4 -> 24.8 /
  // 28.6 ms on Zen 5)
  auto opts8 = hand_coded_optimizations(split, OptConfig{1, 8});
  REQUIRE(opts8.size() >= 2);
  CHECK(opts8[0] == Opt{OptOp::UPCAST, 4, 28});
  CHECK(opts8[1] == Opt{OptOp::UPCAST, 5, 2});
  check_close(run_with(k, opts8), run_with(k, {}), 1e-6f);
  // rows of 40 (80x80 input): AVX2's vectors of 8 divide them; past 4w for neither width, AVX-512's 16 does not
  // divide them: whole (2 vectors and a half, not 5 of 8)
  Tensor x2 = randn({2, C, 80, 80}, 47).requires_grad_(), g2 = randn({2, O, 40, 40}, 48);
  x2.realize(), g2.realize();
  UOpRef split2 = split_ranges(simplify(last_kernel(x2.conv2d(w, std::nullopt, 2).gradient({x2}, &g2)[0]).ast));
  auto w8 = hand_coded_optimizations(split2, OptConfig{1, 8}), w16 = hand_coded_optimizations(split2, OptConfig{1, 16});
  REQUIRE(!w8.empty());
  REQUIRE(!w16.empty());
  CHECK(w8[0] == Opt{OptOp::UPCAST, 4, 8});
  CHECK(w16[0] == Opt{OptOp::UPCAST, 4, 40});
}

// The kernel of a rand's schedule that makes its floats (the others advance the generator's counter).
Kern rand_floats_kernel(const Tensor& r) {
  UOpRef root = r.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  Kern k;
  for (const ScheduleItem& it : s.items)
    for (const UOp* u : toposort(it.ast.get()))
      if (u->op == Ops::BITCAST) k = Kern{it.ast, it.bufs};
  return k;
}

TEST_CASE("split_ranges: an elementwise kernel's rows are one loop; rand over rows of 28 is vector work") {
  // A rand numbers its elements r * 28 + c: as two loops its 28 copies had lane 0's counter r * 28 against the
  // others' r * 28 + k, not one vector op, and the whole threefry ran in scalars (15 ns an element against 1 for rows
  // of 32). Merged (every access reads the two as one), the copies are lanes of one loop: vector integer ops.
  HostLowering h;
  Tensor::manual_seed(11);
  Tensor r = Tensor::rand({64, 28});
  Kern k = rand_floats_kernel(r);
  REQUIRE(k.ast);
  UOpRef merged = split_ranges(simplify(k.ast));
  std::vector<int64_t> loops;
  for (const UOp* a : kernel_axes(merged))
    if (range_type(a) == AxisType::Loop) loops.push_back(a->src(0)->const_int());
  CHECK(loops == std::vector<int64_t>{64 * 28});
  CompiledKernel ck = lower_kernel(k.ast, "rand_rows", h.dev.renderer(), h.lo);
  // the threefry's 21 xors once (vector ops, or one loop over the lanes that LLVM vectorises), not once per copy
  // (28 x 21 scalar xors before)
  CHECK(occurrences(ck.src, " = xor ") <= 3 * 21);
  // the same numbers as one row of 64 * 28 from the same seed, every one in [0, 1)
  Tensor::manual_seed(11);
  std::vector<float> flat = Tensor::rand({64 * 28}).to_vector<float>(), rows = r.to_vector<float>();
  CHECK(rows == flat);
  CHECK(std::all_of(rows.begin(), rows.end(), [](float v) { return v >= 0 && v < 1; }));
  // a column added keeps two loops: the column's load reads the rows, not the columns
  Tensor col = randn({64, 1}, 12).realize();
  Kern kc = last_kernel(Tensor(r.realize() + col));
  UOpRef two = split_ranges(simplify(kc.ast));
  CHECK(kernel_axes(two).size() == 2);
}

TEST_CASE("a random draw along an axis no vector divides is padded to whole vectors (PADTO), not scalar copies") {
  // 2054 = 2 x 1027 numbers: no vector of 4 or more divides them. Odd copies of the threefry's counter lanes were not
  // one op (each copy folds its constant its own way) and ran as scalar code (rand of 4194300: 9.4 ns an element
  // against 1.2 padded). Padded to whole vectors, the padding's lanes compute and store nothing.
  HostLowering h;
  const int64_t n = 2054;
  auto rand_kernel = [](int64_t m) {
    Tensor t = Tensor::rand({m}, dtypes::float32, "CPU");
    return std::make_pair(t, rand_floats_kernel(t));
  };
  // 1094638 = 2 x 547319 numbers: past the two cores' L2 (1 MiB each here), so two threads split the padded loop
  for (int64_t m : {n, int64_t(1094638)})
    for (int threads : {1, 2})
      for (int w : {8, 16}) {
        CAPTURE(m);
        CAPTURE(threads);
        CAPTURE(w);
        auto [t, km] = rand_kernel(m);
        REQUIRE(km.ast);
        OptConfig cfg{threads, w};
        cfg.l2_bytes = int64_t(1) << 20;
        auto opts = hand_coded_optimizations(split_ranges(simplify(km.ast)), cfg);
        REQUIRE(opts.size() >= 2);
        CHECK(opts[0].op == OptOp::PADTO);
        CHECK(opts[0].amt % w == 0);
        CHECK(opts[1] == Opt{OptOp::UPCAST, 0, w});
        const int64_t loop = (m + opts[0].amt - 1) / opts[0].amt * opts[0].amt / w;
        const bool split = std::any_of(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::THREAD; });
        CHECK(split == (threads == 2 && m > n));
        if (split) CHECK(loop % threads == 0);
      }
  {  // 8216 = 8 x 1027: vectors of half the width, padded to full ones; a full vector of 8 divides it as it is
    auto [t, km] = rand_kernel(8216);
    REQUIRE(km.ast);
    auto o16 = hand_coded_optimizations(split_ranges(simplify(km.ast)), OptConfig{1, 16});
    auto o8 = hand_coded_optimizations(split_ranges(simplify(km.ast)), OptConfig{1, 8});
    CHECK(o16 == std::vector<Opt>{{OptOp::PADTO, 0, 16}, {OptOp::UPCAST, 0, 16}});
    CHECK(o8 == std::vector<Opt>{{OptOp::UPCAST, 0, 8}});
  }
  Tensor::manual_seed(5);
  auto [r, k] = rand_kernel(n);
  REQUIRE(k.ast);
  CompiledKernel ck = lower_kernel(k.ast, "rand_padded", h.dev.renderer(), h.lo);
  CHECK(std::count_if(ck.opts.begin(), ck.opts.end(), [](const Opt& o) { return o.op == OptOp::PADTO; }) == 1);
  CHECK(occurrences(ck.src, " = xor ") <= 3 * 21);  // one lane loop (or vector ops), not 2054 / 2 copies' xors
  // the numbers of a longer draw from the same seed, cut to n (counter-based: element i is threefry(key, i))
  Tensor::manual_seed(5);
  std::vector<float> longer = Tensor::rand({n + 10}, dtypes::float32, "CPU").to_vector<float>(), got = r.to_vector<float>();
  REQUIRE(got.size() == size_t(n));
  CHECK(std::equal(got.begin(), got.end(), longer.begin()));
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v >= 0 && v < 1; }));
  // a dropout reads x along the axis: no padding (its loads' addresses would be clamped), vectors of a power of two
  Tensor x = randn({n}, 3).realize();
  auto dopts = hand_coded_optimizations(split_ranges(simplify(last_kernel(x.dropout(0.5)).ast)), OptConfig{1, 16});
  CHECK(std::none_of(dopts.begin(), dopts.end(), [](const Opt& o) { return o.op == OptOp::PADTO; }));
}

TEST_CASE("split_ranges: a reduce kernel's store rows read as one axis are merged (a 1x1 convolution's input gradient)") {
  // dx[n, c, h, w] = sum_o g[n, o, h, w] w[o, c]: every access reads (h, w) as h * 28 + w, so they become one loop of
  // 784 = 49 vectors of 16 (28 was 16 + 8 + 4 copies; bench/torch_compare conv_dx, THREADS=1: 0.80x -> 0.94x libtorch)
  const int64_t N = 2, C = 8, O = 16, H = 28;
  Tensor x = randn({N, C, H, H}, 47).requires_grad_(), w = randn({O, C, 1, 1}, 48), g = randn({N, O, H, H}, 49);
  x.realize(), w.realize(), g.realize();
  Tensor dx = x.conv2d(w).gradient({x}, &g)[0];
  Kern k = last_kernel(dx);
  UOpRef merged = split_ranges(simplify(k.ast));
  std::vector<int64_t> loops;
  for (const UOp* r : kernel_axes(merged))
    if (range_type(r) == AxisType::Loop) loops.push_back(r->src(0)->const_int());
  CHECK(loops == std::vector<int64_t>{N, C, H * H});
  auto opts = hand_coded_optimizations(merged, OptConfig{1, 16});
  REQUIRE(!opts.empty());
  CHECK(opts[0] == Opt{OptOp::UPCAST, 2, 16});
  std::vector<float> got = run_with(k, opts);
  check_close(got, run_with(k, {}), 1e-6f);
  auto xv = dx.to_vector<float>(), gv = g.to_vector<float>(), wv = w.to_vector<float>();
  for (int64_t n = 0; n < N; n++)
    for (int64_t c : {0, 5})
      for (int64_t p : {0, 27, 28, 500, 783}) {
        double s = 0;
        for (int64_t o = 0; o < O; o++) s += double(gv[size_t((n * O + o) * H * H + p)]) * double(wv[size_t(o * C + c)]);
        size_t at = size_t((n * C + c) * H * H + p);
        CHECK(std::abs(got[at] - s) <= 1e-5 * (1 + std::abs(s)));
        CHECK(std::abs(xv[at] - s) <= 1e-5 * (1 + std::abs(s)));
      }
  // a matmul's rows and columns stay two loops: A depends on the rows only
  Tensor a = randn({24, 40}, 5), b = randn({40, 32}, 6);
  a.realize(), b.realize();
  Kern mm = last_kernel(a.matmul(b));
  CHECK(kernel_axes(split_ranges(simplify(mm.ast))).size() == kernel_axes(simplify(mm.ast)).size());
}

TEST_CASE("every opt list computes what the plain loops compute") {
  // matmul with sizes that divide 16, 8, 4 and 2 differently; a row sum; a full sum; an elementwise kernel.
  // (The elementwise kernel adds a column, so its two axes stay two: split_ranges merges a contiguous one's.)
  Tensor a = randn({24, 40}, 5), b = randn({40, 32}, 6), c = randn({12, 64}, 7), col = randn({12, 1}, 8);
  a.realize(), b.realize(), c.realize(), col.realize();
  Kern mm = last_kernel(a.matmul(b)), rs = last_kernel(c.sum(1)), fs = last_kernel(c.sum()),
       ew = last_kernel(Tensor((c * 2 + col).exp()));
  std::vector<float> mm0 = run_with(mm, {}), rs0 = run_with(rs, {}), fs0 = run_with(fs, {}), ew0 = run_with(ew, {});
  using O = Opt;
  for (auto opts : std::vector<std::vector<Opt>>{
           {O{OptOp::UPCAST, 1, 16}, O{OptOp::UPCAST, 0, 8}, O{OptOp::THREAD, 0, 3}},
           {O{OptOp::UPCAST, 0, 4}, O{OptOp::UNROLL, 2, 8}},
           {O{OptOp::UNROLL, 2, 40}},  // the whole reduce axis unrolled
           {O{OptOp::UNROLL, 2, 40}, O{OptOp::UPCAST, 1, 2}},  // ... with copies of the accumulators
           {O{OptOp::UPCAST, 0, 4}, O{OptOp::UPCAST, 1, 4}, O{OptOp::UNROLL, 2, 40}},
           {O{OptOp::UPCAST, 1, 2}, O{OptOp::UPCAST, 1, 2}, O{OptOp::UNROLL, 2, 5}, O{OptOp::THREAD, 1, 2}},
           {O{OptOp::THREAD, 0, 24}}}) {
    CAPTURE(opts.size());
    check_close(run_with(mm, opts), mm0, 1e-5f);
  }
  check_close(run_with(rs, {O{OptOp::UNROLL, 1, 16}, O{OptOp::THREAD, 0, 2}}), rs0, 1e-5f);
  check_close(run_with(rs, {O{OptOp::UPCAST, 0, 4}, O{OptOp::UNROLL, 1, 4}}), rs0, 1e-5f);
  check_close(run_with(fs, {O{OptOp::UNROLL, 1, 16}, O{OptOp::UNROLL, 0, 3}}), fs0, 1e-5f);
  CHECK(run_with(ew, {O{OptOp::UPCAST, 1, 16}, O{OptOp::THREAD, 0, 4}}) == ew0);  // elementwise: bit-identical
}

TEST_CASE("UNROLL alone gives amt accumulators (the expander reaches a REDUCE no copies depend on)") {
  Tensor c = randn({12, 64}, 7);
  c.realize();
  Kern rs = last_kernel(c.sum(1));
  UOpRef k = graph_rewrite(rs.ast, symbolic(), nullptr, false, "simplify");
  k = expand_upcasts(apply_opt(k, Opt{OptOp::UNROLL, 1, 16}));
  int reduces = 0;
  for (const UOp* u : toposort(k.get())) {
    reduces += u->op == Ops::REDUCE;
    if (u->op == Ops::RANGE) CHECK(range_type(u) != AxisType::Unroll);
  }
  CHECK(reduces == 16);
}

TEST_CASE("threads give bit-identical results (a split never changes the order of a reduction)") {
  Tensor a = randn({32, 256}, 8), b = randn({256, 48}, 9);
  a.realize(), b.realize();
  Kern mm = last_kernel(a.matmul(b));
  std::vector<Opt> one{{OptOp::UPCAST, 1, 16}, {OptOp::UPCAST, 0, 4}};
  std::vector<Opt> two = one, eight = one;
  two.push_back({OptOp::THREAD, 0, 2});
  eight.push_back({OptOp::THREAD, 0, 8});
  std::vector<float> r1 = run_with(mm, one);
  CHECK(run_with(mm, two) == r1);
  CHECK(run_with(mm, eight) == r1);
}

TEST_CASE("the heuristic's kernels match a plain computation through the Tensor API") {
  for (const auto& mkn : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {3, 5, 7}, {16, 16, 16}, {33, 17, 65}, {128, 64, 96}}) {
    const int64_t m = mkn[0], k = mkn[1], n = mkn[2];  // plain locals: clang 14 cannot capture bindings in INFO
    INFO("m=" << m << " k=" << k << " n=" << n);
    Tensor a = randn({m, k}, uint64_t(m)), b = randn({k, n}, uint64_t(n));
    auto av = a.to_vector<float>(), bv = b.to_vector<float>(), cv = a.matmul(b).to_vector<float>();
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t x = 0; x < k; x++) s += double(av[size_t(i * k + x)]) * double(bv[size_t(x * n + j)]);
        REQUIRE(std::abs(s - cv[size_t(i * n + j)]) <= 1e-4 * (1 + std::abs(s)));
      }
  }
}

// GPU opts lowered for CUDA (no device needed; also runs in the sanitizer build). Their values are checked on
// OpenCL and against NVRTC in test_gpu.
TEST_CASE("GPU opts lower to work-group indices, local memory with a barrier, and mma.sync for TC") {
  auto cu = make_cuda_renderer(90);
  Tensor::manual_seed(3);
  Tensor x = Tensor::rand({8, 1024});
  x.realize();
  Kern k = last_kernel(x.sum(int64_t(1)));
  std::vector<Opt> opts{{OptOp::LOCAL, 0, 4}, {OptOp::GROUPTOP, 1, 32}};
  LowerOptions lo;
  lo.opts = &opts;
  CompiledKernel ck = lower_kernel(k.ast, "g", *cu, lo);
  CHECK(ck.src.find("__shared__ float smem0[128];") != std::string::npos);
  CHECK(ck.src.find("__syncthreads();") != std::string::npos);
  CHECK(ck.dims.exact_local);
  CHECK(ck.dims.local[0] * ck.dims.local[1] == 128);
  CHECK(ck.dims.global[0] == 2);
  CHECK(to_string(opts[1]) == "Opt(GROUPTOP, axis=1, amt=32)");
  Tensor a = Tensor::rand({32, 32}).cast(dtypes::float16), b = Tensor::rand({32, 16}).cast(dtypes::float16);
  a.realize();
  b.realize();
  Kern m = last_kernel(a.matmul(b));
  UOpRef simple = graph_rewrite(m.ast, symbolic(), nullptr, false, "simplify");  // as lower_kernel sees it
  CHECK(tc_fits(simple));
  CHECK(tc_axes(simple) == std::optional<std::pair<int, int>>({0, 1}));
  std::vector<Opt> tc{{OptOp::TC, 0, 0}};
  lo.opts = &tc;
  ck = lower_kernel(m.ast, "t", *cu, lo);
  CHECK(ck.src.find("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") != std::string::npos);
  CHECK(ck.dims.local[0] == 32);
  CHECK(ck.dims.global[0] * ck.dims.global[1] == (32 / 16) * (16 / 8));
  CHECK(!tc_fits(graph_rewrite(last_kernel(Tensor(x * 2.0f)).ast, symbolic(), nullptr, false, "simplify")));
}

TEST_CASE("SWAP exchanges two output axes: the same values, the other axis innermost (launch axis 0 on a GPU)") {
  Tensor::manual_seed(4);
  Tensor x = Tensor::rand({6, 40}), col = Tensor::rand({6, 1});  // a column added: two axes, not merged into one
  x.realize(), col.realize();
  Kern k = last_kernel(Tensor(x * 3.0f + col));
  CHECK(run_with(k, {{OptOp::SWAP, 0, 1}}) == run_with(k, {}));
  CHECK(run_with(k, {{OptOp::SWAP, 1, 0}, {OptOp::UPCAST, 0, 4}}) == run_with(k, {}));
  auto cu = make_cuda_renderer(90);
  std::vector<Opt> swap{{OptOp::SWAP, 0, 1}};
  LowerOptions lo;
  lo.opts = &swap;
  CompiledKernel ck = lower_kernel(k.ast, "s", *cu, lo);
  CHECK(ck.dims.global[0] * ck.dims.local[0] == 6);  // the row axis is now innermost
  CHECK(ck.dims.global[1] * ck.dims.local[1] == 40);
  CHECK_THROWS_AS(apply_opt(graph_rewrite(k.ast, symbolic(), nullptr, false, "s"), {OptOp::SWAP, 0, 0}), OptError);
  CHECK_THROWS_AS(apply_opt(graph_rewrite(k.ast, symbolic(), nullptr, false, "s"), {OptOp::SWAP, 0, 2}), OptError);
}

TEST_CASE("a gather reads only the rows it picks: index and gather collapse their one-hot reduce into indexed loads") {
  Tensor X = randn({4096, 256}, 21);  // 4 MiB
  X.realize();
  Tensor idx = Tensor::from_vector<int32_t>({3, 100, 4000, 7, 9, 11, 13, 17}, {8});
  idx.realize();
  std::vector<Tensor> picks{X.index({idx}), X.gather(0, idx.reshape({8, 1}).expand({8, 256}))};
  auto xv = X.to_vector<float>();
  const int32_t rows[8] = {3, 100, 4000, 7, 9, 11, 13, 17};
  for (Tensor& y : picks) {
    Kern k = last_kernel(y);
    CompiledKernel ck = lower_kernel(k.ast, "gather_k", get_device("CPU").renderer(), LowerOptions{});
    // the 8 rows read and written, and the indices: bytes of the rows picked, not of X
    CHECK(ck.mem_bytes > 0);
    CHECK(ck.mem_bytes <= 2 * 8 * 256 * 4 + 8 * 256 * 4);
    auto yv = y.to_vector<float>();
    for (size_t r = 0; r < 8; r++)
      for (size_t j = 0; j < 256; j++) CHECK(yv[r * 256 + j] == xv[size_t(rows[r]) * 256 + j]);
  }
}

TEST_CASE("DEBUG=2's work estimate counts a matmul's multiply-adds as two flops each (its GFLOPS match the benchmark's)") {
  Tensor a = randn({64, 48}, 5), b = randn({48, 96}, 6);
  a.realize(), b.realize();
  Kern k = last_kernel(a.matmul(b));
  for (int w : {16, 8}) {  // register tiles of AVX-512 and AVX2 (every term one MULACC), and no tile at all
    OptConfig cfg{1, w};
    cfg.vector_registers = w == 16 ? 32 : 16;
    cfg.fma_chains = 8;  // an unpadded AVX2 tile (a padded one's estimate counts its recomputed rows)
    for (bool noopt : {false, true}) {
      std::vector<Opt> opts = noopt ? std::vector<Opt>{} : hand_coded_optimizations(k.ast, cfg);
      LowerOptions lo;
      lo.opts = &opts;
      lo.config = cfg;
      CompiledKernel ck = lower_kernel(k.ast, "flops_k", get_device("CPU").renderer(), lo);
      CHECK(ck.flops == 2.0 * 64 * 48 * 96);
    }
  }
}

TEST_CASE("THREAD splits a kernel only where each thread's part outlasts waking a worker (vector operations, not iterations)") {
  auto threads_of = [](const Tensor& t, int n, size_t from_end = 0) {
    UOpRef root = t.uop();
    Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
    REQUIRE(s.items.size() > from_end);
    for (const Opt& o : hand_coded_optimizations(s.items[s.items.size() - 1 - from_end].ast, OptConfig{n, 16}))
      if (o.op == OptOp::THREAD) return o.amt;
    return int64_t(1);
  };
  auto hard_swish = [](const Tensor& x) { return x * (x * (1.f / 6) + 0.5f).clip(0.f, 1.f); };
  // PaddleOCR's angle classifier's E_14_98_24: a hard-swish of 14x98x24 (33k) elements, 2-4 us on one Zen 5 core
  // (iterations >= 32768 split it before; with the worker not running it took 6x its time)
  Tensor small = randn({14, 98, 24}, 7).realize();
  CHECK(threads_of(hard_swish(small), 2) == 1);
  // 32x that: each thread's part is about 10 us or more
  Tensor big = randn({14 * 32, 98, 24}, 8).realize();
  CHECK(threads_of(hard_swish(big), 2) == 2);
  CHECK(threads_of(hard_swish(big), 1) == 1);
  // more threads need more work: each part keeps the same minimum
  CHECK(threads_of(hard_swish(randn({14 * 16, 98, 24}, 9).realize()), 2) == 2);
  CHECK(threads_of(hard_swish(randn({14 * 16, 98, 24}, 9).realize()), 8) == 1);
  // a reduce counts its multiply-adds: a 1x1 convolution of 96 -> 96 channels over 10x20 pixels (1.8M, about 35 us)
  // splits; over 2x20 pixels it does not (channels-last on the CPU: the convolution is the kernel before the
  // output's layout copy)
  const size_t conv_at = tg::get_device(tg::default_device()).renderer().grid_limits().threads == 0 ? 1 : 0;
  for (auto hw : {std::pair{10, 2}, std::pair{2, 1}}) {
    const int h = hw.first, want = hw.second;  // not a structured binding: clang 14 refuses one in CAPTURE
    CAPTURE(h);
    Tensor x = randn({1, 96, h, 20}, 10).realize(), w = randn({96, 96, 1, 1}, 11).realize();
    CHECK(threads_of(x.conv2d(w), 2, conv_at) == want);
    // (h = 10: its tile leaves 5 x 5 x 3 of the output axes, none even: the rows are reserved for the threads
    // first) run on this machine's threads, the values of a 1x1 convolution
    std::vector<float> got = x.conv2d(w).to_vector<float>(), xs = x.to_vector<float>(), ws = w.to_vector<float>();
    const size_t px = size_t(h) * 20;
    for (size_t co = 0; co < 96; co++)
      for (size_t p = 0; p < px; p++) {
        double ref = 0;
        for (size_t ci = 0; ci < 96; ci++) ref += double(ws[co * 96 + ci]) * xs[ci * px + p];
        REQUIRE(std::abs(got[co * px + p] - ref) <= 1e-4 * (1 + std::abs(ref)));
      }
  }
}

namespace {

// Lowering options for the prefetch tests: the device's machine model with one thread and a 256 KiB L2, so a
// weight of a few hundred KiB streams from memory whatever the host's cache and core count.
LowerOptions one_thread_small_l2(Device& dev) {
  LowerOptions lo;
  lo.config = opt_config(dev);
  lo.config.threads = 1;
  lo.config.l2_bytes = 256 << 10;
  return lo;
}

}  // namespace

TEST_CASE("PREFETCH: a q4_0 matvec streaming more than L2 prefetches each row's blocks ahead in its block loop; a GEMM does not") {
  // a decode step's linear: x (1, 1024) times a q4_0 weight (1024, 1024) transposed, 576 KiB of blocks, lowered
  // for a machine model with an L2 of 256 KiB (so the test's sizes stay small whatever this machine's L2 is)
  const int64_t rows = 1024, cols = 1024;
  std::mt19937 gen{31};
  std::vector<uint8_t> blocks(size_t(rows * (cols / 32) * 18));
  for (size_t i = 0; i < blocks.size(); i++) blocks[i] = uint8_t(gen());
  for (size_t b = 0; b < blocks.size(); b += 18) blocks[b] = uint8_t(gen() % 256), blocks[b + 1] = 0x1c;  // f16 scales near 2^-8
  Tensor w = Tensor::from_vector(blocks, {rows, cols / 32, 18}).realize();
  Tensor x = randn({1, cols}, 32).realize();
  ScopedEnv float_products("INT_DOT", "0");  // the float matvec, one kernel (INT_DOT quantises x in two more)
  Tensor y = x.matmul(nn::ggml_dequantize(w, "q4_0").reshape({rows, cols}).T());
  Kern k = last_kernel(y);
  Device& dev = get_device("CPU");
  LowerOptions lo = one_thread_small_l2(dev);
  CompiledKernel ck = lower_kernel(k.ast, "pf_q4", dev.renderer(), lo);
  std::vector<Opt> with = ck.opts, without;
  for (const Opt& o : with)
    if (o.op != OptOp::PREFETCH) without.push_back(o);
  REQUIRE(without.size() + 1 == with.size());
  const Opt pf = with.back();
  CHECK(pf.op == OptOp::PREFETCH);
  // the tile's rows share kInFlightBytes (8 KiB) ahead: whole cache lines a stream
  int64_t rows_tile = 1;
  for (const Opt& o : with)
    if (o.op == OptOp::UPCAST) rows_tile *= o.amt;
  CHECK(pf.amt == std::max<int64_t>(64, 8192 / rows_tile / 64 * 64));
  // its axis is the reduce loop over the blocks (32 of them): the other reduce axis is the 32 weights of a block
  UOpRef split = split_ranges(graph_rewrite(k.ast, symbolic(), nullptr, false, "simplify"));
  std::vector<const UOp*> axes = kernel_axes(split);
  REQUIRE(size_t(pf.axis) < axes.size());
  CHECK(range_type(axes[size_t(pf.axis)]) == AxisType::Reduce);
  CHECK(axes[size_t(pf.axis)]->src(0)->const_int() == cols / 32);
  // one prefetch per row of the register tile (the block's scale and its nibbles are one line), none for x (4 KiB)
  int64_t tile = 1;
  for (const Opt& o : with)
    if (o.op == OptOp::UPCAST) tile *= o.amt;
  size_t n_pf = 0;
  for (size_t at = ck.src.find("call void @llvm.prefetch"); at != std::string::npos; at = ck.src.find("call void @llvm.prefetch", at + 1)) n_pf++;
  CHECK(n_pf == size_t(tile));
  // the values do not change: the same opts without PREFETCH give the same bits, and both match a float64 sum of
  // the dequantised weights
  std::vector<float> got = run_with(k, with, 1), plain = run_with(k, without, 1);
  CHECK(got == plain);
  std::vector<float> xs = x.to_vector<float>(), want(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; r++) {
    double acc = 0;
    for (int64_t b = 0; b < cols / 32; b++) {
      const uint8_t* blk = &blocks[size_t((r * (cols / 32) + b) * 18)];
      double d = double(half_bits_to_float(uint16_t(blk[0] | blk[1] << 8)));
      for (int64_t j = 0; j < 16; j++) {
        acc += double(xs[size_t(b * 32 + j)]) * d * double((blk[2 + j] & 15) - 8);
        acc += double(xs[size_t(b * 32 + 16 + j)]) * d * double((blk[2 + j] >> 4) - 8);
      }
    }
    want[size_t(r)] = float(acc);
  }
  check_close(got, want, float(cols) * 1.2e-7f);
  {  // PREFETCH=0: the heuristic leaves it out
    ScopedEnv off("PREFETCH", "0");
    CompiledKernel ck0 = lower_kernel(k.ast, "pf_q4_off", dev.renderer(), lo);
    CHECK(ck0.opts == without);
    CHECK(ck0.src.find("llvm.prefetch") == std::string::npos);
  }
  // the weight within L2: no prefetch
  lo.config.l2_bytes = 1 << 20;
  CHECK(lower_kernel(k.ast, "pf_q4_l2", dev.renderer(), lo).opts == without);
  lo.config.l2_bytes = 256 << 10;
  // a GEMM (64 rows of A) rereads B (2 MiB) from cache 64 times: no prefetch
  {
    ScopedEnv off("PACKED_MATMUL", "0");
    Tensor a = randn({64, 512}, 33).realize(), b = randn({512, 1024}, 34).realize();
    Kern g = last_kernel(a.matmul(b));
    for (const Opt& o : lower_kernel(g.ast, "pf_gemm", dev.renderer(), lo).opts) CHECK(o.op != OptOp::PREFETCH);
  }
  // an explicit PREFETCH needs a reduce axis and a distance
  std::vector<Opt> bad_axis = without, bad_amt = without;
  bad_axis.push_back({OptOp::PREFETCH, 0, 512});
  bad_amt.push_back({OptOp::PREFETCH, pf.axis, 0});
  lo.opts = &bad_axis;
  CHECK_THROWS_AS(lower_kernel(k.ast, "pf_bad", dev.renderer(), lo), OptError);
  lo.opts = &bad_amt;
  CHECK_THROWS_AS(lower_kernel(k.ast, "pf_bad2", dev.renderer(), lo), OptError);
}

TEST_CASE("PREFETCH: a float32 matvec streaming more than L2 does not prefetch (3 vector ops a line); q8_0's does (15.6)") {
  // x (1, 1024) times a float32 weight (1024, 1024) transposed: 4 MiB streamed past a 256 KiB L2, a load and a
  // multiply-add a 16-float vector of it and x's load: under kPrefetchOpsPerLine (8) a line, the core's window keeps
  // enough lines in flight; the same weight as q8_0 blocks dequantised in the matvec is well over it
  Device& dev = get_device("CPU");
  LowerOptions lo = one_thread_small_l2(dev);
  lo.config.vector_width = 16;  // the counts above are of 16-float vectors, whatever this machine's width
  Tensor x = randn({1, 1024}, 51).realize();
  Tensor wf = randn({1024, 1024}, 52).realize();
  Kern f = last_kernel(x.matmul(wf.T()));
  CompiledKernel ckf = lower_kernel(f.ast, "pf_f32", dev.renderer(), lo);
  CHECK(std::none_of(ckf.opts.begin(), ckf.opts.end(), [](const Opt& o) { return o.op == OptOp::PREFETCH; }));
  CHECK(ckf.src.find("llvm.prefetch") == std::string::npos);
  std::mt19937 gen{53};
  std::vector<uint8_t> blocks(size_t(1024 * 32 * 34));
  for (size_t i = 0; i < blocks.size(); i++) blocks[i] = uint8_t(gen());
  for (size_t b = 0; b < blocks.size(); b += 34) blocks[b] = uint8_t(gen() % 256), blocks[b + 1] = 0x1c;
  Tensor wq = Tensor::from_vector(blocks, {1024, 32, 34}).realize();
  ScopedEnv float_products("INT_DOT", "0");
  Kern q = last_kernel(x.matmul(nn::ggml_dequantize(wq, "q8_0").reshape({1024, 1024}).T()));
  CompiledKernel ckq = lower_kernel(q.ast, "pf_q8", dev.renderer(), lo);
  CHECK(std::count_if(ckq.opts.begin(), ckq.opts.end(), [](const Opt& o) { return o.op == OptOp::PREFETCH; }) == 1);
  // the float kernel's values: a float64 dot product of each row
  std::vector<float> got = run_with(f, ckf.opts, 1), xs = x.to_vector<float>(), ws = wf.to_vector<float>();
  std::vector<float> want(1024);
  for (size_t r = 0; r < 1024; r++) {
    double acc = 0;
    for (size_t c = 0; c < 1024; c++) acc += double(xs[c]) * double(ws[r * 1024 + c]);
    want[r] = float(acc);
  }
  check_close(got, want, 1024 * 1.2e-7f);
}

TEST_CASE("PREFETCH runs ahead in loop order: past a short row's end it prefetches the next row tile, not the tile's next row") {
  // x (1, 1024) times a q4_0 weight (1024, 1024) transposed: rows of 32 blocks of 18 bytes, d bytes ahead =
  // ceil(d / 18) blocks, so at the last block of a tile the prefetch of the tile's row u reads row u of a later tile
  // (1024 bytes: 57 blocks, block 24 of row u two tiles on), where it used to read row u + 1 of the same tile, which
  // the tile's next stream reads already
  const int64_t rows = 1024, cols = 1024, nb = cols / 32, row_bytes = nb * 18;
  std::mt19937 gen{41};
  std::vector<uint8_t> blocks(size_t(rows * row_bytes));
  for (auto& b : blocks) b = uint8_t(gen());
  Tensor w = Tensor::from_vector(blocks, {rows, nb, 18}).realize();
  Tensor x = randn({1, cols}, 42).realize();
  ScopedEnv float_products("INT_DOT", "0");
  Kern k = last_kernel(x.matmul(nn::ggml_dequantize(w, "q4_0").reshape({rows, cols}).T()));
  Device& dev = get_device("CPU");
  LowerOptions lo = one_thread_small_l2(dev);
  CompiledKernel ck = lower_kernel(k.ast, "pf_order", dev.renderer(), lo);
  int64_t tile = 1;
  for (const Opt& o : ck.opts)
    if (o.op == OptOp::UPCAST) tile *= o.amt;
  REQUIRE(ck.opts.back().op == OptOp::PREFETCH);
  REQUIRE(tile > 1);
  const int64_t ahead = (ck.opts.back().amt + 17) / 18, last = nb - 1 + ahead;
  // each prefetch's byte address at the first tile's last block (every other loop at 0)
  std::vector<int64_t> at_rows, at_blocks;
  for (const UOp* u : ck.program) {
    if (u->op != Ops::PREFETCH) continue;
    std::vector<std::pair<const UOp*, UOpRef>> sub;
    for (const UOp* q : toposort(u->src(1)))
      if (q->op == Ops::RANGE) {
        const bool blocks_loop = range_type(q) == AxisType::Reduce && q->src(0)->op == Ops::CONST && q->src(0)->const_int() == nb;
        sub.emplace_back(q, UOp::cnst_int(q->dtype, blocks_loop ? nb - 1 : 0));
      }
    UOpRef a = graph_rewrite(substitute(UOpRef(u->src(1)), sub), symbolic(), nullptr, false, "test address");
    REQUIRE(a->op == Ops::CONST);
    at_rows.push_back(a->const_int() / row_bytes), at_blocks.push_back(a->const_int() % row_bytes / 18);
  }
  REQUIRE(int64_t(at_rows.size()) == tile);
  std::sort(at_rows.begin(), at_rows.end());
  for (int64_t u = 0; u < tile; u++) CHECK(at_rows[size_t(u)] == last / nb * tile + u);  // a later tile's rows, each once
  for (int64_t b : at_blocks) CHECK(b == last % nb);
}

TEST_CASE("PREFETCH: a 4096 x 4096 softmax (a row kernel) prefetches the next row in its last sum's loop, a layernorm only where the machine model says so") {
  // a row kernel's work is its loops one after another (3 x 4096 per row), not the product of all its axes (4096^4):
  // it streams x about once, so it prefetches, one row (16 KiB) ahead, within a quarter of L2, in the loop of its
  // last sum before the output loop where that loop computes a transcendental (softmax's sum of exps, reading the
  // other REDUCE), not its first (the max): the next row's reads then run beside the exps. A layernorm's loops (the
  // mean, the variance) are a few adds an element: whether they prefetch is the machine model's row_prefetch (measured
  // on the host); without it no PREFETCH, with it the same one as the softmax's, in the variance's loop. Lowered for
  // a Zen 5 machine model (2 threads, AVX-512, 1 MiB L2), whatever this machine is.
  Device& dev = get_device("CPU");
  LowerOptions lo;
  lo.config = opt_config(dev);
  lo.config.threads = 2, lo.config.vector_width = 16, lo.config.vector_registers = 32;
  lo.config.l2_bytes = 1 << 20;
  const int64_t n = 4096, row_bytes = n * 4;
  Tensor x = randn({n, n}, 51).realize();
  for (int which = 0; which < 3; which++) {  // layernorm without row_prefetch, with it, softmax without it
    INFO(std::string(which == 0 ? "layernorm" : which == 1 ? "layernorm, row_prefetch" : "softmax"));
    lo.config.row_prefetch = which == 1;
    Kern k = last_kernel(which < 2 ? x.layer_norm({n}) : x.softmax(-1));
    CompiledKernel ck = lower_kernel(k.ast, which == 0 ? "pf_ln" : which == 1 ? "pf_ln_rp" : "pf_sm", dev.renderer(), lo);
    std::vector<Opt> without;
    for (const Opt& o : ck.opts)
      if (o.op != OptOp::PREFETCH) without.push_back(o);
    if (which == 0) {
      CHECK(without.size() == ck.opts.size());
      CHECK(!without.empty());  // the row kernel's other opts (lanes, threads) are there
      continue;
    }
    REQUIRE(without.size() + 1 == ck.opts.size());
    const Opt pf = *std::find_if(ck.opts.begin(), ck.opts.end(), [](const Opt& o) { return o.op == OptOp::PREFETCH; });
    CHECK(pf.amt == row_bytes);
    {  // the axis is the loop of the REDUCE that reads the other one
      UOpRef split = split_ranges(graph_rewrite(k.ast, symbolic(), nullptr, false, "simplify"));
      std::vector<const UOp*> axes = kernel_axes(split);
      REQUIRE(size_t(pf.axis) < axes.size());
      const UOp* red = nullptr;
      for (const UOp* u : toposort(split.get()))
        if (u->op == Ops::REDUCE && u->src(1) == axes[size_t(pf.axis)]) red = u;
      REQUIRE(red != nullptr);
      int inside = 0;
      for (const UOp* u : toposort(red->src(0))) inside += u->op == Ops::REDUCE;
      CHECK(inside == 1);
    }
    // every prefetch reads the next row's start (element n) when the loops are at 0 (the row loop, the thread's part)
    size_t n_pf = 0;
    for (const UOp* u : ck.program) {
      if (u->op != Ops::PREFETCH) continue;
      n_pf++;
      std::vector<std::pair<const UOp*, UOpRef>> sub;
      for (const UOp* q : toposort(u->src(1)))
        if (q->op == Ops::RANGE || q->op == Ops::DEFINE_VAR) sub.emplace_back(q, UOp::cnst_int(q->dtype, 0));
      UOpRef a = graph_rewrite(substitute(UOpRef(u->src(1)), sub), symbolic(), nullptr, false, "test address");
      REQUIRE(a->op == Ops::CONST);
      CHECK(a->const_int() == n);
    }
    CHECK(n_pf >= 1);
    CHECK(run_with(k, ck.opts) == run_with(k, without));  // the values do not change
    // a small L2 (48 KiB): a quarter of it ahead (12 KiB), within the row
    LowerOptions small = lo;
    small.config.l2_bytes = 48 << 10;
    std::vector<Opt> so = lower_kernel(k.ast, which == 1 ? "pf_ln_rp_small" : "pf_sm_small", dev.renderer(), small).opts;
    CHECK(std::count(so.begin(), so.end(), Opt{OptOp::PREFETCH, pf.axis, 12 << 10}) == 1);
  }
}

TEST_CASE("PREFETCH: a 2x2 max pool streaming more than L2 prefetches in none of its window loops") {
  // x (64, 32, 20, 20), 3.2 MiB, read once, lowered for an L2 of 256 KiB: a stream, but its reduce loops are the
  // window's rows (80 bytes apart) and a row's 2 elements (8 bytes a pass): neither walks the stream line by line,
  // which moves with the output loops (mnist's step: its max pool's backward ran 28-40 ms a launch with the
  // prefetches, 15-23 ms without). In NCHW and channels-last (rows 2560 bytes apart).
  Device& dev = get_device("CPU");
  LowerOptions lo = one_thread_small_l2(dev);
  Tensor x = randn({64, 32, 20, 20}, 61).realize();
  Tensor xl = x.permute({0, 2, 3, 1}).contiguous().realize();
  for (int which = 0; which < 2; which++) {
    INFO(std::string(which == 0 ? "NCHW" : "channels-last"));
    Tensor in = which == 0 ? x : xl.permute({0, 3, 1, 2});
    Kern k = last_kernel(in.max_pool2d(2));
    CompiledKernel ck = lower_kernel(k.ast, which == 0 ? "pf_pool" : "pf_pool_cl", dev.renderer(), lo);
    CHECK(std::none_of(ck.opts.begin(), ck.opts.end(), [](const Opt& o) { return o.op == OptOp::PREFETCH; }));
    CHECK(ck.src.find("llvm.prefetch") == std::string::npos);
  }
}

namespace {

// whether the opts write the output past the caches
bool has_nt(const std::vector<Opt>& opts) {
  return std::any_of(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::NONTEMPORAL; });
}

// The host's lowering options for a machine model with a 64 KiB last-level cache and 2 threads (the NONTEMPORAL
// tests' sizes stay small on any machine)
LowerOptions small_llc_lowering() {
  LowerOptions lo;
  lo.config = opt_config(get_device("CPU"));
  lo.config.threads = 2;
  lo.config.llc_bytes = 64 << 10;
  return lo;
}

}  // namespace

TEST_CASE("NONTEMPORAL: a layernorm's output rows are packed vector stores past the caches") {
  // rows of 1024 floats, a 1 MiB output, lowered for a machine model with a 64 KiB last-level cache and AVX-512
  Device& dev = get_device("CPU");
  LowerOptions lo;
  lo.config = opt_config(dev);
  lo.config.threads = 2, lo.config.vector_width = 16, lo.config.vector_registers = 32;
  lo.config.llc_bytes = 64 << 10;
  Tensor x = randn({256, 1024}, 61).realize();
  Kern ln = last_kernel(x.layer_norm({1024}));
  CompiledKernel ck = lower_kernel(ln.ast, "nt_ln", dev.renderer(), lo);
  REQUIRE(has_nt(ck.opts));
  // the output loop's copies are one <16 x float> store (the expander packs them), marked, and a fence
  CHECK(occurrences(ck.src, "align 64, !nontemporal") >= 1);
  CHECK(occurrences(ck.src, "store <16 x float>") >= 2 * occurrences(ck.src, "!nontemporal"));
  CHECK(occurrences(ck.src, "fence seq_cst") == 1);
  std::vector<Opt> off;
  for (const Opt& o : ck.opts)
    if (o.op != OptOp::NONTEMPORAL) off.push_back(o);
  CompiledKernel plain = lower_kernel(ln.ast, "nt_ln_off", dev.renderer(), [&] { LowerOptions l = lo; l.opts = &off; return l; }());
  CHECK(plain.src.find("!nontemporal") == std::string::npos);
  std::vector<float> got = run_with(ln, ck.opts), want = run_with(ln, off);
  check_close(got, want, 1e-6f);
}

TEST_CASE("NONTEMPORAL: a softmax past the last-level cache keeps its exps in a row array on the stack, its output past the caches") {
  // rows of 1024 floats (4 KiB), a 1 MiB output, lowered for a machine model with a 64 KiB last-level cache, a 1 MiB
  // L2 (a row array of up to 256 KiB) and AVX-512, whatever this machine is. The heuristic writes the output past the
  // caches (its exps in the output row, cached, cost a third pass over memory: the write allocate), and the lowering
  // then keeps the exps in a row array; without the opt they go into the output row. With a last-level cache that
  // holds the output, the heuristic keeps it cached.
  Device& dev = get_device("CPU");
  LowerOptions lo;
  lo.config = opt_config(dev);
  lo.config.threads = 2, lo.config.vector_width = 16, lo.config.vector_registers = 32;
  lo.config.llc_bytes = 64 << 10, lo.config.l2_bytes = 1 << 20;
  const int64_t rows = 256, n = 1024;
  Tensor x = Tensor(randn({rows, n}, 62) * 4).realize();
  Kern sm = last_kernel(x.softmax(-1));
  const std::string row_array = "alloca [" + std::to_string(n) + " x float]";
  {
    OptConfig big = lo.config;
    big.llc_bytes = 64 << 20;
    CHECK_FALSE(has_nt(hand_coded_optimizations(sm.ast, big)));
  }
  CompiledKernel ck = lower_kernel(sm.ast, "nt_sm", dev.renderer(), lo);
  REQUIRE(has_nt(ck.opts));
  std::vector<Opt> without;
  for (const Opt& o : ck.opts)
    if (o.op != OptOp::NONTEMPORAL) without.push_back(o);
  LowerOptions lo_cached = lo, lo_nt = lo;
  lo_cached.opts = &without;
  lo_nt.opts = &ck.opts;
  CompiledKernel cached = lower_kernel(sm.ast, "nt_sm_cached", dev.renderer(), lo_cached);
  CHECK(cached.src.find(row_array) == std::string::npos);
  // the sum's loop stores exp(x - max) into a stack array of one row; the output loop reads it back and writes
  // packed vectors past the caches (the output buffer is only written)
  CHECK(occurrences(ck.src, row_array) == 1);
  CHECK(occurrences(ck.src, "align 64, !nontemporal") >= 1);
  CHECK(occurrences(ck.src, "store <16 x float>") >= 2 * occurrences(ck.src, "!nontemporal"));
  // one exp per element (exp2 kept as one op to count it)
  {
    ScopedEnv t("TRANSCENDENTAL", "0");
    int exps = 0;
    for (const UOp* u : lower_kernel(sm.ast, "nt_sm_exp", dev.renderer(), lo_nt).program) exps += u->op == Ops::EXP2;
    CHECK(exps == 1);
  }
  // the same bits as with the exps in the output row (the default), and softmax's values (in float32 ulps of the
  // value: exp(d) carries the rounding of d = x - max times log2(e), |d| of them; the sum, its reciprocal and the
  // product a few)
  std::vector<float> got = run_compiled(sm, ck);
  CHECK(got == run_compiled(sm, cached));
  std::vector<float> xs = x.to_vector<float>();
  double worst = 0;
  for (int64_t r = 0; r < rows; r++) {
    const float* row = &xs[size_t(r * n)];
    double m = *std::max_element(row, row + n), sum = 0;
    for (int64_t i = 0; i < n; i++) sum += std::exp(double(row[i]) - m);
    for (int64_t i = 0; i < n; i++) {
      double d = double(row[i]) - m, want = std::exp(d) / sum;
      worst = std::max(worst, std::abs(double(got[size_t(r * n + i)]) - want) / (want * 0x1p-23) + d);
    }
  }
  CAPTURE(worst);
  CHECK(worst <= 5);
  // a row longer than the array (an L2 of 8 KiB holds a 2 KiB one): the exps stay in the output row, which the
  // output loop reads back, so no store is marked
  LowerOptions small = lo_nt;
  small.config.l2_bytes = 8 << 10;
  CompiledKernel ck_small = lower_kernel(sm.ast, "nt_sm_small", dev.renderer(), small);
  CHECK(ck_small.src.find(row_array) == std::string::npos);
  CHECK(ck_small.src.find("!nontemporal") == std::string::npos);
  CHECK(run_compiled(sm, ck_small) == got);
}

TEST_CASE("an axis reserved for the threads and padded for a tile of 3 stays divisible by the threads") {
  // beautiful_mnist's last linear under AVX2 (8 floats x 16 registers): 512 rows x 10 classes. The tile left no axis
  // for 2 threads, so the heuristic reserves the rows for them (256 each) and tiles rows by 3: the padding must make
  // the whole axis a multiple of 3 x 2 (516), not of 3 (513 = 171 tiles, which 2 threads cannot split)
  Tensor x = randn({512, 576}, 7), w = randn({10, 576}, 8), b = randn({10}, 9);
  x.realize(), w.realize(), b.realize();
  Kern k = last_kernel(x.matmul(w.T()) + b);  // nn::Linear's form: both operands contiguous along the sum
  OptConfig avx2{2, 8};
  avx2.vector_registers = 16;
  auto opts = hand_coded_optimizations(k.ast, avx2);
  INFO(opts.size());
  REQUIRE(std::count_if(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::THREAD; }) == 1);
  UOpRef ast = k.ast;
  for (const Opt& o : opts) ast = apply_opt(ast, o);  // threw: "the axis size 171 is not divisible by 2"
  for (const Opt& o : opts)
    if (o.op == OptOp::PADTO) CHECK(o.amt % 2 == 0);
}

TEST_CASE("heuristic: a reduce kernel whose store gathers takes vectors along the axis its loads run along") {
  // A 2x2 sum pool stored NCHW from a channels-last input (mnist's max-pool gradient, r_512_32_10_10): the store's
  // columns read the input 2C floats apart, so neither the store nor the 2x2 window gives vectors; the channels do
  // (every load contiguous along them), where the heuristic took scalar copies of a batch-row tile before.
  HostLowering h;
  Tensor x = randn({4, 8, 8, 2 * h.w}, 95).realize();  // (N, H, W, C)
  Tensor y = x.permute({0, 3, 1, 2}).reshape({4, 2 * h.w, 4, 2, 4, 2}).sum({3, 5});  // (N, C, 4, 4)
  Kern k = last_kernel(y);
  auto opts = hand_coded_optimizations(k.ast, h.lo.config);
  CAPTURE(opts.size());
  CHECK(has_upcast(opts, 1, h.w));
  CompiledKernel ck = lower_kernel(k.ast, "pool_vectors", h.dev.renderer(), h.lo);
  const std::string vec = "load <" + std::to_string(h.w) + " x float>";
  CHECK(ck.src.find(vec) != std::string::npos);
  auto got = run_with(k, ck.opts);
  CHECK(got == run_with(k, {}));
  const std::vector<float> xs = x.to_vector<float>();
  for (int64_t n : {0, 3})
    for (int64_t c : {int64_t(0), h.w + 1})
      for (int64_t i : {0, 3}) {
        const int64_t j = 2;
        float want = 0;  // the same order: the window's rows, then its columns
        for (int64_t a = 0; a < 2; a++)
          for (int64_t b = 0; b < 2; b++) want += xs[size_t(((n * 8 + 2 * i + a) * 8 + 2 * j + b) * 2 * h.w + c)];
        CHECK(got[size_t(((n * 2 * h.w + c) * 4 + i) * 4 + j)] == doctest::Approx(want).epsilon(1e-6));
      }
}

TEST_CASE("threads: a copy with few vector operations but buffers past the cores' L2 is split; a small one is not") {
  // mnist's max-pool output copied channels-last (E_512_10_10_32): 102k vector operations, below the split's 2 x 65536,
  // but 13 MB moved, its NCHW input read 100 floats apart along the stored channels (2.0 ms on one thread). The
  // machine model's L2 decides: the kernel's buffers past the L2 of its threads split it, whatever their operation count
  Tensor x = randn({128, 32, 10, 10}, 91).realize();
  Kern k = last_kernel(x.permute({0, 2, 3, 1}).contiguous());  // 3.3 MB moved, 25.6k vector operations at 16 lanes
  // (the heuristic sees the kernel as lowering gives it: its 10 x 10 pixels one loop of 100, split_ranges' merge)
  const UOpRef split = split_ranges(graph_rewrite(k.ast, symbolic(), nullptr, false, "simplify"));
  CHECK(kernel_axes(split).size() == 3);
  auto threads_of = [&](int64_t l2) {
    OptConfig c{2, 16};
    c.vector_registers = 32;
    c.l2_bytes = l2;
    auto opts = hand_coded_optimizations(split, c);
    return std::count_if(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::THREAD; });
  };
  CHECK(threads_of(1 << 20) == 1);  // 3.3 MB > 2 x 1 MiB
  CHECK(threads_of(4 << 20) == 0);  // fits in 2 x 4 MiB: the operation count alone, too few
  CHECK(threads_of(0) == 0);        // an unknown L2: the operation count alone
  OptConfig c{2, 16};
  c.l2_bytes = 1 << 20;
  auto opts = hand_coded_optimizations(split, c);
  std::vector<float> got = run_with(k, opts), xs = x.to_vector<float>();
  for (int64_t n : {0, 77, 127})
    for (int64_t c2 : {0, 13, 31})
      CHECK(got[size_t(((n * 10 + 3) * 10 + 7) * 32 + c2)] == xs[size_t(((n * 32 + c2) * 10 + 3) * 10 + 7)]);
  CHECK(got == run_with(k, {}));
}

TEST_CASE("NONTEMPORAL: an add larger than the last-level cache writes aligned vectors past the caches, a small one does not") {
  // lowered for a machine model with a 64 KiB last-level cache (the test's sizes stay small on any machine)
  Device& dev = get_device("CPU");
  LowerOptions lo = small_llc_lowering();
  const int64_t big = 1 << 15, small = 1 << 12;  // 128 KiB and 16 KiB of output
  Tensor a = randn({big}, 41).realize(), b = randn({big}, 42).realize();
  Kern k = last_kernel(a + b);
  CompiledKernel ck = lower_kernel(k.ast, "nt_big", dev.renderer(), lo);
  CHECK(has_nt(ck.opts));
  // every store of the output is a vector store with !nontemporal, aligned to its bytes, beside its ordinary form for
  // a buffer whose address is not (one test of the address on entry), and the kernel fences before it returns
  const int lanes = lo.config.vector_width;
  const std::string vec = "<" + std::to_string(lanes) + " x float>";
  CHECK(occurrences(ck.src, "!nontemporal") >= 1);
  CHECK(occurrences(ck.src, "align " + std::to_string(lanes * 4) + ", !nontemporal") == occurrences(ck.src, "!nontemporal"));
  CHECK(occurrences(ck.src, "store " + vec) == 2 * occurrences(ck.src, "!nontemporal"));
  CHECK(occurrences(ck.src, "fence seq_cst") == 1);
  CHECK(occurrences(ck.src, "icmp eq i64") >= 1);
  // the values: exact, with the opts on and off, through an aligned output and one 4 bytes off
  std::vector<Opt> off;
  for (const Opt& o : ck.opts)
    if (o.op != OptOp::NONTEMPORAL) off.push_back(o);
  std::vector<float> as = a.to_vector<float>(), bs = b.to_vector<float>(), want(as.size());
  for (size_t i = 0; i < as.size(); i++) want[i] = as[i] + bs[i];
  CHECK(run_with(k, ck.opts) == want);
  CHECK(run_with(k, off) == want);
  {
    LowerOptions ln = lo;
    ln.opts = &ck.opts;
    CompiledKernel c2 = lower_kernel(k.ast, "nt_big_off4", dev.renderer(), ln);
    auto prog = dev.get_program(c2.src, c2.name);
    std::vector<float> out(size_t(big) + 32, -1.0f);
    float* o = out.data() + ((64 - reinterpret_cast<uintptr_t>(out.data()) % 64) % 64) / 4 + 1;  // 4 bytes past a line
    std::vector<void*> ptrs{o, k.bufs[1]->ptr(), k.bufs[2]->ptr()};
    std::vector<int64_t> vars(c2.var_names.size(), 0);
    LaunchDims dims;
    dims.n_vars = int(vars.size());
    if (c2.core_var >= 0) dims.core_var = c2.core_var, dims.global[0] = c2.threads;
    prog->run(ptrs.data(), vars.data(), dims);
    CHECK(std::vector<float>(o, o + big) == want);
  }
  // a small add (its output fits in the cache): ordinary stores
  Tensor c = randn({small}, 43).realize(), d = randn({small}, 44).realize();
  CompiledKernel cs = lower_kernel(last_kernel(c + d).ast, "nt_small", dev.renderer(), lo);
  CHECK_FALSE(has_nt(cs.opts));
  CHECK(occurrences(cs.src, "!nontemporal") == 0);
  CHECK(occurrences(cs.src, "fence") == 0);
  {  // NONTEMPORAL=0: the heuristic leaves it out
    ScopedEnv no("NONTEMPORAL", "0");
    CHECK_FALSE(has_nt(lower_kernel(k.ast, "nt_big_env", dev.renderer(), lo).opts));
  }
  // the opt names no axis: axis 0, amt 1 only, and the graph is unchanged (lowering marks the stores)
  UOpRef simple = graph_rewrite(k.ast, symbolic(), nullptr, false, "s");
  CHECK_THROWS_AS(apply_opt(simple, {OptOp::NONTEMPORAL, 1, 1}), OptError);
  CHECK_THROWS_AS(apply_opt(simple, {OptOp::NONTEMPORAL, 0, 2}), OptError);
  CHECK(apply_opt(simple, {OptOp::NONTEMPORAL, 0, 1}) == simple);
}

TEST_CASE("NONTEMPORAL: an output smaller than the last-level cache goes past it where the kernel's reads beside it do not fit") {
  // a cast of 2^14 floats to float16 on a machine model with a 64 KiB last-level cache: 32 KiB written beside 64 KiB
  // read, so the output's first lines leave the cache before the kernel ends (bench/bandwidth's cast of 2^24 floats:
  // 32 MiB beside 64 MiB read, on a 32 MiB L3); 2^12 floats (8 KiB beside 16) fit and stay cached
  Device& dev = get_device("CPU");
  LowerOptions lo = small_llc_lowering();
  Tensor big = randn({1 << 14}, 45).realize(), small = randn({1 << 12}, 46).realize();
  Kern k = last_kernel(big.cast(dtypes::float16));
  CompiledKernel ck = lower_kernel(k.ast, "nt_cast", dev.renderer(), lo);
  CHECK(has_nt(ck.opts));
  CHECK(occurrences(ck.src, "!nontemporal") >= 1);
  CHECK(occurrences(ck.src, "fence seq_cst") == 1);
  std::vector<Opt> off;
  for (const Opt& o : ck.opts)
    if (o.op != OptOp::NONTEMPORAL) off.push_back(o);
  std::vector<float> got = run_with(k, ck.opts), want = run_with(k, off);  // pairs of float16s: compare the bits
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  CHECK_FALSE(has_nt(lower_kernel(last_kernel(small.cast(dtypes::float16)).ast, "nt_cast_small", dev.renderer(), lo).opts));
  {  // NONTEMPORAL=0: never
    ScopedEnv no("NONTEMPORAL", "0");
    CHECK_FALSE(has_nt(lower_kernel(k.ast, "nt_cast_env", dev.renderer(), lo).opts));
  }
}

TEST_CASE("NONTEMPORAL: a transpose past the last-level cache writes whole cache lines from each tile column, past the caches") {
  // out[i][j] = in[j][i], 4 MiB, for a machine model with a 64 KiB last-level cache. Each tile column stores one
  // line of each of its output rows (rows 4 KiB apart): not one contiguous block, but no line is left partly
  // written, so the stores go past the caches (before: cached, each line read from memory first: a 4096^2 .T at
  // 5-6.5 ms against 2.7-4.0 on Zen 5). Vectors shorter than a line (AVX2's 8 floats) are widened to one.
  Tensor a = randn({1024, 1024}, 97).realize();
  Kern k = last_kernel(a.T().contiguous());
  auto store_block = [](const std::vector<Opt>& opts) {  // the floats a tile column stores per output row
    int64_t n = 1;
    for (const Opt& o : opts) n *= o.op == OptOp::UPCAST && o.axis == 1 ? o.amt : 1;
    return n;
  };
  for (int w : {16, 8}) {
    CAPTURE(w);
    OptConfig cfg{2, w};
    cfg.llc_bytes = 64 << 10;
    auto opts = hand_coded_optimizations(k.ast, cfg);
    CHECK(has_nt(opts));
    CHECK(store_block(opts) == 16);  // a line of floats
    cfg.llc_bytes = 64 << 20;        // the output fits in the cache: cached stores, vectors of w
    opts = hand_coded_optimizations(k.ast, cfg);
    CHECK_FALSE(has_nt(opts));
    CHECK(store_block(opts) == w);
  }
  {  // AVX2's widened line: its two vectors go out one after the other, row by row (the expander's copy order).
    // With the tile's rows outside the line's halves, all 64 first halves went out, then all second halves: more
    // partly written lines than the core's write-combining buffers (a 4096^2 .T under TG_CPU=haswell,
    // bench/bandwidth on Zen 5, alternated: 8.2 -> 3.6 ms; native vectors of 16: 2.9 ms).
    HostLowering h;
    h.lo.config = OptConfig{2, 8};
    h.lo.config.vector_registers = 16;
    h.lo.config.llc_bytes = 64 << 10;
    CompiledKernel ck = lower_kernel(k.ast, "nt_transpose_avx2", h.dev.renderer(), h.lo);
    CAPTURE(ck.src);
    REQUIRE(has_nt(ck.opts));
    // each non-temporal store's address as (base value, constant offset in floats), in the order of the source
    std::map<std::string, std::pair<std::string, int64_t>> at;
    std::vector<std::pair<std::string, int64_t>> stores;
    std::istringstream lines(ck.src);
    const std::regex gep(R"(\s*(%\w+) = getelementptr inbounds float, ptr %data0, i(?:32|64) (%\w+))"),
        add(R"(\s*(%\w+) = add i(?:32|64) (%\w+), (\d+))"), store(R"(\s*store <8 x float> %\w+, ptr (%\w+), align 32, !nontemporal.*)");
    std::map<std::string, std::pair<std::string, int64_t>> sum;  // %t = add iN %base, c
    for (std::string l; std::getline(lines, l);) {
      std::smatch m;
      if (std::regex_match(l, m, add)) sum[m[1]] = {m[2], std::stoll(m[3])};
      else if (std::regex_match(l, m, gep)) at[m[1]] = sum.count(m[2]) ? sum[m[2]] : std::pair{std::string(m[2]), int64_t(0)};
      else if (std::regex_match(l, m, store)) stores.push_back(at.at(m[1]));
    }
    REQUIRE(stores.size() >= 4);
    REQUIRE(stores.size() % 2 == 0);
    for (size_t i = 0; i < stores.size(); i += 2) {
      CAPTURE(i);
      CHECK(stores[i + 1].first == stores[i].first);
      CHECK(stores[i + 1].second == stores[i].second + 8);  // the line's second half, at once
    }
    CHECK(run_with(k, ck.opts) == run_with(k, {}));
  }
  HostLowering h;
  h.lo.config.llc_bytes = 64 << 10;
  CompiledKernel ck = lower_kernel(k.ast, "nt_transpose", h.dev.renderer(), h.lo);
  REQUIRE(has_nt(ck.opts));
  const size_t nt = occurrences(ck.src, "!nontemporal");
  CHECK(nt >= 16 / size_t(h.w));  // every store of a tile column's line, each aligned to its vector's bytes
  CHECK(occurrences(ck.src, "align " + std::to_string(h.w * 4) + ", !nontemporal") == nt);
  CHECK(occurrences(ck.src, "fence seq_cst") == 1);
  std::vector<float> got = run_with(k, ck.opts);
  CHECK(got == run_with(k, {}));  // exactly the plain loops' values
  const std::vector<float> host = a.to_vector<float>();
  for (int64_t i = 0; i < 1024; i += 7)
    for (int64_t j = 0; j < 1024; j += 3) REQUIRE(got[size_t(i * 1024 + j)] == host[size_t(j * 1024 + i)]);
}

TEST_CASE("NONTEMPORAL: a cast to float16 or bfloat16 larger than the last-level cache stores aligned 16-bit vectors past the caches") {
  Device& dev = get_device("CPU");
  LowerOptions lo = small_llc_lowering();
  const int64_t n = 1 << 16;  // 128 KiB of output
  Tensor a = randn({n}, 46).realize();
  std::vector<float> as = a.to_vector<float>();
  for (DType d : {dtypes::float16, dtypes::bfloat16}) {
    CAPTURE(d.name());
    Kern k = last_kernel(a.cast(d));
    CompiledKernel ck = lower_kernel(k.ast, "nt_16", dev.renderer(), lo);
    CAPTURE(ck.src);
    CHECK(has_nt(ck.opts));
    // every marked store is a vector of the 16-bit type aligned to its bytes
    const std::string t = d == dtypes::float16 ? " x half> " : " x bfloat> ";
    size_t marked = 0;
    for (size_t at = ck.src.find("!nontemporal"); at != std::string::npos; at = ck.src.find("!nontemporal", at + 1)) {
      size_t bol = ck.src.rfind('\n', at) + 1;
      std::string line = ck.src.substr(bol, ck.src.find('\n', at) - bol);
      if (line.find("store <") == std::string::npos) continue;  // the metadata node
      marked++;
      size_t lt = line.find('<') + 1;
      int lanes = std::stoi(line.substr(lt));
      CHECK(line.find(t) != std::string::npos);
      CHECK(line.find("align " + std::to_string(lanes * 2) + ", !nontemporal") != std::string::npos);
    }
    CHECK(marked >= 1);
    // the values: the rounding of each float, with the opt and without
    std::vector<Opt> off;
    for (const Opt& o : ck.opts)
      if (o.op != OptOp::NONTEMPORAL) off.push_back(o);
    for (const std::vector<Opt>* opts : {&ck.opts, &off}) {
      LowerOptions l2 = lo;
      l2.opts = opts;
      run_compiled(k, lower_kernel(k.ast, "nt_16r", dev.renderer(), l2));
      std::vector<uint16_t> got(static_cast<size_t>(n));
      k.bufs[0]->copyout(got.data(), got.size() * 2);
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); i++)
        bad += got[i] != (d == dtypes::float16 ? float_to_half_bits(as[i]) : float_to_bf16_bits(as[i]));
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("heuristic: an elementwise kernel vectorised along its loads, its store gathering along a short row past L2, writes 48 bytes a line") {
  // Winograd's tile gradient moved into its (8, 8, C, N, 6, 6) planes: read contiguously along the 8 points (the
  // vector), stored one float per lane into 8 planes, contiguously along the 6 tile columns (the row). The row whole
  // writes 24 bytes a line; 2 of its rows 48 (one line: the most bytes a line, of the fewest lines); 3 rows 72 (two
  // lines). 2.11 -> 1.58 ms at C = 32, N = 128 (Zen 5). AVX2 takes the row whole as its store's vector (step 1)
  // and the points as a transpose tile's rows: 2 rows of it too (2.31 -> 1.97 ms under TG_CPU=haswell).
  const int64_t n = 16, c = 8;
  Tensor src = randn({n, c, 6, 6, 8, 8}, 141).realize();     // (n, c, tx, ty, i, j): tx and ty do not merge
  Tensor y = src.permute({4, 5, 1, 0, 3, 2}).contiguous();  // (i, j, c, n, ty, tx): 1.2 MB
  Kern k = last_kernel(y);
  OptConfig past{2, 16};
  past.l2_bytes = 128 << 10;  // past two L2s of 128 KiB
  OptConfig avx2 = avx2_config();
  avx2.threads = 2, avx2.l2_bytes = 128 << 10;
  for (const OptConfig& cfg : {past, avx2}) {
    INFO("vector width " << cfg.vector_width);
    auto opts = hand_coded_optimizations(k.ast, cfg);
    CHECK(has_upcast(opts, 1, 8));  // the vector along the loads
    CHECK(has_upcast(opts, 5, 6));  // the row whole
    CHECK(has_upcast(opts, 4, 2));  // 2 of its rows: 48 bytes a line
    CHECK(run_with(k, opts) == run_with(k, {}));
  }
  OptConfig fits = past;
  fits.l2_bytes = 64 << 20;  // in L2 the lines stay
  CHECK_FALSE(has_upcast(hand_coded_optimizations(k.ast, fits), 5, 6));
}

TEST_CASE("heuristic: a reduce kernel storing scalar copies along a short row past L2 takes the row whole (line fill)") {
  // Winograd F(4x4, 5x5)'s output-transform adjoint: out[r, a, c, n, ty, tx] = sum_x A[x][a] dy[n, c, 4 ty + r,
  // 4 tx + x]. The store is contiguous along tx (6 tile columns), whose loads gather (4 floats apart): scalar
  // copies. A tile holding part of the row writes part of each line (planes C * N * 36 floats apart) and the next
  // tiles complete them; past L2 they were evicted by then (9.5 -> 2.0 ms at N = 128, C = 32, Zen 5). A is read
  // along x (a's rows: x unrolled) or, as the Winograd step stores it, along a (the 8 points a vector).
  const int64_t n = 16, c = 8;
  Tensor dy = randn({n, c, 24, 24}, 131).realize();
  std::vector<float> av(32);
  for (size_t i = 0; i < av.size(); i++) av[i] = float(int(i % 7) - 3) * 0.5f;
  Tensor a = Tensor::from_vector(av, {4, 8}).realize();
  Tensor g = dy.reshape({n, c, 6, 4, 6, 4}).permute({3, 1, 0, 2, 4, 5});  // (r, c, n, ty, tx, x)
  auto takes_row = [](const std::vector<Opt>& opts) { return has_upcast(opts, 5, 6); };
  // the output planes a tile writes: its copies along r and a
  auto planes = [](const std::vector<Opt>& opts) {
    int64_t p = 1;
    for (const Opt& o : opts)
      if (o.op == OptOp::UPCAST && o.axis <= 1) p *= o.amt;
    return p;
  };
  OptConfig past{2, 16};
  past.l2_bytes = 128 << 10;  // the output's 590 KB past two L2s of 128 KiB
  OptConfig avx2 = avx2_config();
  avx2.threads = 2, avx2.l2_bytes = 128 << 10;
  for (bool along_a : {false, true}) {
    Tensor av8 = along_a ? a.permute({1, 0}) : a.reshape({8, 4});  // (a, x): strides (1, 8) or (4, 1)
    Tensor y = (g.unsqueeze(1) * av8.reshape({1, 8, 1, 1, 1, 1, 4})).sum(6);  // (r, a, c, n, ty, tx)
    Kern k = last_kernel(y);
    for (const OptConfig& cfg : {past, avx2}) {
      INFO("vector width " << cfg.vector_width << ", A read along " << (along_a ? "a" : "x"));
      auto opts = hand_coded_optimizations(k.ast, cfg);
      CHECK(takes_row(opts));
      // of the tiles that fill lines alike (the row whole, 2 tile rows: 48 bytes a line), the one writing the
      // fewest lines: one plane per point of the vector (16 planes, 2 rows of them: 1.30-1.89 ms against 0.48-0.66
      // at N = 128, C = 32)
      CHECK(planes(opts) == (along_a ? 8 : 1));
      check_close(run_with(k, opts), run_with(k, {}), 1e-6f);  // FMAs against the plain loops' multiply and add
    }
    OptConfig fits = past;
    fits.l2_bytes = 64 << 20;  // in L2 the lines stay: the loads per accumulation decide
    if (!along_a) CHECK_FALSE(takes_row(hand_coded_optimizations(k.ast, fits)));
  }
}
