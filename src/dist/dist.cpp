// tg::dist over MPI (include/tg/dist.hpp). Without TG_HAVE_MPI every rank is rank 0 of 1.
//
// The DIST device carries a collective inside a lazy graph: its memory is host memory, and a copy into it is summed
// over the ranks in place (MPI_Allreduce of float32), so allreduce(t) = COPY(COPY(t, DIST), t's device) is two
// ordinary copy items of the schedule. No kernel runs on DIST.
#include "tg/dist.hpp"

#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tg/device.hpp"

#ifdef TG_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#endif

namespace tg::dist {

namespace {
int g_rank = 0, g_size = 1;
std::once_flag g_once;
std::atomic<int64_t> g_collective_ns{0};

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

#ifdef TG_HAVE_MPI
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(std::string("[dist] ") + what + " failed: " + std::string(msg, size_t(len)));
  }
}
#endif
}  // namespace

bool available() {
#ifdef TG_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void init() {
  std::call_once(g_once, [] {
#ifdef TG_HAVE_MPI
    if (!launched_by_mpirun()) return;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      check(MPI_Init(nullptr, nullptr), "MPI_Init");
      std::atexit([] {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
      });
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    check(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &g_size), "MPI_Comm_size");
#else
    if (launched_by_mpirun() && std::getenv("OMPI_COMM_WORLD_RANK") && std::string(std::getenv("OMPI_COMM_WORLD_SIZE")) != "1")
      throw Error("[dist] started by mpirun, but tg was built without MPI (install libopenmpi-dev and reconfigure)");
#endif
  });
}

int rank() {
  init();
  return g_rank;
}
int world_size() {
  init();
  return g_size;
}

namespace {
#ifdef TG_HAVE_MPI
void host_allreduce(float* data, size_t n, Op op) {
  auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  while (done < n) {  // MPI counts are int
    int c = int(std::min<size_t>(n - done, size_t(1) << 30));
    check(MPI_Allreduce(MPI_IN_PLACE, data + done, c, MPI_FLOAT, op == Op::Sum ? MPI_SUM : MPI_MAX, MPI_COMM_WORLD),
          "MPI_Allreduce");
    done += size_t(c);
  }
  g_collective_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}
#endif

[[noreturn]] void no_kernels(const std::string& what) {
  throw Error("[DIST] " + what + ": no kernel runs on DIST (the ranks' sum of a copy into it); use tg::dist::allreduce");
}

// DIST memory: host memory; a copy into it is the sum over the ranks (float32).
class DistAllocator : public Allocator {
 public:
  ~DistAllocator() override { clear_cache(); }
  void copyin(void* dst, const void* host_src, size_t bytes) override {
    if (bytes % sizeof(float)) throw Error("[DIST] a copy of " + std::to_string(bytes) + " bytes: DIST sums float32 values");
    std::memcpy(dst, host_src, bytes);
#ifdef TG_HAVE_MPI
    if (world_size() > 1) host_allreduce(static_cast<float*>(dst), bytes / sizeof(float), Op::Sum);
#endif
  }
  void copyout(void* host_dst, const void* src, size_t bytes) override { std::memcpy(host_dst, src, bytes); }

 protected:
  void* alloc_raw(size_t bytes) override { return std::malloc(std::max<size_t>(bytes, 1)); }
  void free_raw(void* p, size_t) override { std::free(p); }
};

class DistDevice : public Device {
 public:
  explicit DistDevice(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  Allocator& allocator() override { return allocator_; }
  Renderer& renderer() override { no_kernels("no renderer"); }
  Compiler& compiler() override { no_kernels("no compiler"); }
  std::unique_ptr<Program> load(const std::vector<uint8_t>&, const std::string& name) override {
    no_kernels("cannot load kernel " + name);
  }

 private:
  std::string name_;
  DistAllocator allocator_;
};

// The lowest priority: never the default device.
const bool g_dist_registered = register_device("DIST", [](const std::string& full) { return std::make_unique<DistDevice>(full); }, 0);
}  // namespace

Tensor allreduce(const Tensor& t) {
  if (world_size() == 1) return t;
  if (t.is_multi()) throw Error("[dist] allreduce of a multi-device tensor: gather it first (.to(device))");
  (void)g_dist_registered;
  Tensor f = t.cast(dtypes::float32);
  Tensor there = f.to("DIST");
  UOpRef back = UOp::make(Ops::COPY, dtypes::float32, {there.uop(), UOp::make(Ops::DEVICE, dtypes::void_, {}, t.device())});
  Tensor sum = Tensor(back, t.shape(), t.device());
  // d(sum over ranks of x_r)/dx_r applied to every rank's loss: the sum of the ranks' gradients
  sum = sum.custom_gradient({f}, "dist_allreduce", [](const Tensor& g, const Tensor&, const std::vector<Tensor>&) {
    return std::vector<std::optional<Tensor>>{allreduce(g)};
  });
  return sum.cast(t.dtype());
}

void sync_batchnorm(nn::Module& m) {
  const int w = world_size();
  if (w == 1) return;
  m.apply([w](nn::Module& mod) {
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(&mod)) bn->sync_statistics([](const Tensor& s) { return allreduce(s); }, w);
  });
}

double collective_seconds() { return double(g_collective_ns.load()) * 1e-9; }

void allreduce_(Tensor& t, Op op) {
  if (world_size() == 1) return;
#ifdef TG_HAVE_MPI
  if (t.is_multi()) throw Error("[dist] allreduce_ of a multi-device tensor: gather it first (.to(device))");
  Tensor f = t.cast(dtypes::float32);
  std::vector<float> v = f.to_vector<float>();
  host_allreduce(v.data(), v.size(), op);
  t.assign(Tensor::from_vector(v, {int64_t(v.size())}, t.device()).reshape(t.shape()).cast(t.dtype()));
  t.realize();
#else
  (void)t, (void)op;
#endif
}

size_t allreduce_grads(const std::vector<Tensor>& params) {
  if (world_size() == 1) return 0;
#ifdef TG_HAVE_MPI
  std::vector<Tensor> grads;
  for (auto& p : params)
    if (p.has_grad()) grads.push_back(p.grad());
  std::vector<Tensor*> ptrs;
  for (auto& g : grads) ptrs.push_back(&g);
  Tensor::realize_all(ptrs);
  std::vector<float> flat;
  std::vector<size_t> offsets{0};
  for (auto& g : grads) {
    std::vector<float> v = g.cast(dtypes::float32).to_vector<float>();
    flat.insert(flat.end(), v.begin(), v.end());
    offsets.push_back(flat.size());
  }
  host_allreduce(flat.data(), flat.size(), Op::Sum);
  const float inv = 1.0f / float(world_size());
  for (float& x : flat) x *= inv;
  for (size_t i = 0; i < grads.size(); i++) {
    std::vector<float> v(flat.begin() + std::ptrdiff_t(offsets[i]), flat.begin() + std::ptrdiff_t(offsets[i + 1]));
    grads[i].assign(Tensor::from_vector(v, {int64_t(v.size())}, grads[i].device()).reshape(grads[i].shape()).cast(grads[i].dtype()));
  }
  Tensor::realize_all(ptrs);
  return flat.size() * sizeof(float);
#else
  (void)params;
  return 0;
#endif
}

Tensor rank_share(const Tensor& t) {
  int w = world_size(), r = rank();
  if (w == 1) return t;
  int64_t n = t.shape().at(0);
  if (n % w) throw Error("[dist] a batch of " + std::to_string(n) + " rows does not split over " + std::to_string(w) + " ranks");
  std::vector<std::pair<int64_t, int64_t>> s{{r * n / w, (r + 1) * n / w}};
  for (size_t k = 1; k < t.shape().size(); k++) s.push_back({0, t.shape()[k]});
  return t.shrink(s);
}

bool replicas_equal(const std::vector<Tensor>& ts) {
  if (world_size() == 1) return true;
#ifdef TG_HAVE_MPI
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const Tensor& t : ts) {
    std::vector<float> b = t.cast(dtypes::float32).to_vector<float>();
    XXH3_64bits_update(st, b.data(), b.size() * sizeof(float));
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  std::vector<uint64_t> all(static_cast<size_t>(world_size()));
  check(MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), "MPI_Allgather");
  for (uint64_t x : all)
    if (x != h) return false;
  return true;
#else
  (void)ts;
  return true;
#endif
}

void barrier() {
#ifdef TG_HAVE_MPI
  if (world_size() > 1) check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

}  // namespace tg::dist
