#pragma once
// Devices: the four small interfaces a backend implements (Renderer, Compiler, Allocator, Program),
// the registry that finds backends by name, and Buffer.
// Thread-safety: the registry and the compile caches are internally locked; a Device may be used from
// several threads; a Buffer is not synchronised (the engine orders all work on it).
#include "tg/config.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tg/dtype.hpp"
#include "tg/error.hpp"

namespace tg {

class UOp;

/** Launch dimensions of a kernel (global = number of work groups per axis, local = threads per group). */
struct LaunchDims {
  /// work groups along x, y, z (CPU: global[0] parallel calls)
  int64_t global[3] = {1, 1, 1};
  /// threads per work group along x, y, z (1 on the CPU)
  int64_t local[3] = {1, 1, 1};
  /** CPU: global[0] parallel calls, call i with vars[core_var] = i (the kernel variable core_id); -1: one call. */
  int core_var = -1;
  int n_vars = 0;  ///< length of the vars array
  int n_bufs = 0;  ///< length of the bufs array (a device that runs the launch later copies both arrays)
  /** The kernel indexes items within a group (LOCAL/GROUP/TC opts: get_local_id, local memory, warps): launch
   *  exactly `local` items per group; a device that cannot must fail, not shrink the group. */
  bool exact_local = false;
};

/** Raw memory of one device. Backends implement alloc_raw (nullptr when out of memory), free_raw and the copies;
 *  a backend's destructor must call clear_cache() (the base cannot call free_raw once the backend is gone).
 *  Thread-safe. */
class Allocator {
 public:
  virtual ~Allocator() = default;
  /** Memory for `bytes` bytes (reuses a cached freed block of the same size when there is one). */
  void* alloc(size_t bytes);
  /** Return memory; it is kept in an LRU cache of freed blocks (bounded by TG_ALLOC_CACHE_MB, default 1024, and
   *  by age: see end_round). */
  void free(void* p, size_t bytes);
  /** Drop every cached freed block. */
  void clear_cache();
  /** One round of launches on this device has ended (a realize's schedule, a TinyJit replay): cached blocks freed
   *  more than TG_ALLOC_CACHE_ROUNDS rounds ago (default 16; 0: at the end of the round after) that no allocation
   *  took again are given back to the device. A working set that repeats (a layer's buffers, a training step's)
   *  is reused from the cache; buffers of a one-off computation (a long prompt's float32 weights and activations)
   *  do not stay resident once it is over. */
  void end_round();
  /// bytes held by freed blocks in the cache (not yet returned to the device)
  size_t cached_bytes() const;
  /// bytes allocated through alloc and not freed yet
  size_t live_bytes() const { return live_.load(std::memory_order_relaxed); }
  /// copies `bytes` from host memory into device memory `dst`
  virtual void copyin(void* dst, const void* host_src, size_t bytes) = 0;
  /// copies `bytes` of device memory `src` to host memory
  virtual void copyout(void* host_dst, const void* src, size_t bytes) = 0;
  /** Copy `bytes` from the host into `dst` starting `offset` bytes in (the default handles offset 0 only). */
  virtual void copyin_at(void* dst, size_t offset, const void* host_src, size_t bytes);
  /** The most bytes one allocation may have; SIZE_MAX where alloc_raw reports out of memory itself (the CPU:
   *  physical memory, since its allocator overcommits and the kernel would kill the process on first touch). */
  virtual size_t capacity() const { return SIZE_MAX; }
  /** Whether this allocator's pointers are host memory the CPU may read and write directly: a copy between two
   *  such devices is one memcpy, without a bounce through a host staging buffer. */
  virtual bool host_memory() const { return false; }

 protected:
  /// the device's own allocation of `bytes`, bypassing the cache
  virtual void* alloc_raw(size_t bytes) = 0;
  /// returns memory from alloc_raw to the device
  virtual void free_raw(void* p, size_t bytes) = 0;

 private:
  struct Cached {
    size_t bytes;
    void* p;
    uint64_t round;  // round_ when it was freed
  };
  mutable std::mutex mu_;
  std::list<Cached> lru_;  // most recently freed first
  std::unordered_map<size_t, std::vector<std::list<Cached>::iterator>> by_size_;
  size_t cached_ = 0;
  uint64_t round_ = 0;
  /// takes the least recently freed cached block out of the cache into `victims` (the caller holds mu_)
  void evict_oldest(std::vector<std::pair<size_t, void*>>& victims);
  std::atomic<size_t> live_{0};
};

/** A loaded kernel. `bufs` are device pointers in PARAM order, `vars` the DEFINE_VAR values in order. */
class Program {
 public:
  virtual ~Program() = default;
  /// launches the kernel over `dims`
  virtual void run(void* const* bufs, const int64_t* vars, const LaunchDims& dims) = 0;
};

/** Turns kernel source into a binary (object file, shared object, PTX, ...). */
class Compiler {
 public:
  virtual ~Compiler() = default;
  /** Identifies the compiler and its flags; part of every cache key. */
  virtual std::string id() const = 0;
  /** Compile; on failure throw tg::Error containing the source and the compiler's message. */
  virtual std::vector<uint8_t> compile(const std::string& src, const std::string& name) = 0;
};

/** Renders a linearised kernel (see include/tg/codegen.hpp for the program format) to source text. */
class Renderer {
 public:
  virtual ~Renderer() = default;
  /// the source of kernel `name` from its linear program (throws tg::Error for an op or dtype it cannot render)
  virtual std::string render(const std::string& name, const std::vector<const UOp*>& program) = 0;
  /** Capabilities the optimiser and decompositions consult. */
  virtual bool has_local() const { return false; }
  /// whether this device's kernels may use the dtype
  virtual bool supports(DType) const { return true; }
  /** Whether EXP2/LOG2 render as fast (vectorisable) instructions; else codegen decomposes them into ALU ops
   *  (src/codegen/transcendental.cpp). */
  virtual bool native_transcendentals() const { return true; }
  /** Whether the renderer asks its compiler to vectorise Lane loops (see expand_upcasts): the CPU renderers do. */
  virtual bool vector_lanes() const { return false; }
  /** Vector dtypes (see vectorize in include/tg/opt.hpp): the most lanes of scalar dtype `d` one LOAD, STORE or op
   *  takes (1: scalars only). */
  virtual int vector_lanes_of(DType d) const { (void)d; return 1; }
  /** Whether the vector op or CAST `u` renders as one op (else devectorize splits it into lanes). */
  virtual bool vector_alu(const UOp* u) const { (void)u; return false; }
  /** Whether vector LOADs and STOREs need an address aligned to the vector's size (CUDA's float4). */
  virtual bool vector_aligned() const { return false; }
  /** Limits of a GPU-style launch: kernels whose output loops become work-item indices (SPECIAL) return
   *  threads > 0 (most threads per group) and the most groups per axis; a serial (CPU) kernel returns threads 0. */
  struct GridLimits {
    /// most threads in one work group (0: a serial CPU kernel, no SPECIAL indices)
    int64_t threads = 0;
    /// most work groups per axis x, y, z
    int64_t groups[3] = {0, 0, 0};
    bool tensor_cores = false;  ///< WMMA (CUDA mma.sync m16n8k16 for half/bfloat16 inputs, float accumulators)
  };
  /// the launch limits (a CPU renderer: all zero)
  virtual GridLimits grid_limits() const { return {}; }
};

/** What the optimiser knows of a device's processor. CPU: LLVM's target info for the host's CPU, or for the one
 *  TG_CPU names (an LLVM CPU name such as haswell, znver3, skylake-avx512, whose ISA this CPU must have), and the
 *  cache sizes from sysfs (else glibc's cpuid reading). Read once per device; immutable afterwards. */
struct MachineModel {
  std::string cpu = "unknown";  ///< LLVM's CPU name ("znver3", "sapphirerapids"), or a GPU's device name
  std::string isa;              ///< the vector ISA in words ("AVX-512", "AVX2+FMA", "SSE4.2")
  std::string source = "default";  ///< where the ISA came from: "host", "TG_CPU", or "default" (nothing read)
  int vector_bits = 512;        ///< width of the vector registers generated code uses
  int vector_registers = 32;    ///< how many of them
  /// data cache per core (L1, L2) and shared (L3) in bytes; 0: unknown
  ///@{
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  ///@}
  /// the part of one L3 this process can count on: l3_bytes x cpus / l3_sharing (its share of a cache shared with
  /// other cores, or other VMs: a VM's cpuid may report the whole socket's L3), at least its CPUs' L2s; 0: unknown
  int64_t l3_share_bytes = 0;
  int l3_sharing = 0;           ///< logical CPUs sharing one L3 (0: unknown)
  int cpus = 0;                 ///< logical CPUs this process may run on (its affinity mask)
  std::string cache_source;     ///< "sysfs", "cpuid" (read by tg), "glibc", or "" when unknown
  int cores = 1;                ///< parallel calls of one kernel (THREADS overrides)
  /// a vector FMA of the width above (x86 VFMADD231PS, AArch64 FMLA): cycles from issue to result, and how many
  /// issue per cycle (the reciprocal of LLVM's reciprocal throughput: the FMA pipes). A register tile needs about
  /// latency x per-cycle independent accumulators (chains of dependent FMAs) to keep the pipes busy.
  ///@{
  int fma_latency = 4;
  double fma_per_cycle = 2;
  ///@}
  std::string fma_source = "default";  ///< "LLVM sched model" (of the CPU above) or "default" (nothing read)
  /// the same FMA's issue rate measured on the host (0: not measured: not x86, no FMA, or the host does not run the
  /// model's vectors). LLVM 19 models one 512-bit FMA a cycle on znver4, znver5 and sapphirerapids alike, where Zen 4
  /// issues one and Zen 5 two: the measurement takes LLVM's rate or twice it (FMA_RATE=1|2 sets the multiple). The
  /// register tile keeps LLVM's rate; Winograd's cost model (winograd_pays) takes this one.
  double fma_measured_per_cycle = 0;
  std::string fma_measured_source;  ///< "measured", "FMA_RATE", or "" (not measured)
  /// a vector instruction summing 4 byte products into each int32 lane (x86 vpdpbusd: AVX512-VNNI or AVX-VNNI;
  /// AArch64 sdot): what the int8 GEMM of quantised weights needs to run at 4x the float FMA rate
  bool int8_dot = false;
  /// a row kernel whose loops are a few ops an element (layernorm) prefetches the next row in its last loop before
  /// the output's: measured on the host once per model line (and kept in the disk cache), or ROW_PREFETCH=0/1
  bool row_prefetch = false;
  std::string row_prefetch_source;  ///< "measured", "ROW_PREFETCH", or "" (not known: not prefetched)
};
/** One line: "znver3 (host): AVX2+FMA, 256-bit x 16 vector registers, FMA latency 4 x 2/cycle (LLVM sched model),
 *  L1d 32 KiB, L2 512 KiB, L3 32 MiB (ours 4 MiB: 2 of 16 CPUs) (cpuid), 2 cores", and where known
 *  ", row prefetch yes (measured)". */
std::string to_string(const MachineModel& m);

/** A device: a name ("CPU", "CL:1", ...) and its four parts. */
class Device {
 public:
  virtual ~Device() = default;
  /// the device's name as Tensor::device() spells it ("CPU", "CL:1")
  virtual const std::string& name() const = 0;
  /// the device memory allocator (with its free-block cache)
  virtual Allocator& allocator() = 0;
  /// turns linear programs into source for this device's compiler
  virtual Renderer& renderer() = 0;
  /// turns source into a binary the device loads
  virtual Compiler& compiler() = 0;
  /** Load a compiled binary as a runnable program. */
  virtual std::unique_ptr<Program> load(const std::vector<uint8_t>& binary, const std::string& name) = 0;
  /** How many parallel calls of one kernel the device runs well (CPU: threads; THREADS=N overrides). */
  virtual int threads() const { return 1; }
  /** The processor the optimiser sizes kernels for (register tiles, vector widths, cache blocking). */
  virtual MachineModel machine() const {
    MachineModel m;
    m.cpu = name(), m.cores = threads();
    return m;
  }
  /** Whether kernels index memory with 64-bit arithmetic even where 32 bits would do (64-bit CPUs). */
  virtual bool index64() const { return false; }
  /** Wait for all launched work to finish (a device that launches asynchronously: before its buffers are read or
   *  written from the host; Buffer's copies call it on host-memory devices). */
  virtual void synchronize() {}
  /** False for a storage-only device (DISK: views of a mapped file): no kernel may run on it or read from it,
   *  and nothing is copied into it; its buffers are copied out (Tensor::to) before use. */
  virtual bool runs_kernels() const { return true; }
  /** A virtual copy of another device (CPU:N for N > 0: the one CPU seen as several logical devices, each with its
   *  own allocator, for multi-device code); DEVICE=CPU:1 makes one the default device. */
  virtual bool virtual_copy() const { return false; }
  /** Copy `bytes` of `src` (memory of device `from`) into `dst` (memory of this device) ordered with the work
   *  launched on both devices: after what was launched on either before, before what is launched on either after,
   *  without the calling thread waiting for it (CPU_DEVICE_THREADS: the devices' queues). False where this device
   *  cannot (Buffer::copy_from then synchronises both devices and copies itself). */
  virtual bool enqueue_copy(void* dst, Device& from, const void* src, size_t bytes) {
    (void)dst, (void)from, (void)src, (void)bytes;
    return false;
  }

  /** Compile `src` (or fetch it from the in-memory cache, then the disk cache) and load it. Bounded caches. */
  std::shared_ptr<Program> get_program(const std::string& src, const std::string& name);

 private:
  struct ProgramCache;  // LRU of loaded programs keyed by compiler id + name + source hash (src/engine/device.cpp)
  static std::shared_ptr<ProgramCache> new_program_cache();
  std::shared_ptr<ProgramCache> programs_ = new_program_cache();
};

/// Opens a device by its full name ("CL:1"); registered per backend with register_device.
using DeviceFactory = std::function<std::unique_ptr<Device>(const std::string& full_name)>;
/** Register a backend under a base name ("CPU"); done by each backend folder at static-init time. */
bool register_device(const std::string& base, DeviceFactory f, int priority = 0);
/** The device for "CPU", "CL", "CL:1", ...; an unknown name throws tg::Error listing the known ones. */
Device& get_device(const std::string& name);
/** The default device: DEVICE env var, or CPU=1 / CL=1 / CUDA=1, else the highest-priority registered one. A
 *  DEVICE naming no device or a device that does not open is a tg::EnvError (DEVICE=CPU:5, a logical CPU, opens). */
const std::string& default_device();
/** The machine model of a device (the default device when empty) as one line: what `DEBUG=1` prints. */
std::string device_info(const std::string& device = "");
/** Names of registered backends. */
std::vector<std::string> device_names();

/** The on-disk cache folder: $TG_CACHE_DIR, else $XDG_CACHE_HOME/tg, else ~/.cache/tg. */
std::string cache_dir();
/** Disk cache of compiled binaries (atomic writes: safe with concurrent processes). CACHELEVEL=0 disables. */
bool disk_cache_get(const std::string& key, std::vector<uint8_t>& out);
/// stores `data` under `key` (a no-op with CACHELEVEL=0; may evict the least recently used entries, see TG_CACHE_MB)
void disk_cache_put(const std::string& key, const std::vector<uint8_t>& data);
/** A yes/no fact about this machine that is measured rather than assumed (Llama's decode layout, the machine model's
 *  row prefetch): answered from memory, else from the disk cache under `prefix` + a 64-bit hash of `what` (the
 *  machine model's line and whatever else the answer depends on), else by `measure`, whose answer both then keep.
 *  One measurement at a time in a process; a measurement may ask for another (a device's machine model). */
bool measured_once(const std::string& prefix, const std::string& what, const std::function<bool()>& measure);

/** The bytes of a buffer of `shape` (the caller's, for the message) of `dtype`, checked before anything is
 *  allocated: throws tg::Error "[op] shape ... of dtype needs B bytes ..." when the count overflows 64 bits or,
 *  given a `device`, is more than one allocation there can hold (Allocator::capacity). */
size_t checked_nbytes(const std::string& op, const std::vector<int64_t>& shape, DType dtype, const std::string& device = "");

/** Copies between buffers that went through a host staging buffer (Buffer::copy_from): for tests. */
size_t copies_staged();

/** Memory on a device: `size` elements of `dtype`. Allocated on first use; freed when the last holder drops it. */
class Buffer {
 public:
  /** Throws tg::Error when the bytes of `size` elements of `dtype` overflow 64 bits (nothing is allocated yet). */
  Buffer(std::string device, DType dtype, size_t size);
  /** A buffer over memory owned elsewhere (DISK: a range of a mapped file); `owner` keeps that memory alive for as
   *  long as the buffer lives, and the buffer never frees it. */
  Buffer(std::string device, DType dtype, size_t size, void* memory, std::shared_ptr<const void> owner);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  /// the name of the device that holds it
  const std::string& device() const { return device_; }
  /// the element dtype
  DType dtype() const { return dtype_; }
  /// number of elements
  size_t size() const { return size_; }
  size_t nbytes() const { return size_ * size_t(dtype_.itemsize()); }  ///< checked by the constructor
  /// whether device memory is allocated yet (ptr() allocates)
  bool allocated() const { return ptr_ != nullptr; }
  void* ptr();  ///< allocates on first use
  /// fills the whole buffer from host memory (allocating it); `bytes` other than nbytes() is a tg::Error
  void copyin(const void* host, size_t bytes);
  /// copies the whole buffer to host memory; `bytes` other than nbytes() is a tg::Error
  void copyout(void* host, size_t bytes);
  /** Copy `bytes` from the host into the buffer starting at byte `offset`. */
  void copyin_at(size_t offset, const void* host, size_t bytes);
  /** Copy all of `src` (same byte count) into this buffer: one memcpy when both devices hold host memory (CPU and
   *  CPU:N), else through a host staging buffer. */
  void copy_from(Buffer& src);
  /** The buffer's device (looked up once). */
  Device& dev();

 private:
  std::string device_;
  DType dtype_;
  size_t size_;
  void* ptr_ = nullptr;
  Device* dev_ = nullptr;
  std::shared_ptr<const void> owner_;  // set for memory owned elsewhere
};

}  // namespace tg
