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

// Tensor-core emulation (make_opencl_renderer's tc_emulation): one warp's mma.sync.m16n8k16.row.col with float
// accumulators, written from the PTX ISA's fragment tables (groupID = lane / 4, threadID_in_group = lane % 4):
//   A (16x16): a0,a1,a4,a5 in row groupID, a2,a3,a6,a7 in row groupID+8; column tig*2 + (i & 1), +8 for a4..a7
//   B (16x8):  b0,b1 in rows tig*2 + (i & 1), b2,b3 in those rows +8; column groupID
//   C, D (16x8): c0,c1 in row groupID, c2,c3 in row groupID+8; column tig*2 + (i & 1)
// Each warp (32 consecutive items of the group) gathers its fragments into local memory, then every item computes
// its four results. Every item of the group must call it (two barriers).
constexpr const char* kWmmaEmu = R"(static void tg_wmma_emu(__private float* d, __private const float* a, __private const float* b,
                        __private const float* c, __local float* smem) {
  uint flat = get_local_id(0) + get_local_size(0) * (get_local_id(1) + get_local_size(1) * get_local_id(2));
  uint lane = flat % 32, g = lane / 4, t = lane % 4;
  __local float* A = smem + (flat / 32) * 384;
  __local float* B = A + 256;
  A[g * 16 + t * 2] = a[0];           A[g * 16 + t * 2 + 1] = a[1];
  A[(g + 8) * 16 + t * 2] = a[2];     A[(g + 8) * 16 + t * 2 + 1] = a[3];
  A[g * 16 + t * 2 + 8] = a[4];       A[g * 16 + t * 2 + 9] = a[5];
  A[(g + 8) * 16 + t * 2 + 8] = a[6]; A[(g + 8) * 16 + t * 2 + 9] = a[7];
  B[(t * 2) * 8 + g] = b[0];          B[(t * 2 + 1) * 8 + g] = b[1];
  B[(t * 2 + 8) * 8 + g] = b[2];      B[(t * 2 + 9) * 8 + g] = b[3];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = 0; i < 4; i++) {
    int row = g + (i >= 2 ? 8 : 0), col = t * 2 + (i & 1);
    float acc = c[i];
    for (int k = 0; k < 16; k++) acc += A[row * 16 + k] * B[k * 8 + col];
    d[i] = acc;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
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
  bool tc_emulation() const { return lim_.tensor_cores; }

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
    const auto& a = std::get<std::vector<int64_t>>(u->arg);
    int64_t kind = a.size() > 1 ? a[1] : 0;  // global, group or local index (include/tg/codegen.hpp)
    static const char* fn[] = {"get_global_id(", "get_group_id(", "get_local_id("};
    if (kind < 0 || kind > 2) throw Error("[render] OpenCL: SPECIAL kind " + std::to_string(kind) + " is not 0, 1 or 2");
    return "(" + lang_.type(u->dtype) + ")" + fn[kind] + std::to_string(a.at(0)) + ")";
  }
  std::string render_wmma(const std::string& dst, const std::vector<std::string>& a, const UOp* u,
                          std::string& decls) const override {
    if (!tc_emulation()) return CStyleRenderer::render_wmma(dst, a, u, decls);
    const char* scratch = "tg_wmma_smem";
    if (decls.find(scratch) == std::string::npos)  // 384 floats per warp of the largest group
      decls += "  __local float " + std::string(scratch) + "[" + std::to_string(384 * (lim_.threads + 31) / 32) + "];\n";
    std::string s = "{ float tg_a[8] = {";
    for (size_t i = 0; i < 8; i++) s += (i ? ", " : "") + to_float(a[i], u->src(i)->dtype);
    s += "}; float tg_b[4] = {";
    for (size_t i = 8; i < 12; i++) s += (i > 8 ? ", " : "") + to_float(a[i], u->src(i)->dtype);
    s += "}; float tg_c[4] = {" + a[12] + ", " + a[13] + ", " + a[14] + ", " + a[15] + "}; ";
    return s + "tg_wmma_emu(" + dst + ", tg_a, tg_b, tg_c, " + scratch + "); }";
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
    std::string emu = body.find("tg_wmma_emu(") != std::string::npos ? kWmmaEmu : "";
    return marker + lang_.prelude + emu + "\n__kernel void " + name + "(" + sig + ") {\n" + binds + decls + body + "}\n";
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
  // float4: vload4/vstore4 at any element address; OpenCL C's operators and math functions take vectors
  l.vector_bytes = 16;
  l.vector_float_ops = {Ops::ADD, Ops::SUB, Ops::MUL, Ops::FDIV, Ops::NEG, Ops::MULACC, Ops::RECIPROCAL, Ops::SQRT,
                        Ops::EXP2, Ops::LOG2, Ops::SIN, Ops::TRUNC};
  auto base_mulacc = l.code_for_op[Ops::MULACC];
  l.code_for_op[Ops::MULACC] = [base_mulacc](auto& a, DType dt, auto& lang) {
    return dtypes::is_float(dt) ? fn("fma")(a, dt, lang) : base_mulacc(a, dt, lang);
  };
  return l;
}

std::unique_ptr<Renderer> make_opencl_renderer(bool fp16, bool fp64, int64_t max_threads, bool tc_emulation) {
  Renderer::GridLimits lim;
  lim.threads = max_threads;
  lim.tensor_cores = tc_emulation;
  for (int64_t& g : lim.groups) g = int64_t(1) << 31;
  return std::make_unique<OpenCLRenderer>(opencl_language(fp16, fp64), lim);
}

}  // namespace tg
