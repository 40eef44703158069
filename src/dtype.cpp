#include "tg/dtype.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace tg {
namespace {

constexpr std::array<std::string_view, kNumScalars> kScalarNames = {
    "void",  "index",  "bool",  "weakint", "int8",      "uint8",   "int16",   "uint16",  "int32",   "uint32",
    "int64", "uint64", "weakfloat", "fp8e4m3", "fp8e5m2", "float16", "bfloat16", "float32", "float64",
};

std::string_view scalar_name(Scalar s) { return kScalarNames[size_t(s)]; }

// Bit sets over Scalar: bit i is Scalar(i).
using ScalarSet = uint32_t;
constexpr ScalarSet bit(Scalar s) { return ScalarSet(1) << int(s); }

// tinygrad's promo_lattice: the direct parents of each scalar (0 = not in the lattice).
constexpr ScalarSet direct_parents(Scalar s) {
  switch (s) {
    case Scalar::Bool: return bit(Scalar::WeakInt);
    case Scalar::WeakInt: return bit(Scalar::Int8) | bit(Scalar::UInt8);
    case Scalar::Int8: return bit(Scalar::Int16);
    case Scalar::Int16: return bit(Scalar::Int32);
    case Scalar::Int32: return bit(Scalar::Int64);
    case Scalar::Int64: return bit(Scalar::WeakFloat);
    case Scalar::UInt8: return bit(Scalar::Int16) | bit(Scalar::UInt16);
    case Scalar::UInt16: return bit(Scalar::Int32) | bit(Scalar::UInt32);
    case Scalar::UInt32: return bit(Scalar::Int64) | bit(Scalar::UInt64);
    case Scalar::UInt64: return bit(Scalar::WeakFloat);
    case Scalar::WeakFloat: return bit(Scalar::Fp8E4M3) | bit(Scalar::Fp8E5M2);
    case Scalar::Fp8E4M3: case Scalar::Fp8E5M2: return bit(Scalar::Float16) | bit(Scalar::BFloat16);
    case Scalar::Float16: case Scalar::BFloat16: return bit(Scalar::Float32);
    case Scalar::Float32: return bit(Scalar::Float64);
    default: return 0;
  }
}

// The scalar and everything above it in the lattice (tinygrad's _get_recursive_parents).
constexpr ScalarSet recursive_parents(Scalar s) {
  ScalarSet out = bit(s);
  for (int p = 0; p < kNumScalars; p++)
    if (direct_parents(s) & bit(Scalar(p))) out |= recursive_parents(Scalar(p));
  return out;
}

constexpr std::array<ScalarSet, kNumScalars> kParents = [] {
  std::array<ScalarSet, kNumScalars> a{};
  for (int i = 0; i < kNumScalars; i++) a[size_t(i)] = recursive_parents(Scalar(i));
  return a;
}();

std::string list_names(std::initializer_list<DType> ds) {
  std::string s;
  for (const DType& d : ds) s += (s.empty() ? "" : ", ") + d.name();
  return s;
}

// m / 2^shift (shift >= 1) rounded to nearest, ties to even.
constexpr uint64_t shift_rne(uint64_t m, int shift) {
  if (shift >= 64) return 0;  // callers guarantee the value is below half an ulp here
  uint64_t q = m >> shift, rem = m & ((uint64_t(1) << shift) - 1), half = uint64_t(1) << (shift - 1);
  return (rem > half || (rem == half && (q & 1))) ? q + 1 : q;
}

// IEEE binary16 from a double, rounded once (round-to-nearest-even); overflow -> inf, NaN stays a quiet NaN.
uint16_t double_to_half_bits(double x) {
  uint64_t u = std::bit_cast<uint64_t>(x);
  uint16_t sign = uint16_t((u >> 48) & 0x8000);
  uint64_t a = u & 0x7FFFFFFFFFFFFFFFull;
  int e = int(a >> 52);
  if (e == 0x7FF) {  // inf, or NaN: keep the top payload bits and set the quiet bit
    return uint16_t(sign | 0x7C00 | (a & 0xFFFFFFFFFFFFFull ? 0x200 | ((a >> 42) & 0x3FF) : 0));
  }
  if (a >= 0x40EFFE0000000000ull) return sign | 0x7C00;  // >= 65520: rounds past 65504
  uint64_t m = (a & 0xFFFFFFFFFFFFFull) | (uint64_t(1) << 52);
  if (e >= 1009) {  // normal half (>= 2^-14); a mantissa carry bumps the exponent correctly
    return uint16_t(sign | (shift_rne(m, 42) + (uint64_t(e - 1009) << 10)));
  }
  if (e == 0) return sign;  // double subnormals are far below half's smallest subnormal
  // subnormal half: value / 2^-24 = m * 2^(e - 1075 + 24)
  return uint16_t(sign | shift_rne(m, 1051 - e));
}

struct Fp8Cfg {
  int bias, sig_bits;
  uint64_t mant_mask, min_denorm_half, ovf_threshold, max_norm, min_norm;
};
// tinygrad's _fp8_cfg (from cuda_fp8.hpp): thresholds are bit patterns of doubles.
constexpr Fp8Cfg kE4M3{7, 4, 0x7, 0x3F50000000000000ull, 0x407D000000000000ull, 0x7E, 0x3F90000000000000ull};
constexpr Fp8Cfg kE5M2{15, 3, 0x3, 0x3EE0000000000000ull, 0x40EE000000000000ull - 1, 0x7B, 0x3F10000000000000ull};

const Fp8Cfg& fp8_cfg(Scalar fmt) {
  if (fmt == Scalar::Fp8E4M3) return kE4M3;
  if (fmt == Scalar::Fp8E5M2) return kE5M2;
  throw Error("[fp8] format must be fp8e4m3 or fp8e5m2, got " + DType{fmt}.name());
}

// C-style wrap of trunc(x) modulo 2^64 (exact for every finite double); NaN and +-inf give 0.
uint64_t wrap_u64(double x) {
  if (!std::isfinite(x)) return 0;
  double t = std::trunc(x);
  if (std::fabs(t) < 9223372036854775808.0) return uint64_t(int64_t(t));
  uint64_t u = std::bit_cast<uint64_t>(t);
  int k = int((u >> 52) & 0x7FF) - 1075;  // |t| = m * 2^k, k >= 11 here
  uint64_t m = (u & 0xFFFFFFFFFFFFFull) | (uint64_t(1) << 52);
  uint64_t r = k >= 64 ? 0 : m << k;
  return (u >> 63) ? uint64_t(0) - r : r;
}

// double -> float32 with round-to-nearest-even; finite values past FLT_MAX round to FLT_MAX or inf (no UB).
float double_to_float(double x) {
  constexpr double kFltMax = std::numeric_limits<float>::max();
  constexpr double kInfEdge = 0x1.ffffffp+127;  // FLT_MAX + half an ulp: ties round to inf
  if (std::isfinite(x) && std::fabs(x) > kFltMax) {
    float mag = std::fabs(x) >= kInfEdge ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::max();
    return std::signbit(x) ? -mag : mag;
  }
  return float(x);
}

}  // namespace

std::string DType::name() const {
  std::string s(scalar_name(scalar));
  if (count != 1) s += "x" + std::to_string(count);
  if (!ptr) return s;
  s += "*";
  std::string extra = addr == AddrSpace::Local ? "local" : addr == AddrSpace::Reg ? "reg" : "";
  if (size >= 0) extra += (extra.empty() ? "" : ",") + std::to_string(size);
  return extra.empty() ? s : s + "[" + extra + "]";
}

namespace dtypes {

int64_t min_int(DType d) {
  if (is_bool(d) || is_unsigned(d)) return 0;
  if (!is_int(d)) throw Error("[min_int] expected an int or bool dtype, got " + d.name());
  switch (d.scalar) {
    case Scalar::Int8: return INT8_MIN;
    case Scalar::Int16: return INT16_MIN;
    case Scalar::Int32: return INT32_MIN;
    default: return INT64_MIN;  // int64, index, weakint
  }
}

uint64_t max_uint(DType d) {
  if (is_bool(d)) return 1;
  if (!is_int(d)) throw Error("[max_uint] expected an int or bool dtype, got " + d.name());
  switch (d.scalar) {
    case Scalar::Int8: return INT8_MAX;
    case Scalar::UInt8: return UINT8_MAX;
    case Scalar::Int16: return INT16_MAX;
    case Scalar::UInt16: return UINT16_MAX;
    case Scalar::Int32: return INT32_MAX;
    case Scalar::UInt32: return UINT32_MAX;
    case Scalar::UInt64: return UINT64_MAX;
    default: return INT64_MAX;  // int64, index, weakint
  }
}

int64_t max_int(DType d) {
  if (!is_int(d) && !is_bool(d)) throw Error("[max_int] expected an int or bool dtype, got " + d.name());
  uint64_t m = max_uint(d);
  return m > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(m);
}

DType from_name(std::string_view name) {
  struct Alias { std::string_view name; Scalar s; };
  static constexpr Alias kAliases[] = {
      {"bool", Scalar::Bool},       {"int8", Scalar::Int8},         {"char", Scalar::Int8},
      {"uint8", Scalar::UInt8},     {"uchar", Scalar::UInt8},       {"int16", Scalar::Int16},
      {"short", Scalar::Int16},     {"uint16", Scalar::UInt16},     {"ushort", Scalar::UInt16},
      {"int32", Scalar::Int32},     {"int", Scalar::Int32},         {"uint32", Scalar::UInt32},
      {"uint", Scalar::UInt32},     {"int64", Scalar::Int64},       {"long", Scalar::Int64},
      {"uint64", Scalar::UInt64},   {"ulong", Scalar::UInt64},      {"float16", Scalar::Float16},
      {"half", Scalar::Float16},    {"bfloat16", Scalar::BFloat16}, {"float32", Scalar::Float32},
      {"float", Scalar::Float32},   {"float64", Scalar::Float64},   {"double", Scalar::Float64},
      {"fp8e4m3", Scalar::Fp8E4M3}, {"fp8e5m2", Scalar::Fp8E5M2},   {"index", Scalar::Index},
  };
  std::string lower(name);
  for (char& c : lower) if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  for (const Alias& a : kAliases)
    if (a.name == lower) return DType{a.s};
  std::string valid;
  for (const Alias& a : kAliases) valid += (valid.empty() ? "" : ", ") + std::string(a.name);
  throw Error("[from_name] unknown dtype '" + std::string(name) + "'; expected one of: " + valid);
}

}  // namespace dtypes

DType least_upper_dtype(std::initializer_list<DType> ds) {
  if (ds.size() == 0) throw Error("[least_upper_dtype] needs at least one dtype");
  const DType& first = *ds.begin();
  ScalarSet common = ~ScalarSet(0);
  for (const DType& d : ds) {
    if (d.ptr) throw Error("[least_upper_dtype] pointer dtypes do not promote: " + list_names(ds));
    if (d.count != first.count) throw Error("[least_upper_dtype] vector widths differ: " + list_names(ds));
    if (d.scalar == Scalar::Index) {
      if (first.scalar != Scalar::Index) throw Error("[least_upper_dtype] index only combines with index: " + list_names(ds));
      continue;
    }
    if (first.scalar == Scalar::Index) throw Error("[least_upper_dtype] index only combines with index: " + list_names(ds));
    if (d.scalar == Scalar::Void) throw Error("[least_upper_dtype] void does not promote: " + list_names(ds));
    common &= kParents[size_t(d.scalar)];
  }
  if (first.scalar == Scalar::Index) return dtypes::index.vec(first.count);
  // float64 is above every lattice member, so `common` is never empty; the lowest bit is the lowest priority
  return DType{Scalar(std::countr_zero(common))}.vec(first.count);
}

DType least_upper_float(DType dt) {
  if (dt.scalar == Scalar::WeakInt && !dt.ptr) return dtypes::weakfloat.vec(dt.count);
  if (dtypes::is_float(dt)) return dt;
  return least_upper_dtype({dt, dtypes::default_float.vec(dt.count)});
}

DType sum_acc_dtype(DType dt) {
  // tinygrad reads SUM_DTYPE (default float32); tg keeps this pure and uses float32.
  if (dtypes::is_unsigned(dt)) return least_upper_dtype({dt, dtypes::uint32.vec(dt.count)});
  if (dtypes::is_int(dt) || dtypes::is_bool(dt)) return least_upper_dtype({dt, dtypes::int32.vec(dt.count)});
  return least_upper_dtype({dt, dtypes::float32.vec(dt.count)});
}

bool can_lossless_cast(DType from, DType to) {
  if (from == to) return true;
  if (from.ptr || to.ptr || from.count != to.count) return false;
  if (from.scalar == Scalar::Bool) return true;
  auto in = [&](std::initializer_list<Scalar> ss) {
    for (Scalar s : ss)
      if (from.scalar == s) return true;
    return false;
  };
  using S = Scalar;
  switch (to.scalar) {
    case S::WeakInt: return in({S::UInt8, S::UInt16, S::UInt32, S::UInt64, S::Int8, S::Int16, S::Int32, S::Int64});
    case S::Float64:
      return in({S::Float32, S::Float16, S::BFloat16, S::Fp8E4M3, S::Fp8E5M2, S::UInt32, S::UInt16, S::UInt8, S::Int32,
                 S::Int16, S::Int8});
    case S::Float32:
      return in({S::Float16, S::BFloat16, S::Fp8E4M3, S::Fp8E5M2, S::UInt16, S::UInt8, S::Int16, S::Int8});
    case S::Float16: return in({S::Fp8E4M3, S::Fp8E5M2, S::UInt8, S::Int8});
    case S::UInt64: return in({S::UInt32, S::UInt16, S::UInt8});
    case S::UInt32: return in({S::UInt16, S::UInt8});
    case S::UInt16: return in({S::UInt8});
    case S::Int64: return in({S::UInt32, S::UInt16, S::UInt8, S::Int32, S::Int16, S::Int8});
    case S::Int32: return in({S::UInt16, S::UInt8, S::Int16, S::Int8});
    case S::Int16: return in({S::UInt8, S::Int8});
    default: return false;
  }
}

uint16_t float_to_half_bits(float x) { return double_to_half_bits(double(x)); }  // float -> double is exact

float half_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  if (e != 0) return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
  if (m == 0) return std::bit_cast<float>(sign);
  int exp = -14;  // subnormal: normalize m * 2^-24
  while (!(m & 0x400)) { m <<= 1; exp--; }
  return std::bit_cast<float>(sign | (uint32_t(exp + 127) << 23) | ((m & 0x3FF) << 13));
}

uint16_t float_to_bf16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);  // NaN: keep sign and top payload, quiet
  if ((u & 0x7FFFFFFFu) == 0x7F800000u) return uint16_t(u >> 16);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);  // finite overflow rounds to inf
}

float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

uint8_t double_to_fp8_bits(double x, Scalar fmt) {
  const Fp8Cfg& c = fp8_cfg(fmt);
  if (!std::isfinite(x)) {
    int sign = std::signbit(x) ? 0x80 : 0;
    if (fmt == Scalar::Fp8E4M3) return uint8_t(sign | 0x7F);  // e4m3 has no inf: +-inf and NaN become NaN
    return uint8_t(sign | (std::isinf(x) ? 0x7C : 0x7F));
  }
  uint64_t xbits = std::bit_cast<uint64_t>(x);
  uint64_t half_ulp = uint64_t(1) << (52 - c.sig_bits);
  uint64_t sign = ((xbits >> 63) & 1) << 7, absx = xbits & 0x7FFFFFFFFFFFFFFFull;
  int64_t exp = int64_t((xbits >> 52) & 0x7FF) - 1023 + c.bias;
  uint64_t mantissa = (xbits >> (53 - c.sig_bits)) & c.mant_mask, res;
  if (absx <= c.min_denorm_half) {
    res = 0;
  } else if (absx > c.ovf_threshold) {
    res = c.max_norm;  // finite overflow saturates
  } else if (absx >= c.min_norm) {
    res = (uint64_t(exp) << (c.sig_bits - 1)) | mantissa;
    uint64_t round_bits = xbits & ((half_ulp << 1) - 1);
    if (round_bits > half_ulp || (round_bits == half_ulp && (mantissa & 1))) res++;
  } else {
    int shift = int(1 - exp);  // 1..sig_bits in the subnormal range
    mantissa |= uint64_t(1) << (c.sig_bits - 1);
    res = mantissa >> shift;
    uint64_t half = half_ulp << shift, round_bits = (xbits | (uint64_t(1) << 52)) & ((half << 1) - 1);
    if (round_bits > half || (round_bits == half && (res & 1))) res++;
  }
  return uint8_t(res | sign);
}

double fp8_bits_to_double(uint8_t b, Scalar fmt) {
  const Fp8Cfg& c = fp8_cfg(fmt);
  if ((b & 0x7F) == 0) return (b & 0x80) ? -0.0 : 0.0;
  int mant_bits = c.sig_bits - 1, exp_bits = 8 - c.sig_bits;
  int exp_max = (1 << exp_bits) - 1, mant_max = (1 << mant_bits) - 1;
  int sign = (b >> 7) & 1, exp = (b >> mant_bits) & exp_max, mantissa = b & mant_max;
  if (exp == exp_max) {
    if (fmt == Scalar::Fp8E5M2)
      return std::copysign(mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity(),
                           sign ? -1.0 : 1.0);
    if (mantissa == mant_max) return std::numeric_limits<double>::quiet_NaN();
  }
  double frac = double(mantissa) / double(mant_max + 1);
  double val = exp == 0 ? std::ldexp(frac, 1 - c.bias) : std::ldexp(1.0 + frac, exp - c.bias);
  return sign ? -val : val;
}

double truncate_float(double x, DType dt) {
  if (dt.ptr || dt.scalar == Scalar::Void) throw Error("[truncate_float] cannot truncate to " + dt.name());
  switch (dt.scalar) {
    case Scalar::Bool: return x != 0 ? 1.0 : 0.0;  // NaN is truthy, as in Python
    case Scalar::Float64: case Scalar::WeakFloat: return x;
    case Scalar::Float32: return double(double_to_float(x));
    case Scalar::Float16: return double(half_bits_to_float(double_to_half_bits(x)));
    case Scalar::BFloat16: return double(bf16_bits_to_float(float_to_bf16_bits(double_to_float(x))));  // via float32, as tinygrad
    case Scalar::Fp8E4M3: case Scalar::Fp8E5M2: return fp8_bits_to_double(double_to_fp8_bits(x, dt.scalar), dt.scalar);
    case Scalar::Int8: return double(int8_t(wrap_u64(x)));
    case Scalar::UInt8: return double(uint8_t(wrap_u64(x)));
    case Scalar::Int16: return double(int16_t(wrap_u64(x)));
    case Scalar::UInt16: return double(uint16_t(wrap_u64(x)));
    case Scalar::Int32: return double(int32_t(wrap_u64(x)));
    case Scalar::UInt32: return double(uint32_t(wrap_u64(x)));
    case Scalar::UInt64: return double(wrap_u64(x));
    default: return double(int64_t(wrap_u64(x)));  // int64, index, weakint
  }
}

}  // namespace tg
