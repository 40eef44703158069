// Stage "layouts" of the scheduler: rules that choose how a computation lays out its operands in memory, given the
// capabilities of the device it runs on (pm_layout). They run on the tensor graph before anything else, so they
// apply however the computation was written: `a.matmul(b)`, `(a.reshape({m,1,k}) * b.T().reshape({1,n,k})).sum(2)`
// and the matmuls autograd builds for a gradient are one pattern.
#include "stages.hpp"

#include <algorithm>

namespace tg::sched {

namespace {

struct LayoutCtx {
  ShapeCache shapes;
  bool packed_matmul;                            // PACKED_MATMUL=0 turns the panelled matmul off
  std::unordered_map<std::string, bool> serial;  // device -> runs kernels with output loops in order (a CPU)
  std::vector<UOpRef> keep;

  bool serial_device(const std::string& d) {
    if (auto it = serial.find(d); it != serial.end()) return it->second;
    Device& dev = get_device(d);
    return serial[d] = dev.runs_kernels() && dev.renderer().grid_limits().threads == 0;
  }
};

UOpRef mov(Ops op, const UOpRef& x, std::vector<int64_t> arg) { return UOp::make(op, x->dtype, {x}, std::move(arg)); }

// A large matrix product on a serial (CPU) device: C[i][j] = sum over k of A[i][k] B[k][j], written as a reduce over
// one axis of the product of two broadcasts (A broadcast along j, B along i; in any axis order: the forward matmul
// reduces its last axis, the gradients' matmuls another). B is first copied into panels of 32 columns, each K x 32
// and contiguous (Bp[j/32][k][j%32]), and the product is computed panel by panel, C'[j/32][i][j%32] = sum_k A[i][k]
// Bp[j/32][k][j%32], then permuted back. One panel (K x 128 bytes) stays in L2 while every row tile of A streams
// past it; B read in place has a row stride of N floats, so its column tiles alias in the cache sets and each row
// tile streamed all of B from memory again (N=4096: 105 -> 329 GFLOPS, bench/matmul). The sum over k runs in the
// same order as the plain kernel's: the same values. Packing copies B once (B at least 4 MiB: past L2); the plain
// kernel streams all of B from memory again for each tile of 8 rows of A, so the copy pays from 4 row tiles on
// (m >= 32: a LLaMA prefill's (64, 2048) x (2048, 5632) product 136 -> 26 ms, (128, 1024) x (1024, 1024) 7.4 -> 2.1 ms;
// at 8 rows, one tile, the copy is pure cost: 17 -> 26 ms). A B computed by the kernel that packs it (a quantised
// weight dequantised from its blocks) is dequantised once, straight into the panels.
UOpRef packed_matmul(const UOp* red, LayoutCtx& c) {
  constexpr int64_t P = 32, kPackMinRows = 32;
  const auto& ra = std::get<ReduceArg>(red->arg);
  const UOp* mul = red->src(0);
  if (!c.packed_matmul || ra.op != Ops::ADD || ra.axes.size() != 1 || mul->op != Ops::MUL ||
      mul->dtype != dtypes::float32 || red->sym() || mul->sym())
    return {};
  // The product's axes of size 1 (a batch of one: a model's (1, T, D) activations) are dropped first: the rule sees
  // the three axes m, n and k, and the result is reshaped back to the reduce's shape.
  const Shape& full = c.shapes.of(mul);
  std::vector<int64_t> live;
  for (int64_t i = 0; i < int64_t(full.size()); i++)
    if (full[size_t(i)] != 1) live.push_back(i);
  auto at = std::find(live.begin(), live.end(), ra.axes[0]);
  if (live.size() != 3 || at == live.end()) return {};
  const int64_t r = at - live.begin();
  auto squeeze = [&](const Shape& x) { return Shape{x[size_t(live[0])], x[size_t(live[1])], x[size_t(live[2])]}; };
  const Shape s = squeeze(full);
  std::vector<int64_t> rest;  // the output axes
  for (int64_t i = 0; i < 3; i++)
    if (i != r) rest.push_back(i);
  // (i axis, j axis): the panels' columns are the output's inner axis where both orders fit
  const std::pair<int64_t, int64_t> orders[2] = {{rest[0], rest[1]}, {rest[1], rest[0]}};
  for (auto [im, jn] : orders)
    for (int side = 0; side < 2; side++) {
      const UOp* ea = mul->src(size_t(side));      // A: broadcast along j
      const UOp* eb = mul->src(size_t(1 - side));  // B: broadcast along i
      if (ea->op != Ops::EXPAND || eb->op != Ops::EXPAND || ea->sym() || eb->sym() ||
          c.shapes.of(ea->src(0)).size() != full.size() || c.shapes.of(eb->src(0)).size() != full.size())
        continue;
      const Shape as = squeeze(c.shapes.of(ea->src(0))), bs = squeeze(c.shapes.of(eb->src(0)));
      int64_t m = s[size_t(im)], n = s[size_t(jn)], k = s[size_t(r)];
      if (as[size_t(jn)] != 1 || as[size_t(im)] != m || as[size_t(r)] != k || bs[size_t(im)] != 1 ||
          bs[size_t(jn)] != n || bs[size_t(r)] != k || m == 1 || n == 1)
        continue;
      if (n % P || m < kPackMinRows || k * n * 4 < (int64_t(4) << 20)) return {};
      if (!c.serial_device(device_of(red))) return {};  // GPUs tile in the kernel
      std::vector<int64_t> perm{im, jn, r}, inv(3);
      for (int64_t i = 0; i < 3; i++) inv[size_t(perm[size_t(i)])] = i;
      bool same = perm == std::vector<int64_t>{0, 1, 2};
      UOpRef a = ea->src()[0], b = eb->src()[0];
      if (full.size() != 3) a = mov(Ops::RESHAPE, a, as), b = mov(Ops::RESHAPE, b, bs);
      if (!same) a = mov(Ops::PERMUTE, a, perm), b = mov(Ops::PERMUTE, b, perm);  // (m, 1, k) and (1, n, k)
      UOpRef bp = UOp::make(Ops::CONTIGUOUS, b->dtype, {mov(Ops::PERMUTE, mov(Ops::RESHAPE, b, {n / P, P, k}), {0, 2, 1})});
      UOpRef pa = mov(Ops::EXPAND, mov(Ops::RESHAPE, a, {1, m, k, 1}), {n / P, m, k, P});
      UOpRef pb = mov(Ops::EXPAND, mov(Ops::RESHAPE, bp, {n / P, 1, k, P}), {n / P, m, k, P});
      UOpRef prod = UOp::make(Ops::REDUCE_AXIS, red->dtype, {pa->alu(Ops::MUL, pb)}, ReduceArg{Ops::ADD, {2}});
      UOpRef cp = UOp::make(Ops::CONTIGUOUS, red->dtype, {mov(Ops::RESHAPE, prod, {n / P, m, P})});
      UOpRef out = mov(Ops::RESHAPE, mov(Ops::PERMUTE, cp, {1, 0, 2}), {m, n, 1});
      if (!same) out = mov(Ops::PERMUTE, out, inv);
      if (full.size() != 3) out = mov(Ops::RESHAPE, out, c.shapes.of(red));
      c.keep.push_back(out);
      return out;
    }
  return {};
}

const PatternMatcher& pm_layout() {
  using namespace pat;
  static const PatternMatcher pm(
      table(rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return packed_matmul(m.root, m.template ctx<LayoutCtx>()); })));
  return pm;
}

}  // namespace

std::vector<UOpRef> apply_layouts(std::span<const UOpRef> roots, const Knobs& knobs) {
  LayoutCtx ctx{{}, knobs.packed_matmul, {}, {}};
  return rewrite_roots(roots, pm_layout(), &ctx, "layouts");
}

}  // namespace tg::sched
