// The OpenCL device through the ICD loader (any platform: PoCL on CI, a GPU driver elsewhere). Registered as
// "CL"; CL:N is the N-th device over all platforms, in platform order. Buffers are cl_mem handles (what
// Buffer::ptr() returns on CL); copies are blocking reads and writes on one in-order queue per device, kernels
// are enqueued on the same queue, so they are ordered. Binaries are the kernel source (see ClCompiler).
// Thread-safety: the queue is thread-safe (OpenCL 1.2); setting a kernel's arguments and enqueuing it is
// done under the program's lock.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <CL/cl_ext.h>  // CL_PLATFORM_NOT_FOUND_KHR

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <string>
#include <vector>

#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/render.hpp"

namespace tg::opencl {

namespace {

const char* kSelect = "select another device with DEVICE=CPU (or DEVICE=CL:N for another OpenCL device)";

std::string cl_err(cl_int e) {
  switch (e) {
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_BINARY: return "CL_INVALID_BINARY";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_ARG_INDEX: return "CL_INVALID_ARG_INDEX";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_WORK_ITEM_SIZE: return "CL_INVALID_WORK_ITEM_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case CL_PLATFORM_NOT_FOUND_KHR: return "CL_PLATFORM_NOT_FOUND_KHR (no OpenCL platform installed)";
    default: return "OpenCL error " + std::to_string(e);
  }
}

void check(cl_int e, const char* what) {
  if (e != CL_SUCCESS) throw Error(std::string("[CL] ") + what + " failed: " + cl_err(e));
}

std::string device_str(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS) return "";
  std::string s(n, '\0');
  clGetDeviceInfo(d, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

// Every OpenCL device of every platform, in platform order.
std::vector<cl_device_id> all_devices() {
  cl_uint np = 0;
  cl_int e = clGetPlatformIDs(0, nullptr, &np);
  if (e == CL_PLATFORM_NOT_FOUND_KHR || np == 0)
    throw Error(std::string("[CL] no OpenCL platform found: the ICD loader (libOpenCL.so.1) lists no ICD in "
                            "/etc/OpenCL/vendors; install one (e.g. Debian's pocl-opencl-icd or a GPU driver) or ") +
                kSelect);
  check(e, "clGetPlatformIDs");
  std::vector<cl_platform_id> ps(np);
  check(clGetPlatformIDs(np, ps.data(), nullptr), "clGetPlatformIDs");
  std::vector<cl_device_id> out;
  for (cl_platform_id p : ps) {
    cl_uint nd = 0;
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS || nd == 0) continue;
    std::vector<cl_device_id> ds(nd);
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, ds.data(), nullptr) == CL_SUCCESS) out.insert(out.end(), ds.begin(), ds.end());
  }
  return out;
}

// The compiled "binary": a small header (argument counts, read from the renderer's marker line) and the source.
// Program::run gets no counts, and OpenCL needs to know which arguments are buffers.
struct BinHeader {
  char magic[8] = {'T', 'G', 'C', 'L', 'S', 'R', 'C', '1'};
  int32_t n_bufs = 0, n_vars = 0;
};

void parse_marker(const std::string& src, int32_t& nb, int32_t& nv) {
  if (std::sscanf(src.c_str(), "// tg kernel args: %d buffers, %d vars", &nb, &nv) != 2)
    throw Error("[CL] kernel source does not start with the renderer's '// tg kernel args' line");
}

class ClAllocator : public Allocator {
 public:
  ClAllocator(cl_context ctx, cl_command_queue q) : ctx_(ctx), q_(q) {}
  ~ClAllocator() override { clear_cache(); }
  void copyin(void* dst, const void* host_src, size_t bytes) override {
    if (bytes) check(clEnqueueWriteBuffer(q_, cl_mem(dst), CL_TRUE, 0, bytes, host_src, 0, nullptr, nullptr), "clEnqueueWriteBuffer");
  }
  void copyin_at(void* dst, size_t offset, const void* host_src, size_t bytes) override {
    if (bytes) check(clEnqueueWriteBuffer(q_, cl_mem(dst), CL_TRUE, offset, bytes, host_src, 0, nullptr, nullptr), "clEnqueueWriteBuffer");
  }
  void copyout(void* host_dst, const void* src, size_t bytes) override {
    if (bytes) check(clEnqueueReadBuffer(q_, cl_mem(const_cast<void*>(src)), CL_TRUE, 0, bytes, host_dst, 0, nullptr, nullptr), "clEnqueueReadBuffer");
  }

 protected:
  void* alloc_raw(size_t bytes) override {
    cl_int e = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx_, CL_MEM_READ_WRITE, std::max<size_t>(bytes, 1), nullptr, &e);
    if (e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES || e == CL_OUT_OF_HOST_MEMORY ||
        e == CL_INVALID_BUFFER_SIZE)
      return nullptr;  // the base class reports out of memory
    check(e, "clCreateBuffer");
    return m;
  }
  void free_raw(void* p, size_t) override { clReleaseMemObject(cl_mem(p)); }

 private:
  cl_context ctx_;
  cl_command_queue q_;
};

// Programs built by compile(), waiting for load() to take them (load normally follows compile at once), so
// that a kernel is built once. Bounded: an untaken program is dropped once kMax newer ones wait.
struct BuiltPrograms {
  static constexpr size_t kMax = 64;
  std::mutex mu;
  std::list<std::pair<std::string, cl_program>> waiting;  // source -> program, newest first
  void put(const std::string& src, cl_program p) {
    std::lock_guard lk(mu);
    waiting.emplace_front(src, p);
    if (waiting.size() > kMax) {
      clReleaseProgram(waiting.back().second);
      waiting.pop_back();
    }
  }
  cl_program take(const std::string& src) {
    std::lock_guard lk(mu);
    for (auto it = waiting.begin(); it != waiting.end(); ++it)
      if (it->first == src) {
        cl_program p = it->second;
        waiting.erase(it);
        return p;
      }
    return nullptr;
  }
  ~BuiltPrograms() {
    for (auto& [s, p] : waiting) clReleaseProgram(p);
  }
};

// The "binary" of a CL kernel is a header and its source: platform binaries are not portable between driver
// versions, and with PoCL fetching them costs a second code generation per kernel (a work-group function for
// any local size, on top of the one specialised at the first launch). The driver's own cache keeps builds.
class ClCompiler : public Compiler {
 public:
  ClCompiler(cl_context ctx, cl_device_id dev, std::string id, BuiltPrograms& built)
      : ctx_(ctx), dev_(dev), id_(std::move(id)), built_(built) {}
  std::string id() const override { return id_; }
  std::vector<uint8_t> compile(const std::string& src, const std::string& name) override {
    BinHeader h;
    parse_marker(src, h.n_bufs, h.n_vars);
    built_.put(src, build(ctx_, dev_, src, name));
    std::vector<uint8_t> out(sizeof h + src.size());
    std::memcpy(out.data(), &h, sizeof h);
    std::memcpy(out.data() + sizeof h, src.data(), src.size());
    return out;
  }
  // Build `src` for `dev`; a failure throws with the build log and the source.
  static cl_program build(cl_context ctx, cl_device_id dev, const std::string& src, const std::string& name) {
    const char* s = src.c_str();
    size_t n = src.size();
    cl_int e = CL_SUCCESS;
    cl_program p = clCreateProgramWithSource(ctx, 1, &s, &n, &e);
    check(e, "clCreateProgramWithSource");
    e = clBuildProgram(p, 1, &dev, "-cl-std=CL1.2", nullptr, nullptr);
    if (e != CL_SUCCESS) {
      size_t ln = 0;
      clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, 0, nullptr, &ln);
      std::string log(ln, '\0');
      clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, ln, log.data(), nullptr);
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
      clReleaseProgram(p);
      throw Error("[CL] kernel " + name + " failed to build (" + cl_err(e) + "):\n" + log + "\n--- source:\n" + src);
    }
    return p;
  }

 private:
  cl_context ctx_;
  cl_device_id dev_;
  std::string id_;
  BuiltPrograms& built_;
};

class ClProgram : public Program {
 public:
  ClProgram(cl_program p, cl_kernel k, cl_command_queue q, BinHeader h, size_t max_wg, bool sync)
      : prog_(p), kernel_(k), q_(q), h_(h), max_wg_(std::max<size_t>(max_wg, 1)), sync_(sync) {}
  ~ClProgram() override {
    clReleaseKernel(kernel_);
    clReleaseProgram(prog_);
  }
  void run(void* const* bufs, const int64_t* vars, const LaunchDims& dims) override {
    std::lock_guard lk(mu_);
    for (int32_t i = 0; i < h_.n_bufs; i++) {
      cl_mem m = cl_mem(bufs[i]);
      check(clSetKernelArg(kernel_, cl_uint(i), sizeof m, &m), "clSetKernelArg");
    }
    for (int32_t j = 0; j < h_.n_vars; j++) {
      if (!vars) throw Error("[CL] kernel needs " + std::to_string(h_.n_vars) + " variable value(s), none given");
      cl_long v = vars[j];
      check(clSetKernelArg(kernel_, cl_uint(h_.n_bufs + j), sizeof v, &v), "clSetKernelArg");
    }
    size_t global[3], local[3];
    for (int i = 0; i < 3; i++) {
      local[i] = size_t(dims.local[i]);
      global[i] = size_t(dims.global[i]) * local[i];
    }
    // Kernels that index work items globally are right for any group size dividing the global size: shrink a
    // group this kernel cannot have (a GPU driver may allow fewer items for a register-heavy kernel). Kernels
    // with work-group opts (local memory, warps) need exactly their group.
    size_t want = local[0] * local[1] * local[2];
    if (dims.exact_local && want > max_wg_)
      throw Error("[CL] kernel needs work groups of " + std::to_string(want) + " items (LOCAL/GROUP/TC opts) but the "
                  "device allows " + std::to_string(max_wg_) + " for it; run with fewer (NOOPT=1) or DEVICE=CPU");
    while (local[0] * local[1] * local[2] > max_wg_) {
      int ax = local[0] > 1 ? 0 : local[1] > 1 ? 1 : 2;
      size_t d = local[ax] - 1;
      while (d > 1 && global[ax] % d != 0) d--;
      local[ax] = d;
    }
    check(clEnqueueNDRangeKernel(q_, kernel_, 3, nullptr, global, local, 0, nullptr, nullptr), "clEnqueueNDRangeKernel");
    if (sync_) check(clFinish(q_), "clFinish");
  }

 private:
  std::mutex mu_;
  cl_program prog_;
  cl_kernel kernel_;
  cl_command_queue q_;
  BinHeader h_;
  size_t max_wg_;
  bool sync_;
};

bool has_ext(cl_device_id d, const char* ext) {
  std::string exts = " " + device_str(d, CL_DEVICE_EXTENSIONS) + " ";
  return exts.find(std::string(" ") + ext + " ") != std::string::npos;
}

class ClDevice : public Device {
 public:
  ClDevice(std::string name, cl_device_id dev) : name_(std::move(name)), dev_(dev) {
    cl_int e = CL_SUCCESS;
    ctx_ = clCreateContext(nullptr, 1, &dev_, nullptr, nullptr, &e);
    check(e, "clCreateContext");
    q_ = clCreateCommandQueue(ctx_, dev_, 0, &e);
    if (e != CL_SUCCESS) clReleaseContext(ctx_);
    check(e, "clCreateCommandQueue");
    size_t max_wg = 256;
    clGetDeviceInfo(dev_, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, nullptr);
    cl_device_type type = 0;
    clGetDeviceInfo(dev_, CL_DEVICE_TYPE, sizeof type, &type, nullptr);
    cpu_device_ = (type & CL_DEVICE_TYPE_CPU) != 0;
    renderer_ = make_opencl_renderer(has_ext(dev_, "cl_khr_fp16"), has_ext(dev_, "cl_khr_fp64"),
                                     int64_t(std::min<size_t>(max_wg, 256)));
    std::string id = "opencl-" + device_str(dev_, CL_DEVICE_NAME) + "-" + device_str(dev_, CL_DRIVER_VERSION);
    for (char& c : id)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
    compiler_ = std::make_unique<ClCompiler>(ctx_, dev_, id, built_);
    allocator_ = std::make_unique<ClAllocator>(ctx_, q_);
    if (debug_level() >= 1)
      std::fprintf(stderr, "tg: %s is OpenCL device '%s' (%s)\n", name_.c_str(), device_str(dev_, CL_DEVICE_NAME).c_str(),
                   device_str(dev_, CL_DEVICE_VERSION).c_str());
  }
  ~ClDevice() override {
    allocator_.reset();  // frees the cached buffers while the context lives
    clReleaseCommandQueue(q_);
    clReleaseContext(ctx_);
  }
  const std::string& name() const override { return name_; }
  Allocator& allocator() override { return *allocator_; }
  Renderer& renderer() override { return *renderer_; }
  Compiler& compiler() override { return *compiler_; }
  void synchronize() override { check(clFinish(q_), "clFinish"); }
  std::unique_ptr<Program> load(const std::vector<uint8_t>& binary, const std::string& name) override {
    BinHeader h;
    if (binary.size() < sizeof h || std::memcmp(binary.data(), h.magic, sizeof h.magic) != 0)
      throw Error("[CL] not a tg OpenCL binary for kernel " + name);
    std::memcpy(&h, binary.data(), sizeof h);
    std::string src(binary.begin() + sizeof h, binary.end());
    cl_program p = built_.take(src);
    if (!p) p = ClCompiler::build(ctx_, dev_, src, name);
    cl_int e = CL_SUCCESS;
    cl_kernel k = clCreateKernel(p, name.c_str(), &e);
    if (e != CL_SUCCESS) {
      clReleaseProgram(p);
      check(e, ("clCreateKernel(" + name + ")").c_str());
    }
    size_t max_wg = 0;
    if (clGetKernelWorkGroupInfo(k, dev_, CL_KERNEL_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, nullptr) != CL_SUCCESS)
      max_wg = size_t(-1);  // unknown: keep the renderer's choice
    return std::make_unique<ClProgram>(p, k, q_, h, max_wg, cpu_device_);
  }

 private:
  std::string name_;
  cl_device_id dev_;
  cl_context ctx_ = nullptr;
  cl_command_queue q_ = nullptr;
  // A CPU device (PoCL) runs each kernel to completion before run() returns: its cores are the host's, so little
  // overlap is lost, and no kernel is left in flight at exit, where PoCL may still be compiling it in a worker
  // thread while exit destroys its LLVM (a crash seen in about one of 20 test runs).
  bool cpu_device_ = false;
  BuiltPrograms built_;
  std::unique_ptr<Renderer> renderer_;
  std::unique_ptr<Compiler> compiler_;
  std::unique_ptr<Allocator> allocator_;
};

std::unique_ptr<Device> open_device(const std::string& full) {
  size_t colon = full.find(':');
  size_t idx = colon == std::string::npos ? 0 : size_t(std::stoul(full.substr(colon + 1)));
  std::vector<cl_device_id> ds = all_devices();
  if (ds.empty()) throw Error(std::string("[CL] the OpenCL platforms have no devices; ") + kSelect);
  if (idx >= ds.size())
    throw Error("[CL] there is no OpenCL device " + full + ": " + std::to_string(ds.size()) +
                " device(s) found (CL to CL:" + std::to_string(ds.size() - 1) + "); " + kSelect);
  return std::make_unique<ClDevice>(full, ds[idx]);
}

// Registered below the CPU: CL=1 or DEVICE=CL selects it.
const bool g_registered = register_device("CL", open_device, 50);

}  // namespace

}  // namespace tg::opencl
