// The CPU's measured fp32 FMA peak: a hand-written loop of independent vector FMAs (AVX-512 where the CPU has it,
// else AVX2+FMA), on one thread and on every CPU this process may use, best of several runs. The physical limit
// the matmul and conv numbers are read against. Prints a line and one JSON record.
#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <string>
#include <cstdio>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "tg/device.hpp"

namespace {

constexpr long kIters = 20'000'000;
constexpr int kAcc = 12;  // independent chains: covers 2 FMA ports x 4 cycles of latency, with room to spare

// Returns a value that depends on every accumulator, so the loop is not removed.
__attribute__((target("avx512f"))) float fma_loop_512(long iters) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; i++) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long n = 0; n < iters; n++)
    for (int i = 0; i < kAcc; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < kAcc; i++) s = _mm512_add_ps(s, acc[i]);
  float out[16];  // not _mm512_reduce_add_ps: g++ 12's header trips -Wuninitialized at -O3
  _mm512_storeu_ps(out, s);
  float t = 0;
  for (float x : out) t += x;
  return t;
}

__attribute__((target("avx2,fma"))) float fma_loop_256(long iters) {
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; i++) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long n = 0; n < iters; n++)
    for (int i = 0; i < kAcc; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < kAcc; i++) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

volatile float g_sink;

// GFLOPS of `threads` threads each running the loop once (best of 5).
double gflops(int threads, bool avx512) {
  int lanes = avx512 ? 16 : 8;
  double ms = bench::best_ms([&] {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++)
      ts.emplace_back([&] { g_sink = avx512 ? fma_loop_512(kIters) : fma_loop_256(kIters); });
    for (auto& t : ts) t.join();
  }, 5);
  return double(threads) * double(kIters) * kAcc * lanes * 2 / ms / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  // --model: tg's machine model of the CPU (the host's, or TG_CPU's), one line, for bench/run
  std::string model = tg::device_info("CPU");
  if (argc > 1 && std::string(argv[1]) == "--model") {
    std::printf("%s\n", model.c_str());
    return 0;
  }
  std::printf("tg machine model: %s\n", model.c_str());
  __builtin_cpu_init();
  // the ISA tg compiles for: under TG_CPU=haswell on an AVX-512 machine, the AVX2 peak is the limit
  bool avx512 = __builtin_cpu_supports("avx512f") && model.find("AVX-512") != std::string::npos;
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    std::printf("FMA peak: the CPU has neither AVX-512 nor AVX2+FMA; not measured\n");
    return 0;
  }
  cpu_set_t set;
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
  double one = gflops(1, avx512), all = gflops(n, avx512);
  std::printf("FMA peak (%s, fp32): %.1f GFLOPS on 1 thread, %.1f GFLOPS on %d threads\n", avx512 ? "AVX-512" : "AVX2",
              one, all, n);
  std::printf("{\"case\": \"fma_peak_f32\", \"variant\": \"default\", \"gflops_1thread\": %.2f, \"gflops\": %.2f, "
              "\"threads\": %d, \"isa\": \"%s\"}\n",
              one, all, n, avx512 ? "avx512" : "avx2");
  return 0;
}
