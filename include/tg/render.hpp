#pragma once
// Renderers: a linear program (see include/tg/codegen.hpp) to source text.
//   CStyleRenderer  shared by every C-like language; driven by a CStyleLanguage (tokens, type spellings,
//                   per-op expression templates) that a dialect fills in. CRenderer is the CPU dialect.
//   LLVMRenderer    textual LLVM IR (LLVM 19, opaque pointers) for the CPU ORC JIT.
// Numeric semantics are exec_alu's (include/tg/uop.hpp): ints wrap, IDIV/MOD truncate, comparisons give bool,
// float16/bfloat16 compute in float32 and round after every op, float MAX propagates NaN. Deliberate
// differences: int64/uint64 -> float32 rounds once (as C); float -> int is defined for values in [-2^63, 2^63)
// (wrapping to the target width; uint64 also takes [2^63, 2^64)); integer division by zero is undefined;
// MULACC on floats is one fused multiply-add.
// Thread-safety: render() keeps all state on its stack; a renderer may be used from several threads.
#include "tg/config.hpp"

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tg/device.hpp"
#include "tg/uop.hpp"

namespace tg {

struct CStyleLanguage;
/** A C expression for one ALU op from its operand expressions and the dtype it computes in. */
using CodeForOp = std::function<std::string(const std::vector<std::string>& a, DType dt, const CStyleLanguage& lang)>;

/** Everything a C-like dialect differs in: mostly data, plus the per-op expression templates. */
struct CStyleLanguage {
  std::string name;                        ///< "C", "OpenCL", "CUDA" (used in error messages)
  std::string prelude;                     ///< includes and helpers emitted before the kernel
  std::string kernel_prefix;               ///< before the return type of the kernel
  std::string buffer_prefix;               ///< before pointer types of buffer arguments ("__global ")
  std::string restrict_kw = "restrict";    ///< appended to buffer pointers ("" for none)
  std::string smem_prefix;                 ///< before DEFINE_LOCAL arrays; "" = no local memory
  std::string barrier;                     ///< statement for BARRIER; "" = unsupported
  std::string prefetch;                    ///< function for PREFETCH (a read prefetch of an address); "" = none (a hint: dropped)
  std::array<std::string, kNumScalars> types{};  ///< spelling per scalar kind; "" = unsupported
  /** float16/bfloat16 held as uint16 bits and converted with helper functions (else native types). */
  /// float16 / bfloat16 held as uint16 bits and converted with the helpers below (false: the dialect's native type)
  ///@{
  bool half_as_bits = true, bf16_as_bits = true;
  ///@}
  /// helper names: half to float, float to half, double to half, bfloat16 to float, float to bfloat16
  ///@{
  std::string h2f = "tg_h2f", f2h = "tg_f2h", d2h = "tg_d2h", bf2f = "tg_bf2f", f2bf = "tg_f2bf";
  ///@}
  std::unordered_map<Ops, CodeForOp> code_for_op;  ///< ALU templates; a missing op is a render error
  /// Vector types (TYPEn: float4, int4) of float32 and int32: the widest in bytes (0: none, the CPU C dialect)
  int vector_bytes = 0;
  /// vector LOAD/STORE as a cast to an aligned vector pointer (CUDA; only at addresses aligned to the vector), else
  /// OpenCL's vloadn/vstoren (any element-aligned address). Register arrays are then declared aligned to vector_bytes
  /// (`aligned_array`), so that their aligned runs are vectors too (a tile's accumulators).
  bool vector_aligned = false;
  std::string aligned_array;  ///< before a register array when vector_aligned: CUDA's "__align__(16) "
  /// a vector from its lanes: "make_" (CUDA: make_float4(a, b, c, d)), "" (OpenCL: (float4)(a, b, c, d))
  std::string vector_make;
  /// ALU ops whose templates work unchanged on float32 vectors (CUDA's float4 has no arithmetic: none)
  std::vector<Ops> vector_float_ops;
  /** Spelling of a scalar dtype; throws tg::Error for unsupported ones. */
  const std::string& type(DType dt) const;
  /** Unsigned spelling of the same width ("uint32_t" for int32). */
  const std::string& utype(DType dt) const;
  /** The base templates shared by all C-like dialects (dialects copy and override entries). */
  static std::unordered_map<Ops, CodeForOp> base_code_for_op();
};

/** Renders a linear program as a C-like kernel. Dialects override the hooks below. */
class CStyleRenderer : public Renderer {
 public:
  /// a renderer for the dialect `lang` describes
  explicit CStyleRenderer(CStyleLanguage lang);
  std::string render(const std::string& name, const std::vector<const UOp*>& program) override;
  bool has_local() const override { return !lang_.smem_prefix.empty(); }
  bool supports(DType dt) const override;
  /// float32 and int32 vectors up to the dialect's vector_bytes
  int vector_lanes_of(DType d) const override;
  /// the dialect's vector_float_ops on float32 lanes
  bool vector_alu(const UOp* u) const override;
  bool vector_aligned() const override { return lang_.vector_aligned; }
  /// the dialect's description
  const CStyleLanguage& lang() const { return lang_; }

  /** One kernel argument as the signature hook sees it. */
  struct KernelArg {
    std::string name;  ///< the identifier the body uses
    DType dtype;       ///< pointer dtype for buffers, int dtype for variables
    /// a buffer pointer (PARAM) rather than an int variable (DEFINE_VAR)
    bool is_buffer;
    std::string comment;  ///< variable name for DEFINE_VARs
  };

 protected:
  /** The whole kernel: signature and argument binding around `body` (the CPU ABI by default). */
  virtual std::string render_kernel(const std::string& name, const std::vector<KernelArg>& args,
                                    const std::string& decls, const std::string& body) const;
  /** A constant as a C literal of its dtype. */
  virtual std::string render_const(const UOp* c) const;
  /** Expression converting `x` from `from` to `to` (CAST semantics). */
  virtual std::string render_cast(const std::string& x, DType from, DType to) const;
  /** Statements setting the already declared variable `dst` to the bits of lvalue `x`. */
  virtual std::string render_bitcast(const std::string& dst, const std::string& x, DType from, DType to) const;
  /** float32 expression of a 16-bit float `x` held in the dialect's representation, and back. */
  virtual std::string to_float(const std::string& x, DType dt) const;
  /// expression converting float32 `x` to the 16-bit float `dt` in the dialect's representation
  virtual std::string from_float(const std::string& x, DType dt) const;
  /** Expression for SPECIAL (work-item indices); dialects with them override. */
  virtual std::string render_special(const UOp* u) const;
  /** Statements filling the declared array `dst` with a WMMA's result from its operand expressions `a`; may add
   *  function-scope declarations to `decls`. Dialects with tensor cores override (the base throws). */
  virtual std::string render_wmma(const std::string& dst, const std::vector<std::string>& a, const UOp* u,
                                  std::string& decls) const;

  /// the dialect this renderer writes
  CStyleLanguage lang_;
};

/** The CPU C dialect, compiled by clang into a shared object. */
CStyleLanguage c_language();
/** CStyleRenderer with c_language(). */
class CRenderer : public CStyleRenderer {
 public:
  CRenderer() : CStyleRenderer(c_language()) {}
  bool native_transcendentals() const override { return false; }  // libm calls, one element at a time
  bool vector_lanes() const override { return true; }
};

/** The OpenCL C dialect; `fp16`/`fp64`: the device has cl_khr_fp16 / cl_khr_fp64 (src/codegen/render/opencl.cpp). */
CStyleLanguage opencl_language(bool fp16, bool fp64);
/** An OpenCL C renderer whose kernels launch with at most `max_threads` work items per group. `tc_emulation`:
 *  it offers tensor cores (TC) and renders each WMMA as the warp-wide mma.sync computed through local memory from
 *  the PTX ISA's fragment layouts (for testing TC kernels on a CPU OpenCL device; groups of 32-item warps). */
std::unique_ptr<Renderer> make_opencl_renderer(bool fp16, bool fp64, int64_t max_threads, bool tc_emulation = false);
/** A CUDA C renderer for compute capability `sm` (e.g. 80, 90) (src/codegen/render/cuda.cpp). */
std::unique_ptr<Renderer> make_cuda_renderer(int sm);

/** Renders a linear program as LLVM IR text: one `void NAME(ptr bufs, ptr vars)` function, no target triple. */
class LLVMRenderer : public Renderer {
 public:
  std::string render(const std::string& name, const std::vector<const UOp*>& program) override;
  bool supports(DType dt) const override;
  bool native_transcendentals() const override { return false; }  // libm calls, one element at a time
  bool vector_lanes() const override { return true; }
  /// `<n x T>` vectors of every 32- and 64-bit kind (and bool)
  int vector_lanes_of(DType d) const override;
  bool vector_alu(const UOp* u) const override;
};

}  // namespace tg
