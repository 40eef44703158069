// NVRTC through dlopen: libnvrtc.so.13, then .12, then the unversioned name, then the toolkit's folder
// ($CUDA_PATH, /usr/local/cuda). The compiled binary carries a small header with the kernel's argument counts
// (read from the renderer's "// tg kernel args" line), which the CUDA program needs to build its parameter list.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda.hpp"
#include "cuda_bin.hpp"
#include "tg/env.hpp"

namespace tg::cuda {

namespace {

using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;

struct Nvrtc {
  void* lib = nullptr;
  std::string error;  // why it could not be loaded
  const char* (*GetErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*Version)(int*, int*) = nullptr;
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  nvrtcResult (*DestroyProgram)(nvrtcProgram*) = nullptr;
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetPTX)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
};

template <class F>
bool sym(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

const Nvrtc& nvrtc() {
  static const Nvrtc n = [] {
    Nvrtc r;
    std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    for (std::string root : {getenv_str("CUDA_PATH"), std::string("/usr/local/cuda")})
      if (!root.empty()) names.push_back(root + "/lib64/libnvrtc.so");
    std::string tried;
    for (const std::string& nm : names) {
      if ((r.lib = dlopen(nm.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
      tried += (tried.empty() ? "" : ", ") + nm;
    }
    if (!r.lib) {
      r.error = "[CUDA] cannot load NVRTC (tried " + tried +
                "): install the CUDA toolkit's NVRTC (or point LD_LIBRARY_PATH at it), or select another device "
                "with DEVICE=CPU or DEVICE=CL";
      return r;
    }
    bool ok = sym(r.lib, "nvrtcGetErrorString", r.GetErrorString) && sym(r.lib, "nvrtcVersion", r.Version) &&
              sym(r.lib, "nvrtcCreateProgram", r.CreateProgram) && sym(r.lib, "nvrtcDestroyProgram", r.DestroyProgram) &&
              sym(r.lib, "nvrtcCompileProgram", r.CompileProgram) &&
              sym(r.lib, "nvrtcGetProgramLogSize", r.GetProgramLogSize) && sym(r.lib, "nvrtcGetProgramLog", r.GetProgramLog) &&
              sym(r.lib, "nvrtcGetPTXSize", r.GetPTXSize) && sym(r.lib, "nvrtcGetPTX", r.GetPTX);
    sym(r.lib, "nvrtcGetCUBINSize", r.GetCUBINSize);  // NVRTC >= 11.1
    sym(r.lib, "nvrtcGetCUBIN", r.GetCUBIN);
    if (!ok) r.error = "[CUDA] the loaded libnvrtc lacks required functions (too old?); need NVRTC >= 11.1";
    return r;
  }();
  if (!n.error.empty()) throw Error(n.error);
  return n;
}

class NvrtcCompiler : public Compiler {
 public:
  NvrtcCompiler(int sm, bool cubin) : sm_(sm), cubin_(cubin && nvrtc().GetCUBIN != nullptr) {
    id_ = "nvrtc-" + nvrtc_version() + (cubin_ ? "-sm_" : "-compute_") + std::to_string(sm_);
  }
  std::string id() const override { return id_; }
  std::vector<uint8_t> compile(const std::string& src, const std::string& name) override {
    const Nvrtc& n = nvrtc();
    BinHeader h = parse_args_marker(src);
    nvrtcProgram p = nullptr;
    nvrtcResult e = n.CreateProgram(&p, src.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr);
    if (e != 0) throw Error("[CUDA] nvrtcCreateProgram failed: " + std::string(n.GetErrorString(e)));
    std::string arch = std::string("--gpu-architecture=") + (cubin_ ? "sm_" : "compute_") + std::to_string(sm_);
    // --fmad=false: a*b+c stays two roundings, as on the other devices (exec_alu's semantics).
    const char* opts[] = {arch.c_str(), "--fmad=false", "-w"};
    e = n.CompileProgram(p, 3, opts);
    if (e != 0) {
      size_t ls = 0;
      n.GetProgramLogSize(p, &ls);
      std::string log(ls, '\0');
      if (ls) n.GetProgramLog(p, log.data());
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
      n.DestroyProgram(&p);
      throw Error("[CUDA] kernel " + name + " failed to compile with NVRTC for " + arch.substr(arch.find('=') + 1) + " (" +
                  n.GetErrorString(e) + "):\n" + log + "\n--- source:\n" + src);
    }
    size_t size = 0;
    std::vector<uint8_t> out(sizeof h);
    std::memcpy(out.data(), &h, sizeof h);
    e = cubin_ ? n.GetCUBINSize(p, &size) : n.GetPTXSize(p, &size);
    if (e == 0) {
      out.resize(sizeof h + size);
      e = cubin_ ? n.GetCUBIN(p, reinterpret_cast<char*>(out.data() + sizeof h))
                 : n.GetPTX(p, reinterpret_cast<char*>(out.data() + sizeof h));
    }
    n.DestroyProgram(&p);
    if (e != 0) throw Error("[CUDA] reading NVRTC's output failed: " + std::string(n.GetErrorString(e)));
    return out;
  }

 private:
  int sm_;
  bool cubin_;
  std::string id_;
};

}  // namespace

BinHeader parse_args_marker(const std::string& src) {
  BinHeader h;
  if (std::sscanf(src.c_str(), "// tg kernel args: %d buffers, %d vars", &h.n_bufs, &h.n_vars) != 2)
    throw Error("[CUDA] kernel source does not start with the renderer's '// tg kernel args' line");
  return h;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtc().Version(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

std::unique_ptr<Compiler> make_nvrtc_compiler(int sm, bool cubin) { return std::make_unique<NvrtcCompiler>(sm, cubin); }

}  // namespace tg::cuda
