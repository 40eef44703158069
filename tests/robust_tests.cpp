// Hostile sizes and values (issue 24): byte counts that overflow or exceed the machine, integer division by zero,
// NaN in orderings, malformed environment values. Each case names the class it covers.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "scoped_env.hpp"
#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {
// The message of the tg::Error `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

// ---------------------------------------------------------------- sizes whose bytes overflow

TEST_CASE("a realized buffer whose bytes overflow 64 bits is an error naming the op and shape") {
  const int64_t n = int64_t(1) << 62;  // 2^62 float32: 2^64 bytes, wrapped to 0 before
  std::string e = error_of([&] { Tensor::ones({n}).contiguous().realize(); });
  CHECK(contains(e, "[realize]"));
  CHECK(contains(e, std::to_string(n)));
  CHECK(contains(e, "2^64 bytes"));
  CHECK(contains(error_of([&] { Tensor::zeros({n}).contiguous().realize(); }), "[realize]"));
  CHECK(contains(error_of([&] { Tensor(Tensor::ones({n}) * 2.0).realize(); }), "[realize]"));
  e = error_of([&] { Tensor(Tensor::empty({n}) * 0.0).realize(); });
  CHECK(contains(e, "[empty]"));
  CHECK(contains(e, "(4611686018427387904,)"));
}

TEST_CASE("a view of an overflowing empty tensor is refused, not read as garbage") {
  const int64_t n = int64_t(1) << 62;
  CHECK(contains(error_of([&] { Tensor::empty({n}).shrink({{0, 4}}).to_vector<float>(); }), "[empty]"));
  CHECK(contains(error_of([&] { Tensor::empty({n, 4}, dtypes::int64); }), "2^64 bytes"));
}

TEST_CASE("a buffer larger than the machine's memory is an error naming its bytes") {
  // 2^40 float32 = 4 TiB: more than this machine holds (the CPU's capacity is its physical memory)
  const int64_t n = int64_t(1) << 40;
  size_t cap = get_device(default_device()).allocator().capacity();
  if (cap >= (size_t(4) << 40)) return;  // a device that holds it (or reports out of memory itself)
  std::string e = error_of([&] { Tensor::empty({n}); });
  CHECK(contains(e, "[empty]"));
  CHECK(contains(e, std::to_string(size_t(4) << 40) + " bytes"));
  CHECK(contains(error_of([&] { Tensor::ones({n}).contiguous().realize(); }), "[realize]"));
  CHECK(contains(error_of([&] { Tensor::arange(0, double(n), 1, dtypes::float32); }), "[arange]"));
}

TEST_CASE("arange and rand of 2^62 elements are errors before any host memory is touched") {
  const double n = std::ldexp(1.0, 62);
  CHECK(contains(error_of([&] { Tensor::arange(0, n, 1, dtypes::int32); }), "[arange]"));
  CHECK(contains(error_of([&] { Tensor::arange(0, n, 1, dtypes::int64); }), "2^64 bytes"));
  CHECK(contains(error_of([&] { Tensor::arange(0, std::numeric_limits<double>::infinity()); }), "[arange]"));
  CHECK(contains(error_of([&] { Tensor::arange(0, std::nan("")); }), "[arange]"));
  CHECK(contains(error_of([&] { Tensor::rand({int64_t(1) << 62}); }), "[rand]"));
  CHECK(contains(error_of([&] { Tensor::randn({int64_t(1) << 62}); }), "[randn]"));
}

TEST_CASE("arange fills a buffer larger than its host staging chunk exactly") {
  const int64_t n = (int64_t(1) << 18) + 3;  // 1 MiB of int64 is 2^17 values: three chunks
  auto v = Tensor::arange(0, double(n), 1, dtypes::int64).to_vector<int64_t>();
  REQUIRE(v.size() == size_t(n));
  bool exact = true;
  for (int64_t i = 0; i < n; i++) exact &= v[size_t(i)] == i;
  CHECK(exact);
}

TEST_CASE("padding whose size overflows 64 bits is an error") {
  Tensor t = Tensor::ones({2});
  CHECK(contains(error_of([&] { t.pad({{0, std::numeric_limits<int64_t>::max()}}); }), "[pad]"));
}
