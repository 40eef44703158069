// symbolic_fuzz [seconds] [seed]: simplify random integer expressions (index and int32) for a while and compare them
// with their originals at random points. Prints samples/s; on a mismatch prints a minimal counterexample, exits 1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tg/rule_check.hpp"

int main(int argc, char** argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 10.0;
  uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  if (seconds <= 0) {
    std::fprintf(stderr, "usage: symbolic_fuzz [seconds > 0] [seed]\n");
    return 2;
  }
  tg::rule_check::ExprFuzzer fz(seed);
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double next_report = 1.0;
  while (elapsed() < seconds) {
    if (auto c = fz.step()) {
      std::printf("MISMATCH after %llu expressions (seed %llu)\n%s", (unsigned long long)fz.exprs(),
                  (unsigned long long)seed, fz.minimize(*c).str().c_str());
      return 1;
    }
    if (elapsed() >= next_report) {
      std::printf("%.0f s: %llu expressions, %llu samples\n", elapsed(), (unsigned long long)fz.exprs(),
                  (unsigned long long)fz.samples());
      std::fflush(stdout);
      next_report *= 2;
    }
  }
  double s = elapsed();
  std::printf("%llu expressions, %llu samples in %.1f s: %.0f samples/s, %.0f expressions/s, 0 mismatches\n",
              (unsigned long long)fz.exprs(), (unsigned long long)fz.samples(), s, double(fz.samples()) / s,
              double(fz.exprs()) / s);
  return 0;
}
