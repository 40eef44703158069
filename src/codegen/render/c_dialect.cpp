// The CPU C dialect: standard C11 compiled by clang. float16/bfloat16 live as uint16 bits; float16 converts
// through clang's __fp16 storage type (F16C with -march=native), bfloat16 with integer rounding.
#include "tg/render.hpp"

namespace tg {

namespace {

constexpr const char* kPrelude = R"(#include <math.h>
#include <stdbool.h>
#include <stdint.h>
static inline float tg_h2f(uint16_t h) { __fp16 x; __builtin_memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t tg_f2h(float f) { __fp16 x = (__fp16)f; uint16_t h; __builtin_memcpy(&h, &x, 2); return h; }
/* double -> half rounded once: round to odd into float (24 bits >= 11 + 2), then to nearest even */
static inline uint16_t tg_d2h(double d) {
  float f = (float)d;
  if ((double)f != d && f == f) {
    uint32_t u; __builtin_memcpy(&u, &f, 4);
    if (__builtin_fabs((double)f) > __builtin_fabs(d)) u -= 1;
    u |= 1; __builtin_memcpy(&f, &u, 4);
  }
  return tg_f2h(f);
}
static inline float tg_bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline uint16_t tg_f2bf(float f) {
  uint32_t u; __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* maximum as torch.maximum: NaN if either is NaN, +0 above -0 */
static inline float tg_fmaxf(float a, float b) {
  if (a != a || b != b) return a + b;
  if (a == b) return __builtin_signbit(a) ? b : a;
  return a > b ? a : b;
}
static inline double tg_fmax(double a, double b) {
  if (a != a || b != b) return a + b;
  if (a == b) return __builtin_signbit(a) ? b : a;
  return a > b ? a : b;
}
)";

}  // namespace

CStyleLanguage c_language() {
  CStyleLanguage l;
  l.name = "C";
  l.prefetch = "__builtin_prefetch";
  l.prelude = kPrelude;
  auto set = [&](DType d, const char* t) { l.types[size_t(d.scalar)] = t; };
  set(dtypes::bool_, "bool");
  set(dtypes::int8, "int8_t");
  set(dtypes::uint8, "uint8_t");
  set(dtypes::int16, "int16_t");
  set(dtypes::uint16, "uint16_t");
  set(dtypes::int32, "int32_t");
  set(dtypes::uint32, "uint32_t");
  set(dtypes::int64, "int64_t");
  set(dtypes::uint64, "uint64_t");
  set(dtypes::float16, "uint16_t");
  set(dtypes::bfloat16, "uint16_t");
  set(dtypes::float32, "float");
  set(dtypes::float64, "double");
  l.code_for_op = CStyleLanguage::base_code_for_op();
  return l;
}

}  // namespace tg
