// Memory-bound kernels against the machine's measured bandwidth, in the same run: a best-effort STREAM triad
// (bench/triad.hpp: a[i] = b[i] + s*c[i] on the threads tg uses, vector code, both store kinds) gives the reference
// GB/s; tg's elementwise add of 2^24 floats (and a mul, a relu of an add, an a + b*c and a cast to float16), softmax
// and layernorm over (4096, 4096), a 4096^2 transpose and an NCHW -> NHWC copy are timed (best of several, compile
// excluded) and their bytes moved (each input read once, the output written once) divided by the time. Each case
// runs alternately with the triad, each side twice a round (bench::interleaved), and each is judged against the
// triad's best in its own window: on this VM the triad's best moves from one minute to the next.
// Each case is also judged against a stream with its own mix of reads and writes (bench/triad.hpp: float arrays
// read, one array written as the case writes it), run in the same rounds: the triad reads two bytes for each one it
// writes, softmax, layernorm and the copies one, a cast to float16 two for one: on a machine whose writes cost more
// than its reads the triad alone overstates what those can reach.
// Prints a table and one JSON object per case (see bench/run).
#include <cstdio>
#include <functional>
#include <vector>

#include "bench_util.hpp"
#include "tg/tensor.hpp"
#include "triad.hpp"

using namespace tg;

int main() {
  bench::LoadReport load;
  const size_t n = size_t(1) << 24;
  bench::Triad tri;
  double triad_ms = tri.best_ms(10);
  tri.check();
  std::printf("triad (%s): %.3f ms, %.1f GB/s on its own (ordinary stores %.1f, non-temporal %.1f); measured again "
              "beside each case\n", tri.describe().c_str(), triad_ms, tri.gbs(triad_ms), tri.best_gbs(false),
              tri.best_gbs(true));
  auto triad_gbs = [&](double ms) { return tri.gbs(ms); };

  // reads: the float arrays the case reads; half: it writes float16
  auto run = [&](const char* name, const std::function<void()>& f, double bytes, int reads, bool half) {
    f();  // compile
    bench::Triad mix(n, reads, half);
    bench::Rounds r = bench::interleaved(tri, {f}, 15, &mix);
    mix.check();
    double tg_ms = r.best(0), gbs = bytes / tg_ms / 1e6, peer_gbs = triad_gbs(r.triad_ms), mix_gbs = mix.gbs(r.mix_ms);
    std::printf("%-22s tg %8.3f ms %7.1f GB/s   bandwidth %7.1f GB/s   tg/bandwidth %.2f   same mix (%d read, %s) %7.1f GB/s   tg/mix %.2f\n",
                name, tg_ms, gbs, peer_gbs, gbs / peer_gbs, reads, half ? "float16" : "float32", mix_gbs, gbs / mix_gbs);
    bench::json(name, "default", tg_ms, "bandwidth", bytes / peer_gbs / 1e6);
    bench::json(name, "default", tg_ms, "same_mix", bytes / mix_gbs / 1e6);
  };

  Tensor x = Tensor::rand({int64_t(n)}), y = Tensor::rand({int64_t(n)}), z = Tensor::rand({int64_t(n)});
  x.realize(), y.realize(), z.realize();
  run("add_f32_2^24", [&] { Tensor(x + y).realize(); }, 3.0 * 4.0 * double(n), 2, false);
  // other elementwise kernels that only stream memory: their bytes as the add's (inputs once, the output once)
  run("mul_f32_2^24", [&] { Tensor(x * y).realize(); }, 3.0 * 4.0 * double(n), 2, false);
  run("relu_add_f32_2^24", [&] { (x + y).relu().realize(); }, 3.0 * 4.0 * double(n), 2, false);
  run("fma_f32_2^24", [&] { Tensor(x + y * z).realize(); }, 4.0 * 4.0 * double(n), 3, false);
  run("cast_f32_f16_2^24", [&] { x.cast(dtypes::float16).realize(); }, (4.0 + 2.0) * double(n), 1, true);

  Tensor m = Tensor::rand({4096, 4096});
  m.realize();
  run("softmax_4096x4096", [&] { m.softmax(-1).realize(); }, 2.0 * 4.0 * 4096.0 * 4096.0, 1, false);
  run("layernorm_4096x4096", [&] { m.layer_norm({4096}).realize(); }, 2.0 * 4.0 * 4096.0 * 4096.0, 1, false);
  // transposes: a matrix's .T made contiguous, and a convolution's NCHW activation copied channels-last
  run("transpose_4096x4096", [&] { m.T().contiguous().realize(); }, 2.0 * 4.0 * 4096.0 * 4096.0, 1, false);
  Tensor act = Tensor::rand({64, 64, 56, 56});
  act.realize();
  run("nchw_nhwc_64x64x56x56", [&] { act.permute({0, 2, 3, 1}).contiguous().realize(); }, 2.0 * 4.0 * double(act.numel()), 1, false);
  return 0;
}
