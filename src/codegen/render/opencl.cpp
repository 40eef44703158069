// The OpenCL C dialect (tinygrad: renderer/cstyle.py, OpenCLRenderer). Buffers are __global pointers in the
// kernel's signature, variables are `long` arguments, work-item indices come from get_global_id. float16 is the
// native `half` when the device has cl_khr_fp16, else uint16 bits converted with vload_half/vstore_half_rte;
// bfloat16 is always uint16 bits. bool buffers are uchar (bool is not allowed in kernel arguments).
#include <cstdio>
#include <memory>

#include "linear.hpp"
#include "tg/error.hpp"
#include "tg/render.hpp"

namespace tg {

namespace {

constexpr const char* kBf16 = R"(static inline float tg_bf2f(ushort b) { return as_float((uint)b << 16); }
static inline ushort tg_f2bf(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* maximum as torch.maximum: NaN if either is NaN, +0 above -0 */
static inline float tg_fmaxf(float a, float b) {
  if (isnan(a) || isnan(b)) return a + b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
)";

constexpr const char* kFp64 = R"(static inline double tg_fmax(double a, double b) {
  if (isnan(a) || isnan(b)) return a + b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
)";

// float16 as bits (no cl_khr_fp16): the core vload_half/vstore_half functions convert.
constexpr const char* kHalfBits = R"(static inline float tg_h2f(ushort h) { return vload_half(0, (const __private half*)&h); }
static inline ushort tg_f2h(float f) { ushort h; vstore_half_rte(f, 0, (__private half*)&h); return h; }
)";
// double -> half rounded once: round to odd into float (24 bits >= 11 + 2), then to nearest even.
constexpr const char* kD2hBits = R"(static inline ushort tg_d2h(double d) {
  float f = (float)d;
  if ((double)f != d && f == f) {
    uint u = as_uint(f);
    if (fabs((double)f) > fabs(d)) u -= 1;
    f = as_float(u | 1u);
  }
  return tg_f2h(f);
}
)";

CodeForOp fn(const char* name) {
  return [name](const std::vector<std::string>& a, DType, const CStyleLanguage&) {
    std::string s = std::string(name) + "(";
    for (size_t i = 0; i < a.size(); i++) s += (i ? ", " : "") + a[i];
    return s + ")";
  };
}

class OpenCLRenderer : public CStyleRenderer {
 public:
  OpenCLRenderer(CStyleLanguage l, GridLimits lim) : CStyleRenderer(std::move(l)), lim_(lim) {}
  GridLimits grid_limits() const override { return lim_; }

 protected:
  std::string render_const(const UOp* c) const override {
    if (c->dtype.scalar != Scalar::Int64 && c->dtype.scalar != Scalar::UInt64) return CStyleRenderer::render_const(c);
    int64_t v = std::get<int64_t>(c->arg);  // `long` literals: OpenCL C has no long long
    if (c->dtype.scalar == Scalar::UInt64) return std::to_string(uint64_t(v)) + "UL";
    if (v == INT64_MIN) return "(-9223372036854775807L-1)";
    return v < 0 ? "(" + std::to_string(v) + "L)" : std::to_string(v) + "L";
  }
  std::string render_bitcast(const std::string& dst, const std::string& x, DType from, DType to) const override {
    if (lang_.type(from) == lang_.type(to) || dtypes::is_bool(from) || dtypes::is_bool(to))
      return CStyleRenderer::render_bitcast(dst, x, from, to);
    return dst + " = as_" + lang_.type(to) + "(" + x + ");";
  }
  std::string render_special(const UOp* u) const override {
    int64_t axis = std::get<std::vector<int64_t>>(u->arg).at(0);
    return "(" + lang_.type(u->dtype) + ")get_global_id(" + std::to_string(axis) + ")";
  }
  std::string render_kernel(const std::string& name, const std::vector<KernelArg>& args, const std::string& decls,
                            const std::string& body) const override {
    int nb = 0, nv = 0;
    std::string sig, binds;
    for (const KernelArg& a : args) {
      sig += sig.empty() ? "" : ", ";
      if (a.is_buffer) {
        DType b = a.dtype.base();
        sig += "__global " + (dtypes::is_bool(b) ? std::string("uchar") : lang_.type(b)) + "* restrict " + a.name;
        nb++;
      } else {
        sig += "long " + a.name + "_arg";
        binds += "  const " + lang_.type(a.dtype) + " " + a.name + " = (" + lang_.type(a.dtype) + ")" + a.name +
                 "_arg;  /* " + a.comment + " */\n";
        nv++;
      }
    }
    char marker[96];
    std::snprintf(marker, sizeof marker, "// tg kernel args: %d buffers, %d vars\n", nb, nv);
    return marker + lang_.prelude + "\n__kernel void " + name + "(" + sig + ") {\n" + binds + decls + body + "}\n";
  }

 private:
  GridLimits lim_;
};

}  // namespace

CStyleLanguage opencl_language(bool fp16, bool fp64) {
  CStyleLanguage l;
  l.name = "OpenCL";
  l.kernel_prefix = "__kernel ";
  l.buffer_prefix = "__global ";
  l.smem_prefix = "__local ";
  l.barrier = "barrier(CLK_LOCAL_MEM_FENCE);";
  auto set = [&](DType d, const char* t) { l.types[size_t(d.scalar)] = t; };
  set(dtypes::bool_, "bool");
  set(dtypes::int8, "char");
  set(dtypes::uint8, "uchar");
  set(dtypes::int16, "short");
  set(dtypes::uint16, "ushort");
  set(dtypes::int32, "int");
  set(dtypes::uint32, "uint");
  set(dtypes::int64, "long");
  set(dtypes::uint64, "ulong");
  set(dtypes::float16, fp16 ? "half" : "ushort");
  set(dtypes::bfloat16, "ushort");
  set(dtypes::float32, "float");
  if (fp64) set(dtypes::float64, "double");
  l.half_as_bits = !fp16;
  l.prelude = std::string(fp64 ? "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" : "") +
              (fp16 ? "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" : "") + kBf16 + (fp64 ? kFp64 : "") +
              (fp16 ? "" : kHalfBits) + (fp16 || !fp64 ? "" : kD2hBits);
  l.code_for_op = CStyleLanguage::base_code_for_op();
  // OpenCL's math functions are overloaded on float and double.
  l.code_for_op[Ops::EXP2] = fn("exp2");
  l.code_for_op[Ops::LOG2] = fn("log2");
  l.code_for_op[Ops::SIN] = fn("sin");
  l.code_for_op[Ops::SQRT] = fn("sqrt");
  l.code_for_op[Ops::TRUNC] = [](auto& a, DType dt, auto& lang) { return dtypes::is_float(dt) ? fn("trunc")(a, dt, lang) : a[0]; };
  auto base_pow = l.code_for_op[Ops::POW];
  l.code_for_op[Ops::POW] = [base_pow](auto& a, DType dt, auto& lang) {
    return dtypes::is_float(dt) ? fn("pow")(a, dt, lang) : base_pow(a, dt, lang);
  };
  auto base_mulacc = l.code_for_op[Ops::MULACC];
  l.code_for_op[Ops::MULACC] = [base_mulacc](auto& a, DType dt, auto& lang) {
    return dtypes::is_float(dt) ? fn("fma")(a, dt, lang) : base_mulacc(a, dt, lang);
  };
  return l;
}

std::unique_ptr<Renderer> make_opencl_renderer(bool fp16, bool fp64, int64_t max_threads) {
  Renderer::GridLimits lim;
  lim.threads = max_threads;
  for (int64_t& g : lim.groups) g = int64_t(1) << 31;
  return std::make_unique<OpenCLRenderer>(opencl_language(fp16, fp64), lim);
}

}  // namespace tg
