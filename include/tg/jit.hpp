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

#include "tg/tensor.hpp"

namespace tg {

class Buffer;
/** One launched kernel or copy, as captured. */
struct JitItem {
  std::shared_ptr<void> runner;  // the compiled kernel (null for a copy)
  std::vector<std::shared_ptr<Buffer>> bufs;
  const void* key = nullptr;     // identifies the kernel (its AST), for comparing captures
};
/** Start / stop recording every item run_schedule executes on this thread. */
void jit_begin_capture(std::vector<JitItem>* sink);
void jit_end_capture();
/** Run one captured item on these buffers (same count and sizes as captured). */
void jit_run(const JitItem& item, const std::vector<Buffer*>& bufs);

/** Wraps a step function of tensors. Inputs must keep their shapes and dtypes across calls. */
class TinyJit {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  explicit TinyJit(Fn fn) : fn_(std::move(fn)) {}
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);
  /** Number of calls so far, and whether the next call replays. */
  int calls() const { return calls_; }
  bool replaying() const { return calls_ >= 3; }
  size_t captured_kernels() const { return items_.size(); }

 private:
  std::vector<Tensor> run_capture(const std::vector<Tensor>& inputs, std::vector<JitItem>& items);
  Fn fn_;
  int calls_ = 0;
  std::vector<std::pair<Shape, DType>> specs_;
  std::vector<JitItem> items_;
  std::vector<const Buffer*> input_bufs_;  // the inputs' buffers during the capture that is replayed
  std::vector<Tensor> outputs_;
};

}  // namespace tg
