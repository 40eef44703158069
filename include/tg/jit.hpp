#pragma once
// TinyJit: capture the kernels a step function launches, then replay them with new input buffers, skipping
// scheduling and lowering. Call 1 runs normally (and compiles), calls 2 and 3 run normally while capturing
// (the two captures must launch the same kernels), calls 4+ replay.
// Outputs are the same tensors on every replay: their buffers are overwritten (copy what you keep).
// Random numbers drawn inside the function (rand, randn, randint, dropout, ...) advance the device's generator
// state, a buffer the captured kernels read and update: every replay draws fresh numbers, the same ones as the
// same calls run eagerly (Tensor::manual_seed resets that buffer in place, so it applies to replays too).
// Thread-safety: one TinyJit is called from one thread; capture state is per thread.
#include "tg/config.hpp"

#include <functional>
#include <memory>
#include <vector>

#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

namespace tg {

class Buffer;
/** One launched kernel or copy, as captured. */
struct JitItem {
  std::shared_ptr<void> runner;  ///< the compiled kernel (null for a copy)
  /// the buffers it ran on, outputs first (a replay substitutes the inputs')
  std::vector<std::shared_ptr<Buffer>> bufs;
  const void* key = nullptr;     ///< identifies the kernel (its AST), for comparing captures
  size_t outputs = 1;            ///< bufs[0, outputs) are written
  bool index_check = false;      ///< bufs.back() is the kernel's IndexCheck record (schedule.hpp): a replay checks it
  bool writes_existing = false;  ///< it writes state that existed before its schedule (ScheduleItem::writes_existing)
  std::vector<IndexDiag> index_diags;  ///< its index checks' diagnostic kernels
};

/** The index checks of the kernels of one run (IndexCheck in schedule.hpp): each record is zeroed before the run
 *  (arm) and read after it with the others (flush: one host sync on an asynchronous device), or earlier: before a
 *  kernel that writes state that existed before the run, or that overwrites a buffer a checked kernel read (its
 *  diagnostic kernel, run after a hit, reads them again). flush throws the first hit as a tg::Error.
 *  Not thread-safe: one per run. */
class IndexChecks {
 public:
  /// zeroes the record of a checked kernel that will run on bufs (the record last)
  static void arm(const std::vector<Buffer*>& bufs);
  /// a checked kernel was launched on bufs (outputs first, the record last) on device
  void launched(std::vector<Buffer*> bufs, size_t n_out, std::string device, const std::vector<IndexDiag>* diags);
  /// before launching a kernel on bufs: reads the pending records now if it must (see the class comment)
  void before(const std::vector<Buffer*>& bufs, size_t n_out, bool writes_existing, const VarVals& vals);
  /// reads the pending records; throws for the first that recorded a hit (counting them with its diagnostic kernels)
  void flush(const VarVals& vals);

 private:
  struct Pending {
    std::vector<Buffer*> bufs;
    size_t n_out;
    std::string device;
    const std::vector<IndexDiag>* diags;
  };
  std::vector<Pending> pending_;
};
/** Start / stop recording every item run_schedule executes on this thread. */
void jit_begin_capture(std::vector<JitItem>* sink);
/// stops recording on this thread (see jit_begin_capture)
void jit_end_capture();
/** During a TinyJit capture, notes a host read (to_vector, item) of buffer `b`: the capture cannot be replayed if
 *  `b` holds a value computed from the function's inputs (a replay would reuse the value read at capture). */
void jit_note_host_read(const Buffer* b);
/** Realise, in one schedule, the live lazy tensors that read any of these buffers (not pure views of them): a
 *  replay calls it before overwriting them, so a tensor keeps the value it had when it was defined. */
void realize_readers_of(const std::vector<const Buffer*>& written);
/** Run one captured item on these buffers (same count and sizes as captured). */
void jit_run(const JitItem& item, const std::vector<Buffer*>& bufs, const VarVals& vals = {}, IndexChecks* checks = nullptr);

/** Wraps a step function of tensors. Inputs must keep their shapes and dtypes across calls; a symbolic dim (see
 *  tg/variable.hpp) may take another value on each call, and so may the bound Variables passed beside the inputs:
 *  a replay launches the captured kernels with the new values, compiling nothing. */
class TinyJit {
 public:
  /// A step from input tensors to output tensors.
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  /** A step that also takes bound Variables: `jit({tok}, {pos.bind(p)})`, the function using `vars[0]` in shapes. */
  using FnVars = std::function<std::vector<Tensor>(const std::vector<Tensor>&, const std::vector<sint>&)>;
  /// wraps a step that takes tensors only
  explicit TinyJit(Fn fn) : fn_([f = std::move(fn)](const std::vector<Tensor>& in, const std::vector<sint>&) { return f(in); }) {}
  /// wraps a step that also takes bound Variables
  explicit TinyJit(FnVars fn) : fn_(std::move(fn)) {}
  /// runs the step: call 1 warms up, calls 2-3 capture its kernels (they must agree), later calls replay them
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs, const std::vector<sint>& vars = {});
  /** Number of calls so far, and whether the next call replays. */
  int calls() const { return calls_; }
  /// whether the next call replays the capture (after three calls)
  bool replaying() const { return calls_ >= 3; }
  /// number of kernels and copies the capture holds
  size_t captured_kernels() const { return items_.size(); }
  /** Whether a capture read a value computed from the inputs on the host (the call threw: such a function cannot be
   *  replayed; run it without the JIT). */
  bool reads_inputs_on_host() const { return reads_inputs_; }
  /** Buffers the step reads that no one changes between calls (a model's weights): kernels computing only from them
   *  (a weight's layout copy) run in the capture and are not replayed; their results stay in the capture's buffers.
   *  Set before the third call. */
  void set_constant_buffers(std::vector<const Buffer*> bufs) { constants_ = std::move(bufs); }

 private:
  std::vector<Tensor> run_capture(const std::vector<Tensor>& inputs, const std::vector<sint>& vars, std::vector<JitItem>& items);
  FnVars fn_;
  int calls_ = 0;
  bool reads_inputs_ = false;
  std::vector<std::pair<std::string, DType>> specs_;  // each input's shape (symbolic dims by expression) and dtype
  std::vector<std::string> var_names_;
  std::vector<JitItem> items_;
  std::vector<const Buffer*> input_bufs_;  // the inputs' buffers during the capture that is replayed
  std::vector<Tensor> outputs_;
  std::vector<std::string> devices_;  // the devices the capture's buffers are on: a replay ends a round of each allocator
  std::vector<const Buffer*> constants_;  // set_constant_buffers
  std::vector<std::vector<std::shared_ptr<Buffer>>> held_;  // the buffers of the items drop_constant_items dropped
  void drop_constant_items();
  void plan_memory();  // intermediates share storage (jit.cpp)
};

}  // namespace tg
