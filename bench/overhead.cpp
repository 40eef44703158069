// Dispatch overhead: µs per realize() of a small elementwise op once the kernel cache hits, ms for the first
// realize of a kernel never seen before (schedule + lower + compile + run), and µs per kernel of a TinyJit replay
// (a step of 64 tiny dependent kernels; their own run time, well under a µs each, is included).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tg/jit.hpp"
#include "tg/tensor.hpp"

using namespace tg;
using clk = std::chrono::steady_clock;

int main() {
  setenv("CACHELEVEL", "0", 1);  // measure real compiles, not the disk cache
  auto a = Tensor::rand({64}), b = Tensor::rand({64});
  a.realize();
  b.realize();
  // First time: a new kernel each round (a different constant makes a different kernel).
  double first = 0;
  const int kNew = 10;
  for (int i = 0; i < kNew; i++) {
    auto t = clk::now();
    Tensor c = a * b + double(1000 + i);
    c.realize();
    first += std::chrono::duration<double, std::milli>(clk::now() - t).count();
  }
  // Cached: the same program again and again.
  const int kRuns = 2000;
  for (int i = 0; i < 50; i++) Tensor(a * b + 1.0).realize();
  auto t = clk::now();
  for (int i = 0; i < kRuns; i++) {
    Tensor c = a * b + 1.0;
    c.realize();
  }
  double us = std::chrono::duration<double, std::micro>(clk::now() - t).count() / kRuns;
  std::printf("overhead: %.1f us per cached realize of a*b+1 (64 floats); %.1f ms for a new kernel (mean of %d)\n", us,
              first / kNew, kNew);
  // against the target of 20 us per cached realize (peer "target": speedup above 1 meets it)
  std::printf("{\"case\": \"realize_cached_small\", \"variant\": \"default\", \"tg_ms\": %.5f, \"peer\": \"target\", "
              "\"peer_ms\": 0.02, \"speedup\": %.3f}\n",
              us / 1e3, 20.0 / us);
  // TinyJit: 64 kernels per call, each realised before the next (separate kernels), replayed.
  const int kKernels = 64;
  TinyJit step([&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    Tensor x = in[0];
    for (int k = 0; k < kKernels; k++) {
      x = Tensor(x * 1.0001 + 0.5);
      x.realize();
    }
    return {x};
  });
  for (int i = 0; i < 5; i++) step({a});
  if (!step.replaying() || step.captured_kernels() != size_t(kKernels)) {
    std::fprintf(stderr, "overhead: the JIT captured %zu kernels, expected %d\n", step.captured_kernels(), kKernels);
    return 1;
  }
  const int kReplays = 500;
  auto tj = clk::now();
  for (int i = 0; i < kReplays; i++) step({a});
  double per_kernel = std::chrono::duration<double, std::micro>(clk::now() - tj).count() / kReplays / kKernels;
  // the replays computed: a fresh input through the replay matches the same chain run eagerly
  Tensor fresh = Tensor::rand({64});
  fresh.realize();
  std::vector<float> got = step({fresh})[0].to_vector<float>(), want = fresh.to_vector<float>();
  for (float& w : want)
    for (int k = 0; k < kKernels; k++) w = w * 1.0001f + 0.5f;
  for (size_t i = 0; i < want.size(); i++)
    if (std::abs(got[i] - want[i]) > 1e-4f * std::abs(want[i])) {
      std::fprintf(stderr, "overhead: the replay computed %g, expected %g\n", double(got[i]), double(want[i]));
      return 1;
    }
  std::printf("overhead: %.2f us per kernel of a TinyJit replay (%d tiny kernels per step)\n", per_kernel, kKernels);
  std::printf("{\"case\": \"jit_replay_per_kernel\", \"variant\": \"default\", \"tg_ms\": %.6f, \"peer\": \"target\", "
              "\"peer_ms\": 0.005, \"speedup\": %.3f}\n",
              per_kernel / 1e3, 5.0 / per_kernel);
  return 0;
}
