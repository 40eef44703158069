// TinyJit: capture, verify, replay.
#include "tg/jit.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <unordered_set>

#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/schedule.hpp"

namespace tg {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string r;
  for (auto& x : v) r += (r.empty() ? "" : ", ") + x;
  return r;
}

// An input's shape with its symbolic dims unbound (the values may change between calls, the expressions may not).
std::string shape_key(const Tensor& t) {
  SymShape s;
  for (const sint& d : t.sym_shape()) s.emplace_back(unbind(d.uop()));
  return shape_str(s);
}

// This call's variable values: the bound Variables passed, then those bound in the inputs' symbolic dims.
VarVals call_vals(const std::vector<Tensor>& inputs, const std::vector<sint>& vars) {
  std::vector<UOpRef> roots;
  for (const sint& v : vars) {
    if (v.uop()->op != Ops::BIND) throw Error("[TinyJit] a variable argument must be a bound Variable (Variable::bind), got " + v.str());
    roots.push_back(v.uop());
  }
  for (const Tensor& t : inputs)
    if (t.is_symbolic()) roots.push_back(t.uop());
  return bound_vars(roots, "TinyJit");
}
// The capture in progress on this thread: its items so far, the function's input buffers, whether a host read saw
// a value computed from them.
struct CaptureWatch {
  const std::vector<JitItem>* items = nullptr;
  std::vector<const Buffer*> inputs;
  bool input_read = false;
};
thread_local CaptureWatch* g_watch = nullptr;
}  // namespace

void jit_note_host_read(const Buffer* b) {
  CaptureWatch* w = g_watch;
  if (!w || w->input_read) return;
  // taint: the inputs, then every buffer an item writes (bufs[0, outputs)) from a tainted one
  std::unordered_set<const Buffer*> tainted(w->inputs.begin(), w->inputs.end());
  for (const JitItem& it : *w->items) {
    size_t n_out = std::min(it.outputs, it.bufs.size());
    bool reads = false;
    for (size_t k = n_out; k < it.bufs.size() && !reads; k++) reads = tainted.count(it.bufs[k].get()) > 0;
    if (reads)
      for (size_t k = 0; k < n_out; k++) tainted.insert(it.bufs[k].get());
  }
  w->input_read = tainted.count(b) > 0;
}

std::vector<Tensor> TinyJit::run_capture(const std::vector<Tensor>& inputs, const std::vector<sint>& vars,
                                         std::vector<JitItem>& items) {
  CaptureWatch watch{&items, {}, false};
  for (auto& t : inputs) watch.inputs.push_back(buffer_of(contiguous_buffer(t.uop().get())).get());
  jit_begin_capture(&items);
  g_watch = &watch;
  std::vector<Tensor> out;
  try {
    out = fn_(inputs, vars);
    std::vector<Tensor*> ptrs;
    for (auto& t : out) ptrs.push_back(&t);
    Tensor::realize_all(ptrs);
  } catch (...) {
    jit_end_capture();
    g_watch = nullptr;
    throw;
  }
  jit_end_capture();
  g_watch = nullptr;
  if (watch.input_read) {
    reads_inputs_ = true;
    throw Error("[TinyJit] the function read a value computed from its inputs on the host (to_vector, item, a shape "
                "or branch taken from data): a replay would reuse the value read during the capture; run it without "
                "the JIT");
  }
  return out;
}

// The items that compute only from constant buffers (set_constant_buffers) or from such items' results: a replay
// would compute the same values again. Each is run once more here into a buffer of its own (the memory planner may
// have handed its output to a later kernel), which the items after it read until that buffer is written again, and
// is not replayed.
void TinyJit::drop_constant_items() {
  if (constants_.empty() || !var_names_.empty()) return;  // a kernel with variables computes per call
  std::unordered_set<const Buffer*> constant(constants_.begin(), constants_.end());
  for (const Buffer* b : input_bufs_) constant.erase(b);
  std::unordered_map<const Buffer*, std::shared_ptr<Buffer>> renamed;  // a dropped item's output -> its own buffer
  std::vector<JitItem> kept;
  for (JitItem& it : items_) {
    const size_t n_out = std::min(it.outputs, it.bufs.size());
    for (size_t k = n_out; k < it.bufs.size(); k++)
      if (auto r = renamed.find(it.bufs[k].get()); r != renamed.end()) it.bufs[k] = r->second;
    bool fixed = !it.index_check && !it.writes_existing && n_out > 0 && n_out < it.bufs.size();
    for (size_t k = 0; k < it.bufs.size() && fixed; k++) {
      const Buffer* b = it.bufs[k].get();
      fixed = k < n_out ? !constant.count(b) && std::find(input_bufs_.begin(), input_bufs_.end(), b) == input_bufs_.end()
                        : constant.count(b) > 0;
    }
    if (!fixed) {
      for (size_t k = 0; k < n_out; k++) renamed.erase(it.bufs[k].get());  // written again: later reads see this
      kept.push_back(std::move(it));
      continue;
    }
    for (size_t k = 0; k < n_out; k++) {
      const Buffer& b = *it.bufs[k];
      auto own = std::make_shared<Buffer>(b.device(), b.dtype(), b.size());
      renamed[it.bufs[k].get()] = own;
      it.bufs[k] = own;
      constant.insert(own.get());
    }
    std::vector<Buffer*> raw;
    for (auto& b : it.bufs) raw.push_back(b.get());
    jit_run(it, raw, {}, nullptr);
    held_.push_back(std::move(it.bufs));  // the results stay allocated
  }
  items_ = std::move(kept);
}

// The capture's intermediates (tinygrad's JIT memory planner): a buffer only the captured items hold (no tensor,
// not an input, not an output) lives from the item that first writes it to the last that touches it, and later
// intermediates take its storage after that (plan_reuse, as the schedule's "plan memory" stage does within one
// schedule: this plans across the schedules a step realises, a model's layers one after another). A checked
// kernel's inputs and record keep theirs (a replay reads the records after its last kernel); a copy's buffers are
// reused only at exactly their size.
void TinyJit::plan_memory() {
  std::unordered_map<const Buffer*, int> id;
  std::vector<std::shared_ptr<Buffer>> buf;
  std::vector<long> uses;  // the items' references to each buffer
  std::vector<std::vector<int>> steps;
  std::vector<size_t> n_out;
  for (const JitItem& it : items_) {
    std::vector<int>& step = steps.emplace_back();
    for (const auto& b : it.bufs) {
      auto [p, fresh] = id.try_emplace(b.get(), int(buf.size()));
      if (fresh) buf.push_back(b), uses.push_back(0);
      uses[size_t(p->second)]++;
      step.push_back(p->second);
    }
    n_out.push_back(std::min(it.outputs, it.bufs.size()));
  }
  std::vector<ReuseBuffer> rb(buf.size());
  for (size_t b = 0; b < buf.size(); b++) {
    // held elsewhere too (a tensor, the registry of live BUFFER nodes, set_constant_buffers' results): kept
    const bool only_items = buf[b].use_count() == uses[b] + 1 &&  // + 1: buf's own reference
                            std::find(input_bufs_.begin(), input_bufs_.end(), buf[b].get()) == input_bufs_.end();
    rb[b] = {buf[b]->device(), buf[b]->dtype(), int64_t(buf[b]->size()), false, only_items, only_items};
  }
  for (size_t i = 0; i < items_.size(); i++) {
    if (!items_[i].runner)
      for (int b : steps[i]) rb[size_t(b)].exact = true;
    if (items_[i].index_check)
      for (size_t k = n_out[i]; k < steps[i].size(); k++) rb[size_t(steps[i][k])].release = false;
  }
  const std::vector<int> remap = plan_reuse(rb, steps, n_out);
  for (size_t i = 0; i < items_.size(); i++)
    for (size_t k = 0; k < steps[i].size(); k++) items_[i].bufs[k] = buf[size_t(remap[size_t(steps[i][k])])];
  if (debug_level() >= 1) {  // as tinygrad's "JIT memory reduced from ..."
    size_t n = 0, kept = 0;
    double bytes = 0, kept_bytes = 0;
    for (size_t b = 0; b < buf.size(); b++)
      if (rb[b].take) {
        n++, bytes += double(buf[b]->nbytes());
        if (remap[b] == int(b)) kept++, kept_bytes += double(buf[b]->nbytes());
      }
    std::fprintf(stderr, "tg: TinyJit: the capture's %zu intermediate buffers (%.2f MB) share %zu (%.2f MB)\n", n, bytes / 1e6,
                 kept, kept_bytes / 1e6);
  }
}

std::vector<Tensor> TinyJit::operator()(const std::vector<Tensor>& in, const std::vector<sint>& vars) {
  std::vector<Tensor> inputs = in;
  // Inputs are realised buffers; their shapes and dtypes are fixed by the first call.
  std::vector<Tensor*> lazy;
  for (auto& t : inputs)
    if (!contiguous_buffer(t.uop().get())) {
      t = t.contiguous();
      lazy.push_back(&t);
    }
  if (!lazy.empty()) Tensor::realize_all(lazy);
  VarVals vals = call_vals(inputs, vars);
  std::vector<std::string> names;
  for (auto& [k, v] : vals) names.push_back(k);
  if (calls_ == 0) {
    for (auto& t : inputs) specs_.emplace_back(shape_key(t), t.dtype());
    var_names_ = names;
  } else {
    if (names != var_names_)
      throw Error("[TinyJit] called with the variables (" + join(names) + "), the first call had (" + join(var_names_) + ")");
    if (inputs.size() != specs_.size())
      throw Error("[TinyJit] called with " + std::to_string(inputs.size()) + " inputs, first call had " +
                  std::to_string(specs_.size()));
    for (size_t i = 0; i < inputs.size(); i++)
      if (shape_key(inputs[i]) != specs_[i].first || !(inputs[i].dtype() == specs_[i].second))
        throw Error("[TinyJit] input " + std::to_string(i) + " changed from " + specs_[i].first + " " +
                    specs_[i].second.name() + " to " + shape_key(inputs[i]) + " " + inputs[i].dtype().name());
  }
  if (calls_ == 0) {  // warm up: compile everything
    calls_++;
    std::vector<Tensor> out = fn_(inputs, vars);
    std::vector<Tensor*> ptrs;
    for (auto& t : out) ptrs.push_back(&t);
    Tensor::realize_all(ptrs);
    return out;
  }
  if (calls_ == 1 || calls_ == 2) {  // capture twice: the kernel sequences must agree
    std::vector<JitItem> items;
    std::vector<Tensor> out = run_capture(inputs, vars, items);
    if (calls_ == 2) {
      bool same = items.size() == items_.size();
      for (size_t i = 0; same && i < items.size(); i++) same = items[i].key == items_[i].key;
      if (!same)
        throw Error("[TinyJit] the function launched " + std::to_string(items_.size()) + " kernels on its second call and " +
                    std::to_string(items.size()) + " different ones on its third: it cannot be replayed (does it "
                    "branch on values, or change shapes?)");
    }
    items_ = std::move(items);
    std::set<std::string> devices;
    for (const JitItem& it : items_)
      for (const auto& b : it.bufs) devices.insert(b->device());
    devices_.assign(devices.begin(), devices.end());
    input_bufs_.clear();
    for (auto& t : inputs) input_bufs_.push_back(buffer_of(contiguous_buffer(t.uop().get())).get());
    if (calls_ == 2) drop_constant_items(), plan_memory();
    outputs_ = out;
    calls_++;
    return out;
  }
  // Replay with this call's input buffers in place of the captured ones.
  std::vector<std::shared_ptr<Buffer>> now;
  for (auto& t : inputs) now.push_back(buffer_of(contiguous_buffer(t.uop().get())));
  // A lazy tensor that reads what the replay overwrites (a parameter, a previous call's output) keeps its value.
  std::vector<const Buffer*> written;
  for (const JitItem& it : items_)
    for (size_t k = 0; k < it.outputs && k < it.bufs.size(); k++) {
      const Buffer* b = it.bufs[k].get();
      for (size_t i = 0; i < input_bufs_.size(); i++)
        if (input_bufs_[i] == b) b = now[i].get();
      written.push_back(b);
    }
  realize_readers_of(written);
  std::vector<std::vector<Buffer*>> bufs(items_.size());
  IndexChecks checks;  // the replay's index checks, read together after it (or before it changes state)
  for (size_t i = 0; i < items_.size(); i++) {
    for (auto& b : items_[i].bufs) {
      Buffer* use = b.get();
      for (size_t k = 0; k < input_bufs_.size(); k++)
        if (input_bufs_[k] == b.get()) use = now[k].get();
      bufs[i].push_back(use);
    }
    if (items_[i].index_check) IndexChecks::arm(bufs[i]);
  }
  for (size_t i = 0; i < items_.size(); i++) jit_run(items_[i], bufs[i], vals, &checks);
  checks.flush(vals);
  for (const std::string& d : devices_) get_device(d).allocator().end_round();
  calls_++;
  // Symbolic outputs: the same buffers, their dims bound to this call's values.
  for (Tensor& t : outputs_)
    if (t.is_symbolic()) t.impl()->uop = rebind(t.uop(), vals);
  return outputs_;
}

}  // namespace tg
