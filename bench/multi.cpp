// bench/multi: beautiful_mnist's train step (examples/beautiful_mnist_model.hpp, Adam over one flat buffer, batch BS
// (default 256) of fixed random images) data parallel, two ways, each against its one-device run in the same program:
//   devices  1 vs 2 logical CPU devices in one process (DEVICES=CPU:0,CPU:1: weights replicated, batch rows split),
//            TinyJit-replayed; the allreduce's share: a replayed allreduce of the flat gradient alone / the step
//   ranks    1 vs 2 MPI ranks (this program under `mpirun -np 2 --oversubscribe`, half the batch each, THREADS=1
//            each; the 1-rank run uses THREADS=2): synchronised batchnorm (tg::dist::sync_batchnorm), gradients,
//            MPI_Allreduce of them (tg::dist), update; the shares are the time in dist::allreduce_grads and in the
//            batchnorm statistics' allreduces
//   devices with CPU_DEVICE_THREADS=THREADS/2 (a child process): each logical device launches its kernels on its
//            own thread with half the cores, so the two devices compute at the same time
// Median ms per step. Prints a table and JSON lines (peer = the one-device / one-rank run). Without
// CPU_DEVICE_THREADS the logical devices run one after the other (each kernel on every core), so 2 devices cannot
// be faster than 1: the figure is the cost of the split (copies, allreduce, smaller kernels).
//   build/bench/multi [--steps N]        (the MPI case needs tg built with MPI and mpirun on the PATH)
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../examples/beautiful_mnist_model.hpp"
#include "bench_util.hpp"
#include "tg/device.hpp"
#include "tg/dist.hpp"
#include "tg/jit.hpp"
#include "tg/multi.hpp"
#include "tg/nn/optim.hpp"

using namespace tg;
using bench::clk;

namespace {

int64_t env_int(const char* name, int64_t d) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : d;
}

struct Setup {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<nn::optim::Adam> opt;
  Tensor x, y;
  int64_t numel = 0;
};

Setup make(const std::vector<std::string>& devs, int64_t bs) {
  Setup s;
  Tensor::manual_seed(1);
  s.model = tg::examples::beautiful_mnist_model();
  s.x = Tensor::randn({bs, 1, 28, 28}).contiguous().realize();
  s.y = Tensor::randint(0, 10, {bs}).contiguous().realize();
  if (devs.size() > 1) {
    for (Tensor& p : s.model->parameters()) p.shard_(devs);
    for (Tensor& b : s.model->buffers()) b.shard_(devs);
    s.x = s.x.shard(devs, 0), s.y = s.y.shard(devs, 0);
  }
  for (Tensor& p : s.model->parameters()) s.numel += p.numel();
  s.opt = std::make_unique<nn::optim::Adam>(s.model->parameters(), nn::optim::AdamOptions{.fused = true});
  return s;
}

// median ms of the jitted step on devs
double device_step_ms(const std::vector<std::string>& devs, int64_t bs, int steps) {
  Setup s = make(devs, bs);
  TinyJit step([&](const std::vector<Tensor>&) -> std::vector<Tensor> {
    s.model->train(true);
    s.opt->zero_grad();
    Tensor loss = (*s.model)(s.x).sparse_categorical_crossentropy(s.y);
    loss.backward();
    std::vector<Tensor> out = s.opt->schedule_step();
    for (Tensor& b : s.model->buffers()) out.push_back(b);
    out.push_back(loss);
    return out;
  });
  for (int i = 0; i < 2; i++) step({}).back().item<float>();  // capture
  return bench::median_ms([&] { step({}).back().item<float>(); }, steps);
}

// median ms of an allreduce of n floats over devs (the flat gradient's size), replayed
double allreduce_ms(const std::vector<std::string>& devs, int64_t n, int steps) {
  Tensor g = Tensor::randn({int64_t(devs.size()), n}).contiguous().realize().shard(devs, 0).realize();
  TinyJit ar([&](const std::vector<Tensor>&) -> std::vector<Tensor> { return {g.sum(0).contiguous()}; });
  for (int i = 0; i < 2; i++) ar({})[0].to(devs[0]).realize();
  return bench::median_ms([&] { ar({})[0].realize(); }, steps);
}

// One rank's part of the MPI case: prints "rank-step MS ALLREDUCE_MS" on rank 0.
int rank_child(int64_t bs, int steps) {
  int world = dist::world_size();
  Setup s = make({}, bs / world);
  dist::sync_batchnorm(*s.model);  // batchnorm over the whole batch: its per-channel sums allreduced in the step
  std::vector<double> step_ms, ar_ms, bn_ms;
  for (int i = 0; i < steps + 2; i++) {
    auto t0 = clk::now();
    s.model->train(true);
    s.opt->zero_grad();
    Tensor loss = (*s.model)(s.x).sparse_categorical_crossentropy(s.y);
    loss.backward();
    std::vector<Tensor> gs;
    for (Tensor& p : s.model->parameters()) gs.push_back(p.grad());
    std::vector<Tensor*> ptrs;
    for (Tensor& g : gs) ptrs.push_back(&g);
    ptrs.push_back(&loss);
    double c0 = dist::collective_seconds();
    Tensor::realize_all(ptrs);
    double bn = 1e3 * (dist::collective_seconds() - c0);  // the batchnorm statistics' MPI_Allreduce calls
    auto t1 = clk::now();
    dist::allreduce_grads(s.model->parameters());  // host copies, MPI_Allreduce, written back
    double ar = bench::ms_since(t1);
    s.opt->step();
    loss.item<float>();
    double total = bench::ms_since(t0);
    if (i >= 2) step_ms.push_back(total), ar_ms.push_back(ar), bn_ms.push_back(bn);
  }
  for (auto* v : {&step_ms, &ar_ms, &bn_ms}) std::sort(v->begin(), v->end());
  size_t m = step_ms.size() / 2;
  if (dist::rank() == 0) std::printf("rank-step %.3f %.3f %.3f\n", step_ms[m], ar_ms[m], bn_ms[m]);
  return 0;
}

// The 2-device case in a child process with CPU_DEVICE_THREADS (read when a device opens): prints "dev-step MS".
int devices_child(int64_t bs, int steps) {
  std::printf("dev-step %.3f\n", device_step_ms({"CPU:0", "CPU:1"}, bs, steps));
  return 0;
}

bool run_child(const std::string& cmd, double& step) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  char line[512];
  bool ok = false;
  while (std::fgets(line, sizeof line, p))
    if (std::sscanf(line, "dev-step %lf", &step) == 1) ok = true;
  return pclose(p) == 0 && ok;
}

bool run_ranks(const std::string& cmd, double& step, double& ar, double& bn) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  char line[512];
  bool ok = false;
  while (std::fgets(line, sizeof line, p))
    if (std::sscanf(line, "rank-step %lf %lf %lf", &step, &ar, &bn) == 3) ok = true;
  return pclose(p) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5;
  bool child = false, dev_child = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::max(3, std::atoi(argv[++i]));
    else if (a == "--rank-child") child = true;
    else if (a == "--devices-child") dev_child = true;
    else {
      std::fprintf(stderr, "usage: multi [--steps N]\n");
      return 2;
    }
  }
  const int64_t bs = env_int("BS", 256);
  try {
    if (child) return rank_child(bs, steps);
    if (dev_child) return devices_child(bs, steps);
    bench::LoadReport load;
    const std::vector<std::string> one{"CPU"}, two{"CPU:0", "CPU:1"};
    // each device on its own thread with half the cores (CPU_DEVICE_THREADS: a child process, as the variable is
    // read when a device opens)
    std::string self = argv[0], steps_s = std::to_string(steps);
    const int share = std::max(1, get_device("CPU").threads() / 2);
    auto concurrent = [&] {
      double ms = 0;
      if (!run_child("CPU_DEVICE_THREADS=" + std::to_string(share) + " '" + self + "' --devices-child --steps " + steps_s, ms))
        throw Error("[bench/multi] the CPU_DEVICE_THREADS run failed");
      return ms;
    };
    // alternated (1, 2, 2 concurrent, 1, 2, 2 concurrent): the lower of each's two medians, on a machine whose
    // load changes
    double d1a = device_step_ms(one, bs, steps), d2a = device_step_ms(two, bs, steps), c2a = concurrent();
    double d1b = device_step_ms(one, bs, steps), d2b = device_step_ms(two, bs, steps), c2b = concurrent();
    double d1 = std::min(d1a, d1b), d2 = std::min(d2a, d2b), c2 = std::min(c2a, c2b);
    std::printf("1 device: %.1f, %.1f ms; 2 devices: %.1f, %.1f ms; 2 devices, CPU_DEVICE_THREADS=%d: %.1f, %.1f ms (the "
                "lower of each is compared)\n", d1a, d1b, d2a, d2b, share, c2a, c2b);
    int64_t numel = make({}, 2).numel;
    double ar = allreduce_ms(two, numel, steps);
    std::printf("beautiful_mnist step, batch %lld: 1 device %.1f ms, 2 logical devices %.1f ms (%.2fx); allreduce of the "
                "%lld-float gradient %.2f ms (%.1f%% of the 2-device step)\n",
                (long long)bs, d1, d2, d1 / d2, (long long)numel, ar, 100 * ar / d2);
    bench::json("mnist_step_2dev", "default", d2, "1dev", d1, ", \"allreduce_ms\": " + std::to_string(ar));
    std::printf("beautiful_mnist step, batch %lld: 2 logical devices with CPU_DEVICE_THREADS=%d (each on its own thread) "
                "%.1f ms (%.2fx of 1 device, %.2fx of 2 devices in turn)\n",
                (long long)bs, share, c2, d1 / c2, d2 / c2);
    bench::json("mnist_step_2dev_concurrent", ("CPU_DEVICE_THREADS=" + std::to_string(share)).c_str(), c2, "1dev", d1,
                ", \"sequential_2dev_ms\": " + std::to_string(d2));
    if (!dist::available() || std::system("command -v mpirun > /dev/null 2>&1") != 0) {
      std::printf("ranks: tg was built without MPI, or no mpirun: skipped\n");
      return 0;
    }
    double r1 = 0, a1 = 0, b1 = 0, r2 = 0, a2 = 0, b2 = 0;
    bool ok1 = run_ranks("THREADS=2 '" + self + "' --rank-child --steps " + steps_s, r1, a1, b1);
    bool ok2 = run_ranks("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 THREADS=1 mpirun -np 2 --oversubscribe '" +
                             self + "' --rank-child --steps " + steps_s,
                         r2, a2, b2);
    if (!ok1 || !ok2) throw Error("[bench/multi] a rank run failed");
    std::printf("beautiful_mnist step, batch %lld: 1 rank %.1f ms, 2 MPI ranks %.1f ms (%.2fx); MPI_Allreduce of the "
                "gradients (host copies included) %.1f ms (%.1f%% of the step); the synchronised batchnorm's "
                "allreduces %.1f ms (%.1f%%, waiting for the other rank included)\n",
                (long long)bs, r1, r2, r1 / r2, a2, 100 * a2 / r2, b2, 100 * b2 / r2);
    bench::json("mnist_step_2ranks", "default", r2, "1rank", r1,
                ", \"allreduce_ms\": " + std::to_string(a2) + ", \"bn_allreduce_ms\": " + std::to_string(b2));
  } catch (const Error& e) {
    std::fprintf(stderr, "bench/multi: %s\n", e.what());
    return 1;
  }
  return 0;
}
