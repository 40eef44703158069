// The NVRTC compile check (see nvrtc_check.hpp): lower each AST with the CUDA renderer, compile once per distinct
// source for each architecture, count and keep the first errors.
#include "nvrtc_check.hpp"

#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "../backends/cuda/cuda.hpp"
#include "tg/codegen.hpp"
#include "tg/device.hpp"
#include "tg/render.hpp"
#include "tg/schedule.hpp"

namespace tg::test {

namespace {

constexpr int kArchs[] = {80, 90};

struct State {
  std::mutex mu;
  std::set<size_t> seen;  // hashes of the rendered sources
  std::vector<std::string> errors;
  std::atomic<int> kernels{0}, compiles{0}, cached{0}, failures{0};
  std::atomic<int64_t> us{0};
  std::unique_ptr<Renderer> renderer = make_cuda_renderer(90);
  std::vector<std::unique_ptr<Compiler>> compilers;
};

State& state() {
  static State* s = new State;
  return *s;
}

void fail(State& s, const std::string& what) {
  s.failures++;
  std::lock_guard lk(s.mu);
  if (s.errors.size() < 5) s.errors.push_back(what);
}

void check_kernel(const UOpRef& ast, const std::string& name) {
  State& s = state();
  std::string src;
  try {
    src = lower_kernel(ast, name, *s.renderer).src;
  } catch (const Error& e) {
    fail(s, "render " + name + ": " + e.what());
    return;
  }
  {
    std::lock_guard lk(s.mu);
    if (!s.seen.insert(std::hash<std::string>()(src)).second) return;
  }
  s.kernels++;
  auto t0 = std::chrono::steady_clock::now();
  for (auto& c : s.compilers) {
    // A source that compiled before with the same compiler is not compiled again (tg's disk cache, shared by the
    // suites and by later runs; CACHELEVEL=0 turns it off). Only successes are recorded.
    std::string id = c->id() + "\n" + src;
    XXH128_hash_t h = XXH3_128bits(id.data(), id.size());
    char key[48];
    std::snprintf(key, sizeof key, "nvrtc-ok-%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    std::vector<uint8_t> hit;
    if (disk_cache_get(key, hit)) {
      s.cached++;
      continue;
    }
    try {
      c->compile(src, name);
      s.compiles++;
      disk_cache_put(key, {1});
    } catch (const Error& e) {
      fail(s, c->id() + ": " + e.what());
    }
  }
  s.us += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void install_nvrtc_check() {
  State& s = state();
  for (int sm : kArchs) s.compilers.push_back(cuda::make_nvrtc_compiler(sm, true));  // throws without NVRTC
  set_kernel_compile_hook(check_kernel);
}

int nvrtc_check_report() {
  State& s = state();
  set_kernel_compile_hook({});
  std::lock_guard lk(s.mu);
  std::printf("nvrtc check (NVRTC %s): %d kernels rendered for CUDA; for sm_80 and sm_90: %d compiled (%.1f s of "
              "compile threads), %d known good from the cache, %d failed\n",
              cuda::nvrtc_version().c_str(), s.kernels.load(), s.compiles.load(), double(s.us.load()) / 1e6,
              s.cached.load(), s.failures.load());
  for (const std::string& e : s.errors) std::printf("---\n%s\n", e.c_str());
  return s.failures.load();
}

bool nvrtc_check_from_env() {
  const char* nv = std::getenv("TG_NVRTC_CHECK");
  if (!nv || std::atoi(nv) <= 0) return false;
  install_nvrtc_check();
  return true;
}

int nvrtc_check_exit(bool on, int rc) {
  if (on && nvrtc_check_report() > 0) return rc ? rc : 1;
  return rc;
}

}  // namespace tg::test
