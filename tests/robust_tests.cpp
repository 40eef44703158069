// Hostile sizes and values (issue 24): byte counts that overflow or exceed the machine, integer division by zero,
// NaN in orderings, malformed environment values. Each case names the class it covers.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "scoped_env.hpp"
#include "test_util.hpp"
#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {
using test::error_of;
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
  CHECK(contains(error_of([&] { Tensor::arange(0, -std::numeric_limits<double>::infinity()); }), "[arange]"));
  CHECK(Tensor::arange(0, -1e300).numel() == 0);  // a count far below 0 (was an out-of-range conversion)
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

// ---------------------------------------------------------------- integer division by zero

TEST_CASE("integer // and % by zero give 0 on every path, and INT_MIN // -1 wraps") {
  auto a = Tensor::from_vector(std::vector<int32_t>{7, -7, 0, 5, INT32_MIN, 9}, {6});
  auto b = Tensor::from_vector(std::vector<int32_t>{0, 0, 0, 2, -1, -1}, {6});
  CHECK(a.idiv(b).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 2, INT32_MIN, -9});
  CHECK(a.mod(b).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 1, 0, 0});
  CHECK(Tensor(a % b).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 1, 0, 0});
  CHECK(a.alu(Ops::IDIV, b).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 2, INT32_MIN, -9});
  CHECK(a.alu(Ops::MOD, b).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0, 1, 0, 0});
  // a constant divisor 0 (the kernel used to divide by a literal 0) and -1
  CHECK(a.idiv(Tensor(0)).to_vector<int32_t>() == std::vector<int32_t>(6, 0));
  CHECK(a.mod(Tensor(0)).to_vector<int32_t>() == std::vector<int32_t>(6, 0));
  CHECK(a.idiv(Tensor(-1)).to_vector<int32_t>() == std::vector<int32_t>{-7, 7, 0, -5, INT32_MIN, -9});
  CHECK(a.mod(Tensor(-1)).to_vector<int32_t>() == std::vector<int32_t>(6, 0));
  // other int dtypes: int64, int8 (INT8_MIN / -1), unsigned
  auto l = Tensor::from_vector(std::vector<int64_t>{INT64_MIN, 3, -3}, {3});
  auto ld = Tensor::from_vector(std::vector<int64_t>{-1, 0, 2}, {3});
  CHECK(l.idiv(ld).to_vector<int64_t>() == std::vector<int64_t>{INT64_MIN, 0, -2});
  CHECK(l.mod(ld).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1});
  auto c = Tensor::from_vector(std::vector<int8_t>{-128, 100}, {2});
  auto cd = Tensor::from_vector(std::vector<int8_t>{-1, 0}, {2});
  CHECK(c.idiv(cd).to_vector<int8_t>() == std::vector<int8_t>{-128, 0});
  auto u = Tensor::from_vector(std::vector<uint32_t>{7, 4000000000u}, {2});
  auto ud = Tensor::from_vector(std::vector<uint32_t>{0, 3}, {2});
  CHECK(u.idiv(ud).to_vector<uint32_t>() == std::vector<uint32_t>{0, 1333333333u});
  CHECK(u.mod(ud).to_vector<uint32_t>() == std::vector<uint32_t>{0, 1});
}

TEST_CASE("a division by a nonzero constant stays one IDIV (no guard)") {
  auto a = Tensor::from_vector(std::vector<int32_t>{7, -7}, {2});
  Tensor q = a.alu(Ops::IDIV, Tensor(2));
  CHECK(q.uop()->op == Ops::IDIV);
  CHECK(q.to_vector<int32_t>() == std::vector<int32_t>{3, -3});
}

// ---------------------------------------------------------------- NaN in orderings (torch's: NaN is the largest)

namespace {
const float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
// Equal, NaN matching NaN.
bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}
}  // namespace

TEST_CASE("argmax and argmin of a row with NaN give the first NaN's index") {
  auto x = Tensor::from_vector(std::vector<float>{1, kNan, 3, kNan}, {4});
  CHECK(x.argmax().item<int64_t>() == 1);
  CHECK(x.argmin().item<int64_t>() == 1);
  auto m = Tensor::from_vector(std::vector<float>{1, 5, 3, 2, 7, kNan, kNan, 0, 4}, {3, 3});
  CHECK(m.argmax(1).to_vector<int64_t>() == std::vector<int64_t>{1, 2, 0});
  CHECK(m.argmin(1).to_vector<int64_t>() == std::vector<int64_t>{0, 2, 0});
  CHECK(m.argmax(0).to_vector<int64_t>() == std::vector<int64_t>{2, 1, 1});
  CHECK(m.argmax().item<int64_t>() == 5);
  // rows without NaN are unchanged: the first maximum
  CHECK(Tensor::from_vector(std::vector<float>{2, -kInf, 2}, {3}).argmax().item<int64_t>() == 0);
}

TEST_CASE("max and min propagate NaN, as torch") {
  auto m = Tensor::from_vector(std::vector<float>{1, kNan, 3, 2, 0, -1}, {2, 3});
  CHECK(same_floats(m.max(1).to_vector<float>(), {kNan, 2}));
  CHECK(same_floats(m.min(1).to_vector<float>(), {kNan, -1}));
  auto a = Tensor::from_vector(std::vector<float>{kNan, 1, 2}, {3}), b = Tensor::from_vector(std::vector<float>{0, kNan, 3}, {3});
  CHECK(same_floats(a.maximum(b).to_vector<float>(), {kNan, kNan, 3}));
  CHECK(same_floats(a.minimum(b).to_vector<float>(), {kNan, kNan, 2}));
}

TEST_CASE("sort and topk keep every value with NaN and infinities, NaN last ascending and first descending") {
  auto x = Tensor::from_vector(std::vector<float>{1, kNan, -kInf, 3, kNan, kInf, -2}, {7});
  auto [v, i] = x.sort();
  CHECK(same_floats(v.to_vector<float>(), {-kInf, -2, 1, 3, kInf, kNan, kNan}));
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{2, 6, 0, 3, 5, 1, 4});
  auto [vd, id] = x.sort(0, true);
  CHECK(same_floats(vd.to_vector<float>(), {kNan, kNan, kInf, 3, 1, -2, -kInf}));
  CHECK(id.to_vector<int64_t>() == std::vector<int64_t>{1, 4, 5, 3, 0, 6, 2});
  auto [tv, ti] = x.topk(3);
  CHECK(same_floats(tv.to_vector<float>(), {kNan, kNan, kInf}));
  CHECK(ti.to_vector<int64_t>() == std::vector<int64_t>{1, 4, 5});
  auto [sv, si] = x.topk(2, 0, false);
  CHECK(same_floats(sv.to_vector<float>(), {-kInf, -2}));
  CHECK(si.to_vector<int64_t>() == std::vector<int64_t>{2, 6});
}

TEST_CASE("cummax with NaN carries the NaN and the latest NaN's index, as torch") {
  auto x = Tensor::from_vector(std::vector<float>{1, kNan, 3, kNan, 0}, {5});
  auto [v, i] = x.cummax(0);
  CHECK(same_floats(v.to_vector<float>(), {1, kNan, kNan, kNan, kNan}));
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 1, 3, 3});
}

// ---------------------------------------------------------------- environment values

namespace {
// The message of the EnvError `f` throws ("" when it throws none or another error).
template <class F>
std::string env_error_of(F&& f) {
  try {
    f();
  } catch (const EnvError& e) {
    return e.what();
  } catch (const Error&) {
  }
  return "";
}
}  // namespace

TEST_CASE("DEBUG below 0 is an EnvError naming the variable, the value and the range") {
  ScopedEnv e("DEBUG", "-1");
  std::string m = env_error_of([] { (void)debug_level(); });
  CHECK(contains(m, "DEBUG=-1"));
  CHECK(contains(m, "expected an integer >= 0"));
}

TEST_CASE("THREADS=0 is an EnvError (unset means every CPU)") {
  {
    ScopedEnv e("THREADS", "0");
    std::string m = env_error_of([] { get_device("CPU:9"); });  // a new CPU device reads THREADS
    CHECK(contains(m, "THREADS=0"));
    CHECK(contains(m, "expected 1..1024"));
  }
  {
    ScopedEnv e("THREADS", "-3");
    CHECK(contains(env_error_of([] { get_device("CPU:10"); }), "THREADS=-3"));
  }
  ScopedEnv e("THREADS", nullptr);
  CHECK(get_device("CPU:9").threads() >= 1);
}

TEST_CASE("TG_ALLOC_CACHE_MB below 0 is an EnvError; 0 keeps no freed blocks") {
  {
    ScopedEnv e("TG_ALLOC_CACHE_MB", "-5");
    std::string m = env_error_of([] { Tensor::from_vector(std::vector<float>{1, 2}); });
    CHECK(contains(m, "TG_ALLOC_CACHE_MB=-5"));
    CHECK(contains(m, "expected 0.."));
  }
  ScopedEnv e("TG_ALLOC_CACHE_MB", "0");
  CHECK(Tensor::from_vector(std::vector<float>{1, 2}).to_vector<float>() == std::vector<float>{1, 2});
}

TEST_CASE("DEVICE naming no device or a missing device is an EnvError; a logical CPU (CPU:5) is accepted") {
  std::string base = default_device();
  {
    ScopedEnv e("DEVICE", "CPU:5");
    CHECK(default_device() == "CPU:5");
  }
  {
    ScopedEnv e("DEVICE", "NO_SUCH_DEVICE");
    CHECK(contains(env_error_of([] { (void)default_device(); }), "DEVICE=NO_SUCH_DEVICE"));
  }
  {
    ScopedEnv e("DEVICE", "CPU");
    CHECK(default_device() == "CPU");
  }
  CHECK(default_device() == base);
  CHECK(get_device("CPU:5").virtual_copy());  // a device of its own
  CHECK(!get_device("CPU").virtual_copy());
}

// ---------------------------------------------------------------- scatter, arange dtypes

TEST_CASE("scatter with repeated indices writes the last value, not the sum") {
  auto self = Tensor::zeros({4});
  auto idx = Tensor::from_vector(std::vector<int64_t>{1, 3, 1, 1}, {4});
  auto src = Tensor::from_vector(std::vector<float>{10, 20, 30, 40}, {4});
  CHECK(self.scatter(0, idx, src).to_vector<float>() == std::vector<float>{0, 40, 0, 20});
  auto m = Tensor::zeros({2, 3}, dtypes::int32);
  auto mi = Tensor::from_vector(std::vector<int64_t>{2, 2, 0, 0}, {2, 2});
  auto ms = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4}, {2, 2});
  CHECK(m.scatter(1, mi, ms).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 2, 4, 0, 0});
  CHECK(m.scatter(1, mi, 7.0).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 7, 7, 0, 0});
}

TEST_CASE("arange with a fractional argument is float32 unless a dtype is given") {
  Tensor a = Tensor::arange(0.5, 3);
  CHECK(a.dtype() == dtypes::float32);
  CHECK(a.to_vector<float>() == std::vector<float>{0.5f, 1.5f, 2.5f});
  CHECK(Tensor::arange(0, 1, 0.25).to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f});
  CHECK(Tensor::arange(0, 3).dtype() == dtypes::int32);
  CHECK(Tensor::arange(0.5, 3, 1, dtypes::int32).to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2});
}

// ---------------------------------------------------------------- realize from several threads

TEST_CASE("two threads realising independent and shared tensors get every value right and no exception") {
  const int n = 300;
  Tensor shared_in = Tensor::from_vector(std::vector<float>{1, 2, 3, 4});
  std::vector<Tensor> lazy;  // the same lazy tensors realised by both threads at once
  for (int i = 0; i < n; i++) lazy.push_back(Tensor::from_vector(std::vector<float>{float(i), 1, 2, 3}) * 2.f + 1.f);
  std::atomic<int> wrong{0}, errors{0};
  std::string first_error;
  auto work = [&](int id) {
    for (int i = 0; i < n; i++) {
      try {
        // identical graphs in both threads intern to the same nodes; the data differs per iteration
        Tensor x = Tensor::from_vector(std::vector<float>{float(i), float(id), 1, 1});
        Tensor y = Tensor(x * shared_in + 1.f).sum();
        Tensor ones = Tensor(Tensor::ones({4}) * 3.f).contiguous();
        Tensor::realize_all({&y, &ones});
        if (y.item<float>() != float(i) + 2.f * float(id) + 3.f + 4.f + 4.f) wrong++;
        if (ones.to_vector<float>() != std::vector<float>{3, 3, 3, 3}) wrong++;
        if (lazy[size_t(i)].to_vector<float>()[0] != float(2 * i + 1)) wrong++;
      } catch (const std::exception& e) {
        if (errors++ == 0) first_error = e.what();  // one writer: the thread that counted the first
      }
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  CAPTURE(first_error);
  CHECK(errors.load() == 0);
  CHECK(wrong.load() == 0);
}
