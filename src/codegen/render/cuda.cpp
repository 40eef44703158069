// The CUDA C dialect (tinygrad: renderer/cstyle.py, CUDARenderer), compiled by NVRTC. The source needs no
// headers (NVRTC finds none on a machine without the toolkit's include folder): fixed-width types are spelled
// with builtin types, float16 and bfloat16 live as 16-bit bits (`tg_half`, `tg_bf16`) converted with PTX cvt
// instructions, work-item indices are blockIdx * blockDim + threadIdx.
#include <cstdio>
#include <memory>

#include "linear.hpp"
#include "tg/error.hpp"
#include "tg/render.hpp"

namespace tg {

namespace {

constexpr const char* kPrelude = R"(#define INFINITY (__int_as_float(0x7f800000))
#define NAN (__int_as_float(0x7fffffff))
typedef unsigned short tg_half;
typedef unsigned short tg_bf16;
__device__ __forceinline__ float tg_h2f(tg_half h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ tg_half tg_f2h(float f) { tg_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ tg_half tg_d2h(double d) { tg_half h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
__device__ __forceinline__ float tg_bf2f(tg_bf16 b) { return __uint_as_float((unsigned int)b << 16); }
__device__ __forceinline__ tg_bf16 tg_f2bf(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (tg_bf16)((u >> 16) | 0x40u);
  return (tg_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* maximum as torch.maximum: NaN if either is NaN, +0 above -0 */
__device__ __forceinline__ float tg_fmaxf(float a, float b) {
  if (a != a || b != b) return a + b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
__device__ __forceinline__ double tg_fmax(double a, double b) {
  if (a != a || b != b) return a + b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
)";

class CUDARenderer : public CStyleRenderer {
 public:
  CUDARenderer(CStyleLanguage l, int sm) : CStyleRenderer(std::move(l)), sm_(sm) {}
  GridLimits grid_limits() const override {
    GridLimits g;
    g.threads = kThreads;
    g.groups[0] = (int64_t(1) << 31) - 1;
    g.groups[1] = g.groups[2] = 65535;
    return g;
  }

 protected:
  std::string render_bitcast(const std::string& dst, const std::string& x, DType from, DType to) const override {
    if (lang_.type(from) == lang_.type(to) || dtypes::is_bool(from) || dtypes::is_bool(to))
      return CStyleRenderer::render_bitcast(dst, x, from, to);
    return "memcpy(&" + dst + ", &" + x + ", sizeof(" + dst + "));";
  }
  std::string render_special(const UOp* u) const override {
    static const char* xyz[] = {"x", "y", "z"};
    int64_t axis = std::get<std::vector<int64_t>>(u->arg).at(0);
    if (axis < 0 || axis > 2) throw Error("[render] CUDA launch axis " + std::to_string(axis) + " is not 0, 1 or 2");
    std::string a = xyz[axis];
    return "((" + lang_.type(u->dtype) + ")blockIdx." + a + "*blockDim." + a + "+threadIdx." + a + ")";
  }
  std::string render_kernel(const std::string& name, const std::vector<KernelArg>& args, const std::string& decls,
                            const std::string& body) const override {
    int nb = 0, nv = 0;
    std::string sig, binds;
    for (const KernelArg& a : args) {
      sig += sig.empty() ? "" : ", ";
      if (a.is_buffer) {
        sig += lang_.type(a.dtype.base()) + "* __restrict__ " + a.name;
        nb++;
      } else {
        sig += "long long " + a.name + "_arg";
        binds += "  const " + lang_.type(a.dtype) + " " + a.name + " = (" + lang_.type(a.dtype) + ")" + a.name +
                 "_arg;  /* " + a.comment + " */\n";
        nv++;
      }
    }
    char head[160];
    std::snprintf(head, sizeof head, "// tg kernel args: %d buffers, %d vars (sm_%d)\n", nb, nv, sm_);
    return head + lang_.prelude + "\nextern \"C\" __global__ void __launch_bounds__(" + std::to_string(kThreads) + ") " +
           name + "(" + sig + ") {\n" + binds + decls + body + "}\n";
  }

 private:
  static constexpr int64_t kThreads = 256;
  int sm_;
};

}  // namespace

CStyleLanguage cuda_language() {
  CStyleLanguage l;
  l.name = "CUDA";
  l.prelude = kPrelude;
  l.kernel_prefix = "extern \"C\" __global__ ";
  l.restrict_kw = "__restrict__";
  l.smem_prefix = "__shared__ ";
  l.barrier = "__syncthreads();";
  auto set = [&](DType d, const char* t) { l.types[size_t(d.scalar)] = t; };
  set(dtypes::bool_, "bool");
  set(dtypes::int8, "signed char");
  set(dtypes::uint8, "unsigned char");
  set(dtypes::int16, "short");
  set(dtypes::uint16, "unsigned short");
  set(dtypes::int32, "int");
  set(dtypes::uint32, "unsigned int");
  set(dtypes::int64, "long long");
  set(dtypes::uint64, "unsigned long long");
  set(dtypes::float16, "tg_half");
  set(dtypes::bfloat16, "tg_bf16");
  set(dtypes::float32, "float");
  set(dtypes::float64, "double");
  l.code_for_op = CStyleLanguage::base_code_for_op();
  return l;
}

std::unique_ptr<Renderer> make_cuda_renderer(int sm) { return std::make_unique<CUDARenderer>(cuda_language(), sm); }

}  // namespace tg
