// Memory-bound kernels against the machine's measured bandwidth, in the same run: a STREAM-like triad
// (a[i] = b[i] + s*c[i], plain C++ on the same threads tg uses) gives the reference GB/s; tg's elementwise add of
// 2^24 floats, softmax and layernorm over (4096, 4096) are timed (best of several, compile excluded) and their
// bytes moved (each input read once, the output written once) divided by the time. Each case runs alternately with
// the triad, and each is judged against the triad's best in its own window: on this VM the triad's best of ten
// moved between 54 and 83 GB/s from one minute to the next. Prints a table and one JSON object per case (see
// bench/run).
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench_util.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {

// Best times of a case and of the triad, run alternately.
struct Pair {
  double tg_ms = 1e30, triad_ms = 1e30;
};
Pair interleaved(const std::function<void()>& f, const std::function<void()>& triad, int reps) {
  Pair p;
  for (int r = 0; r < reps; r++) {
    p.triad_ms = std::min(p.triad_ms, bench::best_ms(triad, 1));
    p.tg_ms = std::min(p.tg_ms, bench::best_ms(f, 1));
  }
  return p;
}

}  // namespace

int main() {
  bench::LoadReport load;
  const size_t n = size_t(1) << 24;
  // The reference: a triad over three 64 MiB arrays, split in blocks over the threads.
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  auto triad = [&] {
    tbb::parallel_for(size_t(0), n, size_t(1) << 16, [&](size_t i) {
      size_t e = std::min(n, i + (size_t(1) << 16));
      for (size_t k = i; k < e; k++) a[k] = b[k] + 3.0f * c[k];
    });
  };
  // parallel_for with a step visits block starts; the loop above covers each block once.
  auto triad_gbs = [&](double ms) { return 3.0 * 4.0 * double(n) / ms / 1e6; };
  double triad_ms = bench::best_ms(triad, 10);
  std::printf("triad (2^24 floats, 3 arrays): %.3f ms, %.1f GB/s on its own; measured again beside each case\n",
              triad_ms, triad_gbs(triad_ms));

  auto run = [&](const char* name, const std::function<void()>& f, double bytes) {
    f();  // compile
    Pair p = interleaved(f, triad, 15);
    double gbs = bytes / p.tg_ms / 1e6, peer_gbs = triad_gbs(p.triad_ms);
    std::printf("%-22s tg %8.3f ms %7.1f GB/s   bandwidth %7.1f GB/s   tg/bandwidth %.2f\n", name, p.tg_ms, gbs,
                peer_gbs, gbs / peer_gbs);
    bench::json(name, "default", p.tg_ms, "bandwidth", bytes / peer_gbs / 1e6);
  };

  Tensor x = Tensor::rand({int64_t(n)}), y = Tensor::rand({int64_t(n)});
  x.realize(), y.realize();
  run("add_f32_2^24", [&] { Tensor(x + y).realize(); }, 3.0 * 4.0 * double(n));

  Tensor m = Tensor::rand({4096, 4096});
  m.realize();
  run("softmax_4096x4096", [&] { m.softmax(-1).realize(); }, 2.0 * 4.0 * 4096.0 * 4096.0);
  run("layernorm_4096x4096", [&] { m.layer_norm({4096}).realize(); }, 2.0 * 4.0 * 4096.0 * 4096.0);
  return 0;
}
