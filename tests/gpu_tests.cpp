// The GPU backends on any machine: OpenCL (PoCL on CI) when a platform is installed, CUDA rendering and NVRTC
// compilation when libnvrtc is, and the errors that say what is missing when they are not.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "../backends/cuda/cuda.hpp"
#include "tg/codegen.hpp"
#include "tg/env.hpp"
#include "tg/render.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {

bool has_device(const std::string& name) {
  try {
    get_device(name);
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool has_nvrtc() {
  try {
    cuda::nvrtc_version();
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Sets (or with nullptr unsets) an environment variable for one scope; tg's cached values are forgotten.
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const char* v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (v) setenv(n, v, 1);
    else unsetenv(n);
    env_reset_cache();
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
    env_reset_cache();
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The last kernel of realising `t`, lowered for `r`.
CompiledKernel lower_last(const Tensor& t, Renderer& r) {
  UOpRef u = t.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&u, 1));
  REQUIRE(!s.items.empty());
  return lower_kernel(s.items.back().ast, "k", r);
}

}  // namespace

TEST_CASE("a missing CUDA driver or GPU is a tg::Error that names it and how to select another device; the CPU keeps working") {
  bool cuda_ok = true;
  try {
    get_device("CUDA");
  } catch (const Error& e) {
    cuda_ok = false;
    std::string m = e.what();
    CHECK(contains(m, "[CUDA]"));
    CHECK(contains(m, "DEVICE=CPU"));
    CHECK((contains(m, "libcuda.so.1") || contains(m, "GPU") || contains(m, "cuInit")));
  }
  if (!cuda_ok) CHECK_THROWS_AS(get_device("CUDA"), Error);  // the same error again, no crash
  Tensor a = Tensor::arange(0, 4, 1, dtypes::int32, "CPU") * 2;
  CHECK(a.to_vector<int32_t>() == std::vector<int32_t>{0, 2, 4, 6});
}

TEST_CASE("DEVICE=CL, CL=1 and CUDA=1 select the default device; CL:0 is CL") {
  {
    ScopedEnv d("DEVICE", nullptr), c("CL", "1");
    CHECK(default_device() == "CL");
  }
  {
    ScopedEnv d("DEVICE", nullptr), c("CL", nullptr), u("CUDA", "1");
    CHECK(default_device() == "CUDA");  // selected by name; opening it is what reports a missing driver
  }
  {
    ScopedEnv d("DEVICE", "cl:0");
    CHECK(default_device() == "CL");
  }
  {
    ScopedEnv d("DEVICE", "CL:1");
    CHECK(default_device() == "CL:1");
  }
  if (has_device("CL")) CHECK(get_device("CL:0").name() == "CL");
}

TEST_CASE("an OpenCL device index past the last device is a tg::Error saying how many there are") {
  if (!has_device("CL")) {
    CHECK_THROWS_AS(get_device("CL"), Error);
    return;
  }
  try {
    get_device("CL:99");
    FAIL("CL:99 opened");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "device(s) found"));
    CHECK(contains(e.what(), "DEVICE=CPU"));
  }
}

TEST_CASE("an OpenCL kernel that fails to build reports the build log and the source") {
  if (!has_device("CL")) return;
  Compiler& c = get_device("CL").compiler();
  std::string src = "// tg kernel args: 0 buffers, 0 vars\n__kernel void k() { int x = no_such_name; }\n";
  try {
    c.compile(src, "k");
    FAIL("a broken kernel built");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "no_such_name"));
    CHECK(contains(e.what(), "failed to build"));
  }
}

TEST_CASE("OpenCL kernels index work items with get_global_id and launch one item per output element") {
  if (!has_device("CL")) return;
  Tensor a = Tensor::arange(0, 6 * 8, 1, dtypes::int32, "CL").reshape({6, 8});
  CompiledKernel k = lower_last(a + 1, get_device("CL").renderer());
  CHECK(contains(k.src, "__kernel void k("));
  CHECK(contains(k.src, "get_global_id(0)"));
  CHECK(contains(k.src, "__global int* restrict data0"));
  CHECK(k.dims.global[0] * k.dims.local[0] == 8);
  CHECK(k.dims.global[1] * k.dims.local[1] == 6);
  CHECK(Tensor(a + 1).sum().item<int64_t>() == 48 * 49 / 2);
}

TEST_CASE("to() copies between CPU and CL both ways; results match the CPU") {
  if (!has_device("CL")) return;
  Tensor x = Tensor::arange(0, 1000, 1, dtypes::float32, "CPU") * 0.5f;
  Tensor y = x.to("CL");
  CHECK(y.device() == "CL");
  Tensor z = Tensor(y * y).sum().to("CPU");
  CHECK(z.device() == "CPU");
  CHECK(z.item<float>() == doctest::Approx(Tensor(x * x).sum().item<float>()).epsilon(1e-6));
  CHECK(Tensor(y.to("CPU") == x).all().item<bool>());
}

TEST_CASE("CUDA kernels index work items with blockIdx/threadIdx and compile with NVRTC for sm_80 and sm_90") {
  auto r = make_cuda_renderer(90);
  Tensor a = Tensor::arange(0, 256 * 3, 1, dtypes::float16, "CPU").reshape({3, 256});
  CompiledKernel k = lower_last(Tensor(a * 2).sum(int64_t(0)), *r);
  CHECK(contains(k.src, "extern \"C\" __global__"));
  CHECK(contains(k.src, "blockIdx.x*blockDim.x+threadIdx.x"));
  CHECK(k.dims.global[0] * k.dims.local[0] == 256);
  if (!has_nvrtc()) {
    CHECK_THROWS_AS(cuda::make_nvrtc_compiler(90), Error);
    return;
  }
  for (int sm : {80, 90}) {
    auto c = cuda::make_nvrtc_compiler(sm);
    std::vector<uint8_t> bin = c->compile(k.src, "k");
    CHECK(bin.size() > 100);
    CHECK(contains(c->id(), "sm_" + std::to_string(sm)));
  }
}

TEST_CASE("an NVRTC compile error carries NVRTC's log and the source") {
  if (!has_nvrtc()) return;
  auto c = cuda::make_nvrtc_compiler(90);
  try {
    c->compile("// tg kernel args: 0 buffers, 0 vars\nextern \"C\" __global__ void k() { int x = no_such_name; }\n", "k");
    FAIL("a broken kernel compiled");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "no_such_name"));
    CHECK(contains(e.what(), "sm_90"));
  }
  CHECK_THROWS_AS(c->compile("__global__ void k() {}", "k"), Error);  // no argument line
}

TEST_CASE("the native-half OpenCL dialect (devices with cl_khr_fp16) gives the CPU's float16 results") {
  if (!has_device("CL")) return;
  Device& cl = get_device("CL");
  auto r = make_opencl_renderer(true, true, 64);
  Tensor a = Tensor::arange(-40, 40, 1, dtypes::float16, "CPU") * 0.37f;
  Tensor b = Tensor::arange(0, 80, 1, dtypes::int32, "CPU");
  a.realize();
  b.realize();
  Tensor out = Tensor(Tensor(a * a + b.cast(dtypes::float16)).sqrt() - a.relu()).cast(dtypes::float16);
  UOpRef u = out.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&u, 1));
  REQUIRE(s.items.size() == 1);
  CompiledKernel k = lower_kernel(s.items.back().ast, "k", *r);
  CHECK(contains(k.src, "cl_khr_fp16"));
  CHECK(contains(k.src, "half"));
  std::unique_ptr<Program> prog;
  try {
    prog = cl.load(cl.compiler().compile(k.src, "k"), "k");
  } catch (const Error& e) {
    MESSAGE("this OpenCL device does not build native half: " << std::string(e.what()).substr(0, 200));
    return;
  }
  // The same buffers on CL: copy the inputs over, run, and compare with the CPU's run of the same schedule.
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<void*> ptrs;
  for (auto& b : s.items.back().bufs) {
    bufs.push_back(std::make_unique<Buffer>("CL", b->dtype(), b->size()));
    if (b->allocated()) {
      std::vector<uint8_t> host(b->nbytes());
      b->copyout(host.data(), host.size());
      bufs.back()->copyin(host.data(), host.size());
    }
    ptrs.push_back(bufs.back()->ptr());
  }
  prog->run(ptrs.data(), nullptr, k.dims);
  std::vector<uint16_t> got(80);
  bufs[0]->copyout(got.data(), 160);
  run_schedule(s);
  std::vector<uint16_t> want(80);
  s.items.back().bufs[0]->copyout(want.data(), 160);
  CHECK(got == want);
}
