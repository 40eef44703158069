// bench/qmatvec: one decode-step matvec y = x @ W.T on a Q8_0 or Q4_0 weight kept as stored, with INT_DOT=1 (x
// quantised to q8_0 blocks in its own kernels, integer block sums) against INT_DOT=0 (the weight dequantised to float
// inside the matvec), alternating, in the same run: the median time of a realize (every kernel of the product) and
// the GB/s of the weight's bytes and the GFLOPS. Environment: QMV_N (5632), QMV_K (2048: the ~1B LLaMA's FFN up
// projection), QMV_M (1: rows of x; a short prompt's product from 2, a prefill's from 32, where INT_DOT=0 is the
// packed float GEMM), QMV_REPS (200), QMV_MATS (1: distinct weights of the same shape, the launches cycling through
// them; enough of them that their bytes exceed the last-level cache make every launch read its weight from memory,
// as a decode step does), QMV_ROWS (0: the blocks as stored, row after row; R > 0: stored row-interleaved as
// (N/R, K/32, R, block bytes), the R rows' blocks of one column next to each other, and read through the inverse view
// back to (N, K/32, block bytes); the pairs then compare that layout with the plain one, both INT_DOT=1), THREADS.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench_util.hpp"
#include "tg/env.hpp"
#include "tg/nn/state.hpp"
#include "tg/tensor.hpp"

using namespace tg;

int main() {
  bench::LoadReport load;
  const int64_t N = getenv_int("QMV_N", 5632), K = getenv_int("QMV_K", 2048), reps = getenv_int("QMV_REPS", 200);
  const int64_t mats = getenv_int("QMV_MATS", 1, 1, 4096);
  const int64_t M = getenv_int("QMV_M", 1, 1, 1 << 20);
  const int64_t R = getenv_int("QMV_ROWS", 0, 0, 1 << 20);
  if (R > 0 && N % R) {
    std::fprintf(stderr, "QMV_ROWS=%lld must divide QMV_N=%lld\n", (long long)R, (long long)N);
    return 1;
  }
  std::mt19937 gen{1};
  for (const auto& type_bytes : {std::pair<std::string, int64_t>{"q8_0", 34}, {"q4_0", 18}}) {
    const std::string& type = type_bytes.first;
    const int64_t bytes = type_bytes.second;
    std::vector<uint8_t> blocks(size_t(N * K / 32 * bytes));
    // wts[0]: the blocks as stored (dequantised lazily); wts[1]: the same blocks row-interleaved (QMV_ROWS)
    std::vector<Tensor> wts[2];
    for (int64_t m = 0; m < mats; m++) {
      for (auto& b : blocks) b = uint8_t(gen());
      for (size_t b = 0; b < blocks.size(); b += size_t(bytes)) blocks[b + 1] = uint8_t(0x18 + gen() % 9);
      Tensor w = Tensor::from_vector(blocks, {N, K / 32, bytes}).realize();
      wts[0].push_back(nn::ggml_dequantize(w, type).reshape({N, K}).T());
      if (R > 0) {  // (N, K/32, b) -> (N/R, K/32, R, b) stored, viewed back as (N, K/32, b)
        Tensor il = w.reshape({N / R, R, K / 32, bytes}).permute({0, 2, 1, 3}).contiguous().realize();
        il = il.permute({0, 2, 1, 3}).reshape({N, K / 32, bytes});
        wts[1].push_back(nn::ggml_dequantize(il, type).reshape({N, K}).T());
      }
    }
    Tensor x = Tensor::randn({M, K}).realize();
    if (R > 0) {  // the layouts agree (the same integer sums in another order)
      setenv("INT_DOT", "1", 1);
      env_reset_cache();
      std::vector<float> a = x.matmul(wts[0][0]).realize().to_vector<float>(), b = x.matmul(wts[1][0]).realize().to_vector<float>();
      double err = 0;
      for (size_t i = 0; i < a.size(); i++) err = std::max(err, double(std::fabs(a[i] - b[i])) / (1.0 + std::fabs(double(a[i]))));
      if (err > 1e-4) {
        std::fprintf(stderr, "%s: the interleaved layout's product differs from the plain one's by %g\n", type.c_str(), err);
        return 1;
      }
    }
    // pairs: INT_DOT=0 then 1 on the plain layout; with QMV_ROWS the plain then the interleaved layout, INT_DOT=1
    std::vector<double> ms[2];
    for (int64_t r = 0; r < reps + 5; r++)
      for (int on = 0; on < 2; on++) {
        setenv("INT_DOT", on || R > 0 ? "1" : "0", 1);
        env_reset_cache();
        auto t0 = bench::clk::now();
        Tensor y = x.matmul(wts[R > 0 ? on : 0][size_t((2 * r + on) % mats)]);
        y.realize();
        if (r >= 5) ms[on].push_back(bench::ms_since(t0));
      }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    double off = median(ms[0]), on = median(ms[1]), gb = double(blocks.size()) / 1e9;
    const double gflop = 2e-9 * double(M) * double(N) * double(K);
    const std::string a = R > 0 ? "rows interleaved by " + std::to_string(R) : "INT_DOT=1", b = R > 0 ? "plain" : "INT_DOT=0";
    std::printf("%s (%lld x %lld, %lld rows of x, %lld distinct): %s %.3f ms (%.1f GB/s of blocks, %.1f GFLOPS), %s %.3f ms (%.1f GB/s, %.1f GFLOPS): %.2fx\n",
                type.c_str(), (long long)N, (long long)K, (long long)M, (long long)mats, a.c_str(), on, gb / on * 1e3, gflop / on * 1e3,
                b.c_str(), off, gb / off * 1e3, gflop / off * 1e3, off / on);
  }
}
