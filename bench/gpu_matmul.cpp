// Matmul on a CUDA GPU: tg's generated kernels for fp32 and fp16 (float accumulation) against cuBLAS in the same
// run, on the same device buffers. fp16 runs twice in tg: as the heuristic picks (tensor cores, Opt TC, on sm_80+)
// and with the GPU heuristic's opts without TC (the same kernel AST lowered and launched directly). cuBLAS is loaded with dlopen (libcublas.so.13, .12, unversioned); it runs on the
// legacy default stream, as tg's kernels do, so both are timed with a device synchronisation.
// Usage: gpu_matmul [N...] (default 1024 4096). Without a GPU it says so and exits with status 2.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tg/codegen.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

using namespace tg;
using clk = std::chrono::steady_clock;

namespace {

using cublasHandle_t = struct cublasContext*;
using Status = int;
constexpr int kOpN = 0, kR16F = 2, kR32F = 0, kCompute32F = 68, kGemmDefault = -1;
constexpr int kDefaultMath = 0, kPedanticMath = 2, kTf32Math = 3;

struct Cublas {
  void* lib = nullptr;
  Status (*Create)(cublasHandle_t*) = nullptr;
  Status (*SetMathMode)(cublasHandle_t, int) = nullptr;
  Status (*Sgemm)(cublasHandle_t, int, int, int, int, int, const float*, const float*, int, const float*, int,
                  const float*, float*, int) = nullptr;
  Status (*GemmEx)(cublasHandle_t, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                   const void*, void*, int, int, int, int) = nullptr;
  cublasHandle_t h = nullptr;
  bool load() {
    for (const char* n : {"libcublas.so.13", "libcublas.so.12", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so"})
      if ((lib = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) return false;
    Create = reinterpret_cast<decltype(Create)>(dlsym(lib, "cublasCreate_v2"));
    SetMathMode = reinterpret_cast<decltype(SetMathMode)>(dlsym(lib, "cublasSetMathMode"));
    Sgemm = reinterpret_cast<decltype(Sgemm)>(dlsym(lib, "cublasSgemm_v2"));
    GemmEx = reinterpret_cast<decltype(GemmEx)>(dlsym(lib, "cublasGemmEx"));
    return Create && SetMathMode && Sgemm && GemmEx && Create(&h) == 0;
  }
};

void* dptr(const Tensor& t) {
  const UOp* b = contiguous_buffer(t.uop().get());
  if (!b) throw Error("[gpu_matmul] tensor is not a realised buffer");
  return buffer_of(b)->ptr();
}

// The matmul kernel of a @ b lowered for `dev` with the GPU heuristic without tensor cores, ready to launch on
// (c, a, b) in the order of its PARAMs.
struct NoTcKernel {
  CompiledKernel k;
  std::shared_ptr<Program> prog;
  std::vector<void*> ptrs;
};
NoTcKernel no_tc_kernel(Device& dev, const Tensor& a, const Tensor& b, const Tensor& c) {
  UOpRef u = a.matmul(b).uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&u, 1));
  if (s.items.size() != 1) throw Error("[gpu_matmul] the matmul is not one kernel");
  OptConfig cfg;
  cfg.local_threads = dev.renderer().grid_limits().threads;
  cfg.tensor_cores = false;
  std::vector<Opt> opts = gpu_hand_coded_optimizations(s.items[0].ast, cfg);
  cfg.tensor_cores = dev.renderer().grid_limits().tensor_cores;
  std::string with, without;
  for (const Opt& o : gpu_hand_coded_optimizations(s.items[0].ast, cfg)) with += (with.empty() ? "" : ", ") + to_string(o);
  for (const Opt& o : opts) without += (without.empty() ? "" : ", ") + to_string(o);
  std::printf("  [tg opts: %s; without TC: %s]", with.c_str(), without.c_str());
  LowerOptions lo;
  lo.opts = &opts;
  NoTcKernel r;
  r.k = lower_kernel(s.items[0].ast, "matmul_no_tc", dev.renderer(), lo);
  r.prog = dev.get_program(r.k.src, r.k.name);
  // PARAM 0 is the output; the inputs follow in the schedule's buffer order (a and b are realised buffers).
  r.ptrs.push_back(dptr(c));
  for (size_t i = 1; i < s.items[0].bufs.size(); i++)
    r.ptrs.push_back(s.items[0].bufs[i]->ptr());
  return r;
}

template <class F>
double best_ms(Device& dev, F&& f, int reps) {
  f();  // warm-up (compiles)
  dev.synchronize();
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    auto t = clk::now();
    f();
    dev.synchronize();
    best = std::min(best, std::chrono::duration<double, std::milli>(clk::now() - t).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  Device* dev = nullptr;
  try {
    dev = &get_device("CUDA");
  } catch (const Error& e) {
    std::printf("gpu_matmul: no CUDA device: %s\n", e.what());
    return 2;
  }
  Cublas cb;
  bool have_cublas = cb.load();
  if (!have_cublas) std::printf("gpu_matmul: cuBLAS not found; tg figures only\n");
  std::vector<int64_t> sizes;
  for (int i = 1; i < argc; i++) sizes.push_back(std::atoll(argv[i]));
  if (sizes.empty()) sizes = {1024, 4096};
  for (int64_t N : sizes) {
    double flop = 2.0 * double(N) * double(N) * double(N);
    int reps = N >= 4096 ? 3 : 10;
    for (DType dt : {dtypes::float32, dtypes::float16}) {
      Tensor a = Tensor::rand({N, N}, dt, "CUDA"), b = Tensor::rand({N, N}, dt, "CUDA");
      a.realize();
      b.realize();
      Tensor c = Tensor::empty({N, N}, dt, "CUDA");
      c.realize();
      double tg_ms = best_ms(*dev, [&] { a.matmul(b).realize(); }, reps);
      std::printf("N=%5lld %-8s tg %9.1f GFLOPS (%8.3f ms)", (long long)N, dt.name().c_str(), flop / tg_ms / 1e6, tg_ms);
      if (dt == dtypes::float16) {
        try {
          NoTcKernel nt = no_tc_kernel(*dev, a, b, c);
          double ms = best_ms(*dev, [&] { nt.prog->run(nt.ptrs.data(), nullptr, nt.k.dims); }, reps);
          std::printf("  tg no TC %9.1f GFLOPS", flop / ms / 1e6);
        } catch (const Error& e) {
          std::printf("  tg no TC: %s", e.what());
        }
      }
      if (have_cublas) {
        int n = int(N);
        void *A = dptr(a), *B = dptr(b), *C = dptr(c);
        for (int mode : {kPedanticMath, kDefaultMath}) {
          if (dt == dtypes::float32 && mode == kDefaultMath) mode = kTf32Math;
          cb.SetMathMode(cb.h, mode);
          float one = 1, zero = 0;
          // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
          double ms = best_ms(*dev, [&] {
            if (dt == dtypes::float32)
              cb.Sgemm(cb.h, kOpN, kOpN, n, n, n, &one, static_cast<float*>(B), n, static_cast<float*>(A), n, &zero,
                       static_cast<float*>(C), n);
            else
              cb.GemmEx(cb.h, kOpN, kOpN, n, n, n, &one, B, kR16F, n, A, kR16F, n, &zero, C, kR16F, n, kCompute32F,
                        kGemmDefault);
          }, reps);
          const char* what = mode == kPedanticMath ? "cuBLAS (no TC)" : dt == dtypes::float32 ? "cuBLAS (TF32 TC)" : "cuBLAS (TC)";
          std::printf("  %s %9.1f GFLOPS tg/cuBLAS %.3f", what, flop / ms / 1e6, ms / tg_ms);
        }
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  (void)kR32F;
  return 0;
}
