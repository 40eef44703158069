#pragma once
// Codegen: lowering one kernel AST to a linear program that a Renderer turns into source.
//
// The linear program (what codegen produces and every renderer consumes) is a list of UOps in
// execution order. Its ops and their meaning:
//   PARAM       dtype T* (pointer to the element type), arg = int64 index i. Buffer argument i.
//               All PARAMs come first, in index order.
//   DEFINE_VAR  dtype int32 or int64, arg VarArg. Kernel integer argument, in order of appearance.
//   CONST       a scalar constant (int args for ints/bool, double for floats).
//   RANGE       src (end), dtype int32/int64, arg (id, AxisType). Opens `for (r = 0; r < end; r++)`.
//   END         src (..., RANGE), void: the RANGE is the LAST source (earlier sources are the effects inside
//               the loop, for ordering only). Closes the loop of that RANGE.
//   AFTER       src (ptr, deps...), dtype = ptr's dtype. An alias of src 0 (ordering only): renders nothing,
//               uses of it render as uses of src 0.
//   DEFINE_REG  dtype T* with addr Reg and size n. A private array of n elements (accumulators).
//   INDEX       src (ptr, idx), dtype = ptr's dtype. The address ptr + idx (elements).
//   LOAD        src (INDEX) -> *addr;  or src (INDEX, alt, gate) -> gate ? *addr : alt (no access when !gate).
//   STORE       src (INDEX, value), void. *addr = value;  or src (INDEX, value, gate): only when gate (bool).
//   ALU ops     unary/binary/ternary, CAST, BITCAST with the C semantics of exec_alu (IDIV/MOD truncate,
//               comparisons give bool, shifts as in C for in-range amounts).
//   IF/ENDIF    IF src (cond bool); ENDIF src (IF).
//   SPECIAL     src (size), int32/int64, arg [axis] or [axis, kind]: a work-item index on launch axis 0..2 (GPU
//               renderers only, see Renderer::grid_limits); kind 0 (or absent): the global index, 1: the group
//               index, 2: the index within the group; 0 <= SPECIAL < size.
//   DEFINE_LOCAL dtype T* with addr Local and size n, arg a unique int: an array in work-group local memory.
//   BARRIER     src (STOREs...), void: every item of the group waits here (the STOREs are visible after it).
//   WMMA        src (a0..a7, b0..b3, c0..c3), dtype float32 x4 (count 4), arg "m16n8k16": one warp-wide matrix
//               multiply-accumulate (CUDA mma.sync m16n8k16, row.col, float accumulators); sources are this
//               work item's fragments: 8 A halves, 4 B halves, 4 float accumulators (see src/codegen/opt/tc.cpp).
//   GEP         src (WMMA), scalar float32, arg [i]: element i of a WMMA's result.
//   SINK        last; ignored by renderers.
// No `index` dtype reaches a renderer: index arithmetic is int32 or int64 by then.
// Kernel ABI on the CPU: `extern "C" void NAME(void* const* bufs, const int64_t* vars)`.
#include "tg/config.hpp"

#include <string>
#include <vector>

#include "tg/opt.hpp"
#include "tg/device.hpp"
#include "tg/pattern.hpp"

namespace tg {

class Renderer;

/** A kernel ready to compile: its name, linear program (kept alive by `sink`) and source. */
struct CompiledKernel {
  /// the kernel's function name, tinygrad style: E_ (elementwise) or r_ (reduce) and its loop sizes
  std::string name;
  UOpRef sink;                       ///< the lowered AST (keeps the program's nodes alive)
  std::vector<const UOp*> program;   ///< linear order
  /// the rendered source the device compiles (C, LLVM IR, OpenCL C or CUDA)
  std::string src;
  /// number of buffer parameters (PARAM 0..n_params-1; outputs first)
  int n_params = 0;
  /// names of the symbolic variables the kernel takes as int arguments, in argument order
  std::vector<std::string> var_names;
  /// estimated floating-point operations and bytes moved, for DEBUG=2 lines
  ///@{
  double flops = 0, mem_bytes = 0;   ///< estimates for DEBUG=2 lines
  ///@}
  std::vector<Opt> opts;             ///< the optimisations applied
  int threads = 1;                   ///< calls in parallel, one per core (the kernel variable core_id)
  int core_var = -1;                 ///< position of core_id in var_names, or -1
  LaunchDims dims;                   ///< groups and threads per group (all 1 for a serial kernel)
};

/** How to optimise while lowering: the target's limits, and explicit opts (else the heuristic's). */
struct LowerOptions {
  /// the target's limits (threads, vector width, GPU work-group size) the heuristic and the opts respect
  OptConfig config;
  bool index64 = false;  ///< index arithmetic in int64 even where int32 fits (64-bit CPUs: no sign extensions, so
                         ///< LLVM can prove the expander's copies access consecutive addresses and vectorise them)
  /// opts to apply instead of the heuristic's (BEAM's winner, a test's), or null
  const std::vector<Opt>* opts = nullptr;
};

/** Lower a kernel AST (SINK of STOREs over RANGEs, see src/schedule) into a linear program and render it. */
CompiledKernel lower_kernel(const UOpRef& ast, const std::string& name, Renderer& renderer,
                            const LowerOptions& opt = {});

/** A float POW as exp2(y * log2|x|) with its sign, NaN and y == 0 cases (every renderer: one set of values). */
UOpRef decompose_pow(const UOpRef& sink);
/** EXP2 and LOG2 on float32 (and 16-bit floats, through float32) as plain ALU ops: see
 *  src/codegen/transcendental.cpp for the method and its accuracy. */
UOpRef decompose_transcendentals(const UOpRef& sink);
/** TRANSCENDENTAL=0 never decomposes, 1 (default) when the renderer has no native ones, 2 always. */
bool want_transcendental_decomposition(const Renderer& r);

/** The accumulator arrays a REDUCE of op over dtype d takes in the lowered kernel: 2 for a float MAX (a plain
 *  maximum and a NaN carrier, see src/codegen/lower.cpp), 1 otherwise. The heuristic's register tile counts them. */
int reduce_accumulators(Ops op, DType d);

/** Only linearise an already lowered SINK (exposed for renderer tests). */
std::vector<const UOp*> linearize(const UOpRef& sink);

}  // namespace tg
