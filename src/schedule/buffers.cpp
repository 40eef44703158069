// BUFFER nodes of the tensor graph and the Buffers behind them: a registry by id, emptied as the nodes are freed.
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "tg/schedule.hpp"

namespace tg {

const UOp* contiguous_buffer(const UOp* u) {
  if (u->op == Ops::BUFFER) return u;
  if (u->op == Ops::RESHAPE && u->src(0)->op == Ops::BUFFER) return u->src(0);
  return nullptr;
}

const UOp* assign_buffer(const UOp* t) {
  while (t->op == Ops::RESHAPE || t->op == Ops::PERMUTE || t->op == Ops::SHRINK || t->op == Ops::FLIP) t = t->src(0);
  return t->op == Ops::BUFFER ? t : nullptr;
}

namespace {

std::mutex g_buf_mu;
std::unordered_map<int64_t, std::shared_ptr<Buffer>> g_buffers;
std::atomic<int64_t> g_next_buffer{1};

void on_buffer_free(const UOp* u) {
  int64_t id = std::get<std::vector<int64_t>>(u->arg)[0];
  std::shared_ptr<Buffer> b;
  std::lock_guard lk(g_buf_mu);
  if (auto it = g_buffers.find(id); it != g_buffers.end()) {
    b = std::move(it->second);
    g_buffers.erase(it);
  }
}

}  // namespace

UOpRef new_buffer_uop(const std::string& device, DType dtype, size_t size) {
  return buffer_uop(std::make_shared<Buffer>(device, dtype, size));
}

UOpRef buffer_uop(std::shared_ptr<Buffer> b) {
  static bool hooked = (set_buffer_free_hook(&on_buffer_free), true);
  (void)hooked;
  int64_t id = g_next_buffer++;
  std::string device = b->device();
  DType dtype = b->dtype();
  size_t size = b->size();
  {
    std::lock_guard lk(g_buf_mu);
    g_buffers[id] = b;
  }
  UOpRef dev = UOp::make(Ops::DEVICE, dtypes::void_, {}, device);
  return UOp::make(Ops::BUFFER, dtype, {dev}, std::vector<int64_t>{id, int64_t(size)});
}

std::shared_ptr<Buffer> buffer_of(const UOp* u) {
  if (!u || u->op != Ops::BUFFER) return nullptr;
  std::lock_guard lk(g_buf_mu);
  auto it = g_buffers.find(std::get<std::vector<int64_t>>(u->arg)[0]);
  return it == g_buffers.end() ? nullptr : it->second;
}

}  // namespace tg
