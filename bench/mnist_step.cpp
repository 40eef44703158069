// One training step of examples/beautiful_mnist's model (4 conv + 2 batchnorm + linear, Adam lr 1e-3, batch 512)
// in tg under TinyJit (the replayed step a training loop runs) and in libtorch (eager, the same layers and
// optimiser) in the same run. Both start from the same weights and the same batch; the first step's loss must
// agree, else the program fails. Median ms per step of 5 timed steps after 3 warm-up steps (tg's warm-up
// compiles and captures; its timed steps replay). Run through bench/run, which gives libtorch its best settings
// for the ISA tg compiles for (bench/peer_env: OPENBLAS_CORETYPE, and under TG_CPU=haswell ONEDNN_MAX_CPU_ISA=AVX2
// for its oneDNN convolutions). Freed blocks stay in glibc's heap (mallopt in main), as tg's allocator keeps its
// freed buffers: libtorch maps each of the step's 38-51 MB activations afresh otherwise, and the first touch of
// those pages took its step from about 1.0 to 1.8-2.1 s on the Zen 5 VM. Prints a table line and one JSON line.
#include <malloc.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../examples/beautiful_mnist_model.hpp"
#include "bench_util.hpp"
#include "tg/jit.hpp"
#include "tg/nn/nn.hpp"
#include "tg/nn/optim.hpp"

using clk = std::chrono::steady_clock;

namespace {

constexpr int64_t kBatch = 512;
constexpr int kWarmup = 3, kTimed = 5;

// The same model in libtorch, its tensors copied from tg's state_dict.
struct TorchModel {
  std::map<std::string, torch::Tensor> t;  // tg's names: "0.weight", "4.running_mean", ...
  std::vector<torch::Tensor> params;
  torch::Tensor operator()(const torch::Tensor& x) {
    auto bn = [&](const torch::Tensor& h, const std::string& n) {
      return torch::batch_norm(h, t[n + ".weight"], t[n + ".bias"], t[n + ".running_mean"], t[n + ".running_var"], true, 0.1,
                               1e-5, false);
    };
    torch::Tensor h = torch::relu(torch::conv2d(x, t["0.weight"], t["0.bias"]));
    h = torch::relu(torch::conv2d(h, t["2.weight"], t["2.bias"]));
    h = torch::max_pool2d(bn(h, "4"), 2);
    h = torch::relu(torch::conv2d(h, t["6.weight"], t["6.bias"]));
    h = torch::relu(torch::conv2d(h, t["8.weight"], t["8.bias"]));
    h = torch::max_pool2d(bn(h, "10"), 2);
    return torch::linear(h.flatten(1), t["13.weight"], t["13.bias"]);
  }
};

torch::Tensor to_torch(const tg::Tensor& x) {
  std::vector<float> v = x.to_vector<float>();
  std::vector<int64_t> s(x.shape().begin(), x.shape().end());
  return torch::from_blob(v.data(), s, torch::kFloat).clone();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  try {
    // freed blocks stay in glibc's heap (no mmap per large block, no trimming): both sides reuse warm memory
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    // libtorch on as many threads as tg (every core, or THREADS=N; its default here was one intra-op thread)
    torch::set_num_threads(bench::tg_threads());
    std::printf("libtorch %s, %d intra-op threads; tg on CPU; %ld cores\n", TORCH_VERSION, torch::get_num_threads(),
                sysconf(_SC_NPROCESSORS_ONLN));
    bench::LoadReport load;

    // a fixed batch: pixel values 0..255 as the example feeds them, labels 0..9
    std::mt19937 g(7);
    std::vector<float> xv(static_cast<size_t>(kBatch * 28 * 28));
    std::vector<int32_t> yv(static_cast<size_t>(kBatch));
    for (auto& v : xv) v = float(g() % 256);
    for (auto& v : yv) v = int32_t(g() % 10);
    tg::Tensor tx = tg::Tensor::from_vector(xv, {kBatch, 1, 28, 28}), ty = tg::Tensor::from_vector(yv);
    torch::Tensor hx = torch::from_blob(xv.data(), {kBatch, 1, 28, 28}, torch::kFloat).clone();
    torch::Tensor hy = torch::from_blob(yv.data(), {kBatch}, torch::kInt).to(torch::kLong);

    tg::Tensor::manual_seed(1337);
    auto model = tg::examples::beautiful_mnist_model();
    TorchModel th;
    for (auto& [name, t] : model->state_dict()) th.t[name] = to_torch(t);
    for (auto& [name, t] : th.t)
      if (name.find("running") == std::string::npos) th.params.push_back(t.requires_grad_());
    auto opt = tg::nn::optim::Adam(model->parameters());
    torch::optim::Adam hopt(th.params, torch::optim::AdamOptions(1e-3));

    tg::TinyJit train_step([&](const std::vector<tg::Tensor>& in) -> std::vector<tg::Tensor> {
      model->train(true);
      opt->zero_grad();
      tg::Tensor loss = (*model)(in[0]).sparse_categorical_crossentropy(in[1]);
      loss.backward();
      std::vector<tg::Tensor> out = opt->schedule_step();
      // BatchNorm's running statistics with this batch, as examples/beautiful_mnist does: a step that leaves them
      // pending makes each replay first realise the previous step's update, recomputing its convolutions.
      for (tg::Tensor& b : model->buffers()) out.push_back(b);
      out.push_back(loss);
      return out;
    });
    auto torch_step = [&] {
      hopt.zero_grad();
      torch::Tensor loss = torch::cross_entropy_loss(th(hx), hy);
      loss.backward();
      hopt.step();
      return loss.item<float>();
    };

    std::vector<double> tg_ms, th_ms;
    float tg_loss0 = 0, th_loss0 = 0, tg_loss = 0, th_loss = 0;
    for (int i = 0; i < kWarmup + kTimed; i++) {
      auto t0 = clk::now();
      tg_loss = train_step({tx, ty}).back().item<float>();
      double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
      if (i == 0) tg_loss0 = tg_loss;
      if (i >= kWarmup) tg_ms.push_back(ms);
      std::printf("tg step %d: %8.1f ms%s, loss %.5f\n", i + 1, ms, i < kWarmup ? " (warm-up)" : "", double(tg_loss));
      std::fflush(stdout);
    }
    for (int i = 0; i < kWarmup + kTimed; i++) {
      auto t0 = clk::now();
      th_loss = torch_step();
      double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
      if (i == 0) th_loss0 = th_loss;
      if (i >= kWarmup) th_ms.push_back(ms);
    }
    std::printf("loss of the first step: tg %.6f libtorch %.6f; after %d steps: tg %.6f libtorch %.6f\n", double(tg_loss0),
                double(th_loss0), kWarmup + kTimed, double(tg_loss), double(th_loss));
    if (!(std::abs(tg_loss0 - th_loss0) <= 1e-4 * std::max(1.0f, std::abs(th_loss0)))) {
      std::fprintf(stderr, "mnist_step: tg and libtorch disagree on the first loss: not timing different computations\n");
      return 1;
    }
    double tg_med = median(tg_ms), th_med = median(th_ms);
    std::printf("%-34s tg %9.1f ms   libtorch %8.1f ms   tg/libtorch %6.2fx\n", "mnist train step, batch 512 (JIT)", tg_med,
                th_med, tg_med / th_med);
    std::printf("{\"case\": \"mnist_step_bs512\", \"variant\": \"default\", \"tg_ms\": %.3f, \"peer\": \"libtorch\", "
                "\"peer_ms\": %.3f, \"speedup\": %.4f}\n",
                tg_med, th_med, th_med / tg_med);
    return 0;
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "mnist_step: %s\n", e.what());
    return 1;
  }
}
