// TinyJit: capture, verify, replay.
#include "tg/jit.hpp"

#include "tg/device.hpp"
#include "tg/schedule.hpp"

namespace tg {

namespace {
std::string spec_str(const Shape& s, DType d) { return shape_str(s) + " " + d.name(); }
}  // namespace

std::vector<Tensor> TinyJit::run_capture(const std::vector<Tensor>& inputs, std::vector<JitItem>& items) {
  jit_begin_capture(&items);
  std::vector<Tensor> out;
  try {
    out = fn_(inputs);
    std::vector<Tensor*> ptrs;
    for (auto& t : out) ptrs.push_back(&t);
    Tensor::realize_all(ptrs);
  } catch (...) {
    jit_end_capture();
    throw;
  }
  jit_end_capture();
  return out;
}

std::vector<Tensor> TinyJit::operator()(const std::vector<Tensor>& in) {
  std::vector<Tensor> inputs = in;
  // Inputs are realised buffers; their shapes and dtypes are fixed by the first call.
  std::vector<Tensor*> lazy;
  for (auto& t : inputs)
    if (!contiguous_buffer(t.uop().get())) {
      t = t.contiguous();
      lazy.push_back(&t);
    }
  if (!lazy.empty()) Tensor::realize_all(lazy);
  if (calls_ == 0) {
    for (auto& t : inputs) specs_.emplace_back(t.shape(), t.dtype());
  } else {
    if (inputs.size() != specs_.size())
      throw Error("[TinyJit] called with " + std::to_string(inputs.size()) + " inputs, first call had " +
                  std::to_string(specs_.size()));
    for (size_t i = 0; i < inputs.size(); i++)
      if (inputs[i].shape() != specs_[i].first || !(inputs[i].dtype() == specs_[i].second))
        throw Error("[TinyJit] input " + std::to_string(i) + " changed from " + spec_str(specs_[i].first, specs_[i].second) +
                    " to " + spec_str(inputs[i].shape(), inputs[i].dtype()));
  }
  if (calls_ == 0) {  // warm up: compile everything
    calls_++;
    std::vector<Tensor> out = fn_(inputs);
    std::vector<Tensor*> ptrs;
    for (auto& t : out) ptrs.push_back(&t);
    Tensor::realize_all(ptrs);
    return out;
  }
  if (calls_ == 1 || calls_ == 2) {  // capture twice: the kernel sequences must agree
    std::vector<JitItem> items;
    std::vector<Tensor> out = run_capture(inputs, items);
    if (calls_ == 2) {
      bool same = items.size() == items_.size();
      for (size_t i = 0; same && i < items.size(); i++) same = items[i].key == items_[i].key;
      if (!same)
        throw Error("[TinyJit] the function launched " + std::to_string(items_.size()) + " kernels on its second call and " +
                    std::to_string(items.size()) + " different ones on its third: it cannot be replayed (does it "
                    "branch on values, or change shapes?)");
    }
    items_ = std::move(items);
    input_bufs_.clear();
    for (auto& t : inputs) input_bufs_.push_back(buffer_of(contiguous_buffer(t.uop().get())).get());
    outputs_ = out;
    calls_++;
    return out;
  }
  // Replay with this call's input buffers in place of the captured ones.
  std::vector<std::shared_ptr<Buffer>> now;
  for (auto& t : inputs) now.push_back(buffer_of(contiguous_buffer(t.uop().get())));
  std::vector<Buffer*> bufs;
  for (const JitItem& it : items_) {
    bufs.clear();
    for (auto& b : it.bufs) {
      Buffer* use = b.get();
      for (size_t k = 0; k < input_bufs_.size(); k++)
        if (input_bufs_[k] == b.get()) use = now[k].get();
      bufs.push_back(use);
    }
    jit_run(it, bufs);
  }
  calls_++;
  return outputs_;
}

}  // namespace tg
