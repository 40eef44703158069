// Concurrent realize (issue 24): 4 threads x 1000 realizes of independent small graphs (a fresh input, an
// elementwise op and a sum, a second output, a host read) against the same 4000 realizes on one thread, in the same
// run. Realize holds a process-wide lock (tg/tensor.hpp), so the ratio to expect is about 1 (no speedup); a
// convoy or a collapse shows as a ratio far above 1 and as a spread between rounds (one report saw 1.4 s and 46.8 s).
// Prints each round, the slowest round's ratio and one JSON line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "tg/tensor.hpp"

using namespace tg;
using clk = std::chrono::steady_clock;

namespace {

double run(int threads, int per) {
  std::vector<Tensor> w;
  for (int t = 0; t < threads; t++) w.push_back(Tensor::rand({4}).realize());
  auto t0 = clk::now();
  std::vector<std::thread> th;
  for (int t = 0; t < threads; t++)
    th.emplace_back([&, t] {
      for (int i = 0; i < per; i++) {
        Tensor x = Tensor::from_vector(std::vector<float>{float(i), float(t), 1, 1});
        Tensor y = Tensor(x * w[size_t(t)] + 1.f).sum();
        Tensor ones = Tensor(Tensor::ones({4}) * 3.f).contiguous();
        Tensor::realize_all({&y, &ones});
        (void)y.item<float>();
      }
    });
  for (auto& x : th) x.join();
  return std::chrono::duration<double>(clk::now() - t0).count();
}

}  // namespace

int main() {
  run(1, 50);  // compile once
  const int kRounds = 5;
  double worst_one = 0, worst_four = 0, sum_one = 0, sum_four = 0;
  for (int r = 0; r < kRounds; r++) {
    double one = run(1, 4000), four = run(4, 1000);
    std::printf("threads: round %d: 1 thread x 4000 realizes %.3f s, 4 threads x 1000 %.3f s (ratio %.2f)\n", r, one,
                four, four / one);
    worst_one = std::max(worst_one, one), worst_four = std::max(worst_four, four);
    sum_one += one, sum_four += four;
  }
  std::printf("threads: slowest round 4 threads %.3f s, 1 thread %.3f s; mean ratio %.2f\n", worst_four, worst_one,
              sum_four / sum_one);
  std::printf("{\"case\": \"realize_4_threads_x_1000\", \"variant\": \"default\", \"tg_ms\": %.3f, \"peer\": "
              "\"one_thread\", \"peer_ms\": %.3f, \"speedup\": %.3f}\n",
              sum_four / kRounds * 1e3, sum_one / kRounds * 1e3, sum_one / sum_four);
  return 0;
}
