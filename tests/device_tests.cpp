// Devices: the allocator's LRU cache, the registry, Buffer, the disk and program caches, compile errors.
#include <atomic>
#include <latch>
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "../backends/cpu/cpu.hpp"
#include "scoped_env.hpp"
#include "tg/env.hpp"
#include "tg/opt.hpp"
#include "tg/render.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"
#include "tg/uop.hpp"

using namespace tg;
using cpu::CompilerKind;
namespace fs = std::filesystem;

namespace {

// Counts raw allocations and frees; memory from malloc.
class CountingAllocator : public Allocator {
 public:
  ~CountingAllocator() override { clear_cache(); }
  void copyin(void*, const void*, size_t) override {}
  void copyout(void*, const void*, size_t) override {}
  int raw_allocs = 0;
  std::vector<void*> raw_frees;

 protected:
  void* alloc_raw(size_t bytes) override {
    raw_allocs++;
    return std::malloc(bytes);
  }
  void free_raw(void* p, size_t) override {
    raw_frees.push_back(p);
    std::free(p);
  }
};


// A fresh folder under the system temp dir, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "tg-test-XXXXXX").string();
    REQUIRE(mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A CPU device whose compiler counts compilations.
class CountingDevice : public Device {
 public:
  struct CountingCompiler : Compiler {
    Compiler* inner;
    std::atomic<int> compiles{0};
    std::string id() const override { return inner->id(); }
    std::vector<uint8_t> compile(const std::string& src, const std::string& name) override {
      compiles++;
      return inner->compile(src, name);
    }
  };
  explicit CountingDevice(CompilerKind k) : cpu_(cpu::make_device("CPU", k)) { counting_.inner = &cpu_->compiler(); }
  const std::string& name() const override { return cpu_->name(); }
  Allocator& allocator() override { return cpu_->allocator(); }
  Renderer& renderer() override { return cpu_->renderer(); }
  Compiler& compiler() override { return counting_; }
  std::unique_ptr<Program> load(const std::vector<uint8_t>& b, const std::string& n) override { return cpu_->load(b, n); }
  int compiles() const { return counting_.compiles; }

 private:
  std::unique_ptr<Device> cpu_;
  CountingCompiler counting_;
};

// out[0] = value: the smallest kernel.
std::string store_kernel(Renderer& r, int32_t value) {
  auto p = UOp::make(Ops::PARAM, dtypes::int32.ptr_to(), {}, int64_t(0));
  auto z = UOp::cnst_int(dtypes::int32, 0), v = UOp::cnst_int(dtypes::int32, value);
  auto idx = UOp::make(Ops::INDEX, p->dtype, {p, z});
  auto st = UOp::make(Ops::STORE, dtypes::void_, {idx, v});
  auto sink = UOp::make(Ops::SINK, dtypes::void_, {});
  return r.render("store_k", {p.get(), z.get(), v.get(), idx.get(), st.get(), sink.get()});
}

int32_t run_store(Program& prog) {
  int32_t out = 0;
  void* bufs[] = {&out};
  prog.run(bufs, nullptr, LaunchDims{});
  return out;
}

constexpr CompilerKind kKinds[] = {CompilerKind::LLVM, CompilerKind::Clang};
const char* kind_name(CompilerKind k) { return k == CompilerKind::LLVM ? "llvm" : "clang"; }

}  // namespace

TEST_CASE("the allocator reuses a freed block of the same size") {
  CountingAllocator a;
  void* p = a.alloc(1000);
  a.free(p, 1000);
  CHECK(a.cached_bytes() == 1000);
  CHECK(a.alloc(1000) == p);
  CHECK(a.raw_allocs == 1);
  CHECK(a.cached_bytes() == 0);
  void* q = a.alloc(2000);  // another size: fresh memory
  CHECK(q != p);
  CHECK(a.raw_allocs == 2);
  a.free(p, 1000);
  a.free(q, 2000);
  a.clear_cache();
  CHECK(a.cached_bytes() == 0);
  CHECK(a.raw_frees.size() == 2);
}

TEST_CASE("the allocator cache is bounded by TG_ALLOC_CACHE_MB and evicts the least recently freed") {
  ScopedEnv env("TG_ALLOC_CACHE_MB", "1");
  CountingAllocator a;
  constexpr size_t kB = 400 << 10;
  void* b1 = a.alloc(kB);
  void* b2 = a.alloc(kB);
  void* b3 = a.alloc(kB);
  a.free(b1, kB);
  a.free(b2, kB);
  CHECK(a.raw_frees.empty());
  a.free(b3, kB);  // 1200 KiB > 1 MiB: b1, freed first, goes
  REQUIRE(a.raw_frees.size() == 1);
  CHECK(a.raw_frees[0] == b1);
  CHECK(a.cached_bytes() == 2 * kB);
  CHECK(a.alloc(kB) == b3);  // the most recently freed block comes back first
  void* big = a.alloc(2 << 20);
  a.free(big, 2 << 20);  // larger than the whole cache: freed at once
  CHECK(a.raw_frees.back() == big);
  CHECK(a.cached_bytes() == kB);
  a.free(b3, kB);
}

TEST_CASE("a cached block no allocation takes again within TG_ALLOC_CACHE_ROUNDS rounds of launches is given back") {
  ScopedEnv env("TG_ALLOC_CACHE_ROUNDS", "2");
  CountingAllocator a;
  void* p = a.alloc(1000);
  void* q = a.alloc(2000);
  CHECK(a.live_bytes() == 3000);
  a.free(p, 1000);  // freed in round 0
  a.end_round();    // round 1
  a.free(q, 2000);  // freed in round 1
  CHECK(a.live_bytes() == 0);
  a.end_round();  // round 2: p is 2 rounds old, kept
  CHECK(a.cached_bytes() == 3000);
  a.end_round();  // round 3: p is 3 rounds old, given back
  REQUIRE(a.raw_frees.size() == 1);
  CHECK(a.raw_frees[0] == p);
  CHECK(a.cached_bytes() == 2000);
  void* r = a.alloc(2000);  // a block taken again leaves the cache and does not age
  CHECK(r == q);
  for (int i = 0; i < 5; i++) a.end_round();
  CHECK(a.raw_frees.size() == 1);
  a.free(r, 2000);
  for (int i = 0; i < 3; i++) a.end_round();
  CHECK(a.raw_frees.size() == 2);
  CHECK(a.cached_bytes() == 0);
  CHECK(a.raw_allocs == 2);
}

TEST_CASE("an unknown device is a tg::Error naming the known ones") {
  CHECK_THROWS_AS(get_device("NOPE"), Error);
  try {
    get_device("NOPE:1");
  } catch (const Error& e) {
    std::string m = e.what();
    CHECK(m.find("NOPE") != std::string::npos);
    CHECK(m.find("CPU") != std::string::npos);
  }
  CHECK_THROWS_AS(get_device("CPU:x"), Error);
  CHECK_THROWS_AS(get_device("CPU:"), Error);
}

TEST_CASE("devices are created once per canonical name") {
  static int made = 0;
  static std::vector<std::string> names;
  register_device("TESTDEV", [](const std::string& full) -> std::unique_ptr<Device> {
    made++;
    names.push_back(full);
    return cpu::make_device(full, CompilerKind::LLVM);
  }, -10);
  Device& a = get_device("TESTDEV");
  CHECK(&get_device("testdev:0") == &a);
  Device& b = get_device("TESTDEV:2");
  CHECK(&b != &a);
  CHECK(&get_device("TESTDEV:2") == &b);
  CHECK(made == 2);
  CHECK(names == std::vector<std::string>{"TESTDEV", "TESTDEV:2"});
  auto all = device_names();
  CHECK(std::find(all.begin(), all.end(), "CPU") != all.end());
  CHECK(all.back() == "TESTDEV");  // lowest priority last
  CHECK(get_device("CPU").name() == "CPU");
}

TEST_CASE("the default device comes from DEVICE, then NAME=1, then priority") {
  {
    ScopedEnv d("DEVICE", "testdev");
    CHECK(default_device() == "TESTDEV");
  }
  {
    ScopedEnv d("DEVICE", "");
    ScopedEnv t("TESTDEV", "1");
    CHECK(default_device() == "TESTDEV");
  }
  ScopedEnv d("DEVICE", "");
  CHECK(default_device() == device_names().front());
  {
    ScopedEnv bad("DEVICE", "NOPE");
    CHECK_THROWS_AS(default_device(), Error);
  }
}

TEST_CASE("CPU_COMPILER picks the CPU compiler; a bad value is a tg::Error") {
  {
    ScopedEnv c("CPU_COMPILER", "clang");
    CHECK(get_device("CPU:5").compiler().id().rfind("clang", 0) == 0);
  }
  {
    ScopedEnv c("CPU_COMPILER", "gcc");
    CHECK_THROWS_AS(get_device("CPU:6"), Error);
  }
  CHECK(get_device("CPU:7").compiler().id().rfind("llvm", 0) == 0);
}

// The VmFlags of the mapping holding p (/proc/self/smaps), or "" if none does.
std::string vm_flags(const void* p) {
  std::ifstream f("/proc/self/smaps");
  auto a = reinterpret_cast<uintptr_t>(p);
  bool in = false;
  for (std::string line; std::getline(f, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) in = a >= lo && a < hi;  // a mapping's first line
    else if (in && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST_CASE("CPU buffers of 4 MiB or more ask for transparent huge pages; smaller ones do not") {
  Allocator& al = get_device("CPU").allocator();
  al.clear_cache();
  Buffer big("CPU", dtypes::float32, size_t(1) << 20), small("CPU", dtypes::float32, size_t(1) << 18);  // 4 MiB, 1 MiB
  std::string fb = vm_flags(big.ptr()), fs_ = vm_flags(small.ptr());
  CAPTURE(fb);
  CAPTURE(fs_);
  REQUIRE(!fb.empty());
  REQUIRE(!fs_.empty());
  CHECK(fb.find(" hg") != std::string::npos);  // VM_HUGEPAGE: madvise(MADV_HUGEPAGE)
  CHECK(fs_.find(" hg") == std::string::npos);
}

TEST_CASE("a Buffer allocates lazily, copies exactly its size and frees into the cache") {
  Allocator& al = get_device("CPU").allocator();
  al.clear_cache();
  {
    Buffer b("CPU", dtypes::float32, 16);
    CHECK(!b.allocated());
    CHECK(b.nbytes() == 64);
    std::vector<float> in(16), out(16, 0);
    for (int i = 0; i < 16; i++) in[size_t(i)] = float(i) * 1.25f;
    b.copyin(in.data(), 64);
    CHECK(b.allocated());
    CHECK(reinterpret_cast<uintptr_t>(b.ptr()) % 64 == 0);
    b.copyout(out.data(), 64);
    CHECK(out == in);
    CHECK_THROWS_AS(b.copyin(in.data(), 60), Error);
    try {
      b.copyout(out.data(), 68);
    } catch (const Error& e) {
      std::string m = e.what();
      CHECK(m.find("68") != std::string::npos);
      CHECK(m.find("64") != std::string::npos);
    }
  }
  CHECK(al.cached_bytes() == 64);
  Buffer c("CPU", dtypes::int32, 16);
  c.ptr();
  CHECK(al.cached_bytes() == 0);  // same size: reused
  CHECK_THROWS_AS(Buffer("CPU", dtypes::index, 4), Error);
}

TEST_CASE("the disk cache round-trips, rejects damaged files and honours CACHELEVEL=0") {
  TempDir dir;
  ScopedEnv env("TG_CACHE_DIR", dir.path.string());
  CHECK(cache_dir() == dir.path.string());
  std::vector<uint8_t> data = {1, 2, 3, 250}, got;
  disk_cache_put("abc123", data);
  fs::path f = dir.path / "kernels" / "abc123";
  CHECK(fs::exists(f));
  REQUIRE(disk_cache_get("abc123", got));
  CHECK(got == data);
  CHECK(!disk_cache_get("missing", got));
  {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(-1, std::ios::end);
    s.put(char(7));  // flip the payload: the checksum no longer matches
  }
  CHECK(!disk_cache_get("abc123", got));
  std::filesystem::resize_file(f, 10);  // a torn file
  CHECK(!disk_cache_get("abc123", got));
  CHECK_THROWS_AS(disk_cache_put("../escape", data), Error);
  for (auto& e : fs::directory_iterator(dir.path / "kernels"))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);  // no temp files left behind
  ScopedEnv off("CACHELEVEL", "0");
  disk_cache_put("other", data);
  CHECK(!fs::exists(dir.path / "kernels" / "other"));
  disk_cache_put("abc123", data);  // would repair the file if caching were on
  CHECK(!disk_cache_get("abc123", got));
}

TEST_CASE("the disk cache is bounded by TG_CACHE_MB and removes the least recently used entries") {
  TempDir dir;
  ScopedEnv env("TG_CACHE_DIR", dir.path.string());
  ScopedEnv mb("TG_CACHE_MB", "1");
  std::vector<uint8_t> data(200000, 7), got;
  auto has = [&](int i) { return fs::exists(dir.path / "kernels" / ("e" + std::to_string(i))); };
  for (int i = 0; i < 4; i++) disk_cache_put("e" + std::to_string(i), data);
  REQUIRE(disk_cache_get("e0", got));  // e0 is now the most recently used
  disk_cache_put("e4", data);          // 5 x 200 KB: under 1 MiB, all kept
  for (int i = 0; i < 5; i++) CHECK(has(i));
  disk_cache_put("e5", data);  // over: the oldest go until at most 90% of the bound is left
  CHECK(has(0));
  CHECK(!has(1));
  CHECK(!has(2));
  CHECK(has(3));
  CHECK(has(4));
  CHECK(has(5));
  ScopedEnv bad("TG_CACHE_MB", "0");
  CHECK_THROWS_AS(disk_cache_put("e6", data), EnvError);
}

TEST_CASE("get_program caches in memory and on disk") {
  TempDir dir;
  ScopedEnv env("TG_CACHE_DIR", dir.path.string());
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    CountingDevice d1(k);
    std::string src = store_kernel(d1.renderer(), 42);
    auto p1 = d1.get_program(src, "store_k");
    CHECK(run_store(*p1) == 42);
    CHECK(d1.compiles() == 1);
    CHECK(d1.get_program(src, "store_k") == p1);  // memory cache
    CHECK(d1.compiles() == 1);
    CountingDevice d2(k);  // a new device: empty memory cache, warm disk cache
    auto p2 = d2.get_program(src, "store_k");
    CHECK(d2.compiles() == 0);
    CHECK(run_store(*p2) == 42);
    std::string src2 = store_kernel(d2.renderer(), 43);
    CHECK(run_store(*d2.get_program(src2, "store_k")) == 43);
    CHECK(d2.compiles() == 1);
  }
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir.path / "kernels")) files += e.is_regular_file();
  CHECK(files == 4);
}

TEST_CASE("a compile error is a tg::Error with the compiler's message and the source") {
  {
    auto c = cpu::make_llvm_compiler();
    std::string src = "define void @k(ptr %bufs, ptr %vars) {\n  %x = frobnicate i32 1\n  ret void\n}\n";
    try {
      c->compile(src, "k");
      FAIL("no error");
    } catch (const Error& e) {
      std::string m = e.what();
      CHECK(m.find(src) != std::string::npos);
      CHECK(m.find("frobnicate") != std::string::npos);
      CHECK(m.find("error") != std::string::npos);
    }
  }
  {
    auto c = cpu::make_clang_compiler();
    std::string src = "void k(void* const* bufs, const long* vars) { int x = ; }\n";
    try {
      c->compile(src, "k");
      FAIL("no error");
    } catch (const Error& e) {
      std::string m = e.what();
      CHECK(m.find(src) != std::string::npos);
      CHECK(m.find("expected expression") != std::string::npos);
    }
  }
  ScopedEnv off("CACHELEVEL", "0");
  CountingDevice d(CompilerKind::LLVM);
  CHECK_THROWS_AS(d.get_program("not llvm ir", "k"), Error);
}

TEST_CASE("loading a binary without the kernel symbol is a tg::Error") {
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    auto dev = cpu::make_device("CPU", k);
    auto bin = dev->compiler().compile(store_kernel(dev->renderer(), 1), "store_k");
    CHECK_THROWS_AS(dev->load(bin, "other_name"), Error);
    CHECK_THROWS_AS(dev->load({1, 2, 3}, "store_k"), Error);
    CHECK(run_store(*dev->load(bin, "store_k")) == 1);  // the failed loads left nothing behind
  }
}

TEST_CASE("programs can be loaded and released many times") {
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    auto dev = cpu::make_device("CPU", k);
    auto bin = dev->compiler().compile(store_kernel(dev->renderer(), 5), "store_k");
    auto keep = dev->load(bin, "store_k");
    for (int i = 0; i < 200; i++) CHECK(run_store(*dev->load(bin, "store_k")) == 5);
    CHECK(run_store(*keep) == 5);
  }
}

TEST_CASE("kernels calling libm link against the registered runtime symbols") {
  auto p = UOp::make(Ops::PARAM, dtypes::float32.ptr_to(), {}, int64_t(0));
  auto z = UOp::cnst_int(dtypes::int32, 0);
  auto idx = UOp::make(Ops::INDEX, p->dtype, {p, z});
  auto x = UOp::make(Ops::LOAD, dtypes::float32, {idx});
  auto y = x->alu(Ops::SIN)->alu(Ops::ADD, x->alu(Ops::EXP2))->alu(Ops::ADD, x->alu(Ops::LOG2));
  auto st = UOp::make(Ops::STORE, dtypes::void_, {idx, y});
  auto sink = UOp::make(Ops::SINK, dtypes::void_, {});
  std::vector<const UOp*> prog = {p.get(), z.get(), idx.get(), x.get()};
  for (const UOp* u : toposort(y.get()))
    if (std::find(prog.begin(), prog.end(), u) == prog.end()) prog.push_back(u);
  prog.push_back(st.get());
  prog.push_back(sink.get());
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    auto dev = cpu::make_device("CPU", k);
    auto prg = dev->load(dev->compiler().compile(dev->renderer().render("m", prog), "m"), "m");
    float v = 1.5f;
    void* bufs[] = {&v};
    prg->run(bufs, nullptr, LaunchDims{});
    CHECK(v == doctest::Approx(std::sin(1.5) + std::exp2(1.5) + std::log2(1.5)).epsilon(1e-6));
  }
}

TEST_CASE("kernels compile, cache and load from several threads at once") {
  TempDir dir;
  ScopedEnv env("TG_CACHE_DIR", dir.path.string());
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    auto dev = cpu::make_device("CPU", k);
    constexpr int T = 4, J = 3;
    std::vector<int32_t> got(T * J, -1);
    std::vector<std::thread> ts;
    for (int t = 0; t < T; t++)
      ts.emplace_back([&, t] {
        for (int j = 0; j < J; j++) {
          int32_t v = (j == 0 ? 1000 : t * 10 + j);  // j == 0: the same kernel in every thread
          got[size_t(t * J + j)] = run_store(*dev->get_program(store_kernel(dev->renderer(), v), "store_k"));
        }
      });
    for (auto& t : ts) t.join();
    for (int t = 0; t < T; t++)
      for (int j = 0; j < J; j++) CHECK(got[size_t(t * J + j)] == (j == 0 ? 1000 : t * 10 + j));
  }
}

TEST_CASE("threads asking for a source another thread is compiling wait for that compile (one compile, one program)") {
  ScopedEnv off("CACHELEVEL", "0");  // no disk cache: every miss compiles
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    CountingDevice dev(k);
    constexpr int T = 6;
    auto together = [&](auto&& f) {  // T threads released at once
      std::latch go(T);
      std::vector<std::thread> ts;
      for (int t = 0; t < T; t++)
        ts.emplace_back([&, t] {
          go.arrive_and_wait();
          f(t);
        });
      for (auto& t : ts) t.join();
    };
    std::vector<std::shared_ptr<Program>> got(T);
    std::string src = store_kernel(dev.renderer(), 77);
    together([&](int t) { got[size_t(t)] = dev.get_program(src, "store_k"); });
    CHECK(dev.compiles() == 1);
    for (int t = 0; t < T; t++) CHECK(got[size_t(t)] == got[0]);
    CHECK(run_store(*got[0]) == 77);
    std::vector<int> errors(T, 0);
    together([&](int t) {
      try {
        dev.get_program("not a kernel in any language", "store_k");
      } catch (const Error&) {
        errors[size_t(t)]++;
      }
    });
    for (int t = 0; t < T; t++) CHECK(errors[size_t(t)] == 1);  // a failed compile is an error for every thread that asked
    CHECK(dev.compiles() >= 2);
  }
}

TEST_CASE("two kernels of one schedule with the same AST on different buffers are lowered and compiled once") {
  ScopedEnv off("CACHELEVEL", "0");  // no disk cache: every kernel the memory cache lacks is lowered
  Tensor a = Tensor::rand({1000}), b = Tensor::rand({1000});
  Tensor::realize_all({&a, &b});
  Tensor x = a.exp2() * 0.3125f + 7.0f, y = b.exp2() * 0.3125f + 7.0f;  // a kernel no other test compiles
  size_t before = kernels_lowered();
  Tensor::realize_all({&x, &y});
  CHECK(kernels_lowered() - before == 1);
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>(), xv = x.to_vector<float>(), yv = y.to_vector<float>();
  for (size_t i = 0; i < av.size(); i++) {
    CHECK(xv[i] == doctest::Approx(std::exp2(av[i]) * 0.3125f + 7.0f).epsilon(2e-7));  // float32: a few ulp
    CHECK(yv[i] == doctest::Approx(std::exp2(bv[i]) * 0.3125f + 7.0f).epsilon(2e-7));
  }
}

TEST_CASE("the CPU machine model comes from LLVM's target info for the host or TG_CPU") {
  MachineModel m = get_device("CPU").machine();
  CHECK(m.cores == get_device("CPU").threads());
  CHECK((m.vector_bits == 128 || m.vector_bits == 256 || m.vector_bits == 512));
  CHECK((m.vector_registers == 16 || m.vector_registers == 32));
  CHECK(m.cpu == cpu::cpu_target().cpu);
  CHECK(m.source == cpu::cpu_target().source);
  CHECK(device_info("CPU").find(m.cpu + " (" + m.source + "): " + m.isa) != std::string::npos);
  // AVX-512 code uses the full registers (LLVM's prefer-256-bit tuning is turned off)
  if (m.isa == "AVX-512") CHECK(m.vector_bits == 512);
  if (m.l1d_bytes > 0) CHECK(m.l1d_bytes >= 8 << 10);

  // A host feature map with AVX2 and FMA but no AVX-512 (an AMD Zen 3, say):
  std::map<std::string, bool> zen3;
  for (const char* f : {"sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi", "bmi2",
                        "lzcnt", "popcnt", "movbe", "xsave", "cx16", "aes", "pclmul", "adx", "sha", "rdrnd", "rdseed"})
    zen3[f] = true;
  for (const char* f : {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "amx-tile"}) zen3[f] = false;
  cpu::CpuTarget native = cpu::resolve_cpu_target("", &zen3);
  CHECK(native.source == "host");
  CHECK(native.features.find("+avx2") != std::string::npos);
  MachineModel nm = cpu::machine_model_of(native, 2);
  CHECK(nm.isa == "AVX2+FMA");
  CHECK(nm.vector_bits == 256);
  CHECK(nm.vector_registers == 16);

  cpu::CpuTarget hsw = cpu::resolve_cpu_target("haswell", &zen3);
  CHECK(hsw.cpu == "haswell");
  CHECK(hsw.source == "TG_CPU");
  CHECK(hsw.features.find("-avx512f") != std::string::npos);
  MachineModel hm = cpu::machine_model_of(hsw, 1);
  CHECK(hm.isa == "AVX2+FMA");
  CHECK(hm.vector_bits == 256);
  CHECK(hm.vector_registers == 16);
  CHECK(to_string(hm).find("haswell (TG_CPU): AVX2+FMA, 256-bit x 16 vector registers") == 0);
  // the vector FMA from LLVM's scheduling model of the CPU: Haswell's VFMADD231PS ymm, 5 cycles, two per cycle
  CHECK(hm.fma_source == "LLVM sched model");
  CHECK(hm.fma_latency == 5);
  CHECK(hm.fma_per_cycle == 2);
  CHECK(to_string(hm).find("FMA latency 5 x 2/cycle (LLVM sched model)") != std::string::npos);
  MachineModel z3 = cpu::machine_model_of(cpu::resolve_cpu_target("znver3", &zen3), 1);
  CHECK(z3.fma_latency == 4);  // Zen 3: 4 cycles, two per cycle
  CHECK(z3.fma_per_cycle == 2);

  MachineModel v2 = cpu::machine_model_of(cpu::resolve_cpu_target("x86-64-v2", &zen3), 1);
  CHECK(v2.isa == "SSE4.2");
  CHECK(v2.vector_bits == 128);
  CHECK(v2.fma_source == "default");  // no FMA instruction: nothing read

  // an AVX-512 CPU on a host without AVX-512, an unknown name: tg::EnvError naming the value and what is expected
  auto msg = [&](const std::string& cpu) {
    try {
      cpu::resolve_cpu_target(cpu, &zen3);
    } catch (const EnvError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e1 = msg("skylake-avx512");
  CHECK(e1.find("TG_CPU=skylake-avx512 needs") != std::string::npos);
  CHECK(e1.find("avx512f") != std::string::npos);
  std::string e2 = msg("pentium9000");
  CHECK(e2.find("TG_CPU=pentium9000 is not a CPU LLVM knows") != std::string::npos);
  CHECK(e2.find("haswell") != std::string::npos);  // the list of known names

  // With every feature the AVX-512 CPU needs, it resolves and uses 512-bit registers (not LLVM's 256-bit preference).
  std::map<std::string, bool> all = zen3;
  for (auto& [f, on] : all) on = true;
  for (const char* f : {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "clwb", "clflushopt", "pku", "xsavec",
                        "xsaveopt", "xsaves", "prfchw", "fsgsbase", "invpcid", "rtm", "sahf", "mmx", "fxsr", "cmov",
                        "cx8", "x87", "64bit", "crc32"})
    all[f] = true;
  MachineModel sk = cpu::machine_model_of(cpu::resolve_cpu_target("skylake-avx512", &all), 1);
  CHECK(sk.isa == "AVX-512");
  CHECK(sk.vector_bits == 512);
  CHECK(sk.vector_registers == 32);
  CHECK(sk.fma_latency == 4);  // VFMADD231PS zmm on Skylake-SP: 4 cycles, two per cycle (ports 0 and 5)
  CHECK(sk.fma_per_cycle == 2);
  // LLVM's own preference kept by a feature after the name: the model says what the code uses
  cpu::CpuTarget pref = cpu::resolve_cpu_target("skylake-avx512,+prefer-256-bit", &all);
  CHECK(pref.features.find("-prefer-256-bit") == std::string::npos);
  CHECK(cpu::machine_model_of(pref, 1).vector_bits == 256);
  CHECK(cpu::resolve_cpu_target("native,-avx512f", &all).source == "host+TG_CPU");
  CHECK(msg("haswell,avx2").find("'avx2' is not a feature") != std::string::npos);
  CHECK(msg("haswell,+avx512f").find("turns on avx512f, which this CPU") != std::string::npos);
}

TEST_CASE("cache sizes and the L3's sharing from recorded cpuid words") {
  using Words = std::map<std::pair<uint32_t, uint32_t>, std::array<uint32_t, 4>>;
  auto reader = [](const Words& w) {
    return [w](uint32_t leaf, uint32_t sub) {
      auto it = w.find({leaf, sub});
      return it == w.end() ? std::array<uint32_t, 4>{} : it->second;
    };
  };
  // a 2-CPU VM on an AMD EPYC Zen 5 host: leaf 0x8000001D zeroed, the legacy leaves give the socket's 508 MiB L3,
  // leaf 1 the package's 254 logical CPUs (the words this VM reads)
  Words vm = {{{0, 0}, {0xd, 0x68747541, 0x444d4163, 0x69746e65}},
              {{1, 0}, {0x00b00f21, 0xf2fe0800, 0xfed83203, 0x178bfbff}},
              {{0x80000000, 0}, {0x80000021, 0, 0, 0}},
              {{0x80000005, 0}, {0xff60ff40, 0xff60ff40, 0x300c0140, 0x20080140}},
              {{0x80000006, 0}, {0x40802040, 0x60804040, 0x04006140, 0x0fe09140}}};
  cpu::CpuidCaches c = cpu::caches_from_cpuid(reader(vm));
  CHECK(c.leaf == "0x80000006");
  CHECK(c.l1d_bytes == 48 << 10);
  CHECK(c.l2_bytes == 1 << 20);
  CHECK(c.l3_bytes == int64_t(508) << 20);
  CHECK(c.l3_sharing == 254);
  CHECK(cpu::cache_share(c.l3_bytes, c.l3_sharing, 2, 2 * c.l2_bytes) == 4 << 20);  // 2 MiB per CPU, as on the host

  // a Zen 3 (leaf 0x8000001D): L1d 32 KiB and L2 512 KiB per core (2 threads), L3 32 MiB shared by 16 threads
  Words zen3 = {{{0, 0}, {0x10, 0x68747541, 0x444d4163, 0x69746e65}},
                {{0x80000000, 0}, {0x80000023, 0, 0, 0}},
                {{0x8000001D, 0}, {0x00004121, 0x01c0003f, 0x3f, 0}},
                {{0x8000001D, 1}, {0x00004122, 0x01c0003f, 0x3f, 0}},
                {{0x8000001D, 2}, {0x00004143, 0x01c0003f, 0x3ff, 0}},
                {{0x8000001D, 3}, {0x0003c163, 0x03c0003f, 0x7fff, 0}}};
  c = cpu::caches_from_cpuid(reader(zen3));
  CHECK(c.leaf == "0x8000001d");
  CHECK(c.l1d_bytes == 32 << 10);
  CHECK(c.l2_bytes == 512 << 10);
  CHECK(c.l3_bytes == 32 << 20);
  CHECK(c.l3_sharing == 16);
  CHECK(cpu::cache_share(c.l3_bytes, c.l3_sharing, 2, 2 * c.l2_bytes) == 4 << 20);
  CHECK(cpu::cache_share(c.l3_bytes, c.l3_sharing, 32, 32 * c.l2_bytes) == 64 << 20);  // two CCXs' worth

  // an Intel server part (leaf 4): L3 105 MiB, sharing given as a power-of-two bound (128); 2 CPUs' proportion
  // (1.64 MiB) is below their own L2s (2 x 2 MiB), which is what they count on
  Words intel = {{{0, 0}, {0x20, 0x756e6547, 0x6c65746e, 0x49656e69}},
                 {{0x80000000, 0}, {0x80000008, 0, 0, 0}},
                 {{4, 0}, {0xfc004121, 0x02c0003f, 0x3f, 0}},
                 {{4, 1}, {0xfc004122, 0x01c0003f, 0x3f, 0}},
                 {{4, 2}, {0xfc004143, 0x03c0003f, 0x7ff, 0}},
                 {{4, 3}, {0xfc1fc163, 0x0380003f, 0x1bfff, 0}}};
  c = cpu::caches_from_cpuid(reader(intel));
  CHECK(c.leaf == "4");
  CHECK(c.l1d_bytes == 48 << 10);
  CHECK(c.l2_bytes == 2 << 20);
  CHECK(c.l3_bytes == 105 << 20);
  CHECK(c.l3_sharing == 128);
  CHECK(cpu::cache_share(c.l3_bytes, c.l3_sharing, 2, 2 * c.l2_bytes) == 4 << 20);
  CHECK(cpu::cache_share(c.l3_bytes, c.l3_sharing, 64, 0) == int64_t(105 << 20) / 2);
  CHECK(cpu::cache_share(c.l3_bytes, 0, 2, 0) == 105 << 20);  // sharing unknown: all of it
  CHECK(cpu::cache_share(0, 16, 2, 1 << 20) == 0);           // no L3

  // nothing reported: all zero
  CHECK(cpu::caches_from_cpuid(reader({})).leaf.empty());
  CHECK(cpu::caches_from_cpuid(reader({})).l3_bytes == 0);

  // the machine model line names the share
  MachineModel m;
  m.cpu = "znver5", m.source = "host", m.isa = "AVX-512", m.l1d_bytes = 48 << 10, m.l2_bytes = 1 << 20;
  m.l3_bytes = int64_t(508) << 20, m.l3_sharing = 254, m.cpus = 2, m.l3_share_bytes = 4 << 20, m.cache_source = "cpuid";
  CHECK(to_string(m).find("L1d 48 KiB, L2 1 MiB, L3 508 MiB (ours 4 MiB: 2 of 254 CPUs) (cpuid)") != std::string::npos);
  // and the host's model carries one, at least its CPUs' L2s, at most the L3 x its CPUs
  MachineModel h = get_device("CPU").machine();
  if (h.l3_bytes > 0 && h.l3_sharing > 0) {
    CHECK(h.l3_share_bytes >= h.l2_bytes * h.cpus);
    CHECK(h.l3_share_bytes <= std::max(h.l3_bytes * h.cpus, h.l2_bytes * h.cpus));
  }
}

TEST_CASE("opt_config sizes the optimiser from the device's machine model") {
  Device& d = get_device("CPU");
  OptConfig c = opt_config(d);
  MachineModel m = d.machine();
  CHECK(c.threads == d.threads());
  CHECK(c.vector_width == m.vector_bits / 32);
  CHECK(c.vector_registers == m.vector_registers);
  CHECK(c.l2_bytes == m.l2_bytes);
  // the last-level cache the optimiser sizes non-temporal stores by: this process's share of the L3
  if (m.l3_share_bytes > 0) CHECK(c.llc_bytes == m.l3_share_bytes);
  // FMA chains: (latency + 1) x FMAs per cycle (Zen 5's zmm in LLVM's model: (4 + 1) x 1; Haswell's ymm: (5 + 1) x 2)
  CHECK(c.fma_chains == int(std::lround((m.fma_latency + 1) * m.fma_per_cycle)));
}

TEST_CASE("the machine model's row prefetch: measured once on the host and kept, or set by ROW_PREFETCH") {
  const cpu::CpuTarget& t = cpu::cpu_target();
  {
    ScopedEnv e("ROW_PREFETCH", "1");
    MachineModel m = cpu::machine_model_of(t, 2);
    CHECK(m.row_prefetch);
    CHECK(m.row_prefetch_source == "ROW_PREFETCH");
    CHECK(to_string(m).find(", row prefetch yes (ROW_PREFETCH)") != std::string::npos);
  }
  {
    ScopedEnv e("ROW_PREFETCH", "0");
    MachineModel m = cpu::machine_model_of(t, 2);
    CHECK(!m.row_prefetch);
    CHECK(to_string(m).find(", row prefetch no (ROW_PREFETCH)") != std::string::npos);
  }
  {
    ScopedEnv e("ROW_PREFETCH", "2");
    CHECK_THROWS_WITH_AS(cpu::machine_model_of(t, 2), doctest::Contains("ROW_PREFETCH"), EnvError);
  }
  // unset: measured (x86), then answered from memory (the same decision, though memory speed varies run to run)
  ScopedEnv e("ROW_PREFETCH", "");
  MachineModel a = cpu::machine_model_of(t, 2);
#if defined(__x86_64__)
  CHECK(a.row_prefetch_source == "measured");
#endif
  for (int i = 0; i < 3; i++) CHECK(cpu::machine_model_of(t, 2).row_prefetch == a.row_prefetch);
  CHECK(opt_config(get_device("CPU")).row_prefetch == get_device("CPU").machine().row_prefetch);
}

TEST_CASE("the machine model's FMA issue rate: LLVM's or twice it, measured once on the host, or set by FMA_RATE") {
  const cpu::CpuTarget& t = cpu::cpu_target();
  MachineModel llvm_only;
  {
    ScopedEnv e("FMA_RATE", "2");
    MachineModel m = cpu::machine_model_of(t, 2);
    llvm_only = m;
    if (m.fma_source == "LLVM sched model" && m.vector_bits >= 256) {
      CHECK(m.fma_measured_source == "FMA_RATE");
      CHECK(m.fma_measured_per_cycle == 2 * m.fma_per_cycle);
      char want[64];
      std::snprintf(want, sizeof want, ", FMA issue %g/cycle (FMA_RATE)", 2 * m.fma_per_cycle);
      CHECK(to_string(m).find(want) != std::string::npos);
    }
  }
  {
    ScopedEnv e("FMA_RATE", "3");
    CHECK_THROWS_WITH_AS(cpu::machine_model_of(t, 2), doctest::Contains("FMA_RATE"), EnvError);
  }
  // unset: measured where the host runs the model's vectors (x86 with FMA), then answered from memory
  ScopedEnv e("FMA_RATE", "");
  MachineModel a = cpu::machine_model_of(t, 2);
#if defined(__x86_64__)
  if (a.fma_source == "LLVM sched model" && a.vector_bits >= 256) {
    CHECK(a.fma_measured_source == "measured");
    CHECK((a.fma_measured_per_cycle == a.fma_per_cycle || a.fma_measured_per_cycle == 2 * a.fma_per_cycle));
    // the probe itself: an issue rate near LLVM's or twice it (Zen 4's 512-bit FMA measured 1.00/cycle, its 256-bit
    // one 2.0 by Zen 4's latency of 4, 1.6 by Haswell's 5), not a figure off by the clock
    const double rate = cpu::fma_rate_measured(a.vector_bits >= 512 ? 16 : 8, a.fma_latency);
    CHECK(rate > 0.6 * a.fma_per_cycle);
    CHECK(rate < 2.6 * a.fma_per_cycle);
  }
#endif
  for (int i = 0; i < 3; i++) CHECK(cpu::machine_model_of(t, 2).fma_measured_per_cycle == a.fma_measured_per_cycle);
  CHECK(llvm_only.fma_per_cycle == a.fma_per_cycle);  // LLVM's own figure (the register tile's) stays as it was
}

TEST_CASE("TG_PROCESS_REPLAY records each compiled kernel's key, opts and source as a JSON line") {
  TempDir dir;
  Tensor a = Tensor::arange(0, 331, 1).cast(dtypes::float32);
  a.realize();
  Tensor b = a * 3.0f + 1.0f;  // a kernel no other test compiles
  {
    ScopedEnv rec("TG_PROCESS_REPLAY", dir.path.string());
    b.realize();
  }
  std::string lines;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    CHECK(e.path().filename().string() == std::to_string(getpid()) + ".jsonl");
    std::ifstream f(e.path());
    lines += std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  REQUIRE(std::count(lines.begin(), lines.end(), '\n') == 1);  // one kernel
  CHECK(lines.find("\"device\":\"CPU\"") != std::string::npos);
  CHECK(lines.find("\"name\":\"E_331\"") != std::string::npos);
  CHECK(lines.find("\"opts\":\"Opt(UPCAST") == std::string::npos);  // 331 is prime: no split divides it
  CHECK(lines.find("define void @E_331") != std::string::npos);      // the LLVM source
  CHECK(lines.find("\"key\":\"") != std::string::npos);
  CHECK(std::vector<float>(b.to_vector<float>())[330] == 991.0f);
}

// Runs the program-cache child with its kernel cache in `dir` and the extra environment `env`; its output. (Not
// under a process-replay capture of this suite: recording every compile turns the disk cache off.)
static std::string run_cache_child(const fs::path& dir, const std::string& env) {
  std::string cmd = "env -u TG_PROCESS_REPLAY TG_CACHE_DIR='" + dir.string() + "' " + env + " '" TG_PROGRAM_CACHE_CHILD "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  CHECK(pclose(p) == 0);
  return out;
}

TEST_CASE("a kernel lowered in one process is loaded from the disk cache by the next, without lowering") {
  TempDir dir;
  auto run_child = [&](const std::string& env) { return run_cache_child(dir.path, env); };
  auto lowered = [](const std::string& out) {
    auto at = out.find("lowered=");
    REQUIRE(at != std::string::npos);
    return std::stoul(out.substr(at + 8));
  };
  // sum over i < 37 of 2.5 i + 1 = 2.5 * 666 + 37
  std::string first = run_child(""), second = run_child("");
  CHECK(first.find("value=1702.000") != std::string::npos);
  CHECK(second.find("value=1702.000") != std::string::npos);
  CHECK(lowered(first) >= 1);
  CHECK(lowered(second) == 0);
  size_t progs = 0;
  for (auto& e : fs::directory_iterator(dir.path / "kernels")) progs += e.path().filename().string().rfind("prog-", 0) == 0;
  CHECK(progs == lowered(first));
  // A knob lowering reads is part of the key: NOOPT=1 lowers afresh; CACHELEVEL=0 neither reads nor writes.
  CHECK(lowered(run_child("NOOPT=1")) >= 1);
  CHECK(lowered(run_child("CACHELEVEL=0")) >= 1);
}

TEST_CASE("a valid disk-cache entry under another key is not used, and the repair warns once") {
  TempDir dir;
  auto run_child = [&](const std::string& env) { return run_cache_child(dir.path, env); };
  auto count = [](const std::string& s, const std::string& part) {
    size_t n = 0;
    for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) n++;
    return n;
  };
  CHECK(count(run_child(""), "warning") == 0);
  run_child("TG_CPU=x86-64-v3");  // the same sum for AVX2: other keys, entries of the same kinds
  std::vector<fs::path> progs, bins;
  for (auto& e : fs::directory_iterator(dir.path / "kernels"))
    (e.path().filename().string().rfind("prog-", 0) == 0 ? progs : bins).push_back(e.path());
  REQUIRE(progs.size() == 2);
  REQUIRE(bins.size() >= 2);
  auto swap_files = [](const fs::path& a, const fs::path& b) {
    fs::path t = a;
    t += ".swap";
    fs::rename(a, t);
    fs::rename(b, a);
    fs::rename(t, b);
  };
  swap_files(progs[0], progs[1]);
  swap_files(bins[0], bins[1]);
  std::string out = run_child("");
  CAPTURE(out);
  CHECK(out.find("value=1702.000") != std::string::npos);
  CHECK(out.find("lowered=0") == std::string::npos);  // the swapped entries were refused and rebuilt
  CHECK(count(out, "tg: warning: the kernel cache entry") == 1);
  CHECK(count(run_child(""), "warning") == 0);  // repaired
  // a corrupt entry (its last byte flipped: the checksum no longer matches) is rebuilt with one warning too
  for (auto& e : fs::directory_iterator(dir.path / "kernels")) {
    std::fstream s(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(-1, std::ios::end);
    char last = 0;
    s.get(last);
    s.seekp(-1, std::ios::end);
    s.put(char(last ^ 0x5a));
  }
  out = run_child("");
  CHECK(out.find("value=1702.000") != std::string::npos);
  CHECK(count(out, "tg: warning: the kernel cache entry") == 1);
  CHECK(count(out, "is corrupt (its checksum does not match)") == 1);
  CHECK(count(run_child(""), "warning") == 0);
}

TEST_CASE("SPEC=1 accepts optimised reductions: the index dtype lowering is checked on its result") {
  TempDir dir;
  std::string cmd = "TG_CACHE_DIR='" + dir.path.string() + "' SPEC=1 '" TG_PROGRAM_CACHE_CHILD "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  CAPTURE(out);
  CHECK(pclose(p) == 0);
  CHECK(out.find("value=1702.000") != std::string::npos);  // sum over i < 37 of 2.5 i + 1
}
