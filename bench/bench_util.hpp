#pragma once
// Shared by the bench programs: timers, the load of the machine during a run, and the one-line JSON record every
// case prints (bench/run collects these lines into one file and prints the table):
//   {"case": "matmul_f32_1024", "variant": "default"|"beam", "tg_ms": ..., "peer": "openblas"|"libtorch"|
//    "bandwidth"|..., "peer_ms": ..., "speedup": peer_ms / tg_ms}          (above 1: tg is faster)
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tg/device.hpp"

namespace bench {

using clk = std::chrono::steady_clock;

// Threads tg's kernels run on (THREADS=N, else every core): each peer is given the same number.
inline int tg_threads() { return tg::get_device(tg::default_device()).threads(); }
inline double ms_since(clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); }

/** Best (minimum) ms of f over `reps` runs. */
template <class F>
double best_ms(F&& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    auto t = clk::now();
    f();
    best = std::min(best, ms_since(t));
  }
  return best;
}

/** Median ms of f over up to `reps` runs (at least 3; stops after ~budget_s seconds) after warming up for at least
 *  150 ms (one run at least): a peer's idle threads spin on the cores after its last call (libtorch's OpenMP team;
 *  OpenBLAS's, bench/matmul), and a side timed right after the other shared the cores with them: tg's batched matmul
 *  under TG_CPU=haswell read 10.2 ms timed after libtorch's convolutions, 5.3 ms alone and 5.3 ms after them with
 *  OMP_WAIT_POLICY=PASSIVE (2-core Zen 5, 2 threads). */
template <class F>
double median_ms(F&& f, int reps = 7, double budget_s = 20) {
  for (auto warm = clk::now(); f(), ms_since(warm) < 150;) {
  }
  std::vector<double> ms;
  auto start = clk::now();
  for (int r = 0; r < reps; r++) {
    auto t = clk::now();
    f();
    ms.push_back(ms_since(t));
    if (r >= 2 && ms_since(start) > budget_s * 1e3) break;
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/** "beam" when BEAM is set to a positive width, else "default". */
inline const char* variant() {
  const char* b = std::getenv("BEAM");
  return b && std::atoi(b) > 0 ? "beam" : "default";
}

/** The JSON record of one case (extra: more `"key": value` pairs, each starting with ", "). */
inline void json(const std::string& name, const char* variant, double tg_ms, const char* peer, double peer_ms,
                 const std::string& extra = "") {
  std::printf("{\"case\": \"%s\", \"variant\": \"%s\", \"tg_ms\": %.4f, \"peer\": \"%s\", \"peer_ms\": %.4f, "
              "\"speedup\": %.4f%s}\n",
              name.c_str(), variant, tg_ms, peer, peer_ms, peer_ms / tg_ms, extra.c_str());
  std::fflush(stdout);
}

/** CPU seconds the whole machine spent busy (/proc/stat) and this process's own, to report the load of a run. */
inline double machine_busy_s() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  f >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq;
  return (user + nice + sys + irq + softirq) / double(sysconf(_SC_CLK_TCK));
}
// this process's CPU seconds and its finished children's (a peer run as a child process, e.g. llama.cpp from Node)
inline double own_cpu_s() {
  double s = 0;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage r{};
    getrusage(who, &r);
    s += double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  }
  return s;
}

/** Prints, at scope exit, how much CPU other processes used during the run. */
struct LoadReport {
  double busy0 = machine_busy_s(), own0 = own_cpu_s();
  clk::time_point t0 = clk::now();
  ~LoadReport() {
    double wall = ms_since(t0) / 1e3;
    double others = (machine_busy_s() - busy0) - (own_cpu_s() - own0);
    std::printf("other processes used %.1f CPU-seconds during the %.1f s run (%.0f%% of one core): %s\n", others, wall,
                100 * others / wall, others / wall > 0.2 ? "a busy machine, timings are noisy" : "a quiet machine");
  }
};

}  // namespace bench
