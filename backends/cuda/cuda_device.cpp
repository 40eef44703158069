// The CUDA device: the driver API loaded with dlopen("libcuda.so.1") (never linked: a machine without a driver
// has only the link stub), entry points by their versioned names. Each device uses its primary context;
// kernels and copies go to the legacy default stream, so they are ordered; copies to and from pageable host
// memory are synchronous.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda.hpp"
#include "cuda_bin.hpp"
#include "tg/env.hpp"
#include "tg/render.hpp"

namespace tg::cuda {

namespace {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
constexpr int kAttrCcMajor = 75, kAttrCcMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR

const char* kSelect = "select another device with DEVICE=CPU or DEVICE=CL";

struct Driver {
  void* lib = nullptr;
  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*CtxSynchronize)() = nullptr;
  CUresult (*MemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*MemFree)(CUdeviceptr) = nullptr;
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleUnload)(CUmodule) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**) = nullptr;
};

std::string err_str(const Driver& d, CUresult e) {
  const char* s = nullptr;
  if (d.GetErrorString && d.GetErrorString(e, &s) == 0 && s) return s + (" (" + std::to_string(e) + ")");
  return "CUDA error " + std::to_string(e);
}

template <class F>
bool sym(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

// Loaded and initialised once; a failure is remembered and reported on every attempt to open a CUDA device.
const Driver& driver() {
  static std::string error;
  static const Driver d = [] {
    Driver r;
    r.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!r.lib) {
      const char* why = dlerror();
      error = std::string("[CUDA] cannot load libcuda.so.1, the NVIDIA driver (") + (why ? why : "not found") +
              "): this machine has no CUDA driver; " + kSelect;
      return r;
    }
    bool ok = sym(r.lib, "cuInit", r.Init) && sym(r.lib, "cuGetErrorString", r.GetErrorString) &&
              sym(r.lib, "cuDeviceGetCount", r.DeviceGetCount) && sym(r.lib, "cuDeviceGet", r.DeviceGet) &&
              sym(r.lib, "cuDeviceGetName", r.DeviceGetName) && sym(r.lib, "cuDeviceGetAttribute", r.DeviceGetAttribute) &&
              sym(r.lib, "cuDevicePrimaryCtxRetain", r.DevicePrimaryCtxRetain) &&
              sym(r.lib, "cuDevicePrimaryCtxRelease_v2", r.DevicePrimaryCtxRelease) &&
              sym(r.lib, "cuCtxSetCurrent", r.CtxSetCurrent) && sym(r.lib, "cuCtxSynchronize", r.CtxSynchronize) &&
              sym(r.lib, "cuMemAlloc_v2", r.MemAlloc) && sym(r.lib, "cuMemFree_v2", r.MemFree) &&
              sym(r.lib, "cuMemcpyHtoD_v2", r.MemcpyHtoD) && sym(r.lib, "cuMemcpyDtoH_v2", r.MemcpyDtoH) &&
              sym(r.lib, "cuModuleLoadData", r.ModuleLoadData) && sym(r.lib, "cuModuleUnload", r.ModuleUnload) &&
              sym(r.lib, "cuModuleGetFunction", r.ModuleGetFunction) && sym(r.lib, "cuLaunchKernel", r.LaunchKernel);
    if (!ok) {
      error = std::string("[CUDA] libcuda.so.1 lacks driver API entry points (") + dlerror() + "); " + kSelect;
      return r;
    }
    CUresult e = r.Init(0);
    if (e == 100)  // CUDA_ERROR_NO_DEVICE
      error = std::string("[CUDA] the NVIDIA driver finds no CUDA-capable GPU; ") + kSelect;
    else if (e != 0)
      error = "[CUDA] cuInit failed: " + err_str(r, e) + " (a driver/library mismatch or a stub libcuda); " + kSelect;
    return r;
  }();
  if (!error.empty()) throw Error(error);
  return d;
}

void check(CUresult e, const char* what) {
  if (e != 0) throw Error(std::string("[CUDA] ") + what + " failed: " + err_str(driver(), e));
}

class CudaAllocator : public Allocator {
 public:
  explicit CudaAllocator(CUcontext ctx) : ctx_(ctx) {}
  ~CudaAllocator() override { clear_cache(); }
  void copyin(void* dst, const void* host_src, size_t bytes) override {
    if (!bytes) return;
    check(driver().CtxSetCurrent(ctx_), "cuCtxSetCurrent");
    check(driver().MemcpyHtoD(CUdeviceptr(dst), host_src, bytes), "cuMemcpyHtoD");
  }
  void copyin_at(void* dst, size_t offset, const void* host_src, size_t bytes) override {
    copyin(static_cast<char*>(dst) + offset, host_src, bytes);
  }
  void copyout(void* host_dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    check(driver().CtxSetCurrent(ctx_), "cuCtxSetCurrent");
    check(driver().MemcpyDtoH(host_dst, CUdeviceptr(src), bytes), "cuMemcpyDtoH");
  }

 protected:
  void* alloc_raw(size_t bytes) override {
    check(driver().CtxSetCurrent(ctx_), "cuCtxSetCurrent");
    CUdeviceptr p = 0;
    CUresult e = driver().MemAlloc(&p, std::max<size_t>(bytes, 1));
    if (e == 2) return nullptr;  // CUDA_ERROR_OUT_OF_MEMORY: the base class frees its cache and retries
    check(e, "cuMemAlloc");
    return reinterpret_cast<void*>(p);
  }
  void free_raw(void* p, size_t) override {
    driver().CtxSetCurrent(ctx_);
    driver().MemFree(CUdeviceptr(p));
  }

 private:
  CUcontext ctx_;
};

class CudaProgram : public Program {
 public:
  CudaProgram(CUcontext ctx, CUmodule m, CUfunction f, BinHeader h) : ctx_(ctx), mod_(m), fn_(f), h_(h) {}
  ~CudaProgram() override {
    driver().CtxSetCurrent(ctx_);
    driver().ModuleUnload(mod_);
  }
  void run(void* const* bufs, const int64_t* vars, const LaunchDims& dims) override {
    const Driver& d = driver();
    check(d.CtxSetCurrent(ctx_), "cuCtxSetCurrent");
    if (h_.n_vars > 0 && !vars) throw Error("[CUDA] kernel needs " + std::to_string(h_.n_vars) + " variable value(s), none given");
    std::vector<CUdeviceptr> ptrs(size_t(h_.n_bufs));
    std::vector<long long> vals(size_t(h_.n_vars));
    std::vector<void*> params;
    for (int32_t i = 0; i < h_.n_bufs; i++) ptrs[size_t(i)] = CUdeviceptr(bufs[i]), params.push_back(&ptrs[size_t(i)]);
    for (int32_t j = 0; j < h_.n_vars; j++) vals[size_t(j)] = vars[j], params.push_back(&vals[size_t(j)]);
    check(d.LaunchKernel(fn_, unsigned(dims.global[0]), unsigned(dims.global[1]), unsigned(dims.global[2]),
                         unsigned(dims.local[0]), unsigned(dims.local[1]), unsigned(dims.local[2]), 0, nullptr,
                         params.data(), nullptr),
          "cuLaunchKernel");
  }

 private:
  CUcontext ctx_;
  CUmodule mod_;
  CUfunction fn_;
  BinHeader h_;
};

class CudaDevice : public Device {
 public:
  CudaDevice(std::string name, int ordinal) : name_(std::move(name)) {
    const Driver& d = driver();
    check(d.DeviceGet(&dev_, ordinal), "cuDeviceGet");
    check(d.DevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
    int major = 0, minor = 0;
    check(d.DeviceGetAttribute(&major, kAttrCcMajor, dev_), "cuDeviceGetAttribute");
    check(d.DeviceGetAttribute(&minor, kAttrCcMinor, dev_), "cuDeviceGetAttribute");
    sm_ = major * 10 + minor;
    char nm[256] = {0};
    d.DeviceGetName(nm, sizeof nm - 1, dev_);
    renderer_ = make_cuda_renderer(sm_);
    compiler_ = make_nvrtc_compiler(sm_, getenv_int("CUDA_PTX", 0) == 0);
    allocator_ = std::make_unique<CudaAllocator>(ctx_);
    if (debug_level() >= 1)
      std::fprintf(stderr, "tg: %s is '%s' (sm_%d), compiler %s\n", name_.c_str(), nm, sm_, compiler_->id().c_str());
  }
  ~CudaDevice() override {
    allocator_.reset();
    driver().DevicePrimaryCtxRelease(dev_);
  }
  const std::string& name() const override { return name_; }
  Allocator& allocator() override { return *allocator_; }
  Renderer& renderer() override { return *renderer_; }
  Compiler& compiler() override { return *compiler_; }
  void synchronize() override {
    check(driver().CtxSetCurrent(ctx_), "cuCtxSetCurrent");
    check(driver().CtxSynchronize(), "cuCtxSynchronize");
  }
  std::unique_ptr<Program> load(const std::vector<uint8_t>& binary, const std::string& name) override {
    BinHeader h;
    if (binary.size() < sizeof h || std::memcmp(binary.data(), h.magic, sizeof h.magic) != 0)
      throw Error("[CUDA] not a tg CUDA binary for kernel " + name);
    std::memcpy(&h, binary.data(), sizeof h);
    std::vector<uint8_t> image(binary.begin() + sizeof h, binary.end());
    if (image.empty() || image.back() != 0) image.push_back(0);  // PTX text must be NUL-terminated
    const Driver& d = driver();
    check(d.CtxSetCurrent(ctx_), "cuCtxSetCurrent");
    CUmodule m = nullptr;
    check(d.ModuleLoadData(&m, image.data()), ("cuModuleLoadData(" + name + ")").c_str());
    CUfunction f = nullptr;
    if (CUresult e = d.ModuleGetFunction(&f, m, name.c_str()); e != 0) {
      d.ModuleUnload(m);
      check(e, ("cuModuleGetFunction(" + name + ")").c_str());
    }
    return std::make_unique<CudaProgram>(ctx_, m, f, h);
  }

 private:
  std::string name_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  int sm_ = 0;
  std::unique_ptr<Renderer> renderer_;
  std::unique_ptr<Compiler> compiler_;
  std::unique_ptr<Allocator> allocator_;
};

std::unique_ptr<Device> open_device(const std::string& full) {
  const Driver& d = driver();
  size_t colon = full.find(':');
  int idx = colon == std::string::npos ? 0 : std::stoi(full.substr(colon + 1));
  int n = 0;
  check(d.DeviceGetCount(&n), "cuDeviceGetCount");
  if (n == 0) throw Error(std::string("[CUDA] the NVIDIA driver finds no CUDA-capable GPU; ") + kSelect);
  if (idx >= n)
    throw Error("[CUDA] there is no CUDA device " + full + ": " + std::to_string(n) + " GPU(s) found (CUDA to CUDA:" +
                std::to_string(n - 1) + "); " + kSelect);
  return std::make_unique<CudaDevice>(full, idx);
}

// Registered on every machine (DEVICE=CUDA then says what is missing), below the CPU and CL.
const bool g_registered = register_device("CUDA", open_device, 40);

}  // namespace

}  // namespace tg::cuda
