// Matmul GFLOPS: tg's generated kernel for (a.reshape(N,1,N) * b.T.reshape(1,N,N)).sum(2) against
// OpenBLAS sgemm in the same run. Run through bench/run, which sets OPENBLAS_CORETYPE for the peer.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "tg/tensor.hpp"

extern "C" char* openblas_get_corename(void);

using namespace tg;
using clk = std::chrono::steady_clock;

template <class F>
static double best_ms(F&& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    auto t = clk::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(clk::now() - t).count());
  }
  return best;
}

int main() {
  std::printf("OpenBLAS core: %s\n", openblas_get_corename());
  for (int64_t N : {256, 512, 1024}) {
    auto a = Tensor::rand({N, N}), b = Tensor::rand({N, N});
    a.realize();
    b.realize();
    auto av = a.to_vector<float>(), bv = b.to_vector<float>();
    std::vector<float> cv(size_t(N * N));
    Tensor warm = (a.reshape({N, 1, N}) * b.T().reshape({1, N, N})).sum(2);
    warm.realize();  // compile once
    int reps = N >= 1024 ? 2 : 5;
    double tg_ms = best_ms([&] { Tensor c = (a.reshape({N, 1, N}) * b.T().reshape({1, N, N})).sum(2); c.realize(); }, reps);
    double blas_ms = best_ms([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(N), int(N), 1.0f, av.data(), int(N), bv.data(),
                  int(N), 0.0f, cv.data(), int(N));
    }, reps);
    double flop = 2.0 * double(N) * double(N) * double(N);
    std::printf("N=%5lld  tg %8.2f GFLOPS (%8.2f ms)  OpenBLAS %8.2f GFLOPS (%7.2f ms)  tg/OpenBLAS %.3f\n", (long long)N,
                flop / tg_ms / 1e6, tg_ms, flop / blas_ms / 1e6, blas_ms, blas_ms / tg_ms);
  }
  return 0;
}
