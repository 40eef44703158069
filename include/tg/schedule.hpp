#pragma once
// The scheduler: from tensor-graph UOps to a list of kernels (rangeify + fusion), and the engine that runs them.
// Thread-safety: scheduling and running are not reentrant; call from one thread at a time (Tensor::realize does:
// it holds the process-wide realise lock around both).
#include "tg/config.hpp"

#include <functional>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tg/device.hpp"
#include "tg/uop.hpp"

namespace tg {

/** An index check as a kernel of its own (see IndexCheck): the check's expressions over the checked kernel's
 *  inputs, storing, for every point of the check's loops, the index where it is out of range and INT64_MIN
 *  elsewhere into an int64 buffer of `size` elements. Run only after its kernel recorded a hit, to count them. */
struct IndexDiag {
  int64_t code = 0;  ///< the checking op (IndexCheck::ops)
  UOpRef ast;        ///< SINK of one STORE into PARAM 0
  int64_t size = 0;  ///< elements of its output
  std::vector<int> params;  ///< PARAM 1.. are these buffers of the checked kernel (positions in its bufs)
};

/** One unit of work: a kernel (ast = SINK of STOREs into PARAM 0.., see codegen.hpp) or a COPY between buffers. */
struct ScheduleItem {
  /// a kernel to compile and run, or a copy between buffers (across devices)
  ///@{
  enum class Kind { Kernel, Copy } kind = Kind::Kernel;
  ///@}
  UOpRef ast;                                  ///< kernel AST (PARAM i is bufs[i])
  std::vector<std::shared_ptr<Buffer>> bufs;   ///< outputs first
  /// how many of bufs it writes (bufs[0, n_out)); it reads the others (a checked kernel's IndexCheck record last,
  /// which its extra stores write: not an output)
  size_t n_out = 1;
  /// the name of the device that runs it
  std::string device;
  /// the kernel checks indices in range: bufs.back() is its hit record (see IndexCheck), zeroed before the run and
  /// read after it (with the run's other records, before any later kernel writes a buffer that existed before)
  bool index_check = false;
  /// it writes a buffer that existed before this schedule (an assign's target): the index checks of the kernels
  /// before it are read first, so a bad index stops the run before it changes any state
  bool writes_existing = false;
  /// the diagnostic kernels of its index checks
  std::vector<IndexDiag> index_diags;
};

/** Indices checked in the kernel. An op whose index tensor must lie in [0, n) (gather, index_select, nll_loss,
 *  cross_entropy, advanced indexing, scatter) marks the compare of its one-hot mask: CMPEQ with arg {code} or
 *  {code, except} (a value allowed outside the range, as ignore_index). The kernel-AST stage that folds the one-hot
 *  sum into a load also stores a hit, when the index is outside [0, n), into a 3-slot int64 record:
 *  {code + 1, the index, n}; for the ops that write through the mask (scatter, index_put: no sum to fold) every
 *  kernel that evaluates the marked compare stores the hit, for the others a kernel that evaluates it outside any
 *  reduce (a mask computed into a buffer, which the sum reading it cannot fold) does too. run_schedule reads the records after the run (a run
 *  stops at the first bad record before a kernel that writes existing state) and throws a tg::Error naming the op,
 *  the index as the user passed it, the axis size, and how many indices were out of range with the first few
 *  (found by a diagnostic kernel built from the same check, run only then). */
struct IndexCheck {
  /** An op that marks its index compare. */
  struct Op {
    const char* name;  ///< the op, as the error names it
    bool wraps;        ///< negative indices count from the end (the front end adds n): a wrapped index is reported as passed
    bool unfolded;     ///< checked wherever the compare is evaluated (under a reduce too), not only where it folds
  };
  /// the ops that mark their index compares, by code
  static constexpr Op ops[] = {{"gather", false, false},       {"index_select", true, false}, {"nll_loss", false, false},
                               {"cross_entropy", false, false}, {"index", true, true},         {"index_put", true, true},
                               {"scatter", false, true},        {"scatter_reduce", false, true}};
  /// slots of the hit record
  static constexpr int64_t kSlots = 3;
  /// the code of op (an entry of ops); throws for another name
  static int64_t code(const std::string& op);
  /// the op of a code (null for an unknown one)
  static const Op* op_of(int64_t code) { return code >= 0 && size_t(code) < std::size(ops) ? &ops[code] : nullptr; }
  /// the index the user passed for a checked one (a wrapping op's negative index had n added: still negative)
  static int64_t as_passed(int64_t code, int64_t index, int64_t n) {
    return op_of(code) && op_of(code)->wraps && index < 0 ? index - n : index;
  }
  /** The error a nonzero record describes, or "" for a zero record; `bad` lists the out-of-range indices as
   *  checked (all of them, or empty when only the record is known). */
  static std::string message(const int64_t* record, const std::vector<int64_t>& bad = {});
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

// ---- memory reuse: the schedule's "plan memory" stage and TinyJit's capture

/** A buffer of a sequence of steps, for plan_reuse. */
struct ReuseBuffer {
  std::string device;    ///< the device that holds it
  DType dtype;           ///< its elements' dtype
  int64_t size = 0;      ///< elements
  bool exact = false;    ///< takes and gives storage only of exactly its size (a copy's buffers)
  bool take = false;     ///< may hold its values in storage a buffer before it no longer needs (an intermediate)
  bool release = false;  ///< its storage is free for a later buffer once its last step has run
};
/** tinygrad's memory planner over a sequence of steps: steps[i] lists the buffers step i touches (ids into bufs),
 *  the n_out[i] it writes first. A `take` buffer whose first touch is a write takes the smallest free storage of its
 *  device and dtype that holds it (of exactly its size where either is `exact`); storage is free once the last step
 *  touching a `release` buffer that holds it has run (not for that step's own writes). A buffer read before any
 *  step writes it holds a value from before the steps (a replay's state from the previous one): it neither takes
 *  storage nor gives its own. Returns, for each buffer, the buffer whose storage holds it (itself where none was
 *  free). */
std::vector<int> plan_reuse(const std::vector<ReuseBuffer>& bufs, const std::vector<std::vector<int>>& steps,
                            const std::vector<size_t>& n_out);

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

// ---- CALL nodes in the tensor graph (src/schedule/call.cpp)

/** A CALL's arg in the tensor graph: kCallifyArg for Tensor::callify's CALL(values...) (compute these together), or
 *  the id of a custom kernel's AST (Tensor::custom_kernel) for CALL(sources...), its AST's PARAM i reading or
 *  writing source i. The outputs are AFTER(source i, CALL) with arg i. */
inline constexpr int64_t kCallifyArg = -1;
/** The id of a custom kernel's AST (the same id for the same AST, so its schedule is cached by structure). The
 *  registry keeps each distinct AST: it grows with the number of distinct custom kernels, not with calls. */
int64_t register_call_ast(const UOpRef& ast);
/** The AST registered under id (a tg::Error for an unknown id). */
UOpRef call_ast(int64_t id);
/** Whether u is an output of a custom kernel: AFTER(source, CALL) whose CALL's arg is an AST id. */
bool is_custom_after(const UOp* u);
/** Whether u is a callified value: AFTER(value, CALL) whose CALL's arg is kCallifyArg. */
bool is_callify_after(const UOp* u);

/** Number of schedules built (a realize whose graph structure was seen before builds none). */
size_t schedules_built();
/** Number of kernels run since start (tests count kernels with it). */
size_t kernels_run();
/** Number of times a run read its kernels' index-check records (IndexChecks::flush with records pending): one host
 *  sync each on an asynchronous device. A run reads them together after its last kernel, or earlier only before a
 *  kernel that writes existing state or overwrites what a checked kernel read (tests count syncs with it). */
size_t index_check_reads();
/** Number of kernels lowered since start: those found neither in memory nor in the on-disk program cache (a
 *  later process loads a kernel lowered once from cache_dir(), keyed by the AST's content key, the device, its
 *  compiler, the opt config and knobs, and this build of tg; CACHELEVEL=0 turns it off). */
size_t kernels_lowered();

/** A hook called with each kernel AST the engine lowers and compiles (a kernel-cache miss), with the kernel's
 *  name; called from compile threads, so it must be thread-safe. Tests use it to render every kernel for another
 *  device as well (tests/nvrtc_check.cpp). Set it before running anything; an empty function removes it. */
void set_kernel_compile_hook(std::function<void(const UOpRef& ast, const std::string& name)> hook);

}  // namespace tg
