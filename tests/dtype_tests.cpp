// dtype tests: names, promotion lattice (vs tinygrad), casts, ranges, and exact float conversions.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tg/dtype.hpp"

using namespace tg;

template <>
struct doctest::StringMaker<DType> {
  static doctest::String convert(const DType& d) { return d.name().c_str(); }
};

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The 15 strong lattice dtypes plus the two weak ones, in tinygrad priority order.
const std::vector<DType> kLattice = {
    dtypes::bool_,   dtypes::weakint, dtypes::int8,      dtypes::uint8,   dtypes::int16,   dtypes::uint16,
    dtypes::int32,   dtypes::uint32,  dtypes::int64,     dtypes::uint64,  dtypes::weakfloat, dtypes::fp8e4m3,
    dtypes::fp8e5m2, dtypes::float16, dtypes::bfloat16,  dtypes::float32, dtypes::float64,
};

DType by_name(const std::string& n) {
  for (DType d : kLattice)
    if (d.name() == n) return d;
  FAIL("unknown name in table: " << n);
  return dtypes::void_;
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream is(s);
  std::vector<std::string> out;
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

DType lub(DType a, DType b) { return least_upper_dtype({a, b}); }

bool is_fp8_nan(uint8_t b, Scalar fmt) {
  return fmt == Scalar::Fp8E4M3 ? (b & 0x7F) == 0x7F : (b & 0x7F) > 0x7C;
}

// Nearest finite value (ties to the even bit pattern) among the non-negative patterns 0..max_bits of a format whose
// decode is monotone in the bits. Independent of the code under test except for the decoder.
template <class Decode>
uint32_t nearest_rne(double ax, uint32_t max_bits, Decode decode) {
  uint32_t lo = 0, hi = max_bits;
  if (ax >= decode(max_bits)) return max_bits;
  while (hi - lo > 1) {  // invariant: decode(lo) <= ax < decode(hi)
    uint32_t mid = (lo + hi) / 2;
    if (decode(mid) <= ax) lo = mid; else hi = mid;
  }
  double dl = ax - decode(lo), dh = decode(hi) - ax;  // exact (Sterbenz)
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

// Reference double -> half bits: RNE, >= 65520 overflows to inf.
uint16_t ref_half(double x) {
  if (std::isnan(x)) return 0x7E00;
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double ax = std::fabs(x);
  if (ax >= 65520.0) return sign | 0x7C00;
  return uint16_t(sign | nearest_rne(ax, 0x7BFF, [](uint32_t b) { return double(half_bits_to_float(uint16_t(b))); }));
}

// Reference double -> fp8 bits: RNE among finite values, saturating at the overflow edge (464 / 61440).
uint8_t ref_fp8(double x, Scalar fmt) {
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  double ax = std::fabs(x);
  uint32_t max_bits = fmt == Scalar::Fp8E4M3 ? 0x7E : 0x7B;
  double edge = fmt == Scalar::Fp8E4M3 ? 464.0 : 61440.0;
  if (ax >= edge) return uint8_t(sign | max_bits);
  return uint8_t(sign | nearest_rne(ax, max_bits, [fmt](uint32_t b) { return fp8_bits_to_double(uint8_t(b), fmt); }));
}

// Reference float -> bf16 bits for finite x: nearest of the two truncations, ties to even.
uint16_t ref_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint16_t lo = uint16_t(u >> 16);
  double v = std::fabs(double(x)), vl = std::fabs(double(bf16_bits_to_float(lo)));
  double vh = std::fabs(double(bf16_bits_to_float(uint16_t(lo + 1))));  // may be inf: then distance is inf
  double dl = v - vl, dh = vh - v;
  if ((lo & 0x7FFF) == 0x7F7F) {  // next is inf: round up only past FLT_MAX-ish edge (max + half ulp)
    double edge = double(bf16_bits_to_float(0x7F7F)) + std::ldexp(1.0, 127 - 8);
    return v >= edge ? uint16_t(lo + 1) : lo;
  }
  if (dl < dh) return lo;
  if (dh < dl) return uint16_t(lo + 1);
  return (lo & 1) ? uint16_t(lo + 1) : lo;
}

std::vector<double> random_doubles(size_t n, int min_exp, int max_exp, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> out;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng();
    int e = min_exp + int(r % uint64_t(max_exp - min_exp + 1));
    double m = 1.0 + double(rng() >> 11) * 0x1p-53;  // [1, 2)
    double x = std::ldexp(m, e);
    out.push_back((r >> 63) ? -x : x);
  }
  return out;
}

}  // namespace

TEST_SUITE("dtype") {

TEST_CASE("scalar names") {
  const char* expected[] = {"void",  "index",  "bool",      "weakint", "int8",    "uint8",   "int16",
                            "uint16", "int32", "uint32",    "int64",   "uint64",  "weakfloat", "fp8e4m3",
                            "fp8e5m2", "float16", "bfloat16", "float32", "float64"};
  for (int i = 0; i < kNumScalars; i++) CHECK(DType{Scalar(i)}.name() == expected[i]);
}

TEST_CASE("vector and pointer names") {
  CHECK(dtypes::float32.vec(4).name() == "float32x4");
  CHECK(dtypes::int8.vec(16).name() == "int8x16");
  CHECK(dtypes::float32.ptr_to().name() == "float32*");
  CHECK(dtypes::float32.ptr_to(16).name() == "float32*[16]");
  CHECK(dtypes::float32.ptr_to(-1, AddrSpace::Local).name() == "float32*[local]");
  CHECK(dtypes::float32.ptr_to(-1, AddrSpace::Reg).name() == "float32*[reg]");
  CHECK(dtypes::float16.vec(4).ptr_to(16, AddrSpace::Local).name() == "float16x4*[local,16]");
  CHECK(dtypes::int32.ptr_to(0).name() == "int32*[0]");
  CHECK(dtypes::float32.ptr_to(16).base().name() == "float32");
}

TEST_CASE("from_name accepts tinygrad and torch names, case-insensitive") {
  struct { const char* n; DType d; } cases[] = {
      {"bool", dtypes::bool_},       {"int8", dtypes::int8},         {"char", dtypes::int8},
      {"uint8", dtypes::uint8},      {"uchar", dtypes::uint8},       {"int16", dtypes::int16},
      {"short", dtypes::int16},      {"uint16", dtypes::uint16},     {"ushort", dtypes::uint16},
      {"int32", dtypes::int32},      {"int", dtypes::int32},         {"uint32", dtypes::uint32},
      {"uint", dtypes::uint32},      {"int64", dtypes::int64},       {"long", dtypes::int64},
      {"uint64", dtypes::uint64},    {"ulong", dtypes::uint64},      {"float16", dtypes::float16},
      {"half", dtypes::float16},     {"bfloat16", dtypes::bfloat16}, {"float32", dtypes::float32},
      {"float", dtypes::float32},    {"float64", dtypes::float64},   {"double", dtypes::float64},
      {"fp8e4m3", dtypes::fp8e4m3},  {"fp8e5m2", dtypes::fp8e5m2},   {"index", dtypes::index},
      {"FLOAT32", dtypes::float32},  {"Half", dtypes::float16},      {"BFloat16", dtypes::bfloat16},
      {"UInt8", dtypes::uint8},      {"FP8E4M3", dtypes::fp8e4m3},
  };
  for (auto& c : cases) {
    CAPTURE(c.n);
    CHECK(dtypes::from_name(c.n) == c.d);
  }
  // every canonical scalar name of a strong dtype parses back to itself
  for (DType d : kLattice)
    if (!dtypes::is_weak(d)) CHECK(dtypes::from_name(d.name()) == d);
}

TEST_CASE("from_name rejects unknown names with a helpful message") {
  for (const char* bad : {"float33", "", "f32", "float32 ", "int4", "weakint", "void", "float32x4", "float32*"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(dtypes::from_name(bad), tg::Error);
  }
  try {
    dtypes::from_name("float33");
    FAIL("expected a throw");
  } catch (const tg::Error& e) {
    std::string msg = e.what();
    CHECK(msg.rfind("[from_name]", 0) == 0);
    CHECK(msg.find("float33") != std::string::npos);
    CHECK(msg.find("float32") != std::string::npos);
    CHECK(msg.find("bfloat16") != std::string::npos);
  }
}

TEST_CASE("predicates and strong()") {
  CHECK(dtypes::is_int(dtypes::index));
  CHECK(dtypes::is_int(dtypes::weakint));
  CHECK_FALSE(dtypes::is_int(dtypes::bool_));
  CHECK(dtypes::is_float(dtypes::weakfloat));
  CHECK(dtypes::is_float(dtypes::fp8e5m2));
  CHECK_FALSE(dtypes::is_float(dtypes::float32.ptr_to()));
  CHECK(dtypes::strong(dtypes::weakint) == dtypes::int32);
  CHECK(dtypes::strong(dtypes::weakfloat.vec(4)) == dtypes::float32.vec(4));
  CHECK(dtypes::strong(dtypes::uint8) == dtypes::uint8);
}

TEST_CASE("promotion: representative pairs derived from the lattice") {
  using namespace dtypes;
  // ints: signed + unsigned of the same width go one signed width up
  CHECK(lub(int8, uint8) == int16);
  CHECK(lub(int16, uint16) == int32);
  CHECK(lub(int32, uint32) == int64);
  CHECK(lub(int64, uint64) == weakfloat);  // no common int: the first common parent is weakfloat
  CHECK(lub(int8, uint64) == weakfloat);
  CHECK(lub(int8, uint32) == int64);
  CHECK(lub(uint8, int8) == int16);
  CHECK(lub(uint8, uint16) == uint16);
  CHECK(lub(uint8, int32) == int32);
  CHECK(lub(uint16, int16) == int32);
  CHECK(lub(uint32, uint64) == uint64);
  CHECK(lub(uint32, int16) == int64);
  CHECK(lub(int8, int64) == int64);
  CHECK(lub(uint8, uint64) == uint64);
  // bool and weak types sit at the bottom
  CHECK(lub(bool_, bool_) == bool_);
  CHECK(lub(bool_, weakint) == weakint);
  CHECK(lub(bool_, int8) == int8);
  CHECK(lub(bool_, uint64) == uint64);
  CHECK(lub(bool_, weakfloat) == weakfloat);
  CHECK(lub(bool_, float16) == float16);
  CHECK(lub(weakint, int8) == int8);
  CHECK(lub(weakint, uint8) == uint8);
  CHECK(lub(weakint, uint32) == uint32);
  CHECK(lub(weakint, weakfloat) == weakfloat);
  CHECK(lub(weakint, bfloat16) == bfloat16);
  CHECK(lub(weakfloat, int64) == weakfloat);
  CHECK(lub(weakfloat, uint64) == weakfloat);
  CHECK(lub(weakfloat, fp8e4m3) == fp8e4m3);
  CHECK(lub(weakfloat, float64) == float64);
  // ints meet floats at the float
  CHECK(lub(int64, fp8e5m2) == fp8e5m2);
  CHECK(lub(uint64, float16) == float16);
  CHECK(lub(int32, bfloat16) == bfloat16);
  CHECK(lub(int8, float32) == float32);
  // floats
  CHECK(lub(fp8e4m3, fp8e5m2) == float16);
  CHECK(lub(fp8e4m3, bfloat16) == bfloat16);
  CHECK(lub(fp8e5m2, float16) == float16);
  CHECK(lub(float16, bfloat16) == float32);
  CHECK(lub(float16, float32) == float32);
  CHECK(lub(bfloat16, float64) == float64);
  CHECK(lub(float32, float64) == float64);
  CHECK(least_upper_dtype({int8, uint8, float16}) == float16);
  CHECK(least_upper_dtype({float16, bfloat16, int64}) == float32);
  CHECK(least_upper_dtype({uint16}) == uint16);
}

TEST_CASE("promotion: full table matches tinygrad") {
  // rows/columns in kLattice order; generated from tinygrad's least_upper_dtype
  const char* table[] = {
      "bool weakint int8 uint8 int16 uint16 int32 uint32 int64 uint64 weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "weakint weakint int8 uint8 int16 uint16 int32 uint32 int64 uint64 weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "int8 int8 int8 int16 int16 int32 int32 int64 int64 weakfloat weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "uint8 uint8 int16 uint8 int16 uint16 int32 uint32 int64 uint64 weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "int16 int16 int16 int16 int16 int32 int32 int64 int64 weakfloat weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "uint16 uint16 int32 uint16 int32 uint16 int32 uint32 int64 uint64 weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "int32 int32 int32 int32 int32 int32 int32 int64 int64 weakfloat weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "uint32 uint32 int64 uint32 int64 uint32 int64 uint32 int64 uint64 weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "int64 int64 int64 int64 int64 int64 int64 int64 int64 weakfloat weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "uint64 uint64 weakfloat uint64 weakfloat uint64 weakfloat uint64 weakfloat uint64 weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "weakfloat weakfloat weakfloat weakfloat weakfloat weakfloat weakfloat weakfloat weakfloat weakfloat weakfloat fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64",
      "fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 fp8e4m3 float16 float16 bfloat16 float32 float64",
      "fp8e5m2 fp8e5m2 fp8e5m2 fp8e5m2 fp8e5m2 fp8e5m2 fp8e5m2 fp8e5m2 fp8e5m2 fp8e5m2 fp8e5m2 float16 fp8e5m2 float16 bfloat16 float32 float64",
      "float16 float16 float16 float16 float16 float16 float16 float16 float16 float16 float16 float16 float16 float16 float32 float32 float64",
      "bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 bfloat16 float32 bfloat16 float32 float64",
      "float32 float32 float32 float32 float32 float32 float32 float32 float32 float32 float32 float32 float32 float32 float32 float32 float64",
      "float64 float64 float64 float64 float64 float64 float64 float64 float64 float64 float64 float64 float64 float64 float64 float64 float64",
  };
  REQUIRE(std::size(table) == kLattice.size());
  for (size_t i = 0; i < kLattice.size(); i++) {
    auto row = words(table[i]);
    REQUIRE(row.size() == kLattice.size());
    for (size_t j = 0; j < kLattice.size(); j++) {
      CAPTURE(kLattice[i].name());
      CAPTURE(kLattice[j].name());
      CHECK(lub(kLattice[i], kLattice[j]) == by_name(row[j]));
    }
  }
}

TEST_CASE("promotion: lattice properties") {
  // tinygrad's two exceptions to associativity
  CHECK(lub(lub(dtypes::fp8e4m3, dtypes::fp8e5m2), dtypes::bfloat16) == dtypes::float32);
  CHECK(least_upper_dtype({dtypes::fp8e4m3, dtypes::fp8e5m2, dtypes::bfloat16}) == dtypes::bfloat16);
  for (DType a : kLattice) {
    CHECK(lub(a, a) == a);                      // idempotent
    CHECK(lub(a, dtypes::float64) == dtypes::float64);  // float64 is the top
    CHECK(lub(a, dtypes::bool_) == a);          // bool is the bottom
    for (DType b : kLattice) {
      DType ab = lub(a, b);
      CHECK(ab == lub(b, a));  // commutative
      CHECK(lub(a, ab) == ab);  // an upper bound of both
      CHECK(lub(b, ab) == ab);
      for (DType c : kLattice) {
        DType abc = least_upper_dtype({a, b, c});
        CHECK(least_upper_dtype({c, b, a}) == abc);
        CHECK(lub(abc, a) == abc);
        // the fold is associative except where the two fp8 formats meet bfloat16: fp8e4m3 and fp8e5m2 have two
        // minimal upper bounds (float16, bfloat16) and tinygrad's min() picks float16 for the pair
        bool fp8_bf16 = a != b && b != c && a != c && lub(lub(a, b), c) != abc;
        if (fp8_bf16) {
          for (DType d : {a, b, c})
            CHECK((d == dtypes::fp8e4m3 || d == dtypes::fp8e5m2 || d == dtypes::bfloat16));
          CHECK(abc == dtypes::bfloat16);
        } else {
          CHECK(lub(ab, c) == abc);
        }
        DType bc = lub(b, c);
        if (!(bc == dtypes::float16 && a == dtypes::bfloat16 && b != c && b != dtypes::float16 && c != dtypes::float16))
          CHECK(lub(a, bc) == abc);
      }
    }
  }
}

TEST_CASE("promotion: index, void, vectors, pointers") {
  using namespace dtypes;
  CHECK(lub(dtypes::index, dtypes::index) == dtypes::index);
  CHECK(least_upper_dtype({dtypes::index}) == dtypes::index);
  CHECK(least_upper_dtype({dtypes::index.vec(4), dtypes::index.vec(4)}) == dtypes::index.vec(4));
  CHECK_THROWS_AS(lub(dtypes::index, int32), tg::Error);
  CHECK_THROWS_AS(lub(int64, dtypes::index), tg::Error);
  CHECK_THROWS_AS(least_upper_dtype({dtypes::index, dtypes::index, weakint}), tg::Error);
  CHECK_THROWS_AS(lub(void_, void_), tg::Error);
  CHECK_THROWS_AS(lub(float32, void_), tg::Error);
  CHECK_THROWS_AS(least_upper_dtype({}), tg::Error);
  // vectors promote lane-wise when the widths agree
  CHECK(lub(int8.vec(4), uint8.vec(4)) == int16.vec(4));
  CHECK(lub(float16.vec(2), bfloat16.vec(2)) == float32.vec(2));
  CHECK(least_upper_dtype({float32.vec(8)}) == float32.vec(8));
  CHECK_THROWS_AS(lub(float32.vec(4), float32), tg::Error);
  CHECK_THROWS_AS(lub(float32.vec(4), float32.vec(2)), tg::Error);
  // pointers never promote
  CHECK_THROWS_AS(lub(float32.ptr_to(), float32.ptr_to()), tg::Error);
  CHECK_THROWS_AS(lub(float32.ptr_to(), float32), tg::Error);
  try {
    lub(dtypes::index, float32);
    FAIL("expected a throw");
  } catch (const tg::Error& e) {
    std::string msg = e.what();
    CHECK(msg.rfind("[least_upper_dtype]", 0) == 0);
    CHECK(msg.find("index") != std::string::npos);
  }
}

TEST_CASE("least_upper_float") {
  const char* expected = "float32 weakfloat float32 float32 float32 float32 float32 float32 float32 float32 weakfloat "
                         "fp8e4m3 fp8e5m2 float16 bfloat16 float32 float64";
  auto exp = words(expected);
  for (size_t i = 0; i < kLattice.size(); i++) {
    CAPTURE(kLattice[i].name());
    CHECK(least_upper_float(kLattice[i]) == by_name(exp[i]));
  }
  CHECK(least_upper_float(dtypes::int32.vec(4)) == dtypes::float32.vec(4));
  CHECK(least_upper_float(dtypes::float16.vec(2)) == dtypes::float16.vec(2));
  CHECK(least_upper_float(dtypes::weakint.vec(3)) == dtypes::weakfloat.vec(3));
  CHECK_THROWS_AS(least_upper_float(dtypes::index), tg::Error);
}

TEST_CASE("sum_acc_dtype") {
  const char* expected = "int32 int32 int32 uint32 int32 uint32 int32 uint32 int64 uint64 float32 "
                         "float32 float32 float32 float32 float32 float64";
  auto exp = words(expected);
  for (size_t i = 0; i < kLattice.size(); i++) {
    CAPTURE(kLattice[i].name());
    CHECK(sum_acc_dtype(kLattice[i]) == by_name(exp[i]));
  }
  CHECK(sum_acc_dtype(dtypes::uint8.vec(4)) == dtypes::uint32.vec(4));
  CHECK(sum_acc_dtype(dtypes::float16.vec(2)) == dtypes::float32.vec(2));
}

TEST_CASE("can_lossless_cast matches tinygrad") {
  // row = from, column = to, in kLattice order; generated from tinygrad's can_lossless_cast
  const char* table[] = {
      "11111111111111111", "01000000000000000", "01101010100001011", "01011111110001011", "01001010100000011",
      "01000111110000011", "01000010100000001", "01000001110000001", "01000000100000000", "01000000010000000",
      "00000000001000000", "00000000000101011", "00000000000011011", "00000000000001011", "00000000000000111",
      "00000000000000011", "00000000000000001",
  };
  for (size_t i = 0; i < kLattice.size(); i++)
    for (size_t j = 0; j < kLattice.size(); j++) {
      CAPTURE(kLattice[i].name());
      CAPTURE(kLattice[j].name());
      CHECK(can_lossless_cast(kLattice[i], kLattice[j]) == (table[i][j] == '1'));
    }
  CHECK(can_lossless_cast(dtypes::index, dtypes::index));
  CHECK_FALSE(can_lossless_cast(dtypes::index, dtypes::int64));
  CHECK(can_lossless_cast(dtypes::int8.vec(4), dtypes::int16.vec(4)));
  CHECK_FALSE(can_lossless_cast(dtypes::int8.vec(4), dtypes::int16));
  CHECK_FALSE(can_lossless_cast(dtypes::int8.ptr_to(), dtypes::int16.ptr_to()));
  CHECK(can_lossless_cast(dtypes::int8.ptr_to(), dtypes::int8.ptr_to()));
}

TEST_CASE("integer ranges") {
  using namespace dtypes;
  CHECK(min_int(bool_) == 0);
  CHECK(max_int(bool_) == 1);
  CHECK(max_uint(bool_) == 1);
  CHECK(min_int(int8) == -128);
  CHECK(max_int(int8) == 127);
  CHECK(min_int(uint8) == 0);
  CHECK(max_int(uint8) == 255);
  CHECK(min_int(int16) == -32768);
  CHECK(max_int(int16) == 32767);
  CHECK(max_int(uint16) == 65535);
  CHECK(min_int(int32) == -2147483648LL);
  CHECK(max_int(int32) == 2147483647LL);
  CHECK(max_uint(uint32) == 4294967295ULL);
  CHECK(min_int(int64) == std::numeric_limits<int64_t>::min());
  CHECK(max_int(int64) == std::numeric_limits<int64_t>::max());
  CHECK(min_int(uint64) == 0);
  CHECK(max_uint(uint64) == std::numeric_limits<uint64_t>::max());
  CHECK(max_int(uint64) == std::numeric_limits<int64_t>::max());  // saturates
  for (DType d : {dtypes::index, weakint}) {
    CHECK(min_int(d) == std::numeric_limits<int64_t>::min());
    CHECK(max_int(d) == std::numeric_limits<int64_t>::max());
    CHECK(max_uint(d) == uint64_t(std::numeric_limits<int64_t>::max()));
  }
  CHECK(max_int(int16.vec(4)) == 32767);
  for (DType d : {float32, float16, weakfloat, void_, int32.ptr_to()}) {
    CAPTURE(d.name());
    CHECK_THROWS_AS(min_int(d), tg::Error);
    CHECK_THROWS_AS(max_int(d), tg::Error);
    CHECK_THROWS_AS(max_uint(d), tg::Error);
  }
}

TEST_CASE("half: all bit patterns round-trip") {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = half_bits_to_float(uint16_t(h));
    uint16_t back = float_to_half_bits(f);
    bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
    if (nan) {
      if (!std::isnan(f) || !((back & 0x7C00) == 0x7C00 && (back & 0x3FF)) || (back & 0x8000) != (h & 0x8000)) {
        CAPTURE(h);
        FAIL("NaN half did not stay NaN");
      }
    } else if (back != h) {
      CAPTURE(h);
      CHECK(back == h);
    }
  }
}

TEST_CASE("half: known values") {
  CHECK(half_bits_to_float(0x3C00) == 1.0f);
  CHECK(half_bits_to_float(0xC000) == -2.0f);
  CHECK(half_bits_to_float(0x7BFF) == 65504.0f);
  CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_bits_to_float(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(half_bits_to_float(0x0400) == std::ldexp(1.0f, -14));
  CHECK(half_bits_to_float(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(std::signbit(half_bits_to_float(0x8000)));
  CHECK(std::isnan(half_bits_to_float(0x7E00)));
  // round to nearest, ties to even
  CHECK(float_to_half_bits(2049.0f) == float_to_half_bits(2048.0f));
  CHECK(half_bits_to_float(float_to_half_bits(2049.0f)) == 2048.0f);
  CHECK(half_bits_to_float(float_to_half_bits(2051.0f)) == 2052.0f);
  CHECK(half_bits_to_float(float_to_half_bits(2050.0f)) == 2050.0f);
  CHECK(half_bits_to_float(float_to_half_bits(std::nextafter(2049.0f, 3000.0f))) == 2050.0f);
  CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);  // tie -> even
  CHECK(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  // overflow
  CHECK(float_to_half_bits(65504.0f) == 0x7BFF);
  CHECK(float_to_half_bits(65519.996f) == 0x7BFF);
  CHECK(float_to_half_bits(65520.0f) == 0x7C00);
  CHECK(float_to_half_bits(-1e10f) == 0xFC00);
  CHECK(float_to_half_bits(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(float_to_half_bits(-std::numeric_limits<float>::infinity()) == 0xFC00);
  // subnormals and underflow
  CHECK(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie -> even (0)
  CHECK(float_to_half_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(float_to_half_bits(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp -> 2
  CHECK(float_to_half_bits(std::ldexp(5.0f, -25)) == 0x0002);  // 2.5 ulp -> 2
  CHECK(float_to_half_bits(std::ldexp(2047.0f, -25)) == 0x0400);  // rounds up into the normal range
  CHECK(float_to_half_bits(-std::ldexp(1.0f, -30)) == 0x8000);
  CHECK(float_to_half_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(float_to_half_bits(-0.0f) == 0x8000);
  // NaN stays NaN, sign kept
  uint16_t n = float_to_half_bits(std::numeric_limits<float>::quiet_NaN());
  CHECK((n & 0x7C00) == 0x7C00);
  CHECK((n & 0x3FF) != 0);
  uint16_t sn = float_to_half_bits(std::bit_cast<float>(0xFF800001u));  // signaling NaN, payload in low bits only
  CHECK((sn & 0x7FFF) > 0x7C00);
  CHECK((sn & 0x8000) != 0);
}

TEST_CASE("half: float -> half matches an independent RNE reference") {
  std::vector<float> xs;
  for (uint32_t h = 0; h < 0x7C00; h++) {  // every finite half, the midpoints to the next, and their neighbours
    float a = half_bits_to_float(uint16_t(h)), b = half_bits_to_float(uint16_t(h + 1));
    float mid = float((double(a) + double(b)) / 2);  // exact in float
    for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (double d : random_doubles(200000, -30, 17, 1)) xs.push_back(float(d));
  for (float x : xs) {
    uint16_t got = float_to_half_bits(x), want = ref_half(double(x));
    if (got != want) {
      CAPTURE(x);
      CHECK(got == want);
    }
  }
}

#ifdef __FLT16_MAX__
TEST_CASE("half: float -> half and double -> half match the compiler's _Float16") {
  auto check = [](float x) {
    uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(x));
    uint16_t got = float_to_half_bits(x);
    if (std::isnan(x) ? !((got & 0x7FFF) > 0x7C00) : got != want) {
      CAPTURE(x);
      CHECK(got == want);
    }
  };
  for (uint32_t h = 0; h < 0x10000; h++) {
    float a = half_bits_to_float(uint16_t(h));
    check(a);
    check(std::nextafter(a, 0.0f));
    check(std::nextafter(a, std::copysign(1e30f, a)));
    if ((h & 0x7FFF) < 0x7C00) {
      float b = half_bits_to_float(uint16_t(h + 1));
      check(float((double(a) + double(b)) / 2));
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; i++) check(std::bit_cast<float>(uint32_t(rng())));
  // double -> half rounds once (no double rounding through float)
  for (double d : random_doubles(200000, -26, 16, 3)) {
    uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(d));
    uint16_t got = float_to_half_bits(half_bits_to_float(want));
    double t = truncate_float(d, dtypes::float16);
    if (t != double(half_bits_to_float(got))) {
      CAPTURE(d);
      CHECK(t == double(half_bits_to_float(got)));
    }
  }
}
#endif

TEST_CASE("half: double rounding is avoided in truncate_float") {
  // 1 + 2^-11 + 2^-40 rounds up in half, but via float (-> 1 + 2^-11 exactly, a tie) it would round down
  double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(float(x) == 1.0f + std::ldexp(1.0f, -11));
  CHECK(truncate_float(x, dtypes::float16) == 1.0 + std::ldexp(1.0, -10));
  CHECK(truncate_float(65519.99999, dtypes::float16) == 65504.0);
  CHECK(truncate_float(65520.0, dtypes::float16) == kInf);
  CHECK(truncate_float(-1e300, dtypes::float16) == -kInf);
  CHECK(truncate_float(std::ldexp(1.0, -25), dtypes::float16) == 0.0);
  CHECK(truncate_float(std::ldexp(1.0, -25) * (1 + 1e-15), dtypes::float16) == std::ldexp(1.0, -24));
  CHECK(std::isnan(truncate_float(kNaN, dtypes::float16)));
  for (double d : random_doubles(100000, -30, 17, 5)) {
    double want = double(half_bits_to_float(ref_half(d)));
    if (truncate_float(d, dtypes::float16) != want) {
      CAPTURE(d);
      CHECK(truncate_float(d, dtypes::float16) == want);
    }
  }
}

TEST_CASE("bf16: known values, ties and NaN") {
  CHECK(float_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(float_to_bf16_bits(-2.0f) == 0xC000);
  CHECK(bf16_bits_to_float(0x3F80) == 1.0f);
  CHECK(bf16_bits_to_float(0x4049) == 3.140625f);
  CHECK(float_to_bf16_bits(3.14159265f) == 0x4049);
  // ties to even: ulp at 1 is 2^-7
  CHECK(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  CHECK(float_to_bf16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)) == 0x3F81);
  CHECK(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(float_to_bf16_bits(std::bit_cast<float>(0x3F818000u)) == 0x3F82);  // tie with odd low -> up
  CHECK(float_to_bf16_bits(std::bit_cast<float>(0x3F828000u)) == 0x3F82);  // tie with even low -> down
  // overflow rounds to inf; inf stays inf
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(float_to_bf16_bits(std::bit_cast<float>(0x7F7F7FFFu)) == 0x7F7F);
  CHECK(float_to_bf16_bits(std::bit_cast<float>(0x7F7F8000u)) == 0x7F80);
  CHECK(float_to_bf16_bits(-std::numeric_limits<float>::infinity()) == 0xFF80);
  // NaN stays NaN (quiet), even when the payload lives only in the low 16 bits
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7F810000u}) {
    CAPTURE(nan);
    uint16_t b = float_to_bf16_bits(std::bit_cast<float>(nan));
    CHECK((b & 0x7FFF) > 0x7F80);
    CHECK((b & 0x40) != 0);
    CHECK((b & 0x8000) == ((nan >> 16) & 0x8000));
    CHECK(std::isnan(bf16_bits_to_float(b)));
  }
  // subnormals round like any other value
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(float_to_bf16_bits(std::bit_cast<float>(0x00008000u)) == 0x0000);
  CHECK(float_to_bf16_bits(std::bit_cast<float>(0x00018000u)) == 0x0002);
  CHECK(float_to_bf16_bits(-0.0f) == 0x8000);
}

TEST_CASE("bf16: all bit patterns round-trip, random floats match the reference") {
  for (uint32_t b = 0; b < 0x10000; b++) {
    float f = bf16_bits_to_float(uint16_t(b));
    uint16_t back = float_to_bf16_bits(f);
    bool nan = (b & 0x7F80) == 0x7F80 && (b & 0x7F);
    if (nan ? !((back & 0x7FFF) > 0x7F80) : back != b) {
      CAPTURE(b);
      CHECK(back == b);
    }
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; i++) {
    float x = std::bit_cast<float>(uint32_t(rng()));
    if (!std::isfinite(x)) continue;
    if (float_to_bf16_bits(x) != ref_bf16(x)) {
      CAPTURE(x);
      CHECK(float_to_bf16_bits(x) == ref_bf16(x));
    }
  }
}

TEST_CASE("fp8: decode known values") {
  const Scalar e4 = Scalar::Fp8E4M3, e5 = Scalar::Fp8E5M2;
  CHECK(fp8_bits_to_double(0x38, e4) == 1.0);
  CHECK(fp8_bits_to_double(0x7E, e4) == 448.0);
  CHECK(fp8_bits_to_double(0xFE, e4) == -448.0);
  CHECK(fp8_bits_to_double(0x01, e4) == std::ldexp(1.0, -9));
  CHECK(fp8_bits_to_double(0x07, e4) == 7 * std::ldexp(1.0, -9));
  CHECK(fp8_bits_to_double(0x08, e4) == std::ldexp(1.0, -6));
  CHECK(fp8_bits_to_double(0x78, e4) == 256.0);  // exponent 15 is finite in e4m3fn
  CHECK(std::isnan(fp8_bits_to_double(0x7F, e4)));
  CHECK(std::isnan(fp8_bits_to_double(0xFF, e4)));
  CHECK(std::signbit(fp8_bits_to_double(0x80, e4)));
  CHECK(fp8_bits_to_double(0x3C, e5) == 1.0);
  CHECK(fp8_bits_to_double(0x7B, e5) == 57344.0);
  CHECK(fp8_bits_to_double(0x01, e5) == std::ldexp(1.0, -16));
  CHECK(fp8_bits_to_double(0x04, e5) == std::ldexp(1.0, -14));
  CHECK(fp8_bits_to_double(0x7C, e5) == kInf);
  CHECK(fp8_bits_to_double(0xFC, e5) == -kInf);
  for (uint8_t b : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) CHECK(std::isnan(fp8_bits_to_double(b, e5)));
  CHECK(std::signbit(fp8_bits_to_double(0x80, e5)));
  CHECK_THROWS_AS(fp8_bits_to_double(0, Scalar::Float16), tg::Error);
  CHECK_THROWS_AS(double_to_fp8_bits(1.0, Scalar::Float32), tg::Error);
}

TEST_CASE("fp8: all bit patterns round-trip") {
  for (Scalar fmt : {Scalar::Fp8E4M3, Scalar::Fp8E5M2}) {
    double prev = 0;
    for (uint32_t b = 0; b < 256; b++) {
      CAPTURE(b);
      double v = fp8_bits_to_double(uint8_t(b), fmt);
      uint8_t back = double_to_fp8_bits(v, fmt);
      if (is_fp8_nan(uint8_t(b), fmt)) {
        CHECK(std::isnan(v));
        CHECK(is_fp8_nan(back, fmt));
      } else {
        CHECK(back == b);
      }
      if (b > 0 && b < 0x80 && !std::isnan(v)) {  // positive values increase with the bits
        CHECK(v > prev);
        prev = v;
      }
    }
  }
}

TEST_CASE("fp8: encode known values") {
  const Scalar e4 = Scalar::Fp8E4M3, e5 = Scalar::Fp8E5M2;
  CHECK(double_to_fp8_bits(448.0, e4) == 0x7E);
  CHECK(double_to_fp8_bits(-448.0, e4) == 0xFE);
  CHECK(double_to_fp8_bits(463.99, e4) == 0x7E);
  CHECK(double_to_fp8_bits(464.0, e4) == 0x7E);  // tie with the missing 480: stays at max
  CHECK(double_to_fp8_bits(1e300, e4) == 0x7E);  // finite overflow saturates
  CHECK(double_to_fp8_bits(kInf, e4) == 0x7F);  // inf -> NaN (as tinygrad/jax)
  CHECK(double_to_fp8_bits(-kInf, e4) == 0xFF);
  CHECK(double_to_fp8_bits(kNaN, e4) == 0x7F);
  CHECK(double_to_fp8_bits(-kNaN, e4) == 0xFF);
  CHECK(double_to_fp8_bits(std::ldexp(1.0, -9), e4) == 0x01);
  CHECK(double_to_fp8_bits(std::ldexp(1.0, -10), e4) == 0x00);  // tie -> even
  CHECK(double_to_fp8_bits(std::nextafter(std::ldexp(1.0, -10), 1.0), e4) == 0x01);
  CHECK(double_to_fp8_bits(3 * std::ldexp(1.0, -10), e4) == 0x02);  // 1.5 ulp -> 2
  CHECK(double_to_fp8_bits(5 * std::ldexp(1.0, -10), e4) == 0x02);  // 2.5 ulp -> 2
  CHECK(double_to_fp8_bits(1.0625, e4) == 0x38);  // tie between 1 and 1.125 -> even
  CHECK(double_to_fp8_bits(1.1875, e4) == 0x3A);  // tie between 1.125 and 1.25 -> even
  CHECK(double_to_fp8_bits(-1e-30, e4) == 0x80);
  CHECK(double_to_fp8_bits(57344.0, e5) == 0x7B);
  CHECK(double_to_fp8_bits(61439.99, e5) == 0x7B);
  CHECK(double_to_fp8_bits(61440.0, e5) == 0x7B);  // finite overflow saturates (tinygrad)
  CHECK(double_to_fp8_bits(-1e300, e5) == 0xFB);
  CHECK(double_to_fp8_bits(kInf, e5) == 0x7C);
  CHECK(double_to_fp8_bits(-kInf, e5) == 0xFC);
  CHECK(double_to_fp8_bits(kNaN, e5) == 0x7F);
  CHECK(double_to_fp8_bits(-kNaN, e5) == 0xFF);
  CHECK(double_to_fp8_bits(std::ldexp(1.0, -16), e5) == 0x01);
  CHECK(double_to_fp8_bits(std::ldexp(1.0, -17), e5) == 0x00);  // tie -> even
  CHECK(double_to_fp8_bits(3 * std::ldexp(1.0, -17), e5) == 0x02);
  CHECK(double_to_fp8_bits(std::ldexp(1.0, -14), e5) == 0x04);
  CHECK(double_to_fp8_bits(1.125, e5) == 0x3C);  // tie between 1 and 1.25 -> even
  CHECK(double_to_fp8_bits(1.375, e5) == 0x3E);  // tie between 1.25 and 1.5 -> even
}

TEST_CASE("fp8 / half / bf16 agree with tinygrad on sample values") {
  // {x, float_to_fp8(e4m3), float_to_fp8(e5m2), fp16 bits, bf16 bits}, generated with tinygrad's dtype.py
  struct Row { double x; uint8_t e4, e5; uint16_t h, bf; };
  const Row rows[] = {
      {0.0, 0x00, 0x00, 0x0000, 0x0000},           {-0.0, 0x80, 0x80, 0x8000, 0x8000},
      {1.0, 0x38, 0x3c, 0x3c00, 0x3f80},           {-1.0, 0xb8, 0xbc, 0xbc00, 0xbf80},
      {0.1, 0x1d, 0x2e, 0x2e66, 0x3dcd},           {-0.3, 0xaa, 0xb5, 0xb4cd, 0xbe9a},
      {1.0625, 0x38, 0x3c, 0x3c40, 0x3f88},        {1.1875, 0x3a, 0x3d, 0x3cc0, 0x3f98},
      {3.14159, 0x45, 0x42, 0x4248, 0x4049},       {240.0, 0x77, 0x5c, 0x5b80, 0x4370},
      {448.0, 0x7e, 0x5f, 0x5f00, 0x43e0},         {449.0, 0x7e, 0x5f, 0x5f04, 0x43e0},
      {464.0, 0x7e, 0x5f, 0x5f40, 0x43e8},         {464.0000001, 0x7e, 0x5f, 0x5f40, 0x43e8},
      {480.0, 0x7e, 0x60, 0x5f80, 0x43f0},         {1000000.0, 0x7e, 0x7b, 0x7c00, 0x4974},
      {-1000000.0, 0xfe, 0xfb, 0xfc00, 0xc974},    {0.015625, 0x08, 0x24, 0x2400, 0x3c80},
      {0.0078125, 0x04, 0x20, 0x2000, 0x3c00},     {0.001953125, 0x01, 0x18, 0x1800, 0x3b00},
      {0.0009765625, 0x00, 0x14, 0x1400, 0x3a80},  {0.00097656259765625, 0x01, 0x14, 0x1400, 0x3a80},
      {0.0029296875, 0x02, 0x1a, 0x1a00, 0x3b40},  {0.0048828125, 0x02, 0x1d, 0x1d00, 0x3ba0},
      {6.103515625e-05, 0x00, 0x04, 0x0400, 0x3880}, {1.52587890625e-05, 0x00, 0x01, 0x0100, 0x3780},
      {7.62939453125e-06, 0x00, 0x00, 0x0080, 0x3700}, {7.62940216064453e-06, 0x00, 0x01, 0x0080, 0x3700},
      {2.288818359375e-05, 0x00, 0x02, 0x0180, 0x37c0}, {57344.0, 0x7e, 0x7b, 0x7b00, 0x4760},
      {60000.0, 0x7e, 0x7b, 0x7b53, 0x476a},       {61439.99, 0x7e, 0x7b, 0x7b80, 0x4770},
      {61440.0, 0x7e, 0x7b, 0x7b80, 0x4770},       {65504.0, 0x7e, 0x7b, 0x7bff, 0x4780},
      {65520.0, 0x7e, 0x7b, 0x7c00, 0x4780},       {1e-30, 0x00, 0x00, 0x0000, 0x0da2},
      {-0.005, 0x83, 0x9d, 0x9d1f, 0xbba4},        {17.0, 0x58, 0x4c, 0x4c40, 0x4188},
      {18.0, 0x59, 0x4c, 0x4c80, 0x4190},          {19.0, 0x5a, 0x4d, 0x4cc0, 0x4198},
      {1e+300, 0x7e, 0x7b, 0x7c00, 0x7f80},        {-1e+300, 0xfe, 0xfb, 0xfc00, 0xff80},
  };
  for (const Row& r : rows) {
    CAPTURE(r.x);
    CHECK(int(double_to_fp8_bits(r.x, Scalar::Fp8E4M3)) == int(r.e4));
    CHECK(int(double_to_fp8_bits(r.x, Scalar::Fp8E5M2)) == int(r.e5));
    CHECK(truncate_float(r.x, dtypes::fp8e4m3) == fp8_bits_to_double(r.e4, Scalar::Fp8E4M3));
    CHECK(truncate_float(r.x, dtypes::fp8e5m2) == fp8_bits_to_double(r.e5, Scalar::Fp8E5M2));
    CHECK(truncate_float(r.x, dtypes::float16) == double(half_bits_to_float(r.h)));
    CHECK(truncate_float(r.x, dtypes::bfloat16) == double(bf16_bits_to_float(r.bf)));
  }
}

TEST_CASE("fp8: encode matches an independent RNE reference") {
  for (Scalar fmt : {Scalar::Fp8E4M3, Scalar::Fp8E5M2}) {
    std::vector<double> xs;
    uint32_t max_bits = fmt == Scalar::Fp8E4M3 ? 0x7E : 0x7B;
    for (uint32_t b = 0; b <= max_bits; b++) {
      double a = fp8_bits_to_double(uint8_t(b), fmt);
      double n = b < max_bits ? fp8_bits_to_double(uint8_t(b + 1), fmt) : (fmt == Scalar::Fp8E4M3 ? 480.0 : 65536.0);
      double mid = (a + n) / 2;
      for (double x : {a, mid, std::nextafter(mid, 0.0), std::nextafter(mid, kInf), std::nextafter(a, 0.0)}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
    for (double d : random_doubles(100000, fmt == Scalar::Fp8E4M3 ? -12 : -19, 17, 9)) xs.push_back(d);
    for (double x : xs) {
      uint8_t got = double_to_fp8_bits(x, fmt), want = ref_fp8(x, fmt);
      if (got != want) {
        CAPTURE(x);
        CAPTURE(int(fmt));
        CHECK(int(got) == int(want));
      }
    }
  }
}

TEST_CASE("truncate_float: floats") {
  CHECK(truncate_float(0.1, dtypes::float64) == 0.1);
  CHECK(truncate_float(0.1, dtypes::weakfloat) == 0.1);
  CHECK(truncate_float(0.1, dtypes::float32) == double(0.1f));
  CHECK(truncate_float(1.0 + std::ldexp(1.0, -24), dtypes::float32) == 1.0);  // tie -> even
  CHECK(truncate_float(1.0 + 3 * std::ldexp(1.0, -24), dtypes::float32) == 1.0 + std::ldexp(1.0, -22));
  double flt_max = double(std::numeric_limits<float>::max());
  CHECK(truncate_float(flt_max, dtypes::float32) == flt_max);
  CHECK(truncate_float(std::nextafter(flt_max + std::ldexp(1.0, 103), 0.0), dtypes::float32) == flt_max);
  CHECK(truncate_float(flt_max + std::ldexp(1.0, 103), dtypes::float32) == kInf);  // tie with 2^128 -> inf
  CHECK(truncate_float(-1e300, dtypes::float32) == -kInf);
  CHECK(truncate_float(1e-300, dtypes::float32) == 0.0);
  CHECK(std::signbit(truncate_float(-1e-300, dtypes::float32)));
  CHECK(std::isnan(truncate_float(kNaN, dtypes::float32)));
  CHECK(truncate_float(kInf, dtypes::float64) == kInf);
  // bfloat16 goes through float32 first, as tinygrad does
  CHECK(truncate_float(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), dtypes::bfloat16) == 1.0);
  CHECK(truncate_float(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -20), dtypes::bfloat16) == 1.0 + std::ldexp(1.0, -7));
  CHECK(truncate_float(1e300, dtypes::bfloat16) == kInf);
  CHECK(std::isnan(truncate_float(kNaN, dtypes::bfloat16)));
  CHECK(std::isnan(truncate_float(kInf, dtypes::fp8e4m3)));
  CHECK(truncate_float(kInf, dtypes::fp8e5m2) == kInf);
  CHECK(truncate_float(1000.0, dtypes::fp8e4m3) == 448.0);
  CHECK(truncate_float(0.3, dtypes::float16.vec(4)) == truncate_float(0.3, dtypes::float16));
}

TEST_CASE("truncate_float: ints wrap, bool tests non-zero") {
  using namespace dtypes;
  CHECK(truncate_float(1.9, int32) == 1.0);
  CHECK(truncate_float(-1.9, int32) == -1.0);
  CHECK(truncate_float(127.0, int8) == 127.0);
  CHECK(truncate_float(128.0, int8) == -128.0);
  CHECK(truncate_float(300.0, int8) == 44.0);
  CHECK(truncate_float(-129.5, int8) == 127.0);
  CHECK(truncate_float(256.0, uint8) == 0.0);
  CHECK(truncate_float(-1.0, uint8) == 255.0);
  CHECK(truncate_float(-0.5, uint8) == 0.0);
  CHECK(truncate_float(70000.0, int16) == 4464.0);
  CHECK(truncate_float(-1.0, uint16) == 65535.0);
  CHECK(truncate_float(2147483648.0, int32) == -2147483648.0);
  CHECK(truncate_float(4294967296.0 + 5, uint32) == 5.0);
  CHECK(truncate_float(-1.0, uint32) == 4294967295.0);
  CHECK(truncate_float(std::ldexp(1.0, 63), int64) == -std::ldexp(1.0, 63));
  CHECK(truncate_float(std::ldexp(1.0, 64), int64) == 0.0);
  CHECK(truncate_float(std::ldexp(1.0, 64) + std::ldexp(1.0, 12), int64) == 4096.0);  // exact wrap of large values
  CHECK(truncate_float(std::ldexp(3.0, 62), uint64) == std::ldexp(3.0, 62));
  CHECK(truncate_float(-std::ldexp(1.0, 63), uint64) == std::ldexp(1.0, 63));
  CHECK(truncate_float(std::ldexp(1.0, 40) + 7, int32) == 7.0);
  CHECK(truncate_float(-(std::ldexp(1.0, 40) + 7), int32) == -7.0);
  CHECK(truncate_float(1e300, int32) == 0.0);
  CHECK(truncate_float(123.7, dtypes::index) == 123.0);
  CHECK(truncate_float(-5.5, weakint) == -5.0);
  for (DType d : {int8, uint8, int32, uint64, int64}) {
    CHECK(truncate_float(kNaN, d) == 0.0);
    CHECK(truncate_float(kInf, d) == 0.0);
    CHECK(truncate_float(-kInf, d) == 0.0);
  }
  CHECK(truncate_float(0.0, bool_) == 0.0);
  CHECK(truncate_float(-0.0, bool_) == 0.0);
  CHECK(truncate_float(0.25, bool_) == 1.0);
  CHECK(truncate_float(-3.0, bool_) == 1.0);
  CHECK(truncate_float(kNaN, bool_) == 1.0);
  CHECK_THROWS_AS(truncate_float(1.0, void_), tg::Error);
  CHECK_THROWS_AS(truncate_float(1.0, float32.ptr_to()), tg::Error);
}

}  // TEST_SUITE
