#pragma once
// nn: layers with parameters (initialised as in tinygrad/PyTorch), a Module base with named parameters and
// train/eval mode, Sequential. Layers are callables Tensor -> Tensor.
// Thread-safety: a module is used from one thread.
#include "tg/config.hpp"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tg/tensor.hpp"

namespace tg::nn {

/** Base of layers: named parameters and buffers (running statistics), children, train/eval mode. */
class Module {
 public:
  virtual ~Module() = default;
  /// the layer's output for input x (shapes as the layer's torch namesake; a wrong input rank or size is a tg::Error)
  virtual Tensor forward(const Tensor& x) = 0;
  /** forward(x); a tg::Error raised inside names this call's position in the caller's source. */
  Tensor operator()(const Tensor& x, CallLoc loc = CallLoc::current()) {
    CallSite site(loc);
    return forward(x);
  }
  /** Every tensor of the module and its children by dotted name ("0.weight", "bn.running_mean", ...). */
  std::map<std::string, Tensor> state_dict();
  /** The trainable tensors (state_dict without the buffers), in registration order. */
  std::vector<Tensor> parameters();
  /** The non-trainable state (BatchNorm's running statistics), in registration order. Training updates them with
   *  lazy assigns: realise them with the step (a train step returns them beside the loss, as tinygrad's optimiser
   *  does with its buffers), or the next use recomputes the old batch's forward pass. */
  std::vector<Tensor> buffers();
  /** Copy values in: every key must exist with the same shape (strict) or is skipped (not strict). */
  void load_state_dict(const std::map<std::string, Tensor>& sd, bool strict = true);
  /** Training mode switch (affects BatchNorm, Dropout); applies to children. */
  void train(bool on = true);
  /// evaluation mode: train(false)
  void eval() { train(false); }
  /// whether the module is in training mode
  bool training() const { return training_; }
  /** fn(module) for this module and every module under it, parents first (torch's Module.apply). */
  void apply(const std::function<void(Module&)>& fn);

 protected:
  /// registers `t` as a trainable parameter named `name` (requires grad); the reference stays valid
  Tensor& param(const std::string& name, Tensor t);
  /// registers `t` as non-trainable state named `name` (in state_dict and buffers())
  Tensor& buffer(const std::string& name, Tensor t);
  /// registers a submodule; its tensors appear as "name.*" in state_dict
  void child(const std::string& name, std::shared_ptr<Module> m);
  /// training mode (set by train(); read by BatchNorm and Dropout)
  bool training_ = true;

 private:
  struct Entry {
    std::string name;
    Tensor* t;
    bool trainable;
  };
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Entry>>& out);
  std::vector<std::unique_ptr<Tensor>> owned_;
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

/** Linear's arguments by name (C++20 designated initialisers, in this order):
 *  `nn::Linear fc({.in_features = 784, .out_features = 10, .bias = false});`. */
struct LinearOptions {
  /// size of the input's last dim, and of the output's
  ///@{
  int64_t in_features = 0, out_features = 0;
  ///@}
  /// add a learnt bias (out_features,)
  bool bias = true;
};

/** y = x @ W.T + b; W (out, in) kaiming_uniform(a=sqrt(5)), b uniform(+-1/sqrt(in)), as torch. */
class Linear : public Module {
 public:
  /// weight (out, in) and bias (out,) ~ U(-1/sqrt(in), 1/sqrt(in)) as torch
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  /// from named arguments
  explicit Linear(const LinearOptions& o) : Linear(o.in_features, o.out_features, o.bias) {}
  Tensor forward(const Tensor& x) override;
  /// (out_features, in_features)
  Tensor& weight;
  /// (out_features,), or null without a bias
  Tensor* bias = nullptr;
};

/** A convolution layer's arguments by name (Conv1d/2d/3d), as torch's: `nn::Conv2d c({.in_channels = 1,
 *  .out_channels = 32, .kernel_size = 5, .padding = "same", .bias = false});` (fields in this order). */
struct ConvOptions {
  /// channels of the input (dim 1) and of the output
  ///@{
  int64_t in_channels = 0, out_channels = 0;
  ///@}
  /// window size, one value for every spatial dim or one per dim
  IntArg kernel_size;
  /// step between windows, one value or one per dim
  IntArg stride = 1;
  /// zeros added on both sides of each spatial dim (one value or one per dim), or "same"/"valid" as torch
  ConvPadding padding = 0;
  /// spacing between kernel elements, one value or one per dim
  IntArg dilation = 1;
  /// channel groups: in and out channels split into `groups` independent convolutions
  int64_t groups = 1;
  /// add a learnt bias (out_channels,)
  bool bias = true;
  /// how padding fills: "zeros", "reflect", "replicate" or "circular" as torch
  std::string padding_mode = "zeros";
};
/// Conv1d's named arguments (the ConvOptions of every convolution)
using Conv1dOptions = ConvOptions;
/// Conv2d's named arguments (the ConvOptions of every convolution)
using Conv2dOptions = ConvOptions;
/// Conv3d's named arguments (the ConvOptions of every convolution)
using Conv3dOptions = ConvOptions;

/** N-d convolution layer (Conv1d/2d/3d below); weight (out, in/groups, *kernel). */
class ConvNd : public Module {
 public:
  /// a `dims`-d convolution, initialised as torch's; channels that do not divide into groups are a tg::Error
  ConvNd(int dims, int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel, IntArg stride, ConvPadding padding,
         IntArg dilation, int64_t groups, bool bias, std::string padding_mode);
  Tensor forward(const Tensor& x) override;
  /// (out_channels, in_channels / groups, *kernel)
  Tensor& weight;
  /// (out_channels,), or null without a bias
  Tensor* bias = nullptr;

 private:
  IntArg stride_, dilation_;
  ConvPadding padding_;
  int64_t groups_;
  std::string mode_;
};
/// 1-d convolution over (N, C, L) inputs, as torch.nn.Conv1d.
class Conv1d : public ConvNd {
 public:
  /// from named arguments
  explicit Conv1d(const ConvOptions& o)
      : Conv1d(o.in_channels, o.out_channels, o.kernel_size.v.empty() ? 0 : o.kernel_size.v[0], o.stride, o.padding, o.dilation, o.groups, o.bias,
               o.padding_mode) {}
  /// in and out channels, kernel size k, then torch's positional arguments
  Conv1d(int64_t in, int64_t out, int64_t k, IntArg stride = 1, ConvPadding padding = 0, IntArg dilation = 1,
         int64_t groups = 1, bool bias = true, std::string mode = "zeros")
      : ConvNd(1, in, out, {k}, stride, padding, dilation, groups, bias, std::move(mode)) {}
};
/// 2-d convolution over (N, C, H, W) inputs, as torch.nn.Conv2d.
class Conv2d : public ConvNd {
 public:
  /// from named arguments
  explicit Conv2d(const ConvOptions& o)
      : Conv2d(o.in_channels, o.out_channels, o.kernel_size, o.stride, o.padding, o.dilation, o.groups, o.bias,
               o.padding_mode) {}
  /// in and out channels, kernel size k (one value or (kh, kw)), then torch's positional arguments
  Conv2d(int64_t in, int64_t out, IntArg k, IntArg stride = 1, ConvPadding padding = 0, IntArg dilation = 1,
         int64_t groups = 1, bool bias = true, std::string mode = "zeros")
      : ConvNd(2, in, out, k.v.size() == 1 ? std::vector<int64_t>{k.v[0], k.v[0]} : k.v, stride, padding, dilation, groups,
               bias, std::move(mode)) {}
};
/// 3-d convolution over (N, C, D, H, W) inputs, as torch.nn.Conv3d.
class Conv3d : public ConvNd {
 public:
  /// from named arguments
  explicit Conv3d(const ConvOptions& o)
      : Conv3d(o.in_channels, o.out_channels, o.kernel_size, o.stride, o.padding, o.dilation, o.groups, o.bias,
               o.padding_mode) {}
  /// in and out channels, kernel size k (one value or three), then torch's positional arguments
  Conv3d(int64_t in, int64_t out, IntArg k, IntArg stride = 1, ConvPadding padding = 0, IntArg dilation = 1,
         int64_t groups = 1, bool bias = true, std::string mode = "zeros")
      : ConvNd(3, in, out, k.v.size() == 1 ? std::vector<int64_t>{k.v[0], k.v[0], k.v[0]} : k.v, stride, padding,
               dilation, groups, bias, std::move(mode)) {}
};

/** N-d transposed convolution layer (ConvTranspose1d/2d/3d below); weight (in, out/groups, *kernel), initialised
 *  as torch: kaiming_uniform(a=sqrt(5)) over fan_in = out/groups * prod(kernel), bias uniform(+-1/sqrt(fan_in)).
 *  (tinygrad scales both by 1/sqrt(in * prod(kernel)) instead.) */
class ConvTransposeNd : public Module {
 public:
  /// a `dims`-d transposed convolution (the gradient of a convolution with respect to its input)
  ConvTransposeNd(int dims, int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel, IntArg stride,
                  IntArg padding, IntArg output_padding, IntArg dilation, int64_t groups, bool bias);
  Tensor forward(const Tensor& x) override;
  /// (in_channels, out_channels / groups, *kernel)
  Tensor& weight;
  /// (out_channels,), or null without a bias
  Tensor* bias = nullptr;

 private:
  IntArg stride_, padding_, output_padding_, dilation_;
  int64_t groups_;
};
/// 1-d transposed convolution, as torch.nn.ConvTranspose1d.
class ConvTranspose1d : public ConvTransposeNd {
 public:
  /// in and out channels, kernel size k, then torch's positional arguments
  ConvTranspose1d(int64_t in, int64_t out, int64_t k, IntArg stride = 1, IntArg padding = 0, IntArg output_padding = 0,
                  int64_t groups = 1, bool bias = true, IntArg dilation = 1)
      : ConvTransposeNd(1, in, out, {k}, stride, padding, output_padding, dilation, groups, bias) {}
};
/// 2-d transposed convolution, as torch.nn.ConvTranspose2d.
class ConvTranspose2d : public ConvTransposeNd {
 public:
  /// in and out channels, kernel size k (one value or two), then torch's positional arguments
  ConvTranspose2d(int64_t in, int64_t out, IntArg k, IntArg stride = 1, IntArg padding = 0, IntArg output_padding = 0,
                  int64_t groups = 1, bool bias = true, IntArg dilation = 1)
      : ConvTransposeNd(2, in, out, k.v.size() == 1 ? std::vector<int64_t>{k.v[0], k.v[0]} : k.v, stride, padding,
                        output_padding, dilation, groups, bias) {}
};
/// 3-d transposed convolution, as torch.nn.ConvTranspose3d.
class ConvTranspose3d : public ConvTransposeNd {
 public:
  /// in and out channels, kernel size k (one value or three), then torch's positional arguments
  ConvTranspose3d(int64_t in, int64_t out, IntArg k, IntArg stride = 1, IntArg padding = 0, IntArg output_padding = 0,
                  int64_t groups = 1, bool bias = true, IntArg dilation = 1)
      : ConvTransposeNd(3, in, out, k.v.size() == 1 ? std::vector<int64_t>{k.v[0], k.v[0], k.v[0]} : k.v, stride, padding,
                        output_padding, dilation, groups, bias) {}
};

/** BatchNorm's arguments by name: `nn::BatchNorm bn({.num_features = 64, .momentum = 0.01});`. */
struct BatchNormOptions {
  /// channels (dim 1 of the input)
  int64_t num_features = 0;
  /// added to the variance before the square root, and the running statistics' update rate
  ///@{
  double eps = 1e-5, momentum = 0.1;
  ///@}
  /// learn a scale and shift per channel; keep running statistics (else batch statistics in eval too)
  ///@{
  bool affine = true, track_running_stats = true;
  ///@}
};

/** Batch normalisation over dim 1 (BatchNorm1d/2d/3d): batch statistics in training (running statistics updated
 *  with momentum, unbiased variance as torch), running statistics in eval. */
class BatchNorm : public Module {
 public:
  /// normalisation of `num_features` channels (torch's positional order, momentum last)
  explicit BatchNorm(int64_t num_features, double eps = 1e-5, bool affine = true, bool track_running_stats = true,
                     double momentum = 0.1);
  /// from named arguments
  explicit BatchNorm(const BatchNormOptions& o)
      : BatchNorm(o.num_features, o.eps, o.affine, o.track_running_stats, o.momentum) {}
  Tensor forward(const Tensor& x) override;
  /** Synchronised statistics (torch's SyncBatchNorm): in training, each per-channel sum (of the values, then of
   *  their squared deviations from the mean) is passed through `sum_over_replicas`, which returns its sum over the
   *  `replicas` holders of equal shares of the batch (differentiable; tg::dist::allreduce for MPI ranks), so every
   *  replica normalises with the global batch's mean and variance and keeps the same running statistics. */
  void sync_statistics(std::function<Tensor(const Tensor&)> sum_over_replicas, int64_t replicas);
  /// scale and shift (null unless affine), running mean and variance (null unless tracked), each (num_features,)
  ///@{
  Tensor *weight = nullptr, *bias = nullptr, *running_mean = nullptr, *running_var = nullptr;
  ///@}

 private:
  Tensor forward_synced(const Tensor& x);
  int64_t n_;
  double eps_, momentum_;
  std::function<Tensor(const Tensor&)> sync_;  // see sync_statistics
  int64_t replicas_ = 1;
};
/// batch normalisation of (N, C) or (N, C, L) inputs, as torch.nn.BatchNorm1d
using BatchNorm1d = BatchNorm;
/// batch normalisation of (N, C, H, W) inputs, as torch.nn.BatchNorm2d
using BatchNorm2d = BatchNorm;

/** LayerNorm's arguments by name: `nn::LayerNorm ln({.normalized_shape = {512}, .elementwise_affine = false});`. */
struct LayerNormOptions {
  /// the trailing dims normalised over (and the shape of weight and bias)
  std::vector<int64_t> normalized_shape;
  /// added to the variance before the square root
  double eps = 1e-5;
  /// learn a scale and shift of normalized_shape
  bool elementwise_affine = true;
};

/** Layer normalisation over the last dims. */
class LayerNorm : public Module {
 public:
  /// normalisation over the trailing dims `shape`
  explicit LayerNorm(std::vector<int64_t> shape, double eps = 1e-5, bool affine = true);
  /// from named arguments
  explicit LayerNorm(const LayerNormOptions& o) : LayerNorm(o.normalized_shape, o.eps, o.elementwise_affine) {}
  Tensor forward(const Tensor& x) override;
  /// scale and shift of normalized_shape (null unless affine)
  ///@{
  Tensor *weight = nullptr, *bias = nullptr;
  ///@}

 private:
  std::vector<int64_t> shape_;
  double eps_;
};

/** RMS normalisation over the last dim. */
class RMSNorm : public Module {
 public:
  /// x / sqrt(mean(x^2) + eps) * weight over a last dim of size `dim`
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  /// the scale (dim,), initialised to ones
  Tensor& weight;

 private:
  int64_t dim_;
  double eps_;
};

/** GroupNorm's arguments by name: `nn::GroupNorm gn({.num_groups = 8, .num_channels = 64});`. */
struct GroupNormOptions {
  /// groups the channels are split into (num_channels must divide evenly), and channels (dim 1)
  ///@{
  int64_t num_groups = 0, num_channels = 0;
  ///@}
  /// added to the variance before the square root
  double eps = 1e-5;
  /// learn a scale and shift per channel
  bool affine = true;
};

/** Group normalisation; InstanceNorm is GroupNorm with one channel per group. */
class GroupNorm : public Module {
 public:
  /// normalisation over each group of channels and the spatial dims
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  /// from named arguments
  explicit GroupNorm(const GroupNormOptions& o) : GroupNorm(o.num_groups, o.num_channels, o.eps, o.affine) {}
  Tensor forward(const Tensor& x) override;
  /// scale and shift (num_channels,), null unless affine
  ///@{
  Tensor *weight = nullptr, *bias = nullptr;
  ///@}

 private:
  int64_t groups_;
  double eps_;
};
/// Normalisation of each channel of each sample over its spatial dims (a GroupNorm with one channel a group).
class InstanceNorm : public GroupNorm {
 public:
  /// instance normalisation of `num_channels` channels
  explicit InstanceNorm(int64_t num_channels, double eps = 1e-5, bool affine = true)
      : GroupNorm(num_channels, num_channels, eps, affine) {}
};

/** Embedding's arguments by name: `nn::Embedding e({.num_embeddings = 50257, .embedding_dim = 768});`. */
struct EmbeddingOptions {
  /// rows of the table (the index range) and the width of each row
  ///@{
  int64_t num_embeddings = 0, embedding_dim = 0;
  ///@}
};

/** Embedding table (num, dim) ~ N(0, 1) as torch; forward takes integer indices. */
class Embedding : public Module {
 public:
  /// a table (num_embeddings, dim)
  Embedding(int64_t num_embeddings, int64_t dim);
  /// from named arguments
  explicit Embedding(const EmbeddingOptions& o) : Embedding(o.num_embeddings, o.embedding_dim) {}
  Tensor forward(const Tensor& idx) override;
  /// the table (num_embeddings, embedding_dim); forward gathers its rows
  Tensor& weight;
};

/** Dropout with probability p in training mode. */
class Dropout : public Module {
 public:
  /// zeroes each element with probability p in training, scaling the rest by 1/(1-p)
  explicit Dropout(double p = 0.5) : p_(p) {}
  Tensor forward(const Tensor& x) override { return x.dropout(p_, training_); }

 private:
  double p_;
};

/** Activations as layers, for Sequential (torch's nn.ReLU, nn.GELU, ...). */
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.relu(); }
};
/// max(x, negative_slope * x), as torch.nn.LeakyReLU.
class LeakyReLU : public Module {
 public:
  /// the slope for negative inputs
  explicit LeakyReLU(double negative_slope = 0.01) : slope_(negative_slope) {}
  Tensor forward(const Tensor& x) override { return x.leaky_relu(slope_); }

 private:
  double slope_;
};
/** approximate: "none" (erf) or "tanh", as torch. */
class GELU : public Module {
 public:
  /// "none" (exact, with erf) or "tanh"
  explicit GELU(std::string approximate = "none") : approximate_(std::move(approximate)) {}
  Tensor forward(const Tensor& x) override { return x.gelu(approximate_); }

 private:
  std::string approximate_;
};
/// x * sigmoid(x), as torch.nn.SiLU.
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.silu(); }
};
/// 1 / (1 + exp(-x)), as torch.nn.Sigmoid.
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.sigmoid(); }
};
/// tanh(x), as torch.nn.Tanh.
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.tanh(); }
};
/** softmax / log_softmax along dim (default the last). */
class Softmax : public Module {
 public:
  /// softmax along `dim`
  explicit Softmax(int64_t dim = -1) : dim_(dim) {}
  Tensor forward(const Tensor& x) override { return x.softmax(dim_); }

 private:
  int64_t dim_;
};
/// log(softmax(x)) along a dim, computed stably, as torch.nn.LogSoftmax.
class LogSoftmax : public Module {
 public:
  /// log_softmax along `dim`
  explicit LogSoftmax(int64_t dim = -1) : dim_(dim) {}
  Tensor forward(const Tensor& x) override { return x.log_softmax(dim_); }

 private:
  int64_t dim_;
};
/** Flattens dims start..end; the default keeps the batch dim, as torch's nn.Flatten. */
class Flatten : public Module {
 public:
  /// flattens dims start_dim..end_dim (negative: from the end)
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_, end_); }

 private:
  int64_t start_, end_;
};
/// Returns its input (a placeholder layer, as torch.nn.Identity).
class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
};

/** A function as a layer (relu, flatten, ...). */
class Lambda : public Module {
 public:
  /// a layer whose forward calls f
  explicit Lambda(std::function<Tensor(const Tensor&)> f) : f_(std::move(f)) {}
  Tensor forward(const Tensor& x) override { return f_(x); }

 private:
  std::function<Tensor(const Tensor&)> f_;
};

/** Layers applied in order; children named "0", "1", ... */
class Sequential : public Module {
 public:
  Sequential() = default;
  /// the layers in order, registered as children "0", "1", ...
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  /// appends a layer (child named by its position); returns *this
  Sequential& add(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

/** LSTM cell: (h, c) -> (h', c') with gates i, f, g, o as torch.nn.LSTMCell. */
class LSTMCell : public Module {
 public:
  /// weights ~ U(-1/sqrt(hidden), 1/sqrt(hidden)) as torch
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  Tensor forward(const Tensor& x) override;  ///< h' with zero state
  /// one step: x (N, input), h and c (N, hidden) -> (h', c')
  std::pair<Tensor, Tensor> step(const Tensor& x, const Tensor& h, const Tensor& c);
  /// input and hidden weights (4*hidden, input) and (4*hidden, hidden), gates i, f, g, o stacked
  ///@{
  Tensor &weight_ih, &weight_hh;
  ///@}
  /// biases (4*hidden,), or null without biases
  ///@{
  Tensor *bias_ih = nullptr, *bias_hh = nullptr;
  ///@}

 private:
  int64_t hidden_;
};

}  // namespace tg::nn
