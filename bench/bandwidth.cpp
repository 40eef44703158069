// Memory-bound kernels against the machine's measured bandwidth, in the same run: a STREAM-like triad
// (a[i] = b[i] + s*c[i], plain C++ on the same threads tg uses) gives the reference GB/s; tg's elementwise add of
// 2^24 floats, softmax and layernorm over (4096, 4096) are timed (best of several, compile excluded) and their
// bytes moved (each input read once, the output written once) divided by the time. Prints a table and one JSON
// object per case (see bench/run).
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "tg/tensor.hpp"

using namespace tg;
using clk = std::chrono::steady_clock;

namespace {

double best_ms(const std::function<void()>& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    auto t = clk::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(clk::now() - t).count());
  }
  return best;
}

void report(const char* name, double tg_ms, double bytes, double peer_gbs) {
  double gbs = bytes / tg_ms / 1e6, peer_ms = bytes / peer_gbs / 1e6;
  std::printf("%-22s tg %8.3f ms %7.1f GB/s   bandwidth %7.1f GB/s   tg/bandwidth %.2f\n", name, tg_ms, gbs, peer_gbs,
              gbs / peer_gbs);
  std::printf("{\"case\": \"%s\", \"variant\": \"default\", \"tg_ms\": %.4f, \"peer\": \"bandwidth\", \"peer_ms\": %.4f, "
              "\"speedup\": %.3f}\n",
              name, tg_ms, peer_ms, peer_ms / tg_ms);
}

}  // namespace

int main() {
  const size_t n = size_t(1) << 24;
  // The reference: a triad over three 64 MiB arrays, split in blocks over the threads.
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  double triad_ms = best_ms([&] {
    tbb::parallel_for(size_t(0), n, size_t(1) << 16, [&](size_t i) {
      size_t e = std::min(n, i + (size_t(1) << 16));
      for (size_t k = i; k < e; k++) a[k] = b[k] + 3.0f * c[k];
    });
  }, 10);
  // parallel_for with a step visits block starts; the loop above covers each block once.
  double bw = 3.0 * 4.0 * double(n) / triad_ms / 1e6;
  std::printf("triad (2^24 floats, 3 arrays): %.3f ms, %.1f GB/s\n", triad_ms, bw);

  Tensor x = Tensor::rand({int64_t(n)}), y = Tensor::rand({int64_t(n)});
  x.realize(), y.realize();
  auto add = [&] { Tensor(x + y).realize(); };
  add();
  report("add_f32_2^24", best_ms(add, 10), 3.0 * 4.0 * double(n), bw);

  Tensor m = Tensor::rand({4096, 4096});
  m.realize();
  auto sm = [&] { m.softmax(-1).realize(); };
  sm();
  report("softmax_4096x4096", best_ms(sm, 5), 2.0 * 4.0 * 4096.0 * 4096.0, bw);
  auto ln = [&] { m.layer_norm({4096}).realize(); };
  ln();
  report("layernorm_4096x4096", best_ms(ln, 5), 2.0 * 4.0 * 4096.0 * 4096.0, bw);
  return 0;
}
