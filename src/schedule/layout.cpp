// Stage "layouts" of the scheduler: rules that choose how a computation lays out its operands in memory, given the
// capabilities of the device it runs on (pm_layout). They run on the tensor graph before anything else, so they
// apply however the computation was written: `a.matmul(b)`, `(a.reshape({m,1,k}) * b.T().reshape({1,n,k})).sum(2)`
// and the matmuls autograd builds for a gradient are one pattern.
#include "stages.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <span>

#include "../tensor/conv.hpp"
#include "tg/gradient.hpp"

namespace tg::sched {

namespace {

struct LayoutCtx {
  ShapeCache shapes;
  bool packed_matmul;                            // PACKED_MATMUL=0 turns the panelled matmul off
  bool channels_last;                            // CHANNELS_LAST=0 turns the channels-last convolution off
  bool conv_input_grad;                          // CONV_INPUT_GRAD=0 leaves autograd's convolution input gradient as is
  bool int_dot;                                  // INT_DOT=0 turns the integer block sums off
  bool int_gemm;                                 // INT_GEMM=0 turns the int8 GEMM (from 32 rows) off
  std::unordered_map<std::string, bool> serial;  // device -> runs kernels with output loops in order (a CPU)
  std::vector<UOpRef> keep;
  NodeSet made;  // reduces a rule made: not rewritten again

  UOpRef made_reduce(UOpRef r) {
    made.insert(r.get());
    keep.push_back(r);
    return r;
  }
  std::unordered_map<std::string, int64_t> l2;   // device -> per-core L2 bytes of its machine model (0: unknown)
  bool serial_device(const std::string& d) {
    if (auto it = serial.find(d); it != serial.end()) return it->second;
    Device& dev = get_device(d);
    return serial[d] = dev.runs_kernels() && dev.renderer().grid_limits().threads == 0;
  }
  // Whether the device's vector ISA multiplies and adds 8/16-bit integers into 32-bit sums (x86 vpmaddwd from AVX2
  // on, vpdpwssd/vpdpbusd with VNNI; AArch64 NEON sdot/smlal): what the integer block dot products need to beat the
  // float ones. SSE-only, AVX1 and scalar machine models keep the float products.
  bool int_simd(const std::string& d) {
    const std::string& isa = get_device(d).machine().isa;
    return isa == "AVX-512" || isa.starts_with("AVX2") || isa == "NEON" || isa == "SVE";
  }
  // Whether one vector instruction sums 4 byte products into each int32 lane (vpdpbusd): the int8 GEMM's inner step.
  bool int8_dot(const std::string& d) { return get_device(d).machine().int8_dot; }
  int64_t l2_bytes(const std::string& d) {
    if (auto it = l2.find(d); it != l2.end()) return it->second;
    return l2[d] = get_device(d).machine().l2_bytes;
  }
};

// Rows of A per M block of the panelled matmul: each panel (K x 32) meets one block of A at a time, so the block
// (mc x K floats) is read from cache by every panel instead of all of A streaming from memory once per panel. The
// block is at most 4 L2s (the L3 share near a core on the CPUs seen: Zen 3 and Zen 5 have 4 MiB of L3 per 512 KiB
// or 1 MiB L2; unknown: 2 MiB), used where A is more than twice that: N=4096 on Zen 5 (1 MiB L2): 256 rows, 1
// thread 0.99-1.02x OpenBLAS against 0.87-0.91x unblocked in the same runs. The largest divisor of m that is a
// multiple of 8 (the row tiles) and fits; m itself (one block) where none of 64 rows or more does.
int64_t m_block(int64_t m, int64_t k, int64_t l2) {
  constexpr int64_t kUnknownL2 = int64_t(2) << 20, kMinRows = 64;
  const int64_t block = 4 * (l2 > 0 ? l2 : kUnknownL2);
  if (m * k * 4 <= 2 * block) return m;
  for (int64_t mc = std::min(m / 2, block / (k * 4)) / 8 * 8; mc >= kMinRows; mc -= 8)
    if (m % mc == 0) return mc;
  return m;
}

// Rows of K per slice of the panelled matmul: a panel (K x 32 floats) past half the per-core L2 of the machine model
// (unknown: 2 MiB) leaves no room for A's row tiles streaming past it, which evict it, so it is read again from L3
// for every row tile: K is halved until the panel slice fits. Zen 5 (1 MiB L2), 1 thread, (512, K) x (K, 2048)
// float32 unsliced: K = 2048 215 GFLOPS, 4096 211, 8192 184 (a LLaMA's FFN down projection).
int64_t k_block(int64_t k, int64_t p, int64_t l2) {
  constexpr int64_t kUnknownL2 = int64_t(2) << 20, kMinK = 256;
  const int64_t half = (l2 > 0 ? l2 : kUnknownL2) / 2;
  int64_t kc = k;
  while (kc * p * 4 > half && kc % 2 == 0 && kc / 2 >= kMinK) kc /= 2;
  return kc;
}

UOpRef mov(Ops op, const UOpRef& x, std::vector<int64_t> arg) { return UOp::make(op, x->dtype, {x}, std::move(arg)); }

// Rows of A from which a copy of B made once for a product pays (the panels below, shared_operand's copies): 4 tiles
// of the register tile's 8 rows read it, where the plain kernel would read B in place 4 times.
constexpr int64_t kPackMinRows = 32;

// A large matrix product on a serial (CPU) device: C[i][j] = sum over k of A[i][k] B[k][j], written as a reduce over
// one axis of the product of two broadcasts (A broadcast along j, B along i; in any axis order: the forward matmul
// reduces its last axis, the gradients' matmuls another). B is first copied into panels of 32 columns, each K x 32
// and contiguous (Bp[j/32][k][j%32]), and the product is computed panel by panel, C'[j/32][i][j%32] = sum_k A[i][k]
// Bp[j/32][k][j%32], then permuted back. One panel (K x 128 bytes) stays in L2 while every row tile of A streams
// past it; B read in place has a row stride of N floats, so its column tiles alias in the cache sets and each row
// tile streamed all of B from memory again (N=4096: 105 -> 329 GFLOPS, bench/matmul). The sum over k runs in the
// same order as the plain kernel's: the same values. A large A is taken in M blocks (m_block): C''[i/mc][j/32][i%mc][j%32]. Packing copies B once (B at least 4 MiB, or past half the
// machine model's per-core L2 with 256 rows of A: 2 MiB on Emerald Rapids, 1 MiB on Zen 5, 512 KiB on Zen 3); the plain
// kernel streams all of B from memory again for each tile of 8 rows of A, so the copy pays from 4 row tiles on
// (m >= 32: a LLaMA prefill's (64, 2048) x (2048, 5632) product 136 -> 26 ms, (128, 1024) x (1024, 1024) 7.4 -> 2.1 ms;
// at 8 rows, one tile, the copy is pure cost: 17 -> 26 ms). A B computed by the kernel that packs it (a quantised
// weight dequantised from its blocks) is dequantised once, straight into the panels.
UOpRef packed_matmul(const UOp* red, LayoutCtx& c) {
  constexpr int64_t P = 32, kPackMinRowsNearB = 256, kFarB = int64_t(4) << 20,
                    kUnknownL2 = int64_t(2) << 20;
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
      if (n % P || m < kPackMinRows) return {};
      if (!c.serial_device(device_of(red))) return {};  // GPUs tile in the kernel
      // B of 4 MiB or more: from 32 rows on. A smaller B past half the per-core L2 of the machine model (unknown:
      // 2 MiB; the other half is for A's row tiles and C streaming past it): from 256 rows on, where the copy pays on
      // Zen 5 (1 MiB L2, 1 thread: (512,512)x(512,512) packed 0.90-0.96x the plain time, (256,768)x(768,768) 0.76x;
      // from 32 to 128 rows 1.05-1.28x: the plain kernel reads such a B from L3 fast enough).
      const int64_t l2 = c.l2_bytes(device_of(red)), bytes = k * n * 4;
      if (bytes < kFarB && (bytes <= (l2 > 0 ? l2 : kUnknownL2) / 2 || m < kPackMinRowsNearB)) return {};
      std::vector<int64_t> perm{im, jn, r}, inv(3);
      for (int64_t i = 0; i < 3; i++) inv[size_t(perm[size_t(i)])] = i;
      bool same = perm == std::vector<int64_t>{0, 1, 2};
      UOpRef a = ea->src()[0], b = eb->src()[0];
      if (full.size() != 3) a = mov(Ops::RESHAPE, a, as), b = mov(Ops::RESHAPE, b, bs);
      if (!same) a = mov(Ops::PERMUTE, a, perm), b = mov(Ops::PERMUTE, b, perm);  // (m, 1, k) and (1, n, k)
      UOpRef bp = UOp::make(Ops::CONTIGUOUS, b->dtype, {mov(Ops::PERMUTE, mov(Ops::RESHAPE, b, {n / P, P, k}), {0, 2, 1})});
      // M blocks of mc rows, outermost: C''[i/mc][j/32][i%mc][j%32]. Each panel then meets mc rows of A per pass
      // and A's block (mc x K) stays in cache across all panels, where one pass over all rows per panel streams
      // all of A from memory N/32 times.
      const int64_t kc = k_block(k, P, l2), kb = k / kc, mc = m_block(m, kc, l2), mb = m / mc;
      UOpRef out;
      if (kb == 1) {
        UOpRef pa = mov(Ops::EXPAND, mov(Ops::RESHAPE, a, {mb, 1, mc, k, 1}), {mb, n / P, mc, k, P});
        UOpRef pb = mov(Ops::EXPAND, mov(Ops::RESHAPE, bp, {1, n / P, 1, k, P}), {mb, n / P, mc, k, P});
        UOpRef prod = UOp::make(Ops::REDUCE_AXIS, red->dtype, {pa->alu(Ops::MUL, pb)}, ReduceArg{Ops::ADD, {3}});
        UOpRef cp = UOp::make(Ops::CONTIGUOUS, red->dtype, {mov(Ops::RESHAPE, prod, {mb, n / P, mc, P})});
        out = mov(Ops::RESHAPE, mov(Ops::PERMUTE, cp, {0, 2, 1, 3}), {m, n, 1});
      } else {
        // K in kb slices of kc rows (k_block): one panelled product per slice, its panel slices (kc x 32) small
        // enough to stay in L2, Cs[s][i/mc][j/32][i%mc][j%32]; the consumer adds the kb partial sums.
        UOpRef as = mov(Ops::PERMUTE, mov(Ops::RESHAPE, a, {mb, mc, kb, kc}), {2, 0, 1, 3});  // (kb, mb, mc, kc)
        UOpRef pa = mov(Ops::EXPAND, mov(Ops::RESHAPE, as, {kb, mb, 1, mc, kc, 1}), {kb, mb, n / P, mc, kc, P});
        UOpRef bs = mov(Ops::PERMUTE, mov(Ops::RESHAPE, bp, {n / P, kb, kc, P}), {1, 0, 2, 3});  // (kb, n/P, kc, P)
        UOpRef pb = mov(Ops::EXPAND, mov(Ops::RESHAPE, bs, {kb, 1, n / P, 1, kc, P}), {kb, mb, n / P, mc, kc, P});
        UOpRef prod = UOp::make(Ops::REDUCE_AXIS, red->dtype, {pa->alu(Ops::MUL, pb)}, ReduceArg{Ops::ADD, {4}});
        UOpRef cp = UOp::make(Ops::CONTIGUOUS, red->dtype, {mov(Ops::RESHAPE, prod, {kb, mb, n / P, mc, P})});
        UOpRef sum = c.made_reduce(UOp::make(Ops::REDUCE_AXIS, red->dtype, {cp}, ReduceArg{Ops::ADD, {0}}));
        out = mov(Ops::RESHAPE, mov(Ops::PERMUTE, mov(Ops::RESHAPE, sum, {mb, n / P, mc, P}), {0, 2, 1, 3}), {m, n, 1});
      }
      if (!same) out = mov(Ops::PERMUTE, out, inv);
      if (full.size() != 3) out = mov(Ops::RESHAPE, out, c.shapes.of(red));
      c.keep.push_back(out);
      return out;
    }
  return {};
}

// ---- quantised weights: integer dot products

// The value of a constant tensor (a CONST under movement ops and casts), if it is one.
std::optional<double> const_value(const UOp* u) {
  while ((is_movement(u->op) || u->op == Ops::CAST) && !u->sym()) u = u->src(0);
  if (u->op != Ops::CONST) return {};
  return u->const_float();
}

// A weight dequantised from blocks by tensor ops (nn::ggml_dequantize): w = (q + offset) * scale, shape (..., nb, 32),
// q an integer of at most 8 bits (q8_0's int8, q4_0's nibble with offset -8), scale one float per block broadcast
// over its 32 elements.
struct Dequant {
  UOpRef q;
  int64_t offset = 0;
  UOpRef scale;
};
std::optional<Dequant> dequant_of(const UOp* b, int64_t block, LayoutCtx& c) {
  if (b->op != Ops::MUL || b->dtype != dtypes::float32 || b->sym()) return {};
  const Shape& bs = c.shapes.of(b);
  if (bs.size() < 2 || bs.back() != block) return {};
  for (size_t side = 0; side < 2; side++) {
    const UOp *v = b->src(side), *s = b->src(1 - side);
    if (s->op != Ops::EXPAND || s->sym() || c.shapes.of(s->src(0)).back() != 1) continue;
    int64_t offset = 0;
    if ((v->op == Ops::ADD || v->op == Ops::SUB) && !v->sym()) {
      std::optional<double> k = const_value(v->src(1));
      const UOp* rest = v->src(0);
      if (!k && v->op == Ops::ADD) k = const_value(v->src(0)), rest = v->src(1);
      if (!k || *k != std::trunc(*k) || std::fabs(*k) > 128) continue;
      offset = int64_t(v->op == Ops::SUB ? -*k : *k);
      v = rest;
    }
    if (v->op != Ops::CAST || v->sym() || !dtypes::is_int(v->src(0)->dtype) || v->src(0)->dtype.bitsize() > 8) continue;
    return Dequant{UOpRef(v->src(0)), offset, UOpRef(s)};
  }
  return {};
}

// The largest and smallest value of an integer tensor (its bounds, through movement ops; else its dtype's range).
std::pair<int64_t, int64_t> int_range(const UOp* u) {
  while (is_movement(u->op) && !u->sym()) u = u->src(0);
  if (u->op == Ops::AND && !u->sym())  // a mask (q4_0's nibbles: & 15, the constant broadcast)
    for (int side = 0; side < 2; side++)
      if (std::optional<double> m = const_value(u->src(side)); m && *m >= 0 && *m == std::trunc(*m)) return {0, int64_t(*m)};
  if (u->bounds().known) return {u->vmin(), u->vmax()};
  const int64_t bits = int64_t(u->dtype.bitsize());
  if (dtypes::is_unsigned(u->dtype)) return {0, (int64_t(1) << bits) - 1};
  return {-(int64_t(1) << (bits - 1)), (int64_t(1) << (bits - 1)) - 1};
}

// A prompt's product with a weight quantised in blocks of 32 (from 32 rows of x on), as an int8 GEMM: x quantised
// per block as int_dot_product does, and every block's 32 products summed in int32 four bytes at a time, the form
// x86's vpdpbusd computes (16 int32 lanes, each the sum of 4 unsigned-by-signed byte products), then scaled once per
// block by x's and the weight's scales:
//   y[i][j] = sum over blocks b of (float(sum over groups g < 8 of dot4(U, S)) + corr) * dx[i][b] * dw[j][b]
// dot4 multiplies the four bytes of two int32 words, one side's unsigned, the other's signed: the weight's codes q4_0
// (nibbles 0..15, unsigned; x's int8 signed; the -8 offset as corr = -8 * x's block sum) or q8_0 (int8, signed; x's
// codes + 128 unsigned, corr = -128 * the weight's block sum); corr is a float product of its own over the blocks. The weight's codes are packed once, as packed_matmul
// packs floats, into panels of 16 columns: word (j/16, b, g, j%16) holds codes 4g..4g+3 of column j's block b, so a
// 64-byte vector load gives a group of 4 codes of 16 columns; x's words are read one at a time and broadcast. The
// product runs panel by panel, the output's 16 columns a vector of lanes and a tile of x's rows sharing each load of
// the weight (the heuristic's register tile); lowering's factor_reduce_invariants sums each block's groups in int32
// lanes and scales them once; the CPU compiler turns each dot4 into one vpdpbusd (QuadMulAdd, llvm_jit.cpp).
// The values are the integer sums of x's quantised blocks, as int_dot_product's (and llama.cpp's). Chosen where the
// machine model has the 4-byte dot product (int8_dot: AVX512-VNNI, AVX-VNNI). INT_GEMM=0 turns it off (the packed
// float GEMM of dequantised panels).
UOpRef int_gemm(const UOp* red, const UOp* ex, const UOp* w, const Shape& xs, const std::vector<const UOp*>& path,
                const Dequant& dq, LayoutCtx& c) {
  constexpr int64_t B = 32, L = 16, G = B / 4;
  if (!c.int_gemm) return {};
  const UOp* mul = red->src(0);
  const Shape& f = c.shapes.of(mul);
  const int64_t n = int64_t(f.size()), k = f.back(), nb = k / B;
  const std::string dev = device_of(red);
  // x's rows are the leading axes up to its last one of size > 1 (x broadcast along the rest, W along them): M rows,
  // N columns; axes of size 1 (a batch of one) may lead either
  int64_t split = 0;
  for (int64_t a = 0; a < n - 1; a++)
    if (xs[size_t(a)] != 1) split = a + 1;
  int64_t m = 1, cols = 1;
  for (int64_t a = 0; a < n - 1; a++) (a < split ? m : cols) *= f[size_t(a)];
  for (int64_t a = 0; a < split; a++)
    if (xs[size_t(a)] != f[size_t(a)]) return {};
  if (w->op != Ops::EXPAND || w->sym()) return {};
  const Shape& wb = c.shapes.of(w->src(0));
  for (int64_t a = 0; a < n; a++)
    if (wb[size_t(a)] != (a < split ? 1 : f[size_t(a)])) return {};  // a weight per row (a batched product), or one
                                                                      // broadcast along its own axes: not this GEMM
  if (cols % L) return {};
  auto [qmin, qmax] = int_range(dq.q.get());
  qmin += dq.offset, qmax += dq.offset;
  // U: the weight's codes unsigned (q4_0's nibbles, the offset from x's sums); S: signed (q8_0), x's unsigned
  const bool unsigned_w = dtypes::is_unsigned(dq.q->dtype) && int_range(dq.q.get()).second <= 127;
  const bool signed_w = !unsigned_w && qmin >= -128 && qmax <= 127;
  // Without the 4-byte dot product (AVX2: pmaddubsw + pmaddwd, 2 instructions a group and a half-rate multiply) q4_0's
  // product ran at 0.87x the float GEMM (bench/qmatvec 512 x 2048 x 2048, TG_CPU=haswell): the float GEMM there.
  if (!c.int8_dot(dev) || !(unsigned_w || signed_w)) return {};
  // Packing the weight's words is paid once per product (a strided gather of 16 columns' bytes, each word the OR of
  // four): from 32 rows on (int_dot_product's kMaxRows) the int8 GEMM is the faster product for q8_0 and q4_0 alike
  // (bench/qmatvec 5632 x 2048 against the packed float GEMM, Zen 5: THREADS=1 1.45-1.61x at 32 rows, 1.52-1.61x at
  // 64; 2 threads 1.33-1.59x at 32, 1.80-1.83x at 128).
  const int64_t umask = unsigned_w && int_range(dq.q.get()).second <= 15 ? 15 : 255;
  auto i32 = [](int64_t v) { return Tensor(int(v)).cast(dtypes::int32); };
  // codes (cols, nb, 32): the weight's integers (q8_0: q; q4_0: the nibble, its -8 applied through x's sums)
  Tensor q = Tensor(dq.q, c.shapes.of(dq.q.get()), dev).cast(dtypes::int32);
  if (signed_w && dq.offset) q = q + i32(dq.offset);
  Shape blocks(f.begin(), f.end() - 1);
  blocks.insert(blocks.end(), {nb, B});
  // The weight's view without its broadcast over x's rows (path[0] = w, that EXPAND; the rows' axes of size 1): one
  // row of it, as the codes and scales are per column. Through the EXPAND and a SHRINK back to one row instead, the
  // realize map saw q4_0's decoded nibbles copied M times (its broadcast cost) and computed them into a buffer of
  // int32 codes, 8x the nibbles' bytes, before the word packing read them back (a 5632 x 2048 weight at 512 rows:
  // 1.3 ms for the codes and 3.2 ms for the words, of an 18 ms product, Zen 5).
  Shape blocks1 = blocks;
  for (int64_t a = 0; a < split; a++) blocks1[size_t(a)] = 1;
  auto view = [&](const UOpRef& base) {
    UOpRef v = base;
    for (size_t j = path.size(); j-- > 1;) v = UOp::make(path[j]->op, v->dtype, {v}, path[j]->arg);
    return Tensor(v, wb, dev).reshape(blocks1);
  };
  Tensor codes = view(q.uop()).reshape({cols, nb, B});
  Tensor dw = view(dq.scale).reshape({cols, nb, B}).shrink({{0, cols}, {0, nb}, {0, 1}}).reshape({cols, nb});
  // four int32 codes (..., 4) as one word, code t in byte t
  // (arange's RANGE, made here: Tensor::arange off the default device materialises a buffer, and this graph's
  // buffers are numbered already; a RANGE runs where the graph's buffers are)
  Tensor shifts = Tensor(UOp::make(Ops::RANGE, dtypes::uint32, {UOp::cnst_int(dtypes::index, 4)},
                                   std::vector<int64_t>{-1, int64_t(AxisType::Loop), 4}), {4}, dev) *
                  Tensor(8).cast(dtypes::uint32);
  // x's words: the sum of its 4 shifted codes (a reduce: each code, rounded from x, computed once per word); the
  // weight's: their OR, elementwise (the reduce's int64 lane sums ran at 7 GB/s; q4_0 5632 x 2048: 2.35 -> 1.6 ms)
  auto words = [&](const Tensor& v) {
    Tensor bytes = v.bitwise_and(i32(255)).cast(dtypes::uint32).lshift(shifts);
    return bytes.sum({-1}, false, dtypes::uint32).bitcast(dtypes::int32);
  };
  auto or_words = [&](const Tensor& v) {
    std::vector<std::pair<int64_t, int64_t>> at;
    for (int64_t e : v.shape()) at.emplace_back(0, e);
    Tensor w;
    for (int64_t t = 0; t < 4; t++) {
      at.back() = {t, t + 1};
      Tensor b = v.shrink(at).bitwise_and(i32(255)).cast(dtypes::uint32);
      if (t) b = b.lshift(Tensor(int(8 * t)).cast(dtypes::uint32));
      w = t ? w.bitwise_or(b) : b;
    }
    Shape ws = v.shape();
    ws.pop_back();
    return w.reshape(ws).bitcast(dtypes::int32);
  };
  // the weight's panels (cols/16, nb, 8, 16) of words, its scales (cols/16, nb, 16)
  Tensor wp = or_words(codes.reshape({cols / L, L, nb, G, 4}).permute({0, 2, 3, 1, 4})).contiguous();
  Tensor dwp = dw.reshape({cols / L, L, nb}).permute({0, 2, 1}).contiguous();
  // x's blocks: d = max|x| / 127 (float16, as ggml's block_q8_0), q = round(x / d); its words (m, nb, 8)
  // x computed (a SwiGLU's silu(gate) * up, a norm's scaling) is computed once into a buffer: its blocks' maxima,
  // codes and sums are kernels of their own, and each computed it again (the down projection's input, silu's exp and
  // the gate's and up's corrections per element in three kernels: 21 ms of a 512-token layer's ~131, 1B shape, 2
  // threads, Zen 5, PROFILE=1 of a 4-layer prefill of 526 ms)
  UOpRef xu = UOpRef(ex->src(0));
  const UOp* xb = xu.get();
  while (is_movement(xb->op) && !xb->sym()) xb = xb->src(0);
  if (is_alu(xb->op) || xb->op == Ops::CAST) xu = UOp::make(Ops::CONTIGUOUS, xu->dtype, {xu});
  Tensor x = Tensor(xu, xs, dev).reshape({m, nb, B});
  Tensor d = x.abs().max(-1, true) / Tensor(127.0);
  Tensor xq = d.eq(Tensor(0.0)).where(Tensor(0.0), x / d).round().cast(dtypes::int32);
  Tensor xw = words(xq.reshape({m, nb, G, 4}));
  if (signed_w) xw = xw.bitwise_xor(i32(int32_t(0x80808080u)));  // x + 128 in each byte
  xw = xw.contiguous();
  Tensor dx = d.cast(dtypes::float16).cast(dtypes::float32).reshape({m, nb}).contiguous();
  // the product's axes (cols/16, m, 16, nb, 8), summed over the last two
  const Shape p5{cols / L, m, L, nb, G};
  Tensor wv = wp.permute({0, 3, 1, 2}).reshape({cols / L, 1, L, nb, G}).expand(p5);
  Tensor xv = xw.reshape({1, m, 1, nb, G}).expand(p5);
  const Tensor& uw = unsigned_w ? wv : xv;
  const Tensor& sw = unsigned_w ? xv : wv;
  // every value 32-bit (the vectorize stage packs only those): a signed byte as (w << (24 - 8t)) >> 24 (arithmetic);
  // the four products of a word's bytes one sum (one vpdpbusd: QuadMulAdd, llvm_jit.cpp)
  Tensor dot;
  for (int64_t t = 0; t < 4; t++) {
    Tensor ub = (t ? uw.rshift(i32(8 * t)) : uw).bitwise_and(i32(umask));
    Tensor sb = (t < 3 ? sw.lshift(i32(24 - 8 * t)) : sw).rshift(i32(24));
    dot = t ? dot + ub * sb : ub * sb;
  }
  Tensor scale = dx.reshape({1, m, 1, nb, 1}).expand({cols / L, m, 1, nb, 1}) *
                 dwp.permute({0, 2, 1}).reshape({cols / L, 1, L, nb, 1}).expand({cols / L, m, L, nb, 1});
  Tensor y = (dot.cast(dtypes::float32) * scale.expand(p5)).sum({3, 4}, false, dtypes::float32).contiguous();
  y = y.permute({1, 0, 2}).reshape({m, cols});
  // the offsets' correction, a float product of its own over the blocks (1/32 of the product's terms; in the integer
  // sum it was a gated term per block, which kept the kernel's copies from packing into vectors): q4_0's -8 times
  // x's block sums, q8_0's x + 128 as -128 times the weight's block sums
  if (unsigned_w && dq.offset) {
    Tensor xsum = xq.sum({-1}, false, dtypes::int32).cast(dtypes::float32).reshape({m, nb});
    y = y + (xsum * dx * Tensor(double(dq.offset))).matmul(dw.T());
  } else if (!unsigned_w) {
    Tensor wsum = codes.sum({-1}, false, dtypes::int32).cast(dtypes::float32);
    y = y + dx.matmul((wsum * dw * Tensor(-128.0)).T());
  }
  UOpRef out = y.reshape(c.shapes.of(red)).uop();
  c.keep.push_back(out);
  return out;
}

// A float matrix-vector product with a weight quantised in blocks of 32 (a decode step's linear layers on Q8_0 and
// Q4_0 weights), y[..., j] = sum over k of x[..., k] w[j, k], computed as ggml's CPU backend does: x is quantised
// once per product, in kernels of its own (the blocks' maxima, then the blocks), to blocks of 32 int8 with one scale
// each (quantize_row_q8_0: d = max|x| / 127, kept as float16, q = round(x / d)), and the sum runs per block over
// integers, scaled once:
//   y = sum over blocks b of float(sum over i < 32 of xq[b][i] * wq[b][i]) * dx[b] * dw[b].
// The inner sums are 8-bit products summed in 32 bits (factor_reduce_invariants sums a block's integer terms per
// lane in int32); the weight is read as stored and never converted to float element by element. The values change by
// x's quantisation (at most about half a step, max|x| / 254, per element): llama.cpp's numerics, not a float
// product's. Matched on the tensor graph: a sum over the last axis of EXPAND(x) * W, W the dequantised weight under
// movement ops (matmul's transposes and reshapes) that keep the summed axis whole down to the reshape merging its
// blocks (..., nb, 32) -> (..., nb * 32). Serial devices (CPUs) whose vector ISA has integer multiply-adds
// (int_simd), fewer than 32 rows of x (a decode step, a short prompt; from 32 rows on int_gemm, else packed_matmul
// dequantises the weight once into float panels for a GEMM), and one row only for codes with an offset (q4_0). On by default
// (INT_DOT=0 turns it off). The CPU compiler turns the lane sums into byte multiply-adds
// (backends/cpu/llvm_jit.cpp): q8_0's adjacent pairs of products into vpmaddwd
// (vpdpwssd with VNNI; PairMulAdd), q4_0's nibbles into vpdpbusd (VNNI: a lane the two nibbles of two adjacent bytes,
// 4 products, lowering's quads) or pmaddubsw (ByteMulAdd). bench/qmatvec
// (5632 x 2048, Zen 5, THREADS=1 and 2): q8_0 1.20-1.22x the float product native, 1.26-1.34x TG_CPU=haswell; q4_0
// 1.17-1.18x native, 1.09-1.13x haswell.
UOpRef int_dot_product(const UOp* red, LayoutCtx& c) {
  constexpr int64_t B = 32, kMaxRows = 32;
  const auto& ra = std::get<ReduceArg>(red->arg);
  const UOp* mul = red->src(0);
  if (!c.int_dot || ra.op != Ops::ADD || mul->op != Ops::MUL || mul->dtype != dtypes::float32 || red->sym() || mul->sym())
    return {};
  const Shape& f = c.shapes.of(mul);
  const int64_t n = int64_t(f.size()), k = f.back();
  if (ra.axes != std::vector<int64_t>{n - 1} || k < B || k % B) return {};  // (an empty sum: no blocks)
  const std::string dev = device_of(red);
  if (!c.serial_device(dev) || !c.int_simd(dev)) return {};
  auto prod = [](const Shape& s, int64_t e) {
    int64_t p = 1;
    for (int64_t i = 0; i < e; i++) p *= s[size_t(i)];
    return p;
  };
  for (size_t side = 0; side < 2; side++) {
    const UOp *ex = mul->src(side), *w = mul->src(1 - side);
    if (ex->op != Ops::EXPAND || ex->sym() || c.shapes.of(ex->src(0)).size() != f.size()) continue;
    const Shape xs = c.shapes.of(ex->src(0));
    if (xs.back() != k) continue;
    // Down W's movement ops with the summed axis `a`: an EXPAND leaves it whole, a PERMUTE moves it, a RESHAPE keeps
    // it where an axis of the same size starts at the same flat offset (the same prefix product) and merges it from
    // the blocks at the bottom; anything else (a SHRINK, PAD or FLIP of it) is not this product.
    std::vector<const UOp*> path;
    const UOp* u = w;
    int64_t a = n - 1;
    bool merged = false;
    while (is_movement(u->op) && !u->sym() && !merged) {
      const Shape &o = c.shapes.of(u), &i = c.shapes.of(u->src(0));
      const int64_t pre = prod(o, a);
      if (u->op == Ops::EXPAND) {
        if (i[size_t(a)] != k) break;
      } else if (u->op == Ops::PERMUTE) {
        a = std::get<std::vector<int64_t>>(u->arg)[size_t(a)];
      } else if (u->op == Ops::RESHAPE) {
        int64_t at = -1;
        for (int64_t j = 0; j < int64_t(i.size()) && at < 0; j++)
          if (i[size_t(j)] == k && prod(i, j) == pre) at = j;
        const size_t r = i.size();
        if (at >= 0) a = at;
        else if (r >= 2 && i[r - 1] == B && i[r - 2] * B == k && prod(i, int64_t(r) - 2) == pre) merged = true;
        else break;
      } else {
        break;
      }
      path.push_back(u);
      u = u->src(0);
    }
    if (!merged) continue;
    std::optional<Dequant> dq = dequant_of(u, B, c);
    if (!dq) continue;
    // Codes with an offset (q4_0's nibbles - 8): one row of x only. With more rows the scheduler computes the codes
    // (q - 8 as int32: 7x the blocks' bytes) into a buffer of their own for the rows to share (5632 x 2048: 46 MB
    // written, then read back by the product), and the product is slower than the float one, which decodes each
    // weight once per tile of rows in its own kernel (bench/qmatvec QMV_M, 5632 x 2048, 1 thread, Zen 5: 0.90x at 2
    // rows, 0.14-0.36x from 4; TG_CPU=haswell 0.91x and 0.45-0.48x).
    const int64_t rows = prod(xs, n) / k;
    if (rows >= kMaxRows) {
      if (UOpRef g = int_gemm(red, ex, w, xs, path, *dq, c)) return g;
      continue;
    }
    if (rows > 1 && dq->offset != 0) continue;
    Shape blocks(f.begin(), f.end() - 1), xb(xs.begin(), xs.end() - 1);
    blocks.insert(blocks.end(), {k / B, B});
    xb.insert(xb.end(), {k / B, B});
    Shape per_block = blocks;
    per_block.back() = 1;
    // the weight's integers and block scales in the product's shape: through W's own movement ops
    auto view = [&](const UOpRef& base) {
      UOpRef v = base;
      for (size_t j = path.size(); j-- > 0;) v = UOp::make(path[j]->op, v->dtype, {v}, path[j]->arg);
      return Tensor(v, f, dev).reshape(blocks);
    };
    Tensor q = Tensor(dq->q, c.shapes.of(dq->q.get()), dev).cast(dtypes::int32);
    if (dq->offset) q = q + Tensor(int(dq->offset)).cast(dtypes::int32);
    std::vector<std::pair<int64_t, int64_t>> first;
    for (int64_t d : per_block) first.emplace_back(0, d);
    Tensor wq = view(q.uop()), dw = view(dq->scale).shrink(first);
    // x's blocks: d = max|x| / 127 (rounded to float16 as ggml's block_q8_0 stores it), q = round(x / d) (ggml: x * (1/d),
    // the same but for a rare last-bit tie)
    Tensor x = Tensor(UOpRef(ex->src(0)), xs, dev).reshape(xb);
    Tensor d = x.abs().max(-1, true) / Tensor(127.0);
    Tensor xq = d.eq(Tensor(0.0)).where(Tensor(0.0), x / d).round().cast(dtypes::int8).contiguous();
    Tensor dx = d.cast(dtypes::float16).cast(dtypes::float32);
    // One sum over both block axes (a sum inside a sum would be two kernels): the products are integers (|xq wq| <=
    // 127 * 128) and the lowering's factor_reduce_invariants sums each block's in int32 and scales it once.
    Tensor prod = (xq.expand(blocks).cast(dtypes::int32) * wq).cast(dtypes::float32);
    Tensor y = (prod * (dx.expand(per_block) * dw).expand(blocks)).sum({n - 1, n}, true, dtypes::float32);
    UOpRef out = y.reshape(c.shapes.of(red)).uop();
    c.keep.push_back(out);
    return out;
  }
  return {};
}

// ---- convolutions
//
// A convolution of x (N, Ci, *sp) with w (Co, Ci, *k) reaches the scheduler as Tensor::conv writes it, for every
// device: the product of a window view of the padded input and the weight, (N, 1, Co, *o, Ci, *k), summed over
// (Ci, *k). Autograd's weight gradient is the same product with the output's gradient in the weight's place, summed
// over (N, *o). Both read their operands through movement ops only, so the rules below change where and in which
// order values are stored, never what is computed: each operand's base gets a copy in another axis order, read back
// through the inverse permutation.

// The operand's base for a copy: walking down the operand's movement ops, the node nearest the top of rank `rank`
// whose leading axes are `lead`, with no EXPAND between it and the first computed node below (above an EXPAND the
// view repeats values: the window view's repeat of the input). Its path from the operand down: `path`.
const UOp* view_base(const UOp* top, size_t rank, std::span<const int64_t> lead, LayoutCtx& c, std::vector<const UOp*>& path) {
  std::vector<const UOp*> chain{top};
  while (is_movement(chain.back()->op)) chain.push_back(chain.back()->src(0));
  const UOp* best = nullptr;
  size_t at = 0;
  for (size_t i = chain.size(); i-- > 0;) {  // from the bottom up
    const UOp* u = chain[i];
    if (u->op == Ops::EXPAND || u->sym()) break;
    const Shape& s = c.shapes.of(u);
    if (s.size() == rank && std::equal(lead.begin(), lead.end(), s.begin())) best = u, at = i;
  }
  if (best) path.assign(chain.begin(), chain.begin() + int64_t(at));  // the nodes above it, top first
  return best;
}

// The operand with `base` (on its path below the operand) replaced by `repl`.
UOpRef rebuild(const std::vector<const UOp*>& path, const UOpRef& repl) {
  UOpRef v = repl;
  for (size_t i = path.size(); i-- > 0;) v = UOp::make(path[i]->op, path[i]->dtype, {v}, path[i]->arg);
  return v;
}

// x stored with its axes in `perm` order and read back as x: the same values, another memory layout.
UOpRef stored_as(const UOpRef& x, const std::vector<int64_t>& perm) {
  return mov(Ops::PERMUTE, UOp::make(Ops::CONTIGUOUS, x->dtype, {mov(Ops::PERMUTE, x, perm)}), inverse_permutation(perm));
}
// (N, C, *sp) stored as (N, *sp, C)
UOpRef channels_last(const UOpRef& x, size_t nd) { return stored_as(x, channels_last_perm(nd + 2)); }

// A convolution-shaped reduce: a sum of a product of shape (N, G, Co/G, *o, Ci/G, *k) (nd spatial axes, G groups).
struct ConvShape {
  size_t nd = 0;
  int64_t n = 0, groups = 1, co = 0, ci = 0;  // co and ci per group
  Shape full;
};
std::optional<ConvShape> conv_shape(const UOp* red, LayoutCtx& c, bool weight_grad) {
  if (c.made.count(red)) return {};
  const auto& ra = std::get<ReduceArg>(red->arg);
  const UOp* mul = red->src(0);
  if (ra.op != Ops::ADD || mul->op != Ops::MUL || red->sym() || mul->sym() || !dtypes::is_float(mul->dtype)) return {};
  const Shape& f = c.shapes.of(mul);
  if (f.size() < 6 || f.size() % 2) return {};
  const size_t nd = (f.size() - 4) / 2;
  std::vector<int64_t> want;  // the forward sums (Ci/G, *k), the weight gradient (N, *o); axes of size 1 may be left out
  if (weight_grad) want.push_back(0);
  for (size_t i = 0; i < (weight_grad ? nd : nd + 1); i++) want.push_back(int64_t(weight_grad ? 3 + i : 3 + nd + i));
  for (int64_t a : ra.axes)
    if (std::find(want.begin(), want.end(), a) == want.end()) return {};
  for (int64_t a : want)
    if (f[size_t(a)] != 1 && std::find(ra.axes.begin(), ra.axes.end(), a) == ra.axes.end()) return {};
  return ConvShape{nd, f[0], f[1], f[2], f[3 + nd], f};
}

// x (N, C, *sp) stored channels-last for a convolution's window view. Where x pads its input along the outer spatial
// axes (a convolution's input gradient: the output's gradient padded by k - 1 on every side; a padded forward), that
// padding stays a bounds test above the copy, and only the last spatial axis's is stored: the window view then reads
// a row of kernel taps that lies wholly in the padding under a test that depends on the output row and the tap row
// alone, and lowering's narrow_gated_reduces runs the tap loop over the valid rows only (mnist's second convolution's
// input gradient summed 30% zeros, 1/6 of them along the rows). The last axis's padding is stored where its output
// axis must give the register tile its rows (copies that one loop cannot skip): a batch of fewer than kTileRows
// images. A larger batch gives the rows (the heuristic tiles no axis a bounds test ties to a reduce loop), and that
// padding is a test too, its tap loop narrowed as the rows': mnist's input gradient r_512_24_24_32 (20 of its 24
// columns see all 5 taps) took 59.1-59.3 ms as 3 columns x 4 vectors over the stored padding, 49.9-50.2 ms as 3 images
// x 4 vectors under TG_CPU=haswell; natively 8 columns 30.1-31.0 ms, 8 images 24.8-25.1 ms (Zen 5, alone, 2 threads,
// alternated). Not for a depthwise convolution: its few taps are its whole sum, unrolled into copies that a test at
// every load would slow.
constexpr int64_t kTileRows = 8;  // the batch rows a convolution's register tile takes (AVX-512's 8; AVX2's 3)
UOpRef channels_last_padded(const UOp* x, size_t nd, int64_t batch) {
  if (x->op != Ops::PAD || x->nsrc() != 1 || nd < 2) return channels_last(UOpRef(x), nd);
  const auto& p = std::get<std::vector<int64_t>>(x->arg);
  std::vector<int64_t> inner(p.size(), 0), outer(p.size(), 0);
  bool gated = false;
  for (size_t i = 0; i < nd + 2; i++) {
    const bool out_axis = i >= 2 && i < (batch >= kTileRows ? nd + 2 : nd + 1);
    for (size_t e = 0; e < 2; e++) {
      if (p[2 * i + e] < 0) return channels_last(UOpRef(x), nd);
      (out_axis ? outer : inner)[2 * i + e] = p[2 * i + e];
      gated |= out_axis && p[2 * i + e] > 0;
    }
  }
  if (!gated) return channels_last(UOpRef(x), nd);
  const bool stored = std::any_of(inner.begin(), inner.end(), [](int64_t v) { return v != 0; });
  UOpRef in = stored ? mov(Ops::PAD, x->src()[0], inner) : x->src()[0];
  return mov(Ops::PAD, channels_last(in, nd), outer);
}

// Whether a reduce lies in x's expression within its kernel (above buffers and copies).
bool has_reduce(const UOp* x) {
  std::vector<const UOp*> st{x};
  NodeSet seen{x};
  while (!st.empty()) {
    const UOp* u = st.back();
    st.pop_back();
    if (u->op == Ops::REDUCE_AXIS) return true;
    if (u->op == Ops::BUFFER || u->op == Ops::CONTIGUOUS || u->op == Ops::COPY || u->op == Ops::ASSIGN) continue;
    for (auto& s : u->src())
      if (seen.insert(s.get()).second) st.push_back(s.get());
  }
  return false;
}

// The input's side of a convolution's product with the input stored channels-last (`cl`), or materialised where
// the window view would read it with a bounds test (padded) or recompute a reduce in it (a gather of the batch) at
// every tap; null when neither applies (the view itself when `cl`: one input channel is already in channels-last
// order, and a copy would only repeat it: mnist's first convolution). The window view of the copy, rebuilt.
UOpRef input_copy(const UOp* xo, const ConvShape& cs, bool cl, LayoutCtx& c) {
  const int64_t lead[2] = {cs.n, cs.groups * cs.ci};
  std::vector<const UOp*> path;
  const UOp* x = view_base(xo, cs.nd + 2, lead, c, path);
  if (!x) return {};
  // one input channel: channels-last is NCHW's order, copied only where the NCHW rule below would copy it
  if (cl && cs.groups * cs.ci > 1)
    return rebuild(path, cs.groups == 1 ? channels_last_padded(x, cs.nd, cs.n) : channels_last(UOpRef(x), cs.nd));
  bool padded = false;
  if (x->op == Ops::PAD) {
    const auto& p = std::get<std::vector<int64_t>>(x->arg);
    padded = std::any_of(p.begin(), p.end(), [](int64_t v) { return v > 0; });
  }
  if (!padded && !((is_alu(x->op) || x->op == Ops::CAST) && has_reduce(x))) return cl ? UOpRef(xo) : UOpRef{};
  return rebuild(path, UOp::make(Ops::CONTIGUOUS, x->dtype, {UOpRef(x)}));
}

// The forward convolution (the reduce over Ci and *k) with many input or output channels on a serial (CPU) device is computed
// channels-last, as a matmul of N*o rows and Co columns over Ci*k: the padded input is copied once into
// (N, *sp, Ci) order and the weight into (*k, Ci, Co); each input value is broadcast against a vector of output
// channels, rows of output positions share the weight vectors (a register tile), and the result is computed in
// (N, *o, Co) order and read back as (N, Co, *o). In NCHW the only vector axis is the output row (mnist's 6-wide
// rows: 24-26 GFLOPS in DEBUG=2). A stem with 3 input channels and 16 output channels is such a matmul too (K = 27):
// its vectors are the output channels, and its result is stored channels-last for the depthwise convolution that
// reads it (PaddleOCR det's stem, fused into the next convolution's padding in NCHW: 4.6 GFLOPS, 12% of det's time).
// "Many" is 8 or more (half an AVX-512 vector, a whole AVX2 one): PaddleOCR cls's blocks have 8 channels, and its
// stem (3 -> 8, stride 2) ran in NCHW along stride-2 output rows whose window loads gather (79 us; 9.5 us channels-last).
// Otherwise a padded input is materialised: the window loads are then plain (no
// bounds test per element), which costs one copy of the input and lets the kernel vectorise.
// A depthwise convolution (one input channel per group, many groups) is channels-last too: its vectors run along
// the channels, which its input, weight and output are all contiguous in, and the chains of MobileNet-style blocks
// (pointwise -> depthwise -> pointwise) then keep one layout: the padded copy between a channels-last pointwise
// result and the depthwise convolution is a contiguous copy instead of a transpose with a bounds test per element
// (PaddleOCR rec's E_240_16_84, 12% of its time). The product (N, G, Co/G, *o, Ci/G, *k) is summed in
// (N, *o, *k, Ci/G, G, Co/G) order: the output's channels G x Co/G are the inner axes, in NCHW's channel order.
UOpRef conv_layout(const UOp* red, LayoutCtx& c) {
  auto cs = conv_shape(red, c, false);
  if (!cs) return {};
  const size_t nd = cs->nd;
  const UOp* mul = red->src(0);
  for (int side = 0; side < 2; side++) {
    const UOp* xo = mul->src(size_t(side));      // the input's window view
    const UOp* wo = mul->src(size_t(1 - side));  // the weight, broadcast over N and *o
    if (wo->op != Ops::EXPAND) continue;
    const Shape& ws = c.shapes.of(wo->src(0));
    bool bcast = ws[0] == 1 && ws[2] == cs->co;
    for (size_t i = 0; i < nd; i++) bcast = bcast && ws[3 + i] == 1;
    if (!bcast) continue;
    Shape wshape{cs->groups * cs->co, cs->ci};
    wshape.insert(wshape.end(), cs->full.begin() + int64_t(4 + nd), cs->full.end());
    std::vector<const UOp*> wpath;
    const bool many = cs->groups == 1 ? cs->ci >= 8 || cs->co >= 8 : cs->ci == 1 && cs->groups * cs->co >= 8;
    const bool cl = c.channels_last && many && c.serial_device(device_of(red));
    const UOp* w = cl ? view_base(wo, nd + 2, wshape, c, wpath) : nullptr;
    UOpRef xs = input_copy(xo, *cs, cl && w, c);
    if (!xs) return {};
    if (!cl || !w) return c.made_reduce(UOp::make(Ops::REDUCE_AXIS, red->dtype, {xs->alu(Ops::MUL, UOpRef(wo))}, red->arg));
    // channels-last: the weight stored as (*k, Ci/G, Co), the product (N, *o, *k, Ci/G, G, Co/G) summed over
    // (*k, Ci/G), its last two axes merged into the output channels
    std::vector<int64_t> wperm;
    for (size_t i = 0; i < nd; i++) wperm.push_back(int64_t(2 + i));
    wperm.push_back(1), wperm.push_back(0);
    UOpRef prod = xs->alu(Ops::MUL, rebuild(wpath, stored_as(UOpRef(w), wperm)));
    std::vector<int64_t> perm{0}, red_axes, back{0, int64_t(nd) + 1};
    for (size_t i = 0; i < nd; i++) perm.push_back(int64_t(3 + i));
    for (size_t i = 0; i < nd; i++) perm.push_back(int64_t(4 + nd + i));
    perm.push_back(int64_t(3 + nd)), perm.push_back(1), perm.push_back(2);
    for (size_t i = 0; i <= nd; i++) red_axes.push_back(int64_t(1 + nd + i));
    for (size_t i = 0; i < nd; i++) back.push_back(int64_t(1 + i));
    Shape ps;  // (N, *o, *k, Ci/G, Co)
    for (size_t i = 0; i + 2 < perm.size(); i++) ps.push_back(cs->full[size_t(perm[i])]);
    ps.push_back(cs->groups * cs->co);
    UOpRef r = c.made_reduce(
        UOp::make(Ops::REDUCE_AXIS, red->dtype, {mov(Ops::RESHAPE, mov(Ops::PERMUTE, prod, perm), ps)}, ReduceArg{Ops::ADD, red_axes}));
    Shape os{cs->n};  // (N, *o, Co)
    os.insert(os.end(), cs->full.begin() + 3, cs->full.begin() + int64_t(3 + nd));
    os.push_back(cs->groups * cs->co);
    UOpRef out = mov(Ops::PERMUTE, mov(Ops::RESHAPE, UOp::make(Ops::CONTIGUOUS, red->dtype, {r}), os), back);
    return mov(Ops::RESHAPE, out, c.shapes.of(red));
  }
  return {};
}

// The weight gradient (the reduce over N and *o of the input's window view times the output's gradient broadcast
// over Ci and *k) with many input channels: summed from channels-last copies of the input and the gradient into
// (Co, *k, Ci), read back as (Co, Ci, *k). The kernel's loads and stores are then contiguous in Ci (vectors along
// it) and the gradient's Co values are shared by every Ci (a register tile, as a matmul). Read in the NCHW layout the
// sum's only contiguous axis is the output row (a 5x5 kernel's 20-wide rows: lanes of 4; mnist's second conv ran at
// 100 GFLOPS). On every device. With few input channels it reads the forward's materialised padded input.
UOpRef conv_weight_grad_layout(const UOp* red, LayoutCtx& c) {
  auto cs = conv_shape(red, c, true);
  if (!cs) return {};
  const size_t nd = cs->nd, rank = cs->full.size();
  const UOp* mul = red->src(0);
  for (int side = 0; side < 2; side++) {
    const UOp* xo = mul->src(size_t(side));      // the input's window view
    const UOp* go = mul->src(size_t(1 - side));  // the gradient (N, 1, Co, *o, 1, 1...), broadcast over Ci and *k
    if (go->op != Ops::EXPAND) continue;
    const Shape& gs = c.shapes.of(go->src(0));
    bool bcast = gs[0] == cs->n && gs[2] == cs->co;
    for (size_t i = 3 + nd; i < rank; i++) bcast = bcast && gs[i] == 1;
    if (!bcast) continue;
    const bool cl = c.channels_last && cs->groups == 1 && cs->ci >= 16;
    UOpRef xs = input_copy(xo, *cs, cl, c);
    if (!xs) return {};
    if (!cl) return c.made_reduce(UOp::make(Ops::REDUCE_AXIS, red->dtype, {xs->alu(Ops::MUL, UOpRef(go))}, red->arg));
    // the gradient (N, Co, *o) stored as (N, *o, Co), broadcast as before
    Shape gn{cs->n, cs->co};
    gn.insert(gn.end(), cs->full.begin() + 3, cs->full.begin() + int64_t(3 + nd));
    UOpRef gl = mov(Ops::RESHAPE, channels_last(mov(Ops::RESHAPE, go->src()[0], gn), nd), gs);
    UOpRef prod = xs->alu(Ops::MUL, mov(Ops::EXPAND, gl, c.shapes.of(go)));
    // (N, 1, Co, *o, Ci, *k) -> (N, *o, Co, *k, Ci): summed over (N, *o) into (Co, *k, Ci)
    std::vector<int64_t> perm{0}, red_axes{0}, back{0, int64_t(nd) + 1};
    for (size_t i = 0; i < nd; i++) perm.push_back(int64_t(3 + i)), red_axes.push_back(int64_t(1 + i));
    perm.push_back(2);
    for (size_t i = 0; i < nd; i++) perm.push_back(int64_t(4 + nd + i));
    perm.push_back(int64_t(3 + nd)), perm.push_back(1);
    for (size_t i = 0; i < nd; i++) back.push_back(int64_t(1 + i));
    Shape ps;
    for (size_t i = 0; i + 1 < perm.size(); i++) ps.push_back(cs->full[size_t(perm[i])]);
    UOpRef r = c.made_reduce(
        UOp::make(Ops::REDUCE_AXIS, red->dtype, {mov(Ops::RESHAPE, mov(Ops::PERMUTE, prod, perm), ps)}, ReduceArg{Ops::ADD, red_axes}));
    Shape os{cs->co};  // (Co, *k, Ci)
    os.insert(os.end(), cs->full.begin() + int64_t(4 + nd), cs->full.end());
    os.push_back(cs->ci);
    return mov(Ops::RESHAPE, mov(Ops::PERMUTE, mov(Ops::RESHAPE, r, os), back), c.shapes.of(red));
  }
  return {};
}

// The element strides of the view u reads its values through: u's movement ops (and casts, elementwise) down to the
// first computed node or buffer, taken as stored row-major (what the realize map stores). None where the view is not
// strided (a reshape that splits or merges axes its source does not keep adjacent, a flip) or is symbolic.
std::optional<std::vector<int64_t>> view_strides(const UOp* u, LayoutCtx& c) {
  if (u->sym()) return std::nullopt;
  if (u->op == Ops::CAST) return view_strides(u->src(0), c);
  const Shape& out = c.shapes.of(u);
  if (!is_movement(u->op)) {
    std::vector<int64_t> st(out.size(), 0);
    for (int64_t i = int64_t(out.size()) - 1, acc = 1; i >= 0; acc *= out[size_t(i)], i--) st[size_t(i)] = acc;
    return st;
  }
  auto src = view_strides(u->src(0), c);
  if (!src) return std::nullopt;
  const Shape& in = c.shapes.of(u->src(0));
  std::vector<int64_t> st(out.size(), 0);
  switch (u->op) {
    case Ops::SHRINK:
    case Ops::PAD: return src;
    case Ops::PERMUTE: {
      const auto& perm = std::get<std::vector<int64_t>>(u->arg);
      for (size_t i = 0; i < perm.size(); i++) st[i] = (*src)[size_t(perm[i])];
      return st;
    }
    case Ops::EXPAND:
      for (size_t i = 0; i < out.size(); i++) st[i] = in[i] == 1 ? 0 : (*src)[i];
      return st;
    case Ops::RESHAPE: {
      // groups of input and output axes with equal products; a group's input axes must be adjacent in memory
      std::vector<std::pair<int64_t, int64_t>> ax;  // the input's axes of size > 1: (size, stride)
      for (size_t i = 0; i < in.size(); i++)
        if (in[i] != 1) ax.push_back({in[i], (*src)[i]});
      size_t ii = 0, jo = 0;
      while (jo < out.size()) {
        if (out[jo] == 1) {
          jo++;
          continue;
        }
        if (ii >= ax.size()) return std::nullopt;
        const size_t gi = ii, go = jo;
        int64_t pin = ax[ii++].first, pout = out[jo++];
        while (pin != pout) {
          if (pin < pout) {
            if (ii >= ax.size()) return std::nullopt;
            pin *= ax[ii++].first;
          } else {
            if (jo >= out.size()) return std::nullopt;
            pout *= out[jo++];
          }
        }
        for (size_t k = gi; k + 1 < ii; k++)
          if (ax[k].second != ax[k + 1].second * ax[k + 1].first) return std::nullopt;
        int64_t at = ax[ii - 1].second;
        for (size_t o = jo; o-- > go;) st[o] = out[o] == 1 ? 0 : at, at *= out[o];
      }
      return ii == ax.size() ? std::optional(st) : std::nullopt;
    }
    default: return std::nullopt;
  }
}

// A product summed over its last axis k, one operand B's rows shared by m >= 32 rows of the other, A (a batch of
// heads included), on a serial device: a prompt's attention, a Linear below the panelled matmul's sizes. B is first
// copied once where the product would otherwise pay per use:
//  - B read across its rows: stored contiguous along k and strided along the output's inner axis n (A @ B^T with
//    both row-major: attention's scores q @ k^T, a Linear's x @ W^T). The kernel vectorises along n, where B's loads
//    gather one float per row (or it sums along k in lanes, combining each output's lanes at its end). B is copied
//    with n innermost, read back through the inverse permutation: the product becomes a GEMM's broadcast of A
//    against vectors of B. Zen 5, 2 threads: a LLaMA-1B prefill's scores (8 KV heads x 4 x 512 x 512 over 64, keys
//    float16) 9.3-9.9 ms at 138-148 GFLOPS (one launch of three 16.4) -> 3.3 ms and a 0.09 ms copy.
//  - B converted from 16 bits (float16 or bfloat16 read as float32: a KV cache's values): each vector of B is
//    converted again for every tile of A's rows, which AVX2 pays in its FMAs' pipes. B is converted once into a
//    float32 buffer. The same prefill's attn @ V with TG_CPU=haswell: 11.3-13.3 -> 6.2 ms and a 0.11 ms copy (native
//    AVX-512: 4.0-4.4 ms either way).
// The copy is one pass over B against m passes of the product. PACKED_MATMUL=0 turns it off with the panels.
UOpRef shared_operand(const UOp* red, LayoutCtx& c) {
  constexpr int64_t kMinCols = 32;
  const auto& ra = std::get<ReduceArg>(red->arg);
  const UOp* mul = red->src(0);
  if (!c.packed_matmul || c.made.count(red) || ra.op != Ops::ADD || ra.axes.size() != 1 || mul->op != Ops::MUL ||
      mul->dtype != dtypes::float32 || red->sym() || mul->sym())
    return {};
  const Shape& full = c.shapes.of(mul);
  const size_t rank = full.size();
  if (rank < 2 || ra.axes[0] != int64_t(rank - 1) || full[rank - 1] < 2 || full[rank - 2] < kMinCols) return {};
  const size_t r = rank - 1, j = rank - 2;
  if (!c.serial_device(device_of(red))) return {};
  for (int side = 0; side < 2; side++) {
    const UOp* ea = mul->src(size_t(side));      // A: broadcast along n
    const UOp* eb = mul->src(size_t(1 - side));  // B
    const UOp* b = eb->op == Ops::EXPAND ? eb->src(0) : eb;
    const Shape &as = c.shapes.of(ea->op == Ops::EXPAND ? ea->src(0) : ea), &bs = c.shapes.of(b);
    if (as.size() != rank || bs.size() != rank || as[j] != 1 || bs[j] != full[j] || bs[r] != full[r]) continue;
    int64_t m = 1;  // rows of A sharing each row of B
    for (size_t i = 0; i + 2 < rank; i++)
      if (bs[i] == 1) m *= full[i];
    if (m < kPackMinRows) continue;
    auto st = view_strides(b, c);
    std::vector<const UOp*> path;  // B's movement ops above its value, top first
    const UOp* v = b;
    for (; is_movement(v->op) && !v->sym(); v = v->src(0)) path.push_back(v);
    UOpRef nb;
    if (st && (*st)[r] == 1 && (*st)[j] != 1) {
      std::vector<int64_t> perm;
      for (size_t i = 0; i + 2 < rank; i++) perm.push_back(int64_t(i));
      perm.push_back(int64_t(r)), perm.push_back(int64_t(j));
      nb = stored_as(UOpRef(b), perm);
    } else if (v->op == Ops::CAST && v->dtype == dtypes::float32 &&
               (v->src(0)->dtype == dtypes::float16 || v->src(0)->dtype == dtypes::bfloat16)) {
      nb = rebuild(path, UOp::make(Ops::CONTIGUOUS, v->dtype, {UOpRef(v)}));
    } else {
      continue;
    }
    if (eb->op == Ops::EXPAND) nb = mov(Ops::EXPAND, nb, full);
    UOpRef nm = side == 0 ? UOpRef(ea)->alu(Ops::MUL, nb) : nb->alu(Ops::MUL, UOpRef(ea));
    return c.made_reduce(UOp::make(Ops::REDUCE_AXIS, red->dtype, {nm}, red->arg));
  }
  return {};
}

// ---- the convolution's input gradient
//
// Autograd differentiates a convolution's window view (pool_windows: the input repeated, cut and reshaped so that
// window element j of output o reads input o*s + j*d) into two sums: the window gradient W (N, C, *o, *k), the
// output's gradient times the weight summed over Co, and the sum of W over the view's repeats of each input element
// (the gradient of the repeat's EXPAND). The realize map computes W into a buffer (a reduce nested in another's loops
// gets no register tile): k^nd times the input, written and read back (mnist's second convolution 10x slower than a
// transposed convolution). For each input element i the repeats read exactly the (o, j) with o*s + j*d = i: the sum
// is the gather form of the transposed convolution of the gradient with the weight, which is what the outer reduce
// becomes; the convolution rules above then lay it out as any forward convolution.
//
// The pair is recognised by rebuilding it: from W's operands (the gradient g, the weight w) and each (stride,
// dilation) that gives W's window count from the input's size, autograd's gradient of window_conv(pool_windows(P))
// for a placeholder input P. UOps are interned, so the same graph is the same node: the rule applies only where the
// reduce is exactly that gradient, whoever wrote it.

// The nodes of the RESHAPE (and CAST) chain under an operand (after its broadcast), top first.
std::vector<const UOp*> reshape_chain(const UOp* u) {
  std::vector<const UOp*> out;
  if (u->op == Ops::CAST) u = u->src(0);
  if (u->op == Ops::EXPAND) u = u->src(0);
  for (out.push_back(u); u->op == Ops::RESHAPE || u->op == Ops::CAST; out.push_back(u)) u = u->src(0);
  return out;
}

// The (stride, dilation) pairs per spatial axis that give o windows of k over a (padded) size `in`, combined over the
// axes (at most `cap` combinations; none where every axis has disjoint windows: that view has no repeat to sum).
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> window_params(const Shape& in, const Shape& k,
                                                                                 const Shape& o, size_t cap) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> axis(k.size());
  for (size_t j = 0; j < k.size(); j++)
    for (int64_t s = 1; s <= in[j]; s++)
      for (int64_t d = 1; d <= in[j]; d++)
        if (d * (k[j] - 1) + 1 <= in[j] && (in[j] - d * (k[j] - 1) + s - 1) / s == o[j]) axis[j].push_back({s, d});
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out{{{}, {}}};
  for (size_t j = 0; j < k.size(); j++) {
    std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> next;
    for (auto& [st, dl] : out)
      for (auto [s, d] : axis[j]) {
        if (next.size() >= cap) return {};
        next.push_back({st, dl});
        next.back().first.push_back(s), next.back().second.push_back(d);
      }
    out = std::move(next);
  }
  std::erase_if(out, [&](const auto& p) {
    for (size_t j = 0; j < k.size(); j++)
      if (k[j] > p.first[j] || p.second[j] != 1) return false;
    return true;
  });
  return out;
}

UOpRef conv_input_grad(const UOp* red, LayoutCtx& c) {
  if (!c.conv_input_grad) return {};
  const auto& ra = std::get<ReduceArg>(red->arg);
  if (ra.op != Ops::ADD || red->sym()) return {};
  const UOp* r1 = red->src(0);  // W under the gradient's movement ops (and casts: float16 sums run in float32)
  while (((is_movement(r1->op) && r1->op != Ops::EXPAND) || r1->op == Ops::CAST) && !r1->sym()) r1 = r1->src(0);
  if (r1 == red->src(0) || r1->op != Ops::REDUCE_AXIS || r1->sym()) return {};
  const UOp* pm = r1->src(0)->op == Ops::CAST ? r1->src(0)->src(0) : r1->src(0);
  if (pm->op != Ops::PERMUTE) return {};
  const UOp* mul = pm->src(0);  // (N, G, Co/G, *o, Ci/G, *k)
  if (std::get<ReduceArg>(r1->arg).op != Ops::ADD || mul->op != Ops::MUL || !dtypes::is_float(mul->dtype)) return {};
  const Shape& f = c.shapes.of(mul);
  if (f.size() < 6 || f.size() % 2) return {};
  const size_t nd = (f.size() - 4) / 2;
  const int64_t groups = f[1];
  const Shape o(f.begin() + 3, f.begin() + int64_t(3 + nd)), k(f.begin() + int64_t(4 + nd), f.end());
  Shape gs{f[0], groups * f[2]}, ws{groups * f[2], f[3 + nd]}, in;
  gs.insert(gs.end(), o.begin(), o.end());
  ws.insert(ws.end(), k.begin(), k.end());
  const Shape& rs = c.shapes.of(red);  // the padded input's shape, with the repeat axes (size 1) between
  for (size_t i = 0; i < rs.size(); i++)
    if (std::find(ra.axes.begin(), ra.axes.end(), int64_t(i)) == ra.axes.end()) in.push_back(rs[i]);
  if (in.size() != nd + 2 || in[0] != f[0] || in[1] != groups * f[3 + nd]) return {};
  const Shape sp(in.begin() + 2, in.end());
  auto params = window_params(sp, k, o, 64);
  const std::string dev = device_of(red);
  int64_t numel = 1;
  for (int64_t d : in) numel *= d;
  UOpRef hole = UOp::make(Ops::BUFFER, mul->dtype, {UOp::make(Ops::DEVICE, dtypes::void_, {}, dev)},
                          std::vector<int64_t>{INT64_MIN / 2, numel});
  Tensor p = Tensor(hole, {numel}, dev).reshape(in);
  for (int side = 0; side < 2; side++)
    for (const UOp* gu : reshape_chain(mul->src(size_t(side))))
      for (const UOp* wu : reshape_chain(mul->src(size_t(1 - side)))) {
        if (c.shapes.of(gu) != gs || c.shapes.of(wu) != ws) continue;
        Tensor g(UOpRef(gu), gs, dev), w(UOpRef(wu), ws, dev);
        for (auto& [st, dl] : params) try {
          Tensor v = detail::window_conv(detail::pool_windows(p, k, st, dl, "conv"), w, groups);
          const UOpRef targets[1] = {p.uop()};
          UOpRef gp = compute_gradient(v.uop(), g.uop(), targets, dev)[0];
          const UOp* x = gp.get();
          while (x && x != red && (x->op == Ops::RESHAPE || x->op == Ops::CAST)) x = x->src(0);
          if (x != red) continue;
          std::vector<int64_t> opd;  // rows past the last window get no gradient
          for (size_t j = 0; j < nd; j++) opd.push_back(sp[j] - ((o[j] - 1) * st[j] + dl[j] * (k[j] - 1) + 1));
          UOpRef out = g.conv_transpose(w, std::nullopt, st, 0, opd, groups, dl).cast(red->dtype).reshape(rs).uop();
          c.keep.push_back(out);
          return out;
        } catch (const Error&) {  // a view the Tensor ops refuse: not this gradient
        }
      }
  return {};
}

// A shrink of a broadcast is a broadcast of the shrink: SHRINK(EXPAND(x)) -> EXPAND(SHRINK'(x)), where SHRINK' keeps
// the broadcast axes whole (size 1) and shrinks the others as before. The multi stage gives each device its rows of
// a replicated operand this way (a weight broadcast over a sharded batch); the rules below see the broadcast.
UOpRef shrink_of_expand(const UOp* sh, LayoutCtx& c) {
  const UOp* ex = sh->src(0);
  if (ex->op != Ops::EXPAND || sh->sym() || ex->sym()) return {};
  const Shape& xs = c.shapes.of(ex->src(0));
  auto arg = std::get<std::vector<int64_t>>(sh->arg);
  Shape out;
  bool inner = false;  // SHRINK' does something
  for (size_t i = 0; i < xs.size(); i++) {
    out.push_back(arg[2 * i + 1] - arg[2 * i]);
    if (xs[i] == 1) arg[2 * i] = 0, arg[2 * i + 1] = 1;
    else inner |= arg[2 * i] != 0 || arg[2 * i + 1] != xs[i];
  }
  UOpRef x = ex->src()[0];
  if (inner) x = UOp::make(Ops::SHRINK, x->dtype, {x}, arg);
  return mov(Ops::EXPAND, x, out);
}

const PatternMatcher& pm_layout() {
  using namespace pat;
  static const PatternMatcher pm(table(
      rule(op_any<opset<Ops::SHRINK>>, [](auto& m) { return shrink_of_expand(m.root, m.template ctx<LayoutCtx>()); }),
      rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return conv_input_grad(m.root, m.template ctx<LayoutCtx>()); }),
      rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return int_dot_product(m.root, m.template ctx<LayoutCtx>()); }),
      rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return packed_matmul(m.root, m.template ctx<LayoutCtx>()); }),
      rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return conv_layout(m.root, m.template ctx<LayoutCtx>()); }),
      rule(op_any<opset<Ops::REDUCE_AXIS>>,
           [](auto& m) { return conv_weight_grad_layout(m.root, m.template ctx<LayoutCtx>()); }),
      rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return shared_operand(m.root, m.template ctx<LayoutCtx>()); })));
  return pm;
}

// A computed value copied into several layouts (a convolution's output gradient: channels-last for the weight
// gradient, padded and channels-last for the input gradient) is computed once into a buffer, which the realize map
// stored in the value's own order: NCHW, then copied. Where one copy is the value's own elements reordered (reshapes
// and a permute, nothing cut or padded) the value is computed into that copy instead, and its other readers (the
// other copies, a bias gradient's sum) read the copy back through the inverse view: one buffer fewer, and the value's
// kernel stores in the layout its readers want (mnist's conv2 output gradient was computed NCHW with its stores 1600
// bytes apart along the vectorised channels, E_512_32_20_20, then copied channels-last, E_512_20_20_32).
std::vector<UOpRef> share_layout_copies(std::vector<UOpRef> roots, LayoutCtx& c) {
  std::vector<const UOp*> topo;
  {
    NodeSet seen;
    for (auto& r : roots)
      for (const UOp* u : toposort(r.get()))
        if (seen.insert(u).second) topo.push_back(u);
  }
  NodeSet root_set;
  for (auto& r : roots) root_set.insert(r.get());
  // value -> its copies, and the first copy that reorders it whole (reshapes and permutes only)
  std::unordered_map<const UOp*, int> copies;
  std::unordered_map<const UOp*, const UOp*> whole;
  for (const UOp* u : topo) {
    if (u->op != Ops::CONTIGUOUS || !is_movement(u->src(0)->op)) continue;
    const UOp* v = u->src(0);
    bool reorders = true;
    for (; is_movement(v->op); v = v->src(0)) reorders &= v->op == Ops::RESHAPE || v->op == Ops::PERMUTE;
    if (!(is_alu(v->op) || v->op == Ops::CAST) || root_set.count(v)) continue;
    copies[v]++;
    if (reorders && !whole.count(v)) whole[v] = u;
  }
  // nothing shared (most graphs): the roots as they are, without rebuilding the graph
  if (std::none_of(whole.begin(), whole.end(), [&](const auto& e) { return copies[e.first] >= 2; })) return roots;
  // Rebuilt in topological order: each such value v (its sources rebuilt) is computed into its copy, rebuilt over
  // it, and its readers read the copy back through the inverse view (the copy's reshapes and permute undone).
  std::unordered_map<const UOp*, UOpRef> done, copy_of;  // node -> rebuilt; a chosen copy -> its rebuilt node
  for (const UOp* u : topo) {
    if (auto it = copy_of.find(u); it != copy_of.end()) {
      done.emplace(u, it->second);
      continue;
    }
    bool changed = false;
    std::vector<UOpRef> src = mapped_sources(u, done, changed);
    UOpRef nu = changed ? u->replace_src(src) : UOpRef(u);
    auto n = copies.find(u);
    auto w = whole.find(u);
    if (n == copies.end() || n->second < 2 || w == whole.end()) {
      done.emplace(u, nu);
      continue;
    }
    std::vector<const UOp*> chain;  // the copy's view, from the CONTIGUOUS down to u
    for (const UOp* m = w->second->src(0); m != u; m = m->src(0)) chain.push_back(m);
    UOpRef view = nu;
    for (size_t i = chain.size(); i-- > 0;) view = chain[i]->replace_src(std::span<const UOpRef>(&view, 1));
    UOpRef cp = w->second->replace_src(std::span<const UOpRef>(&view, 1));
    copy_of.emplace(w->second, cp);
    UOpRef back = cp;
    for (const UOp* m : chain) {  // undone from the outermost
      if (m->op == Ops::RESHAPE) {
        back = mov(Ops::RESHAPE, back, c.shapes.of(m->src(0)));
      } else {
        back = mov(Ops::PERMUTE, back, inverse_permutation(std::get<std::vector<int64_t>>(m->arg)));
      }
    }
    done.emplace(u, back);
  }
  for (auto& r : roots) r = done.at(r.get());
  return roots;
}

}  // namespace

std::vector<UOpRef> apply_layouts(std::span<const UOpRef> roots, const Knobs& knobs) {
  LayoutCtx ctx{{}, knobs.packed_matmul, knobs.channels_last, knobs.conv_input_grad, knobs.int_dot, knobs.int_gemm, {}, {}, {}};
  std::vector<UOpRef> out = rewrite_roots(roots, pm_layout(), &ctx, "layouts");
  return knobs.share_layouts ? share_layout_copies(std::move(out), ctx) : out;
}

}  // namespace tg::sched
