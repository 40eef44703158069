// tg against libtorch in the same run: a 4-layer MLP (784-512-512-512-10, batch 256, ReLU, cross-entropy) and a
// conv2d (N=64, C=32, 28x28, 5x5 -> 32, bias), forward and forward+backward. Both start from the same values.
// tg is timed eagerly (build the graph, schedule from the caches, run) and, for forward+backward, under TinyJit
// (replaying captured kernels, as a training loop would). Medians of the timed runs after a warm-up that
// compiles; run through bench/run, which sets OPENBLAS_CORETYPE so libtorch's BLAS runs at its best.
#include <torch/torch.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tg/jit.hpp"
#include "tg/tensor.hpp"

using clk = std::chrono::steady_clock;

namespace {

// Median ms of f over reps runs (at least 3, stopping early after ~budget_s seconds), after one warm-up run.
template <class F>
double median_ms(F&& f, int reps = 7, double budget_s = 20) {
  f();
  std::vector<double> ms;
  auto start = clk::now();
  for (int r = 0; r < reps; r++) {
    auto t = clk::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t).count());
    if (r >= 2 && std::chrono::duration<double>(clk::now() - start).count() > budget_s) break;
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

tg::Tensor to_tg(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  std::vector<int64_t> s(c.sizes().begin(), c.sizes().end());
  tg::DType d = c.scalar_type() == torch::kLong ? tg::dtypes::int64 : tg::dtypes::float32;
  tg::Tensor r = tg::Tensor::from_blob(c.data_ptr(), s, d);
  r.realize();
  return r;
}

void report(const char* what, double tg_ms, double th_ms) {
  std::printf("%-34s tg %9.2f ms   libtorch %8.2f ms   tg/libtorch %6.2fx\n", what, tg_ms, th_ms, tg_ms / th_ms);
}

void bench_mlp() {
  const int64_t B = 256;
  const std::vector<int64_t> dims{784, 512, 512, 512, 10};
  torch::manual_seed(0);
  torch::Tensor hx = torch::rand({B, dims[0]}), hy = torch::randint(0, 10, {B}, torch::kLong);
  std::vector<torch::Tensor> hw, hb;
  for (size_t i = 0; i + 1 < dims.size(); i++) {
    double bound = 1.0 / std::sqrt(double(dims[i]));
    hw.push_back(torch::empty({dims[i + 1], dims[i]}).uniform_(-bound, bound).requires_grad_());
    hb.push_back(torch::empty({dims[i + 1]}).uniform_(-bound, bound).requires_grad_());
  }
  tg::Tensor tx = to_tg(hx), ty = to_tg(hy);
  std::vector<tg::Tensor> tw, tb, params;
  for (size_t i = 0; i < hw.size(); i++) {
    tw.push_back(to_tg(hw[i].detach()).requires_grad_());
    tb.push_back(to_tg(hb[i].detach()).requires_grad_());
    params.push_back(tw.back());
    params.push_back(tb.back());
  }
  std::vector<torch::Tensor> hparams;
  for (size_t i = 0; i < hw.size(); i++) {
    hparams.push_back(hw[i]);
    hparams.push_back(hb[i]);
  }
  auto tg_forward = [&](const tg::Tensor& x) {
    tg::Tensor h = x;
    for (size_t i = 0; i < tw.size(); i++) {
      h = h.linear(tw[i], tb[i]);
      if (i + 1 < tw.size()) h = h.relu();
    }
    return h;
  };
  auto th_forward = [&](const torch::Tensor& x) {
    torch::Tensor h = x;
    for (size_t i = 0; i < hw.size(); i++) {
      h = torch::linear(h, hw[i], hb[i]);
      if (i + 1 < hw.size()) h = torch::relu(h);
    }
    return h;
  };
  // correctness first: the same loss and first-layer gradient
  tg::Tensor tl = tg_forward(tx).cross_entropy(ty);
  auto tgr = tl.gradient(params);
  tg::Tensor::realize_all({&tl, &tgr[0]});
  torch::Tensor hl = torch::cross_entropy_loss(th_forward(hx), hy);
  auto hgr = torch::autograd::grad({hl}, hparams);
  double gdiff = (torch::from_blob(tgr[0].to_vector<float>().data(), hgr[0].sizes()).clone() - hgr[0]).abs().max().item<double>();
  std::printf("MLP 784-512-512-512-10, batch 256: loss tg %.6f libtorch %.6f; max |dW1| difference %.2e\n", tl.item<float>(),
              hl.item<float>(), gdiff);

  double tg_f = median_ms([&] {
    tg::Tensor o = tg_forward(tx);
    o.realize();
  });
  double th_f = median_ms([&] {
    torch::NoGradGuard ng;
    th_forward(hx);
  });
  report("MLP forward", tg_f, th_f);
  double tg_fb = median_ms([&] {
    tg::Tensor loss = tg_forward(tx).cross_entropy(ty);
    auto g = loss.gradient(params);
    std::vector<tg::Tensor*> all{&loss};
    for (auto& t : g) all.push_back(&t);
    tg::Tensor::realize_all(all);
  });
  double th_fb = median_ms([&] {
    torch::Tensor loss = torch::cross_entropy_loss(th_forward(hx), hy);
    torch::autograd::grad({loss}, hparams);
  });
  report("MLP forward+backward", tg_fb, th_fb);
  tg::TinyJit step([&](const std::vector<tg::Tensor>& in) {
    tg::Tensor loss = tg_forward(in[0]).cross_entropy(in[1]);
    auto g = loss.gradient(params);
    g.insert(g.begin(), loss);
    std::vector<tg::Tensor*> all;
    for (auto& t : g) all.push_back(&t);
    tg::Tensor::realize_all(all);
    return g;
  });
  for (int i = 0; i < 3; i++) step({tx, ty});  // compile and capture
  double tg_jit = median_ms([&] { step({tx, ty}); });
  report("MLP forward+backward (TinyJit)", tg_jit, th_fb);
}

void bench_conv() {
  torch::manual_seed(1);
  torch::Tensor hx = torch::rand({64, 32, 28, 28}).requires_grad_(), hw = (torch::rand({32, 32, 5, 5}) - 0.5).requires_grad_(),
                hb = torch::rand({32}).requires_grad_();
  torch::Tensor hseed = torch::randn({64, 32, 24, 24});
  tg::Tensor tx = to_tg(hx.detach()).requires_grad_(), tw = to_tg(hw.detach()).requires_grad_(), tb = to_tg(hb.detach()).requires_grad_();
  tg::Tensor tseed = to_tg(hseed);
  tg::Tensor ty = tx.conv2d(tw, tb);
  auto tgr = ty.gradient({tx, tw, tb}, &tseed);
  tg::Tensor::realize_all({&ty, &tgr[1]});
  torch::Tensor hy = torch::conv2d(hx, hw, hb);
  auto hgr = torch::autograd::grad({hy}, {hx, hw, hb}, {hseed});
  double ydiff = (torch::from_blob(ty.to_vector<float>().data(), hy.sizes()).clone() - hy).abs().max().item<double>();
  double wdiff = (torch::from_blob(tgr[1].to_vector<float>().data(), hgr[1].sizes()).clone() - hgr[1]).abs().max().item<double>();
  std::printf("conv2d N=64 C=32 28x28, 5x5 -> 32: max |y| difference %.2e, max |dW| difference %.2e (|dW| up to %.1f)\n", ydiff,
              wdiff, hgr[1].abs().max().item<double>());

  double tg_f = median_ms([&] {
    tg::Tensor y = tx.conv2d(tw, tb);
    y.realize();
  }, 5);
  double th_f = median_ms([&] {
    torch::NoGradGuard ng;
    torch::conv2d(hx, hw, hb);
  });
  report("conv2d forward", tg_f, th_f);
  double tg_fb = median_ms([&] {
    tg::Tensor y = tx.conv2d(tw, tb);
    auto g = y.gradient({tx, tw, tb}, &tseed);
    tg::Tensor::realize_all({&y, &g[0], &g[1], &g[2]});
  }, 5);
  double th_fb = median_ms([&] {
    torch::Tensor y = torch::conv2d(hx, hw, hb);
    torch::autograd::grad({y}, {hx, hw, hb}, {hseed});
  });
  report("conv2d forward+backward", tg_fb, th_fb);
}

// CPU seconds the whole machine spent busy (from /proc/stat) and this process's own CPU seconds.
double machine_busy_s() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  f >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq;
  return (user + nice + sys + irq + softirq) / double(sysconf(_SC_CLK_TCK));
}
double own_cpu_s() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

}  // namespace

int main() {
  std::printf("libtorch %s, %d intra-op threads; tg on CPU; %ld cores\n", TORCH_VERSION, torch::get_num_threads(),
              sysconf(_SC_NPROCESSORS_ONLN));
  double busy0 = machine_busy_s(), own0 = own_cpu_s();
  auto t0 = clk::now();
  bench_mlp();
  bench_conv();
  double wall = std::chrono::duration<double>(clk::now() - t0).count();
  double others = (machine_busy_s() - busy0) - (own_cpu_s() - own0);
  std::printf("other processes used %.1f CPU-seconds during the %.1f s run (%.0f%% of one core): %s\n", others, wall,
              100 * others / wall, others / wall > 0.2 ? "a busy machine, timings are noisy" : "a quiet machine");
  return 0;
}
