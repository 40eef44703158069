// tinygrad's examples/beautiful_mnist.py in tg: the same 4-conv + batchnorm + linear net, Adam with tinygrad's
// defaults, batch 512, 70 steps, a TinyJit train step and a TinyJit test-accuracy pass every 10 steps (in eval
// mode: batchnorm uses its running statistics). Prints a progress line per step and, last, `test_accuracy: NN.NN%`.
// Environment: STEPS (70), BS (512), FASHION=1 (Fashion-MNIST from Debian's dataset-fashion-mnist), DATA=<dir> (a
// folder with the four IDX files; default: $TG_MNIST_DIR, else data/mnist), SEED (1337: tg's generator, which draws
// the initial weights and, inside the jitted step as tinygrad's does, the batch indices), OPT=adam|adamw|sgd|lamb|
// lars|muon (tinygrad's defaults for each), TARGET_EVAL_ACC_PCT (exit 1 below it), EVAL=0 (no test passes), DEVICES=CPU:0,CPU:1 (data parallel
// as tinygrad's beautiful_mnist_multigpu: the weights and batchnorm statistics replicated on every device, each batch
// split along its rows; Adam and AdamW then update over one flat buffer, so the gradients are one allreduce a step).
// Over MPI (`mpirun -np 2 build/examples/beautiful_mnist`, see tg/dist.hpp): each rank trains on its share of each
// batch (BS rows per rank, drawn from the same generator on every rank, so the ranks' rows together are the batch of
// one process with BS*ranks), batchnorm normalises with the whole batch's statistics (tg::dist::sync_batchnorm: the
// per-channel sums allreduced inside the forward and backward), the gradients are averaged over the ranks by one
// MPI_Allreduce, and rank 0 alone prints and writes files; the loss printed is the mean over the ranks. The ranks'
// training equals one process with BS*ranks within float rounding.
// Flags: --plot FILE.svg writes the training loss (every step) and the test accuracy (every 10 steps) as an SVG chart;
// --save FILE.safetensors writes the trained weights (rank 0); --check-replicas fails when the ranks' weights or
// batchnorm statistics differ in any bit after a step.
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "beautiful_mnist_model.hpp"
#include "tg/dist.hpp"
#include "tg/env.hpp"
#include "tg/jit.hpp"
#include "tg/multi.hpp"
#include "tg/nn/datasets.hpp"
#include "tg/nn/nn.hpp"
#include "tg/nn/optim.hpp"
#include "tg/nn/state.hpp"
#include "tg/plot.hpp"

using namespace tg;
using clk = std::chrono::steady_clock;

namespace {

const char* const kOptimizers[] = {"adam", "adamw", "sgd", "lamb", "lars", "muon"};

std::unique_ptr<nn::optim::Optimizer> make_optimizer(const std::string& name, std::vector<Tensor> params, bool fused) {
  using namespace nn::optim;
  if (name == "adam") return std::make_unique<Adam>(std::move(params), AdamOptions{.fused = fused});
  if (name == "adamw") return std::make_unique<AdamW>(std::move(params), AdamWOptions{.fused = fused});
  if (name == "sgd") return std::make_unique<SGD>(std::move(params));
  if (name == "lamb") return std::make_unique<LAMB>(std::move(params));
  if (name == "lars") return std::make_unique<LARS>(std::move(params));
  return std::make_unique<Muon>(std::move(params));
}

int64_t positive_env(const char* name, int64_t dflt) {
  int64_t v = getenv_int(name, dflt);
  if (v <= 0) throw Error(std::string("[beautiful_mnist] ") + name + " must be a positive integer, got " + std::to_string(v));
  return v;
}

// Rows [idx] of a (N, ...) uint8 host array as a tensor of dtype T (the test set's chunks).
template <class T>
Tensor gather_rows(const std::vector<uint8_t>& data, const Shape& shape, const std::vector<int64_t>& idx) {
  size_t row = 1;
  for (size_t i = 1; i < shape.size(); i++) row *= size_t(shape[i]);
  Shape s = shape;
  s[0] = int64_t(idx.size());
  std::vector<T> out(idx.size() * row);
  for (size_t i = 0; i < idx.size(); i++)
    std::copy_n(data.begin() + std::ptrdiff_t(size_t(idx[i]) * row), row, out.begin() + std::ptrdiff_t(i * row));
  return Tensor::from_vector(out, s);
}

std::string rate_str(double steps, double seconds) {
  char b[32];
  if (seconds <= 0 || steps <= 0) return "   ?   it/s";
  if (steps >= seconds) std::snprintf(b, sizeof b, "%6.2f it/s", steps / seconds);
  else std::snprintf(b, sizeof b, "%6.2f s/it", seconds / steps);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string plot_file;
  CLI::App app{"tinygrad's beautiful_mnist: a conv net trained on MNIST (settings in the environment, see the source)",
               "beautiful_mnist"};
  std::string save_file;
  bool check_replicas = false;
  app.add_option("--plot", plot_file, "write the loss and test-accuracy curves to this SVG file");
  app.add_option("--save", save_file, "write the trained weights to this safetensors file (rank 0)");
  app.add_flag("--check-replicas", check_replicas, "MPI: fail when the ranks' weights differ in any bit after a step");
  CLI11_PARSE(app, argc, argv);
  try {
    const int world = dist::world_size(), rank = dist::rank();
    if (rank != 0 && !std::freopen("/dev/null", "w", stdout))  // rank 0 logs
      throw Error("[beautiful_mnist] rank " + std::to_string(rank) + ": cannot silence stdout");
    if (rank != 0) plot_file.clear(), save_file.clear();  // and writes files
    if (!plot_file.empty() && !std::ofstream(plot_file))  // before training, not after it
      throw Error("[beautiful_mnist] cannot write --plot " + plot_file + ": expected a writable file path");
    int64_t bs = positive_env("BS", 512), steps = positive_env("STEPS", 70);
    int64_t fashion = getenv_int("FASHION", 0), seed = getenv_int("SEED", 1337);
    if (fashion != 0 && fashion != 1) throw Error("[beautiful_mnist] FASHION must be 0 or 1, got " + std::to_string(fashion));
    if (seed < 0) throw Error("[beautiful_mnist] SEED must be >= 0, got " + std::to_string(seed));
    std::string opt_name = getenv_str("OPT", "adam");
    std::transform(opt_name.begin(), opt_name.end(), opt_name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (std::find(std::begin(kOptimizers), std::end(kOptimizers), opt_name) == std::end(kOptimizers))
      throw Error("[beautiful_mnist] OPT must be one of adam, adamw, sgd, lamb, lars, muon; got '" + opt_name + "'");
    std::string target_str = getenv_str("TARGET_EVAL_ACC_PCT", "");
    const bool eval = getenv_int("EVAL", 1) != 0;  // EVAL=0: no test-accuracy passes (training checks)
    if (!eval && !target_str.empty()) throw Error("[beautiful_mnist] TARGET_EVAL_ACC_PCT needs the test passes, but EVAL=0");
    double target = 0;
    if (!target_str.empty()) {
      size_t used = 0;
      try {
        target = std::stod(target_str, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != target_str.size() || !(target >= 0 && target <= 100))
        throw Error("[beautiful_mnist] TARGET_EVAL_ACC_PCT must be a percentage, got '" + target_str + "'");
    }
    std::string dir = getenv_str("DATA", "");
    std::vector<std::string> devices;  // DEVICES: data parallel over these
    if (std::string d = getenv_str("DEVICES", ""); !d.empty()) devices = split_devices(d);
    const bool multi = devices.size() > 1;
    if (multi && bs % int64_t(devices.size()))
      throw Error("[beautiful_mnist] BS=" + std::to_string(bs) + " does not split over the " + std::to_string(devices.size()) +
                  " DEVICES");

    nn::Dataset ds = fashion ? (dir.empty() ? nn::fashion_mnist() : nn::fashion_mnist(dir)) : nn::mnist(dir);
    auto xte = ds.X_test.to_vector<uint8_t>(), yte = ds.Y_test.to_vector<uint8_t>();
    int64_t n_train = ds.X_train.shape()[0], n_test = ds.X_test.shape()[0];
    if (n_train == 0 || n_test == 0) throw Error("[beautiful_mnist] the dataset has no training or no test images");
    std::printf("%s: %lld train / %lld test images; batch %lld, %lld steps, %s, seed %lld\n",
                fashion ? "Fashion-MNIST" : "MNIST", (long long)n_train, (long long)n_test, (long long)bs,
                (long long)steps, opt_name.c_str(), (long long)seed);
    if (world > 1) std::printf("MPI: %d ranks, batch %lld per rank\n", world, (long long)bs);

    Tensor::manual_seed(uint64_t(seed));
    auto model = tg::examples::beautiful_mnist_model();
    if (multi) {  // replicated weights and running statistics
      for (Tensor& p : model->parameters()) p.shard_(devices);
      for (Tensor& b : model->buffers()) b.shard_(devices);
      std::printf("data parallel over %s\n", join_devices(devices).c_str());
    }
    dist::sync_batchnorm(*model);  // MPI: batchnorm statistics over the ranks' shares together (SyncBatchNorm)
    auto opt = make_optimizer(opt_name, model->parameters(), multi);
    // a batch's rows split over the devices (replicated where they do not split)
    auto spread = [&](const Tensor& t) {
      return !multi ? t : t.shape()[0] % int64_t(devices.size()) ? t.shard(devices) : t.shard(devices, 0);
    };

    // As tinygrad's: the step draws its batch on the device (randint advances the generator's state buffer, so
    // every replay draws a new batch) and gathers the rows from the training set, which stays on the device.
    auto step_fn = [&](const std::vector<Tensor>&) -> std::vector<Tensor> {
      model->train(true);
      opt->zero_grad();
      Tensor samples = dist::rank_share(Tensor::randint(0, n_train, {bs * world}));  // this rank's rows of the batch
      Tensor xb = spread(ds.X_train.index_select(0, samples).cast(dtypes::float32));
      Tensor yb = spread(ds.Y_train.index_select(0, samples).cast(dtypes::int32));
      Tensor loss = (*model)(xb).sparse_categorical_crossentropy(yb);
      loss.backward();
      if (world > 1) {  // the update waits for the ranks' gradients (a host allreduce between two realises)
        std::vector<Tensor> out;
        for (Tensor& p : model->parameters()) out.push_back(p.grad());
        for (Tensor& b : model->buffers()) out.push_back(b);
        out.push_back(loss);
        return out;
      }
      std::vector<Tensor> out = opt->schedule_step();
      for (Tensor& b : model->buffers()) out.push_back(b);  // BatchNorm's running statistics, with this batch
      out.push_back(loss);
      return out;
    };
    TinyJit train_step(step_fn);
    // correct predictions in a chunk of test images (eval mode); whole chunks replay, a smaller rest runs eagerly
    auto count_correct = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      NoGrad no_grad;  // an inference: conv2d's cost model picks for the forward alone (no gradient follows)
      model->train(false);
      return {((*model)(spread(in[0])).argmax(1) == spread(in[1]).cast(dtypes::int64)).cast(dtypes::float32).sum()};  // exact below 2^24
    };
    TinyJit test_chunk(count_correct);
    int64_t chunk = std::min<int64_t>(n_test, 1000);
    auto test_accuracy = [&] {
      int64_t correct = 0;
      for (int64_t s = 0; s < n_test; s += chunk) {
        std::vector<int64_t> idx;
        for (int64_t k = s; k < std::min(n_test, s + chunk); k++) idx.push_back(k);
        std::vector<Tensor> in{gather_rows<float>(xte, ds.X_test.shape(), idx), gather_rows<int32_t>(yte, ds.Y_test.shape(), idx)};
        auto out = int64_t(idx.size()) == chunk ? test_chunk(in) : count_correct(in);
        correct += int64_t(out[0].item<float>());
      }
      return 100.0 * double(correct) / double(n_test);
    };

    bool tty = isatty(fileno(stdout));
    double acc = -1, train_s = 0;
    float loss = 0;
    plot::Series loss_curve{"training loss", {}, false, ""}, acc_curve{"test accuracy %", {}, true, ""};
    auto t_start = clk::now();
    for (int64_t i = 0; i < steps; i++) {
      auto t0 = clk::now();
      if (world == 1) {
        loss = train_step({}).back().item<float>();
      } else {  // not jitted: MPI calls run between the gradients and the update
        std::vector<Tensor> out = step_fn({});
        std::vector<Tensor*> ptrs;
        for (Tensor& t : out) ptrs.push_back(&t);
        Tensor::realize_all(ptrs);
        Tensor l = out.back();
        dist::allreduce_grads(model->parameters());
        opt->step();
        dist::allreduce_(l);
        loss = l.item<float>() / float(world);
        std::vector<Tensor> state = model->parameters();  // the running statistics too (synchronised batchnorm)
        for (Tensor& b : model->buffers()) state.push_back(b);
        if (check_replicas && !dist::replicas_equal(state))
          throw Error("[beautiful_mnist] rank " + std::to_string(rank) + ": the ranks' weights differ after step " + std::to_string(i + 1));
      }
      train_s += std::chrono::duration<double>(clk::now() - t0).count();
      loss_curve.points.emplace_back(double(i + 1), double(loss));
      if (eval && (i % 10 == 9 || i + 1 == steps)) acc = test_accuracy(), acc_curve.points.emplace_back(double(i + 1), acc);
      double elapsed = std::chrono::duration<double>(clk::now() - t_start).count();
      int bar = int(30 * (i + 1) / steps);
      char accs[32] = "  -   ";
      if (acc >= 0) std::snprintf(accs, sizeof accs, "%6.2f%%", acc);
      std::printf("%s%3lld/%lld [%-30s] %s  loss %7.4f  test_accuracy %s%s", tty ? "\r" : "", (long long)(i + 1),
                  (long long)steps, std::string(size_t(bar), '#').c_str(), rate_str(double(i + 1), elapsed).c_str(),
                  double(loss), accs, tty ? "" : "\n");
      std::fflush(stdout);
    }
    double total_s = std::chrono::duration<double>(clk::now() - t_start).count();
    std::printf("%strained %lld steps in %.1f s (train steps %.1f s, %.0f ms/step on average)\n", tty ? "\n" : "",
                (long long)steps, total_s, train_s, 1000 * train_s / double(steps));
    std::printf("test_accuracy: %.2f%%\n", acc);
    if (check_replicas && world > 1) std::printf("replicas: the %d ranks' weights and batchnorm statistics were bit-identical after every step\n", world);
    if (!save_file.empty()) {
      std::map<std::string, Tensor> sd = model->state_dict();
      for (auto& [name, t] : sd)
        if (t.is_multi()) t = t.to(devices[0]);  // replicated: every device's copy is the same
      nn::safe_save(sd, save_file);
      std::printf("saved: %s\n", save_file.c_str());
    }
    if (!plot_file.empty()) {
      plot::write_svg(plot_file, {std::string(fashion ? "Fashion-MNIST" : "MNIST") + ": beautiful_mnist, " + opt_name + ", batch " +
                                      std::to_string(bs),
                                  "step", "training loss", "test accuracy (%)", {loss_curve, acc_curve}});
      std::printf("plot: %s\n", plot_file.c_str());
    }
    if (!target_str.empty() && acc < target) {
      std::fprintf(stderr, "beautiful_mnist: test accuracy %.2f%% is below TARGET_EVAL_ACC_PCT=%s\n", acc, target_str.c_str());
      return 1;
    }
    return 0;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%sbeautiful_mnist: %s\n", isatty(fileno(stdout)) ? "\n" : "", e.what());
    return 1;
  }
}
