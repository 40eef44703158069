#pragma once
// dtypes: scalar kinds, vector and pointer types, the promotion lattice, exact conversions.
// Thread-safety: all functions are pure; DType is a trivially copyable value.
#include "tg/config.hpp"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "tg/error.hpp"

namespace tg {

/** Scalar kinds. The order is tinygrad's priority order (used by least_upper_dtype). */
enum class Scalar : uint8_t {
  Void, Index, Bool, WeakInt, Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, UInt64,
  WeakFloat, Fp8E4M3, Fp8E5M2, Float16, BFloat16, Float32, Float64,
};
/// number of Scalar kinds (the size of tables indexed by Scalar)
inline constexpr int kNumScalars = int(Scalar::Float64) + 1;

/** Where a pointer points (codegen only). */
enum class AddrSpace : uint8_t { Global, Local, Reg };

/** A dtype: a scalar kind, a vector width (count), and for codegen a pointer flag with address space and size. */
struct DType {
  /// the element kind (Float32, Int8, Bool, ...)
  Scalar scalar = Scalar::Void;
  uint16_t count = 1;      ///< vector lanes (1 = scalar)
  bool ptr = false;        ///< pointer to `scalar x count`
  /// for pointers: global memory, local (shared) memory or registers
  AddrSpace addr = AddrSpace::Global;
  int64_t size = -1;       ///< for pointers: number of elements, -1 = unknown

  /// equal in every field (kind, lanes, pointer flag, space and size)
  constexpr bool operator==(const DType&) const = default;
  /// the same dtype with n vector lanes
  constexpr DType vec(int n) const { DType d = *this; d.count = uint16_t(n); return d; }
  /// the scalar element type alone (one lane, not a pointer)
  constexpr DType scalar_type() const { return DType{scalar}; }
  /// the pointee without the pointer flag, size and address space (lanes kept)
  constexpr DType base() const { DType d = *this; d.ptr = false; d.size = -1; d.addr = AddrSpace::Global; return d; }
  /// a pointer to this dtype with sz elements (-1: unknown) in address space a
  constexpr DType ptr_to(int64_t sz = -1, AddrSpace a = AddrSpace::Global) const {
    DType d = *this; d.ptr = true; d.size = sz; d.addr = a; return d;
  }
  /** Bits of one scalar element. */
  constexpr int bitsize() const {
    switch (scalar) {
      case Scalar::Void: return 0;
      case Scalar::Bool: return 1;
      case Scalar::Int8: case Scalar::UInt8: case Scalar::Fp8E4M3: case Scalar::Fp8E5M2: return 8;
      case Scalar::Int16: case Scalar::UInt16: case Scalar::Float16: case Scalar::BFloat16: return 16;
      case Scalar::Int32: case Scalar::UInt32: case Scalar::Float32: return 32;
      default: return 64;
    }
  }
  /** Bytes of one element (all lanes); pointers are 8 bytes. */
  constexpr int itemsize() const { return ptr ? 8 : ((bitsize() + 7) / 8) * count; }
  /** "float32", "weakint", "index", ...; vectors "float32x4"; pointers "float32*", followed by a bracket holding the
   *  non-global address space and/or the size when known: "float32*[16]", "float32*[reg]", "float16x4*[local,16]". */
  std::string name() const;
};

namespace dtypes {
/// no value (void_), the index type of shapes and addresses (index: int64 range), bool
///@{
inline constexpr DType void_{Scalar::Void}, index{Scalar::Index}, bool_{Scalar::Bool};
///@}
/// Python-like scalars: they take the other operand's dtype in promotion (else int32 / float32)
///@{
inline constexpr DType weakint{Scalar::WeakInt}, weakfloat{Scalar::WeakFloat};
///@}
/// signed and unsigned 8- and 16-bit integers
///@{
inline constexpr DType int8{Scalar::Int8}, uint8{Scalar::UInt8}, int16{Scalar::Int16}, uint16{Scalar::UInt16};
///@}
/// signed and unsigned 32- and 64-bit integers
///@{
inline constexpr DType int32{Scalar::Int32}, uint32{Scalar::UInt32}, int64{Scalar::Int64}, uint64{Scalar::UInt64};
///@}
/// 8-bit floats: 4 exponent bits and 3 mantissa bits (no inf), or 5 and 2
///@{
inline constexpr DType fp8e4m3{Scalar::Fp8E4M3}, fp8e5m2{Scalar::Fp8E5M2};
///@}
/// IEEE half, bfloat16, IEEE single and double precision
///@{
inline constexpr DType float16{Scalar::Float16}, bfloat16{Scalar::BFloat16}, float32{Scalar::Float32}, float64{Scalar::Float64};
///@}
/// the dtypes weak scalars and unspecified creation take: int32 and float32
///@{
inline constexpr DType default_int = int32, default_float = float32;
///@}

/// whether d is a float kind (fp8 to float64, or weakfloat); pointers are not
constexpr bool is_float(DType d) {
  return !d.ptr && (d.scalar == Scalar::WeakFloat || (d.scalar >= Scalar::Fp8E4M3 && d.scalar <= Scalar::Float64));
}
/// whether d is an unsigned integer (uint8 to uint64)
constexpr bool is_unsigned(DType d) {
  return !d.ptr && (d.scalar == Scalar::UInt8 || d.scalar == Scalar::UInt16 || d.scalar == Scalar::UInt32 || d.scalar == Scalar::UInt64);
}
/** Integer kinds, including index and weakint (bool is not an int). */
constexpr bool is_int(DType d) {
  return !d.ptr && (d.scalar == Scalar::Index || (d.scalar >= Scalar::WeakInt && d.scalar <= Scalar::UInt64));
}
/// whether d is bool (not a pointer)
constexpr bool is_bool(DType d) { return !d.ptr && d.scalar == Scalar::Bool; }
/// whether d is a weak (Python-like) scalar dtype
constexpr bool is_weak(DType d) { return d.scalar == Scalar::WeakInt || d.scalar == Scalar::WeakFloat; }
/** weakint -> default_int, weakfloat -> default_float, others unchanged. */
constexpr DType strong(DType d) {
  return d.scalar == Scalar::WeakInt ? default_int.vec(d.count) : d.scalar == Scalar::WeakFloat ? default_float.vec(d.count) : d;
}
/** Smallest and largest value of an int/bool dtype (index: int64 range). */
int64_t min_int(DType d);
/// the largest value of an int/bool dtype as uint64 (exact for uint64)
uint64_t max_uint(DType d);
int64_t max_int(DType d);  ///< the largest value as int64 (saturates at INT64_MAX for uint64)
/** Parse "float32", "half", "int", ...; throws tg::Error naming the text. */
DType from_name(std::string_view name);
}  // namespace dtypes

/** The least dtype above all of `ds` in the promotion lattice (tinygrad's least_upper_dtype). */
DType least_upper_dtype(std::initializer_list<DType> ds);
/** dt if float, else the least float above dt. */
DType least_upper_float(DType dt);
/** The accumulator dtype of a sum over `dt`. */
DType sum_acc_dtype(DType dt);
/** True when every value of `from` is exactly representable in `to`. */
bool can_lossless_cast(DType from, DType to);

/// Exact, round-to-nearest-even conversions (NaN and infinity preserved where the format has them).
///@{
uint16_t float_to_half_bits(float x);
float half_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(uint16_t b);
uint8_t double_to_fp8_bits(double x, Scalar fmt);  ///< fmt: Fp8E4M3 (saturating, no inf) or Fp8E5M2
double fp8_bits_to_double(uint8_t b, Scalar fmt);
///@}
/** Round a double to the nearest value representable in `dt` (C semantics: ints wrap, floats round).
 *  Floats: float32/float16/fp8 round once (RNE; float32 and float16 overflow to inf, fp8 as double_to_fp8_bits);
 *  bfloat16 rounds via float32 first, as tinygrad does. Ints: trunc toward zero, then wrap modulo 2^bits
 *  (exact even for huge values); NaN and +-inf give 0; uint64 results above 2^53 are rounded back to double.
 *  bool: x != 0 (NaN -> 1). float64/weakfloat: identity. index/weakint: as int64. Vectors use the scalar;
 *  void and pointers throw tg::Error. */
double truncate_float(double x, DType dt);

}  // namespace tg
