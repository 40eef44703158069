// The GPU backends on any machine: OpenCL (PoCL on CI) when a platform is installed, CUDA rendering and NVRTC
// compilation when libnvrtc is, and the errors that say what is missing when they are not.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include "../backends/cuda/cuda.hpp"
#include "scoped_env.hpp"
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
    // DEVICE is opened when read: a second OpenCL device is selected where there is one, else an EnvError says so
    bool two = false;
    try {
      two = get_device("CL:1").name() == "CL:1";
    } catch (const Error&) {
    }
    ScopedEnv d("DEVICE", "CL:1");
    if (two) CHECK(default_device() == "CL:1");
    else CHECK_THROWS_AS(default_device(), EnvError);
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
  // a column added to a 6 x 8 matrix: two axes (split_ranges merges a contiguous elementwise kernel's into one)
  Tensor a = Tensor::arange(0, 6 * 8, 1, dtypes::int32, "CL").reshape({6, 8});
  Tensor col = Tensor::arange(0, 6, 1, dtypes::int32, "CL").reshape({6, 1});
  {
    ScopedEnv no("NOOPT", "1");  // plain: global ids, the group size is the runtime's choice
    CompiledKernel k = lower_last(a + col, get_device("CL").renderer());
    CHECK(contains(k.src, "__kernel void k("));
    CHECK(contains(k.src, "get_global_id(0)"));
    CHECK(contains(k.src, "__global int* restrict data0"));
    CHECK(k.dims.global[0] * k.dims.local[0] == 8);
    CHECK(k.dims.global[1] * k.dims.local[1] == 6);
    CHECK(!k.dims.exact_local);
  }
  // The GPU heuristic: LOCAL 8 on the contiguous axis, LOCAL 2 on the other; group indices for the rest.
  CompiledKernel k = lower_last(a + col, get_device("CL").renderer());
  CHECK(k.opts == std::vector<Opt>{{OptOp::LOCAL, 1, 8}, {OptOp::LOCAL, 0, 2}});
  CHECK(contains(k.src, "get_local_id(0)"));
  CHECK(contains(k.src, "get_group_id(0)"));  // the row axis: 3 groups (the column loop of 8/8 is gone)
  CHECK(k.dims.local[0] == 8);
  CHECK(k.dims.local[1] == 2);
  CHECK(k.dims.global[0] * k.dims.global[1] * k.dims.global[2] == 3);
  CHECK(k.dims.exact_local);
  CHECK(Tensor(a + col).sum().item<int64_t>() == 47 * 48 / 2 + 8 * (5 * 6 / 2));
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
  CompiledKernel k;
  {
    ScopedEnv no("NOOPT", "1");
    k = lower_last(Tensor(a * 2).sum(int64_t(0)), *r);
    CHECK(contains(k.src, "extern \"C\" __global__"));
    CHECK(contains(k.src, "blockIdx.x*blockDim.x+threadIdx.x"));
    CHECK(k.dims.global[0] * k.dims.local[0] == 256);
  }
  k = lower_last(Tensor(a * 2).sum(int64_t(0)), *r);  // LOCAL 32: 8 blocks of 32 threads
  CHECK(contains(k.src, "threadIdx.x"));
  CHECK(contains(k.src, "blockIdx.x"));
  CHECK(k.dims.global[0] * k.dims.local[0] == 256);
  CHECK(k.dims.local[0] == 32);
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

// ---------------------------------------------------------------- work groups, local memory, tensor cores

namespace {

// The last kernel of realising `t` (its inputs realised first), lowered for `r` with `opts` (null: the heuristic).
struct Lowered {
  Schedule s;
  CompiledKernel k;
};
Lowered lower_with(const Tensor& t, Renderer& r, const std::vector<Opt>* opts) {
  UOpRef u = t.uop();
  Lowered l{create_schedule(std::span<const UOpRef>(&u, 1)), {}};
  REQUIRE(!l.s.items.empty());
  for (size_t i = 0; i + 1 < l.s.items.size(); i++) REQUIRE(l.s.items[i].kind == ScheduleItem::Kind::Kernel);
  LowerOptions lo;
  lo.opts = opts;
  l.k = lower_kernel(l.s.items.back().ast, "k", r, lo);
  return l;
}

// Run the lowered kernel on `dev` with copies of its CPU buffers (the schedule's earlier kernels run on the CPU
// first); returns the output bytes of the device run and of the CPU run of the same schedule.
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> run_both(Lowered& l, Device& dev) {
  Schedule head;
  head.items.assign(l.s.items.begin(), l.s.items.end() - 1);
  run_schedule(head);
  auto prog = dev.load(dev.compiler().compile(l.k.src, "k"), "k");
  ScheduleItem& it = l.s.items.back();
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<void*> ptrs;
  for (auto& b : it.bufs) {
    bufs.push_back(std::make_unique<Buffer>(dev.name(), b->dtype(), b->size()));
    if (b->allocated()) {
      std::vector<uint8_t> host(b->nbytes());
      b->copyout(host.data(), host.size());
      bufs.back()->copyin(host.data(), host.size());
    }
    ptrs.push_back(bufs.back()->ptr());
  }
  prog->run(ptrs.data(), nullptr, l.k.dims);
  std::vector<uint8_t> got(bufs[0]->nbytes()), want(got.size());
  bufs[0]->copyout(got.data(), got.size());
  Schedule last;
  last.items.push_back(it);
  run_schedule(last);
  it.bufs[0]->copyout(want.data(), want.size());
  return {got, want};
}

template <class T>
std::vector<T> as(const std::vector<uint8_t>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, float rel) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); i++)
    if (std::fabs(got[i] - want[i]) > rel * std::max(1.0f, std::fabs(want[i]))) {
      FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
      return;
    }
}

float h2f(uint16_t h) {  // float16 bits -> float (normal numbers and zero are enough here)
  uint32_t sign = uint32_t(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
  uint32_t bits = e == 0 ? sign : sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf2f(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Tensor rand_t(Shape s, DType d, uint64_t seed) {
  Tensor::manual_seed(seed);
  Tensor t = Tensor(Tensor::rand(s) - 0.5f).cast(d);
  t.realize();
  return t;
}

}  // namespace

TEST_CASE("the GPU heuristic groups a long row sum: local memory, a barrier, and the CPU's sums on OpenCL") {
  Tensor x = rand_t({4, 4096}, dtypes::float32, 1);
  auto cl_r = make_opencl_renderer(false, true, 256);
  Lowered l = lower_with(x.sum(int64_t(1)), *cl_r, nullptr);
  CHECK(l.k.opts == std::vector<Opt>{{OptOp::GROUP, 1, 256}});
  CHECK(contains(l.k.src, "__local float smem0[256];"));
  CHECK(contains(l.k.src, "barrier(CLK_LOCAL_MEM_FENCE);"));
  CHECK(contains(l.k.src, "get_local_id(0)"));
  CHECK(contains(l.k.src, "get_group_id(0)"));
  CHECK(l.k.dims.exact_local);
  CHECK(l.k.dims.local[0] == 256);
  CHECK(l.k.dims.global[0] == 4);
  auto cu = make_cuda_renderer(90);
  CompiledKernel kc = lower_with(x.sum(int64_t(1)), *cu, nullptr).k;
  CHECK(contains(kc.src, "__shared__ float smem0[256];"));
  CHECK(contains(kc.src, "__syncthreads();"));
  CHECK(contains(kc.src, "threadIdx.x"));
  if (has_nvrtc())
    for (int sm : {80, 90}) CHECK(cuda::make_nvrtc_compiler(sm)->compile(kc.src, "k").size() > 100);
  if (!has_device("CL")) return;
  auto [got, want] = run_both(l, get_device("CL"));
  check_close(as<float>(got), as<float>(want), 1e-5f);
}

TEST_CASE("LOCAL, GROUP and GROUPTOP as explicit opts give the CPU's results on OpenCL and compile with NVRTC") {
  Tensor x = rand_t({8, 1024}, dtypes::float32, 2);
  Tensor y = rand_t({8, 1024}, dtypes::float32, 3), col = rand_t({8, 1}, dtypes::float32, 9);
  auto cl_r = make_opencl_renderer(false, true, 256);
  auto cu = make_cuda_renderer(80);
  struct Case {
    const char* what;
    Tensor t;
    std::vector<Opt> opts;
    bool exact;
  };
  std::vector<Case> cases = {
      {"sum, GROUPTOP 64", Tensor(x * y).sum(int64_t(1)), {{OptOp::GROUPTOP, 1, 64}}, false},
      {"sum, LOCAL 4 x GROUP 16", Tensor(x * y).sum(int64_t(1)), {{OptOp::LOCAL, 0, 4}, {OptOp::GROUP, 1, 16}}, false},
      {"max, GROUP 32 and UPCAST 2", Tensor(x - y).max(int64_t(1)), {{OptOp::UPCAST, 0, 2}, {OptOp::GROUP, 1, 32}}, true},
      {"column sum, GROUP 8 x UNROLL 2", x.sum(int64_t(0)), {{OptOp::LOCAL, 0, 16}, {OptOp::GROUP, 1, 4}, {OptOp::UNROLL, 1, 2}}, false},
      // (a column added: two axes, where x * 2 + y's are merged into one)
      {"elementwise, LOCAL 32 x LOCAL 4", Tensor(x * 2.0f + col), {{OptOp::LOCAL, 1, 32}, {OptOp::LOCAL, 0, 4}}, true},
  };
  for (Case& c : cases) {
    std::string what = c.what;
    CAPTURE(what);
    Lowered l = lower_with(c.t, *cl_r, &c.opts);
    CHECK(l.k.dims.exact_local);
    CompiledKernel kc = lower_with(c.t, *cu, &c.opts).k;
    CHECK(contains(kc.src, "threadIdx."));
    if (has_nvrtc()) CHECK(cuda::make_nvrtc_compiler(80)->compile(kc.src, "k").size() > 100);
    if (!has_device("CL")) continue;
    auto [got, want] = run_both(l, get_device("CL"));
    if (c.exact) CHECK(got == want);
    else check_close(as<float>(got), as<float>(want), 1e-5f);
  }
}

TEST_CASE("work-group opts refuse what they cannot do: a CPU renderer, too many items, a grouped reduce in a loop") {
  Tensor x = rand_t({8, 1024}, dtypes::float32, 4);
  LLVMRenderer llvm;
  std::vector<Opt> g{{OptOp::GROUP, 1, 16}};
  CHECK_THROWS_AS(lower_with(x.sum(int64_t(1)), llvm, &g), OptError);
  std::vector<Opt> tc{{OptOp::TC, 0, 0}};
  auto cl_r = make_opencl_renderer(false, true, 256);
  CHECK_THROWS_AS(lower_with(x.sum(int64_t(1)), *cl_r, &tc), OptError);  // no tensor cores on this renderer
  std::vector<Opt> big{{OptOp::LOCAL, 0, 4}, {OptOp::GROUP, 1, 64}};
  auto small = make_opencl_renderer(false, true, 256);
  CHECK_NOTHROW(lower_with(x.sum(int64_t(1)), *small, &big));
  std::vector<Opt> too_big{{OptOp::LOCAL, 0, 8}, {OptOp::GROUP, 1, 128}};
  try {
    lower_with(x.sum(int64_t(1)), *small, &too_big);
    FAIL("1024 work items per group were accepted");
  } catch (const OptError& e) {
    CHECK(contains(e.what(), "1024 work items"));
  }
  std::vector<Opt> on_out{{OptOp::GROUP, 0, 2}};
  CHECK_THROWS_AS(lower_with(x.sum(int64_t(1)), *small, &on_out), OptError);
}

TEST_CASE("TC: an fp16 matmul kernel for CUDA uses mma.sync m16n8k16 and compiles for sm_80 and sm_90") {
  auto cu = make_cuda_renderer(90);
  for (DType d : {dtypes::float16, dtypes::bfloat16}) {
    CAPTURE(d.name());
    Tensor a = rand_t({64, 48}, d, 5), b = rand_t({48, 32}, d, 6);
    CompiledKernel k = lower_with(a.matmul(b), *cu, nullptr).k;
    // TC, then 2x2 tiles per warp (UPCAST) and 2x2 warps per group (LOCAL) over the output axes (n is axis 1).
    CHECK(k.opts == std::vector<Opt>{{OptOp::TC, 0, 0}, {OptOp::UPCAST, 1, 2}, {OptOp::LOCAL, 1, 2},
                                     {OptOp::UPCAST, 0, 2}, {OptOp::LOCAL, 0, 2}});
    std::string in = d == dtypes::float16 ? "f16" : "bf16";
    CHECK(contains(k.src, "mma.sync.aligned.m16n8k16.row.col.f32." + in + "." + in + ".f32"));
    CHECK(contains(k.src, "tg_mma_m16n8k16_" + in + "(wmma0"));
    CHECK(k.dims.local[0] == 32);
    CHECK(k.dims.local[1] * k.dims.local[2] == 4);
    CHECK(k.dims.global[0] * k.dims.global[1] * k.dims.global[2] == 1);  // 4x4 tiles: 4 warps x 4 each
    if (!has_nvrtc()) continue;
    for (int sm : {80, 90}) CHECK(cuda::make_nvrtc_compiler(sm)->compile(k.src, "k").size() > 100);
  }
  // Shapes that do not fit: no TC from the heuristic, and an explicit TC is an OptError naming the size.
  Tensor a = rand_t({64, 40}, dtypes::float16, 7), b = rand_t({40, 32}, dtypes::float16, 8);
  CHECK(lower_with(a.matmul(b), *cu, nullptr).k.opts.at(0).op != OptOp::TC);
  std::vector<Opt> tc{{OptOp::TC, 0, 0}};
  try {
    lower_with(a.matmul(b), *cu, &tc);
    FAIL("TC applied to K=40");
  } catch (const OptError& e) {
    CHECK(contains(e.what(), "40 is not divisible by 16"));
  }
  Tensor f = rand_t({64, 48}, dtypes::float32, 9), g = rand_t({48, 32}, dtypes::float32, 10);
  CHECK_THROWS_AS(lower_with(f.matmul(g), *cu, &tc), OptError);  // float32 operands
  auto old = make_cuda_renderer(75);
  CHECK_THROWS_AS(lower_with(a.matmul(b), *old, &tc), OptError);  // no tensor cores before sm_80
}

TEST_CASE("TC kernels compute the matmul: the fragment mapping run on OpenCL with mma.sync emulated from the PTX tables") {
  if (!has_device("CL")) return;
  auto emu = make_opencl_renderer(false, true, 256, true);
  struct Case {
    const char* what;
    Tensor t;
  };
  Tensor a = rand_t({32, 64}, dtypes::float16, 11), b = rand_t({64, 24}, dtypes::float16, 12);
  Tensor bt = rand_t({24, 64}, dtypes::float16, 13), bias = rand_t({24}, dtypes::float16, 14);
  Tensor ba = rand_t({3, 16, 32}, dtypes::float16, 15), bb = rand_t({3, 32, 16}, dtypes::float16, 16);
  Tensor p = rand_t({64, 32}, dtypes::float16, 20), q = rand_t({32, 32}, dtypes::float16, 21);
  std::vector<Case> cases = {
      {"a @ b", a.matmul(b)},
      {"p @ q (2x2 tiles per warp, 2x2 warps)", p.matmul(q)},
      {"a @ bt.T + bias", Tensor(a.matmul(bt.T()) + bias)},
      {"batched", ba.matmul(bb)},
      {"bt @ a.T (m and n swapped)", bt.matmul(a.T())},
  };
  for (Case& c : cases) {
    std::string what = c.what;
    CAPTURE(what);
    Lowered l = lower_with(c.t, *emu, nullptr);
    REQUIRE(l.k.opts.at(0) == Opt{OptOp::TC, 0, 0});
    CHECK(contains(l.k.src, "tg_wmma_emu("));
    auto [got, want] = run_both(l, get_device("CL"));
    // The CPU rounds each product to float16 (Tensor::sum of a float16 product); the tensor core does not.
    std::vector<float> g, w;
    for (uint16_t h : as<uint16_t>(got)) g.push_back(h2f(h));
    for (uint16_t h : as<uint16_t>(want)) w.push_back(h2f(h));
    check_close(g, w, 4e-3f);
  }
}

TEST_CASE("TC kernels on a CUDA GPU (when there is one) give the CPU's matmul; so do the grouped reductions") {
  if (!has_device("CUDA")) return;
  Device& dev = get_device("CUDA");
  REQUIRE(dev.renderer().grid_limits().tensor_cores);
  for (DType d : {dtypes::float16, dtypes::bfloat16}) {
    CAPTURE(d.name());
    Tensor a = rand_t({128, 64}, d, 17), b = rand_t({64, 48}, d, 18);
    Lowered l = lower_with(a.matmul(b), dev.renderer(), nullptr);
    REQUIRE(l.k.opts.at(0) == Opt{OptOp::TC, 0, 0});
    auto [got, want] = run_both(l, dev);
    std::vector<float> g, w;
    for (uint16_t h : as<uint16_t>(got)) g.push_back(d == dtypes::float16 ? h2f(h) : bf2f(h));
    for (uint16_t h : as<uint16_t>(want)) w.push_back(d == dtypes::float16 ? h2f(h) : bf2f(h));
    check_close(g, w, d == dtypes::float16 ? 4e-3f : 3e-2f);
  }
  Tensor x = rand_t({4, 4096}, dtypes::float32, 19);
  Lowered l = lower_with(x.sum(int64_t(1)), dev.renderer(), nullptr);
  CHECK(contains(l.k.src, "__syncthreads();"));
  auto [got, want] = run_both(l, dev);
  check_close(as<float>(got), as<float>(want), 1e-5f);
}

TEST_CASE("DEBUG=2 prints one line per copy between CPU and CL, with the bytes and both devices") {
  if (!has_device("CL")) return;
  Tensor x = Tensor::arange(0, 256, 1, dtypes::float32, "CPU");
  x.realize();
  std::string log;
  {
    ScopedEnv dbg("DEBUG", "2");
    std::fflush(stderr);
    int saved = dup(2);
    FILE* tmp = std::tmpfile();
    REQUIRE(tmp);
    dup2(fileno(tmp), 2);
    Tensor y = Tensor(x.to("CL") + 1.0f).to("CPU");
    y.realize();
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::rewind(tmp);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) log.append(buf, n);
    std::fclose(tmp);
    CHECK(y.to_vector<float>()[255] == 256.0f);
  }
  CHECK(contains(log, "copy     1024 bytes CPU -> CL"));
  CHECK(contains(log, "copy     1024 bytes CL -> CPU"));
}

TEST_CASE("copies to a CUDA device without a driver are a tg::Error; the tensor stays usable on the CPU") {
  if (has_device("CUDA")) return;
  Tensor x = Tensor::arange(0, 8, 1, dtypes::float32, "CPU");
  CHECK_THROWS_AS(x.to("CUDA").realize(), Error);
  CHECK(Tensor(x * 2.0f).sum().item<float>() == 56.0f);
}
