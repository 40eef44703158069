// tinygrad's README example: N=1024; (a.reshape(N,1,N) * b.T.reshape(1,N,N)).sum(2), one fused kernel.
// Checks a few entries against a plain triple loop. Run with DEBUG=2 to see the kernel line.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

int main(int argc, char** argv) {
  using namespace tg;
  int64_t N = argc > 1 ? std::atoll(argv[1]) : 1024;
  Tensor::manual_seed(0);
  // a and b from rand: one kernel makes both (two views of one buffer); the matmul is the second kernel.
  Tensor ab = Tensor::rand({2, N, N});
  ab.realize();
  Tensor a = ab.shrink({{0, 1}, {0, N}, {0, N}}).reshape({N, N});
  Tensor b = ab.shrink({{1, 2}, {0, N}, {0, N}}).reshape({N, N});
  size_t k0 = kernels_run();
  auto t0 = std::chrono::steady_clock::now();
  Tensor c = (a.reshape({N, 1, N}) * b.T().reshape({1, N, N})).sum(2);
  c.realize();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  size_t kernels = kernels_run() - k0;
  auto abv = ab.to_vector<float>(), cv = c.to_vector<float>();  // ab is already a buffer: no kernel
  std::vector<float> av(abv.begin(), abv.begin() + N * N), bv(abv.begin() + N * N, abv.end());
  int bad = 0;
  for (int64_t t = 0; t < 16; t++) {
    int64_t i = (t * 7919) % N, j = (t * 104729) % N;
    double s = 0;
    for (int64_t k = 0; k < N; k++) s += double(av[size_t(i * N + k)]) * double(bv[size_t(k * N + j)]);
    if (std::abs(s - double(cv[size_t(i * N + j)])) > 1e-4 * std::abs(s) + 1e-3) bad++;
  }
  std::printf("matmul N=%lld: %zu kernel(s), %.1f ms (compile included), %.2f GFLOPS, check %s\n", (long long)N,
              kernels, ms, 2.0 * double(N) * double(N) * double(N) / ms / 1e6, bad ? "FAILED" : "ok (16 entries)");
  return bad ? 1 : 0;
}
