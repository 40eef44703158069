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

// Tensor cores: one warp-wide mma.sync m16n8k16 (row-major A, column-major B, float accumulators). Each 32-bit
// register holds two 16-bit elements, the lower index in the low half (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type").
constexpr const char* kMma = R"(__device__ __forceinline__ void tg_mma_m16n8k16_IN(float* d, unsigned short a0, unsigned short a1,
    unsigned short a2, unsigned short a3, unsigned short a4, unsigned short a5, unsigned short a6, unsigned short a7,
    unsigned short b0, unsigned short b1, unsigned short b2, unsigned short b3, float c0, float c1, float c2, float c3) {
  unsigned A0 = (unsigned)a0 | ((unsigned)a1 << 16), A1 = (unsigned)a2 | ((unsigned)a3 << 16);
  unsigned A2 = (unsigned)a4 | ((unsigned)a5 << 16), A3 = (unsigned)a6 | ((unsigned)a7 << 16);
  unsigned B0 = (unsigned)b0 | ((unsigned)b1 << 16), B1 = (unsigned)b2 | ((unsigned)b3 << 16);
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.IN.IN.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(A0), "r"(A1), "r"(A2), "r"(A3), "r"(B0), "r"(B1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
}
)";

std::string mma_helper(const std::string& in) {
  std::string s = kMma;
  for (size_t p; (p = s.find("IN")) != std::string::npos;) s.replace(p, 2, in);
  return s;
}

class CUDARenderer : public CStyleRenderer {
 public:
  CUDARenderer(CStyleLanguage l, int sm) : CStyleRenderer(std::move(l)), sm_(sm) {}
  GridLimits grid_limits() const override {
    GridLimits g;
    g.threads = kThreads;
    g.groups[0] = (int64_t(1) << 31) - 1;
    g.groups[1] = g.groups[2] = 65535;
    g.tensor_cores = sm_ >= 80;
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
    const auto& arg = std::get<std::vector<int64_t>>(u->arg);
    int64_t axis = arg.at(0), kind = arg.size() > 1 ? arg[1] : 0;  // global, group or local index
    if (axis < 0 || axis > 2) throw Error("[render] CUDA launch axis " + std::to_string(axis) + " is not 0, 1 or 2");
    if (kind < 0 || kind > 2) throw Error("[render] CUDA: SPECIAL kind " + std::to_string(kind) + " is not 0, 1 or 2");
    std::string a = xyz[axis], T = "(" + lang_.type(u->dtype) + ")";
    if (kind == 1) return T + "blockIdx." + a;
    if (kind == 2) return T + "threadIdx." + a;
    return "(" + T + "blockIdx." + a + "*blockDim." + a + "+threadIdx." + a + ")";
  }
  std::string render_wmma(const std::string& dst, const std::vector<std::string>& a, const UOp* u,
                          std::string&) const override {
    if (sm_ < 80) throw Error("[render] CUDA: mma.sync m16n8k16 needs sm_80 or newer, not sm_" + std::to_string(sm_));
    std::string in = wmma_input(u);
    std::string s = "tg_mma_m16n8k16_" + in + "(" + dst;
    for (const std::string& x : a) s += ", " + x;
    return s + ");";
  }
  std::string render_kernel(const std::string& name, const std::vector<KernelArg>& args, const std::string& decls,
                            const std::string& body) const override {
    std::string helpers;
    for (const char* in : {"f16", "bf16"})
      if (body.find(std::string("tg_mma_m16n8k16_") + in + "(") != std::string::npos) helpers += mma_helper(in);
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
    return head + lang_.prelude + helpers + "\nextern \"C\" __global__ void __launch_bounds__(" + std::to_string(kThreads) + ") " +
           name + "(" + sig + ") {\n" + binds + decls + body + "}\n";
  }

 private:
  static std::string wmma_input(const UOp* u) {
    DType in = u->src(0)->dtype;
    if (in.scalar == Scalar::Float16) return "f16";
    if (in.scalar == Scalar::BFloat16) return "bf16";
    throw Error("[render] CUDA: WMMA inputs must be float16 or bfloat16, not " + in.name());
  }
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
  // float4/int4 loads and stores through aligned vector pointers (16 bytes: cuMemAlloc's buffers are 256-byte
  // aligned), make_float4; CUDA's vector types have no arithmetic, so their ops run lane by lane
  l.vector_bytes = 16;
  l.vector_aligned = true;
  l.aligned_array = "__align__(16) ";
  l.vector_make = "make_";
  return l;
}

std::unique_ptr<Renderer> make_cuda_renderer(int sm) { return std::make_unique<CUDARenderer>(cuda_language(), sm); }

}  // namespace tg
