#pragma once
// Kernel optimisations (tinygrad: codegen/opt). An optimisation changes the type of part of a loop axis:
// shift_to splits RANGE r (size n) into an outer RANGE of n/amt and a new inner RANGE of amt whose type says
// what codegen does with it:
//   UPCAST  an output axis: the inner part is unrolled into amt copies (a register tile; LLVM vectorises the
//           copies into SIMD instructions), so loads that do not depend on it are shared between the copies.
//   UNROLL  a reduce axis: amt independent accumulators, combined after the loop (vectorisable reductions).
//   PADTO   an output axis of n rounded up to a multiple of amt (before an UPCAST of amt that does not divide n): its
//           uses read min(r, n-1) (the padding recomputes the last element, from memory in bounds) and its stores are
//           gated by r < n (the padding stores nothing): no tail loop, no gate inside the reduce loops.
//   THREAD  an output axis split across the CPU's threads: the outer part becomes the kernel variable
//           `core_id` (0..amt-1) and the program runs amt times in parallel, one call per core.
// GPU renderers only (src/codegen/opt/gpu.cpp):
//   LOCAL   an output axis: the inner part becomes work items of one work group (get_local_id / threadIdx), the
//           outer part the group index (get_group_id / blockIdx).
//   GROUP   a reduce axis: the inner part is split across a work group's items (adjacent items read adjacent
//           elements); each item's partial result goes to local memory, a barrier, then each item reduces the
//           partials (all compute the same value; the first stores it). GROUPTOP: the same with the group as the
//           outer part (each item reduces a contiguous chunk).
//   SWAP    exchange the places of output axes `axis` and `amt` (the loop order; on GPUs, which one is launch
//           axis 0, whose neighbouring items are neighbouring work items).
//   TC      tensor cores (CUDA mma.sync m16n8k16, src/codegen/opt/tc.cpp): a half/bfloat16 matmul's output tile
//           of 16x8 and reduce step of 16 become one warp-wide matrix multiply-accumulate; axis and amt unused.
// CPU renderers only:
//   PREFETCH a reduce axis whose loop streams buffers from memory: each iteration of its loop prefetches, for every
//           load of a buffer larger than L2 whose index moves with the axis, the bytes that load reads amt bytes
//           ahead (rounded up to whole iterations), at the start of the loops inside (a quantised matvec's block
//           loop: one prefetch per row and block). The kernel's values do not change; the loop's loads find their
//           lines in cache instead of waiting on DRAM (lowering's `add_prefetches`, rendered as llvm.prefetch /
//           __builtin_prefetch). PREFETCH=0: the heuristic does not choose it.
//   NONTEMPORAL (axis 0, amt 1) the kernel's full, aligned vector stores that write their buffer contiguously
//           bypass the caches (LLVM `!nontemporal`: x86 MOVNTPS, AArch64 STNP): no read of the line before it is
//           written, no eviction of the cached data. The heuristic chooses it for an output larger than the
//           last-level cache (OptConfig::llc_bytes), which would leave the cache before it is read again; BEAM may
//           add it. The values do not change. NONTEMPORAL=0: the heuristic does not choose it; NONTEMPORAL=2:
//           it does for every such output, whatever its size.
// Axes are numbered as kernel_axes() lists them: the output (loop) axes in id order, then the reduce axes.
// NOOPT=1 disables the heuristic; DEBUG=3 prints the opts applied to each kernel.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tg/device.hpp"
#include "tg/error.hpp"
#include "tg/uop.hpp"

namespace tg {

/// What an Opt does: UPCAST/UNROLL (vectorise, unroll), THREAD (CPU cores), LOCAL/GROUP/GROUPTOP (GPU groups), TC, SWAP,
/// PADTO (round an output axis up), PREFETCH (software prefetch in a reduce loop), NONTEMPORAL (streaming stores).
enum class OptOp : uint8_t { UPCAST, UNROLL, THREAD, LOCAL, GROUP, GROUPTOP, TC, SWAP, PADTO, PREFETCH, NONTEMPORAL };

/// One kernel optimisation: an op applied to an axis with an amount (tinygrad's Opt).
struct Opt {
  /// what to do (see OptOp)
  OptOp op;
  int axis;     ///< index into kernel_axes() of the kernel as it is when the opt is applied
  int64_t amt;  ///< split factor (THREAD: number of threads; PREFETCH: bytes ahead)
  /// same op, axis and amount
  bool operator==(const Opt&) const = default;
};
/// "Opt(UPCAST, axis=1, amt=4)", as DEBUG output and process replay print it
std::string to_string(const Opt& o);

/** An opt that cannot apply to this kernel (axis out of range, size not divisible, wrong axis kind). */
struct OptError : Error {
  /// an error with this message (see Error)
  using Error::Error;
};

/** A cache line's bytes: the heuristic's tiles and lowering's non-temporal stores (whole lines) count in it. */
inline constexpr int64_t kCacheLineBytes = 64;
/** The most copies of one node the UPCAST/UNROLL opts of a kernel make (tinygrad: 256): BEAM keeps to it, and so do
 *  the heuristic's tiles of stores. */
inline constexpr int64_t kMaxUpcast = 256;

/** What the optimiser may use on the target device (opt_config(): from its machine model). */
struct OptConfig {
  int threads = 1;        ///< CPU threads a kernel may be split across
  int vector_width = 16;  ///< float lanes of the vector registers kernels use (AVX-512: 16, AVX2: 8)
  int64_t local_threads = 0;  ///< GPU: most work items per group (0: a CPU, no LOCAL/GROUP)
  bool tensor_cores = false;  ///< GPU: the renderer has TC (CUDA mma.sync)
  int vector_registers = 32;  ///< how many vector registers (AVX-512: 32, AVX2: 16); register tiles fit in them
  int64_t l2_bytes = 0;       ///< per-core L2 cache (0: unknown)
  int64_t llc_bytes = 0;      ///< the last-level cache the kernel's threads share (0: unknown)
  /// independent FMA chains (vector accumulators) a register tile needs to keep the FMA pipes busy: (latency + 1) x
  /// FMAs per cycle of the machine model (one cycle of slack per pipe: a late operand load does not idle it)
  int fma_chains = 10;
  /// vector FMAs a cycle the machine model's pipes start (its reciprocal throughput's inverse)
  double fma_per_cycle = 2;
  /// a vector instruction sums 4 byte products into each int32 lane (x86 vpdpbusd; MachineModel::int8_dot)
  bool int8_dot = false;
  /// a row kernel of a few ops an element prefetches its next row too (MachineModel::row_prefetch)
  bool row_prefetch = false;
};

/** The most bytes a row kernel keeps in a row array on the stack (softmax's exps, where its output goes past the
 *  caches: lowering's reuse_row_values): a quarter of the per-core L2, which holds that row, the input's row and the
 *  next one prefetched; 0 (none) where the L2 is unknown. */
int64_t row_array_bytes(const OptConfig& cfg);

/** The OptConfig of a device: threads, vector width and registers, caches from Device::machine(). */
OptConfig opt_config(const Device& dev);

/** The splittable RANGEs of a (simplified) kernel AST: output axes in id order, then reduce axes. */
std::vector<const UOp*> kernel_axes(const UOpRef& ast);

/** Apply one opt (shift_to); throws OptError where it does not apply. The result is not simplified. */
UOpRef apply_opt(const UOpRef& ast, const Opt& opt);

/** Split a reduce RANGE of size n that the kernel takes modulo c (c divides n) into an outer range of n/c and
 *  an inner one of c (innermost of the reduce loops): r % c and r // c become plain ranges, so an index such as
 *  a transposed-and-reshaped operand's (r//64)*8192 + r%64 is linear in the inner one (vectorisable). As
 *  tinygrad's split ranges; an output loop read only as x // c and x % c is split likewise. Then the store's
 *  contiguous loop and the output loop outside it are merged into one where every access reads them as a*B + b
 *  (merge_loops; as tinygrad's merge of adjacent ranges). Run before opts (lower_kernel and BEAM see the same axes). */
UOpRef split_ranges(const UOpRef& ast);

/** The loads of `ast` that stream a buffer larger than `l2_bytes` (their index spans more bytes, bounds known) and
 *  move with RANGE `r`: what Opt PREFETCH prefetches in r's loop (lowering's add_prefetches and the heuristic share
 *  it). l2_bytes 0 (unknown): every load that moves with r. */
std::vector<const UOp*> streamed_loads(const UOp* ast, const UOp* r, int64_t l2_bytes);

/** The default opts for a kernel (no search): register tiles for matmul-shaped kernels, vectorised loops
 *  for elementwise and reduce kernels, and the thread split. */
std::vector<Opt> hand_coded_optimizations(const UOpRef& ast, const OptConfig& cfg);

/** The heuristic's opts with its n best register tiles (by its load model; the first is hand_coded_optimizations'
 *  choice, the others from a wider space: rows of 3 and 6, accumulators in up to three quarters of the vector
 *  registers), distinct, fewer where the kernel has fewer tiles: the seeds of BEAM's search. */
std::vector<std::vector<Opt>> hand_coded_alternatives(const UOpRef& ast, const OptConfig& cfg, size_t n);

/** The default opts for a GPU kernel: TC for fitting half matmuls (when the renderer has tensor cores), GROUP
 *  for large reductions into few outputs, LOCAL on output axes, small UPCASTs for matmul-shaped kernels. */
std::vector<Opt> gpu_hand_coded_optimizations(const UOpRef& ast, const OptConfig& cfg);

/** Lower REDUCEs over GROUP ranges: partial reduce per work item, local memory, BARRIER, final reduce, and the
 *  kernel's stores gated to the group's first item. Throws
 *  OptError for a grouped reduce that sits inside a serial loop (its local memory would be reused unsafely). */
UOpRef lower_group_reduces(const UOpRef& ast);

/** The TC opt (src/codegen/opt/tc.cpp): rewrite a matmul-shaped kernel to use WMMA; throws OptError when the
 *  kernel is not one (one reduce axis, a product of two half/bfloat16 operands) or its sizes do not fit. */
UOpRef apply_tc(const UOpRef& ast);
/** Whether apply_tc would apply (the heuristic's test). */
bool tc_fits(const UOpRef& ast);
/** Where apply_tc would apply: the kernel_axes() positions of the output row and column axes it tiles (16 and 8),
 *  which keep their positions after it; nullopt when it does not fit. */
std::optional<std::pair<int, int>> tc_axes(const UOpRef& ast);
/** After expand_reduces: WMMAs whose results are only added to accumulators take the accumulators as their C
 *  operand instead (D = A*B + C in one instruction). */
UOpRef fuse_wmma_accumulators(const UOpRef& k);

/** Remove UPCAST and UNROLL ranges by replicating the nodes that depend on them (codegen's expander). With
 *  `lanes`, an UNROLL range whose REDUCEs have no other UNROLL (and no REDUCE inside) stays a Lane loop instead,
 *  innermost in each of them (their accumulators become arrays indexed by it, see expand_reduces in lower.cpp;
 *  UPCAST copies of such a REDUCE each get an array), for renderers that vectorise such loops
 *  (Renderer::vector_lanes). */
UOpRef expand_upcasts(const UOpRef& ast, bool lanes = false);
/** Vector dtypes (src/codegen/vectorize.cpp): STOREs of consecutive addresses of one buffer (the expander's copies
 *  of an upcast axis) become one vector STORE of up to the renderer's lanes (Renderer::vector_lanes_of), capped at
 *  `cap32` lanes of a 32-bit element (the CPU's vector width); their values become vector ops over vector LOADs of
 *  consecutive addresses, broadcasts and gathers (VECTORIZE). Where the renderer needs aligned vectors
 *  (Renderer::vector_aligned: CUDA) only buffer addresses provably a multiple of the width are taken. Runs of lanes
 *  that share no vector work stay scalar. cap32 < 2: unchanged. */
UOpRef vectorize(const UOpRef& k, const Renderer& r, int cap32);
/** Split the vector ops the renderer cannot take into lanes (VECTORIZE of scalar ops over GEPs, scalar LOADs and
 *  STOREs for a width or alignment it does not have), folding GEP(VECTORIZE) and VECTORIZE(GEP...) away. */
UOpRef devectorize(const UOpRef& k, const Renderer& r);
/** Opt NONTEMPORAL's stores (after devectorize): each vector STORE into a buffer the kernel does not read, at an index
 *  provably a multiple of its lanes, among stores that together write one contiguous block per step of a loop,
 *  gets arg 1 (renderers that can write past the caches do: LLVM's `!nontemporal`; the others ignore it). */
UOpRef mark_nontemporal_stores(const UOpRef& k);
/** Combine values with a reduce op as a balanced pairwise tree (the expander's order, shared by lane loops). */
UOpRef reduce_tree(Ops op, std::vector<UOpRef> xs);

/** Replace nodes (keys of `map`) throughout the graph under `root`. */
UOpRef substitute(const UOpRef& root, const std::vector<std::pair<const UOp*, UOpRef>>& map);

/** Whether node `r` occurs in the graph under `e`. */
bool depends_on(const UOp* e, const UOp* r);

/** The coefficient of RANGE `r` in an index expression linear in it (0 when it does not occur); nullopt when it
 *  enters non-linearly (a division, a modulo, a product of ranges). */
std::optional<int64_t> index_coef(const UOp* e, const UOp* r);

/** Range id and axis type of a RANGE node. */
int64_t range_id(const UOp* r);
/// the axis type of a RANGE node (loop, reduce, upcast, ...)
AxisType range_type(const UOp* r);

}  // namespace tg
