#pragma once
// Kernel optimisations (tinygrad: codegen/opt). An optimisation changes the type of part of a loop axis:
// shift_to splits RANGE r (size n) into an outer RANGE of n/amt and a new inner RANGE of amt whose type says
// what codegen does with it:
//   UPCAST  an output axis: the inner part is unrolled into amt copies (a register tile; LLVM vectorises the
//           copies into SIMD instructions), so loads that do not depend on it are shared between the copies.
//   UNROLL  a reduce axis: amt independent accumulators, combined after the loop (vectorisable reductions).
//   THREAD  an output axis split across the CPU's threads: the outer part becomes the kernel variable
//           `core_id` (0..amt-1) and the program runs amt times in parallel, one call per core.
// Axes are numbered as kernel_axes() lists them: the output (loop) axes in id order, then the reduce axes.
// NOOPT=1 disables the heuristic; DEBUG=3 prints the opts applied to each kernel.
#include <string>
#include <vector>

#include "tg/error.hpp"
#include "tg/uop.hpp"

namespace tg {

enum class OptOp : uint8_t { UPCAST, UNROLL, THREAD };

struct Opt {
  OptOp op;
  int axis;     // index into kernel_axes() of the kernel as it is when the opt is applied
  int64_t amt;  // split factor (THREAD: number of threads)
  bool operator==(const Opt&) const = default;
};
std::string to_string(const Opt& o);

/** An opt that cannot apply to this kernel (axis out of range, size not divisible, wrong axis kind). */
struct OptError : Error {
  using Error::Error;
};

/** What the optimiser may use on the target device. */
struct OptConfig {
  int threads = 1;        // CPU threads a kernel may be split across
  int vector_width = 16;  // float lanes of the widest SIMD register (AVX-512: 16)
};

/** The splittable RANGEs of a (simplified) kernel AST: output axes in id order, then reduce axes. */
std::vector<const UOp*> kernel_axes(const UOpRef& ast);

/** Apply one opt (shift_to); throws OptError where it does not apply. The result is not simplified. */
UOpRef apply_opt(const UOpRef& ast, const Opt& opt);

/** The default opts for a kernel (no search): register tiles for matmul-shaped kernels, vectorised loops
 *  for elementwise and reduce kernels, and the thread split. */
std::vector<Opt> hand_coded_optimizations(const UOpRef& ast, const OptConfig& cfg);

/** Remove UPCAST and UNROLL ranges by replicating the nodes that depend on them (codegen's expander). */
UOpRef expand_upcasts(const UOpRef& ast);

/** Replace nodes (keys of `map`) throughout the graph under `root`. */
UOpRef substitute(const UOpRef& root, const std::vector<std::pair<const UOp*, UOpRef>>& map);

/** Range id and axis type of a RANGE node. */
int64_t range_id(const UOp* r);
AxisType range_type(const UOp* r);

}  // namespace tg
