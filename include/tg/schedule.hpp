#pragma once
// The scheduler: from tensor-graph UOps to a list of kernels (rangeify + fusion), and the engine that runs them.
// Thread-safety: scheduling and running are not reentrant; call from one thread at a time (Tensor::realize does:
// it holds the process-wide realise lock around both).
#include "tg/config.hpp"

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tg/device.hpp"
#include "tg/uop.hpp"

namespace tg {

/** One unit of work: a kernel (ast = SINK of STOREs into PARAM 0.., see codegen.hpp) or a COPY between buffers. */
struct ScheduleItem {
  /// a kernel to compile and run, or a copy between buffers (across devices)
  ///@{
  enum class Kind { Kernel, Copy } kind = Kind::Kernel;
  ///@}
  UOpRef ast;                                  ///< kernel AST (PARAM i is bufs[i])
  std::vector<std::shared_ptr<Buffer>> bufs;   ///< outputs first
  /// the name of the device that runs it
  std::string device;
  /// the kernel checks indices in range: bufs.back() is its hit record (see IndexCheck), zeroed before the launch
  /// and read after it
  bool index_check = false;
};

/** Indices checked in the kernel. An op whose index tensor must lie in [0, n) (gather, index_select, nll_loss,
 *  cross_entropy) marks the compare of its one-hot mask: CMPEQ with arg {code} or {code, except} (a value allowed
 *  outside the range, as ignore_index). The kernel-AST stage that folds the one-hot sum into a load also stores a
 *  hit, when the index is outside [0, n), into a 3-slot int64 record: {code + 1, the index, n}. run_schedule reads
 *  the record after the kernel and throws a tg::Error naming the op, the index and the axis size. */
struct IndexCheck {
  /// the ops that mark their index compares, by code
  static constexpr const char* ops[] = {"gather", "index_select", "nll_loss", "cross_entropy"};
  /// slots of the hit record
  static constexpr int64_t kSlots = 3;
  /// the code of op (an entry of ops); throws for another name
  static int64_t code(const std::string& op);
  /// the error a nonzero record describes, or "" for a zero record
  static std::string message(const int64_t* record);
};

/** Kernels in dependency order, and what each realised tensor-graph node became (a view of its buffer). */
struct Schedule {
  /// the work, in an order that respects every dependency
  std::vector<ScheduleItem> items;
  /// (tensor-graph node, view of the buffer that now holds it) for each realised node
  std::vector<std::pair<UOpRef, UOpRef>> becomes;
  /** The values of the graph's bound variables (kernel parameters by name; the kernels themselves are unbound). */
  std::vector<std::pair<std::string, int64_t>> var_vals;
};

/** Split the graphs under `roots` into kernels. Movement ops become index arithmetic; elementwise ops and
 *  reductions fuse; reductions that are expanded or used twice, CONTIGUOUS, COPY and the roots materialise. */
Schedule create_schedule(std::span<const UOpRef> roots);
/** Compile every kernel (in parallel when several are new), then run them in order. */
void run_schedule(Schedule& s);

// ---- buffers in the tensor graph

/** A new BUFFER node (arg = (id, size), src = DEVICE) with its Buffer. */
UOpRef new_buffer_uop(const std::string& device, DType dtype, size_t size);
/** A new BUFFER node for an existing Buffer (e.g. one over a mapped file on DISK). */
UOpRef buffer_uop(std::shared_ptr<Buffer> b);
/** The Buffer behind a BUFFER node (null when the node is not a BUFFER). */
std::shared_ptr<Buffer> buffer_of(const UOp* buffer_uop);
/** The BUFFER under a contiguous view (BUFFER or RESHAPE(BUFFER)), else null. */
const UOp* contiguous_buffer(const UOp* u);
/** The BUFFER an assign writes: its target, a buffer or a view of one through movement ops that address each element
 *  once (RESHAPE, PERMUTE, SHRINK, FLIP: `cache.shrink(rows).assign(x)` writes those rows in place); else null. */
const UOp* assign_buffer(const UOp* target);

/** Number of schedules built (a realize whose graph structure was seen before builds none). */
size_t schedules_built();
/** Number of kernels run since start (tests count kernels with it). */
size_t kernels_run();
/** Number of kernels lowered since start: those found neither in memory nor in the on-disk program cache (a
 *  later process loads a kernel lowered once from cache_dir(), keyed by the AST's content key, the device, its
 *  compiler, the opt config and knobs, and this build of tg; CACHELEVEL=0 turns it off). */
size_t kernels_lowered();

/** A hook called with each kernel AST the engine lowers and compiles (a kernel-cache miss), with the kernel's
 *  name; called from compile threads, so it must be thread-safe. Tests use it to render every kernel for another
 *  device as well (tests/nvrtc_check.cpp). Set it before running anything; an empty function removes it. */
void set_kernel_compile_hook(std::function<void(const UOpRef& ast, const std::string& name)> hook);

}  // namespace tg
