// The CPU device: 64-byte aligned host memory, the LLVM (default) or clang compiler, registered as "CPU".
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include "cpu.hpp"
#include "tg/env.hpp"
#include "tg/render.hpp"

namespace tg::cpu {

namespace {

// The arena a launch runs its parallel calls in: a device queue's worker sets its own (CPU_DEVICE_THREADS).
thread_local tbb::task_arena* t_arena = nullptr;

// CPU_DEVICE_THREADS: a device's launches run in order on a worker thread of its own, in an arena of that many
// threads, so two logical devices compute at the same time, each on its share of the cores. wait() returns once
// every launch so far has run (and rethrows the first error one raised). Each pushed item has a ticket (1, 2, ...);
// wait_for(t) returns once the first t items have run: a copy between two queued devices waits on the other
// queue's ticket from its own (see CpuDevice::enqueue_copy).
class LaunchQueue {
 public:
  explicit LaunchQueue(int threads) : arena_(threads, 1), worker_([this] { loop(); }) {}
  /// the process that owns the worker (a forked child has no worker: it runs launches itself)
  pid_t pid() const { return pid_; }
  ~LaunchQueue() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    more_.notify_all();
    worker_.join();
  }
  uint64_t push(std::function<void()> f) {
    uint64_t t;
    {
      std::lock_guard lk(mu_);
      q_.push_back(std::move(f));
      pending_++;
      t = ++pushed_;
    }
    more_.notify_all();
    return t;
  }
  /// the ticket of the last item pushed (0: none yet)
  uint64_t pushed() {
    std::lock_guard lk(mu_);
    return pushed_;
  }
  /// wait until the items up to ticket t have run (their errors stay for wait() to rethrow)
  void wait_for(uint64_t t) {
    std::unique_lock lk(mu_);
    idle_.wait(lk, [&] { return pushed_ - pending_ >= t; });
  }
  void wait(bool rethrow = true) {
    std::unique_lock lk(mu_);
    idle_.wait(lk, [&] { return pending_ == 0; });
    if (rethrow && error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    t_arena = &arena_;
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock lk(mu_);
        more_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      std::exception_ptr e;
      try {
        f();
      } catch (...) {
        e = std::current_exception();
      }
      {
        std::lock_guard lk(mu_);
        if (e && !error_) error_ = e;
        pending_--;
      }
      idle_.notify_all();
    }
  }
  const pid_t pid_ = getpid();
  tbb::task_arena arena_;
  std::mutex mu_;
  std::condition_variable more_, idle_;
  std::deque<std::function<void()>> q_;
  size_t pending_ = 0;
  uint64_t pushed_ = 0;  // items pushed so far: pushed_ - pending_ have run
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

// A program of a device with a launch queue: each run copies its arguments and is queued.
class QueuedProgram : public Program {
 public:
  QueuedProgram(std::shared_ptr<Program> p, LaunchQueue& q) : p_(std::move(p)), q_(q) {}
  void run(void* const* bufs, const int64_t* vars, const LaunchDims& dims) override {
    // A caller that does not give the arrays' length (BEAM's timing, tests), or a forked child (BEAM's crash
    // probe): the launches before it, then this one on the calling thread.
    if ((dims.n_bufs <= 0 && bufs) || getpid() != q_.pid()) {
      if (getpid() == q_.pid()) q_.wait();
      return p_->run(bufs, vars, dims);
    }
    std::vector<void*> b(bufs, bufs + std::max(dims.n_bufs, 0));
    std::vector<int64_t> v(vars, vars + std::max(dims.n_vars, 0));
    q_.push([p = p_, b = std::move(b), v = std::move(v), dims] { p->run(b.data(), v.data(), dims); });
  }

 private:
  std::shared_ptr<Program> p_;
  LaunchQueue& q_;
};

class CpuAllocator : public Allocator {
 public:
  ~CpuAllocator() override { clear_cache(); }
  void copyin(void* dst, const void* host_src, size_t bytes) override { std::memcpy(dst, host_src, bytes); }
  void copyout(void* host_dst, const void* src, size_t bytes) override { std::memcpy(host_dst, src, bytes); }
  void copyin_at(void* dst, size_t offset, const void* host_src, size_t bytes) override {
    std::memcpy(static_cast<char*>(dst) + offset, host_src, bytes);
  }
  // Physical memory: Linux overcommits, so a larger malloc can succeed and the process be killed on first touch.
  bool host_memory() const override { return true; }
  size_t capacity() const override {
    static const size_t cap = [] {
      long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
      return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : SIZE_MAX;
    }();
    return cap;
  }

 protected:
  // Blocks of kMapped bytes or more are mappings of their own: freeing one gives its pages back to the system at
  // once (glibc's heap would keep them after its mmap threshold adapts upwards, up to 32 MiB a block), and pages
  // never written (a KV cache's rows past the position reached) take no memory.
  // Blocks of kHuge bytes or more ask for transparent huge pages (where the system leaves THP to madvise, as Debian
  // does): a first run touching a model's activations takes one page fault per 2 MiB instead of per 4 KiB (PaddleOCR
  // det: 54,000 faults), and kernels streaming through them miss the TLB less. Pages are still faulted in on first
  // write, 2 MiB at a time.
  static constexpr size_t kMapped = size_t(1) << 20, kHuge = size_t(4) << 20;
  void* alloc_raw(size_t bytes) override {
    if (bytes >= kMapped) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      if (bytes >= kHuge) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: refused, the block has small pages
      return p;
    }
    size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;  // aligned_alloc wants a multiple of the alignment
    return std::aligned_alloc(64, n);
  }
  void free_raw(void* p, size_t bytes) override {
    if (queue) queue->wait(false);  // a queued launch may still use it
    if (bytes >= kMapped) {
      munmap(p, bytes);
      return;
    }
    // A smaller block goes back to the C heap, which keeps its pages resident until malloc_trim (a block freed
    // between two that live stays a hole): its whole pages go back to the system first. Their contents are
    // dropped (zero pages on the next touch); the block's first page, where free() writes its links, and anything
    // past its end are left alone.
    static const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t from = (reinterpret_cast<uintptr_t>(p) + 64 + page - 1) / page * page;
    const uintptr_t to = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
    if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
    std::free(p);
  }

 public:
  LaunchQueue* queue = nullptr;  // the device's, with CPU_DEVICE_THREADS
};

// THREADS=N (1..1024; 0 is an error, not "auto"), else the CPUs this process may run on.
int cpu_threads() {
  if (int64_t n = getenv_int("THREADS", 0, 1, 1024); n > 0) return int(n);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

class CpuDevice : public Device {
 public:
  CpuDevice(std::string name, CompilerKind kind) : name_(std::move(name)), kind_(kind) {
    if (int64_t share = getenv_int("CPU_DEVICE_THREADS", 0, 0, 1024); share > 0) {
      threads_ = int(share);
      queue_ = std::make_unique<LaunchQueue>(threads_);
      allocator_.queue = queue_.get();
    }
    if (kind == CompilerKind::LLVM) {
      renderer_ = std::make_unique<LLVMRenderer>();
      compiler_ = make_llvm_compiler();
    } else {
      renderer_ = std::make_unique<CRenderer>();
      compiler_ = make_clang_compiler();
    }
  }
  const std::string& name() const override { return name_; }
  Allocator& allocator() override { return allocator_; }
  Renderer& renderer() override { return *renderer_; }
  Compiler& compiler() override { return *compiler_; }
  int threads() const override { return threads_; }
  MachineModel machine() const override {
    std::call_once(model_once_, [&] { model_ = machine_model_of(cpu_target(), threads_); });
    return model_;
  }
  bool index64() const override { return true; }
  bool virtual_copy() const override { return name_.find(':') != std::string::npos; }  // CPU:N, N > 0
  std::unique_ptr<Program> load(const std::vector<uint8_t>& binary, const std::string& name) override {
    std::unique_ptr<Program> p = kind_ == CompilerKind::LLVM ? load_llvm_object(binary, name) : load_shared_object(binary, name);
    if (queue_) return std::make_unique<QueuedProgram>(std::move(p), *queue_);
    return p;
  }
  void synchronize() override {
    if (queue_) queue_->wait();
  }
  // Between two devices with launch queues: the memcpy is queued on the source's queue once the destination's
  // queue has run what was pushed on it so far (its readers of dst's old contents), and the destination's queue
  // waits for it before what is pushed on it later. Every wait is for an item pushed earlier, so no two queues
  // wait for each other. Freed memory stays safe: freeing waits for the device's own queue, and a block reused from
  // a device's cache is written only by its queue or by a copy ordered after it as here.
  bool enqueue_copy(void* dst, Device& from, const void* src, size_t bytes) override {
    auto* f = dynamic_cast<CpuDevice*>(&from);
    if (!queue_ || !f || !f->queue_ || getpid() != queue_->pid() || getpid() != f->queue_->pid()) return false;
    if (f == this) {
      queue_->push([=] { std::memcpy(dst, src, bytes); });
      return true;
    }
    LaunchQueue &to = *queue_, &fq = *f->queue_;
    const uint64_t dst_ready = to.pushed();
    const uint64_t copied = fq.push([=, &to] {
      to.wait_for(dst_ready);
      std::memcpy(dst, src, bytes);
    });
    to.push([=, &fq] { fq.wait_for(copied); });
    return true;
  }
  ~CpuDevice() override {
    if (queue_) queue_->wait(false);
    allocator_.queue = nullptr;
  }

 private:
  std::string name_;
  CompilerKind kind_;
  int threads_ = cpu_threads();
  mutable std::once_flag model_once_;
  mutable MachineModel model_;
  CpuAllocator allocator_;
  std::unique_ptr<Renderer> renderer_;
  std::unique_ptr<Compiler> compiler_;
  std::unique_ptr<LaunchQueue> queue_;  // CPU_DEVICE_THREADS: launches run on the device's own thread
};

CompilerKind kind_from_env() {
  std::string c = getenv_str("CPU_COMPILER", "llvm");
  for (char& ch : c) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (c == "llvm" || c.empty()) return CompilerKind::LLVM;
  if (c == "clang") return CompilerKind::Clang;
  throw Error("[CPU] CPU_COMPILER='" + c + "' is not a CPU compiler; expected llvm or clang");
}

// Static registration: the CPU is the preferred default device.
const bool g_registered =
    register_device("CPU", [](const std::string& full) { return make_device(full, kind_from_env()); }, 100);

}  // namespace

void run_kernel(KernelFn fn, void* const* bufs, const int64_t* vars, const LaunchDims& dims) {
  int64_t n = dims.global[0];
  if (n <= 1 || dims.core_var < 0 || dims.core_var >= dims.n_vars) return fn(bufs, vars);
  // Persistent worker threads (oneTBB's pool); each call gets its own copy of the variables. THREADS above the
  // machine's concurrency raises oneTBB's limit first (else it warns on stderr and runs fewer workers).
  static const int threads = std::max(1, cpu_threads());
  static const std::unique_ptr<tbb::global_control> allow =
      threads > tbb::info::default_concurrency()
          ? std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, size_t(threads))
          : nullptr;
  static tbb::task_arena global_arena(threads);
  tbb::task_arena& arena = t_arena ? *t_arena : global_arena;
  size_t nv = size_t(dims.n_vars);
  arena.execute([&] {
    tbb::parallel_for(
        int64_t(0), n,
        [&](int64_t i) {
          int64_t small[16];  // no allocation per call for the usual handful of variables
          std::vector<int64_t> big;
          int64_t* v = small;
          if (nv > 16) big.resize(nv), v = big.data();
          std::copy(vars, vars + nv, v);
          v[dims.core_var] = i;
          fn(bufs, v);
        },
        tbb::simple_partitioner());
  });
}

std::unique_ptr<Device> make_device(const std::string& name, CompilerKind kind) {
  (void)g_registered;
  return std::make_unique<CpuDevice>(name, kind);
}

}  // namespace tg::cpu
