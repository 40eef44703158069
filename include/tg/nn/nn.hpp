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
  void eval() { train(false); }
  bool training() const { return training_; }

 protected:
  Tensor& param(const std::string& name, Tensor t);
  Tensor& buffer(const std::string& name, Tensor t);
  void child(const std::string& name, std::shared_ptr<Module> m);
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
  int64_t in_features = 0, out_features = 0;
  bool bias = true;
};

/** y = x @ W.T + b; W (out, in) kaiming_uniform(a=sqrt(5)), b uniform(+-1/sqrt(in)), as torch. */
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  explicit Linear(const LinearOptions& o) : Linear(o.in_features, o.out_features, o.bias) {}
  Tensor forward(const Tensor& x) override;
  Tensor& weight;
  Tensor* bias = nullptr;
};

/** A convolution layer's arguments by name (Conv1d/2d/3d), as torch's: `nn::Conv2d c({.in_channels = 1,
 *  .out_channels = 32, .kernel_size = 5, .padding = "same", .bias = false});` (fields in this order). */
struct ConvOptions {
  int64_t in_channels = 0, out_channels = 0;
  IntArg kernel_size;
  IntArg stride = 1;
  ConvPadding padding = 0;
  IntArg dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  std::string padding_mode = "zeros";
};
using Conv1dOptions = ConvOptions;
using Conv2dOptions = ConvOptions;
using Conv3dOptions = ConvOptions;

/** N-d convolution layer (Conv1d/2d/3d below); weight (out, in/groups, *kernel). */
class ConvNd : public Module {
 public:
  ConvNd(int dims, int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel, IntArg stride, ConvPadding padding,
         IntArg dilation, int64_t groups, bool bias, std::string padding_mode);
  Tensor forward(const Tensor& x) override;
  Tensor& weight;
  Tensor* bias = nullptr;

 private:
  IntArg stride_, dilation_;
  ConvPadding padding_;
  int64_t groups_;
  std::string mode_;
};
class Conv1d : public ConvNd {
 public:
  explicit Conv1d(const ConvOptions& o)
      : Conv1d(o.in_channels, o.out_channels, o.kernel_size.v.empty() ? 0 : o.kernel_size.v[0], o.stride, o.padding, o.dilation, o.groups, o.bias,
               o.padding_mode) {}
  Conv1d(int64_t in, int64_t out, int64_t k, IntArg stride = 1, ConvPadding padding = 0, IntArg dilation = 1,
         int64_t groups = 1, bool bias = true, std::string mode = "zeros")
      : ConvNd(1, in, out, {k}, stride, padding, dilation, groups, bias, std::move(mode)) {}
};
class Conv2d : public ConvNd {
 public:
  explicit Conv2d(const ConvOptions& o)
      : Conv2d(o.in_channels, o.out_channels, o.kernel_size, o.stride, o.padding, o.dilation, o.groups, o.bias,
               o.padding_mode) {}
  Conv2d(int64_t in, int64_t out, IntArg k, IntArg stride = 1, ConvPadding padding = 0, IntArg dilation = 1,
         int64_t groups = 1, bool bias = true, std::string mode = "zeros")
      : ConvNd(2, in, out, k.v.size() == 1 ? std::vector<int64_t>{k.v[0], k.v[0]} : k.v, stride, padding, dilation, groups,
               bias, std::move(mode)) {}
};
class Conv3d : public ConvNd {
 public:
  explicit Conv3d(const ConvOptions& o)
      : Conv3d(o.in_channels, o.out_channels, o.kernel_size, o.stride, o.padding, o.dilation, o.groups, o.bias,
               o.padding_mode) {}
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
  ConvTransposeNd(int dims, int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel, IntArg stride,
                  IntArg padding, IntArg output_padding, IntArg dilation, int64_t groups, bool bias);
  Tensor forward(const Tensor& x) override;
  Tensor& weight;
  Tensor* bias = nullptr;

 private:
  IntArg stride_, padding_, output_padding_, dilation_;
  int64_t groups_;
};
class ConvTranspose1d : public ConvTransposeNd {
 public:
  ConvTranspose1d(int64_t in, int64_t out, int64_t k, IntArg stride = 1, IntArg padding = 0, IntArg output_padding = 0,
                  int64_t groups = 1, bool bias = true, IntArg dilation = 1)
      : ConvTransposeNd(1, in, out, {k}, stride, padding, output_padding, dilation, groups, bias) {}
};
class ConvTranspose2d : public ConvTransposeNd {
 public:
  ConvTranspose2d(int64_t in, int64_t out, IntArg k, IntArg stride = 1, IntArg padding = 0, IntArg output_padding = 0,
                  int64_t groups = 1, bool bias = true, IntArg dilation = 1)
      : ConvTransposeNd(2, in, out, k.v.size() == 1 ? std::vector<int64_t>{k.v[0], k.v[0]} : k.v, stride, padding,
                        output_padding, dilation, groups, bias) {}
};
class ConvTranspose3d : public ConvTransposeNd {
 public:
  ConvTranspose3d(int64_t in, int64_t out, IntArg k, IntArg stride = 1, IntArg padding = 0, IntArg output_padding = 0,
                  int64_t groups = 1, bool bias = true, IntArg dilation = 1)
      : ConvTransposeNd(3, in, out, k.v.size() == 1 ? std::vector<int64_t>{k.v[0], k.v[0], k.v[0]} : k.v, stride, padding,
                        output_padding, dilation, groups, bias) {}
};

/** BatchNorm's arguments by name: `nn::BatchNorm bn({.num_features = 64, .momentum = 0.01});`. */
struct BatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5, momentum = 0.1;
  bool affine = true, track_running_stats = true;
};

/** Batch normalisation over dim 1 (BatchNorm1d/2d/3d): batch statistics in training (running statistics updated
 *  with momentum, unbiased variance as torch), running statistics in eval. */
class BatchNorm : public Module {
 public:
  explicit BatchNorm(int64_t num_features, double eps = 1e-5, bool affine = true, bool track_running_stats = true,
                     double momentum = 0.1);
  explicit BatchNorm(const BatchNormOptions& o)
      : BatchNorm(o.num_features, o.eps, o.affine, o.track_running_stats, o.momentum) {}
  Tensor forward(const Tensor& x) override;
  Tensor *weight = nullptr, *bias = nullptr, *running_mean = nullptr, *running_var = nullptr;

 private:
  int64_t n_;
  double eps_, momentum_;
};
using BatchNorm1d = BatchNorm;
using BatchNorm2d = BatchNorm;

/** LayerNorm's arguments by name: `nn::LayerNorm ln({.normalized_shape = {512}, .elementwise_affine = false});`. */
struct LayerNormOptions {
  std::vector<int64_t> normalized_shape;
  double eps = 1e-5;
  bool elementwise_affine = true;
};

/** Layer normalisation over the last dims. */
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> shape, double eps = 1e-5, bool affine = true);
  explicit LayerNorm(const LayerNormOptions& o) : LayerNorm(o.normalized_shape, o.eps, o.elementwise_affine) {}
  Tensor forward(const Tensor& x) override;
  Tensor *weight = nullptr, *bias = nullptr;

 private:
  std::vector<int64_t> shape_;
  double eps_;
};

/** RMS normalisation over the last dim. */
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  Tensor& weight;

 private:
  int64_t dim_;
  double eps_;
};

/** GroupNorm's arguments by name: `nn::GroupNorm gn({.num_groups = 8, .num_channels = 64});`. */
struct GroupNormOptions {
  int64_t num_groups = 0, num_channels = 0;
  double eps = 1e-5;
  bool affine = true;
};

/** Group normalisation; InstanceNorm is GroupNorm with one channel per group. */
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  explicit GroupNorm(const GroupNormOptions& o) : GroupNorm(o.num_groups, o.num_channels, o.eps, o.affine) {}
  Tensor forward(const Tensor& x) override;
  Tensor *weight = nullptr, *bias = nullptr;

 private:
  int64_t groups_;
  double eps_;
};
class InstanceNorm : public GroupNorm {
 public:
  explicit InstanceNorm(int64_t num_channels, double eps = 1e-5, bool affine = true)
      : GroupNorm(num_channels, num_channels, eps, affine) {}
};

/** Embedding's arguments by name: `nn::Embedding e({.num_embeddings = 50257, .embedding_dim = 768});`. */
struct EmbeddingOptions {
  int64_t num_embeddings = 0, embedding_dim = 0;
};

/** Embedding table (num, dim) ~ N(0, 1) as torch; forward takes integer indices. */
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim);
  explicit Embedding(const EmbeddingOptions& o) : Embedding(o.num_embeddings, o.embedding_dim) {}
  Tensor forward(const Tensor& idx) override;
  Tensor& weight;
};

/** Dropout with probability p in training mode. */
class Dropout : public Module {
 public:
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
class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : slope_(negative_slope) {}
  Tensor forward(const Tensor& x) override { return x.leaky_relu(slope_); }

 private:
  double slope_;
};
/** approximate: "none" (erf) or "tanh", as torch. */
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate_(std::move(approximate)) {}
  Tensor forward(const Tensor& x) override { return x.gelu(approximate_); }

 private:
  std::string approximate_;
};
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.silu(); }
};
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.sigmoid(); }
};
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.tanh(); }
};
/** softmax / log_softmax along dim (default the last). */
class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim = -1) : dim_(dim) {}
  Tensor forward(const Tensor& x) override { return x.softmax(dim_); }

 private:
  int64_t dim_;
};
class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim = -1) : dim_(dim) {}
  Tensor forward(const Tensor& x) override { return x.log_softmax(dim_); }

 private:
  int64_t dim_;
};
/** Flattens dims start..end; the default keeps the batch dim, as torch's nn.Flatten. */
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_, end_); }

 private:
  int64_t start_, end_;
};
class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
};

/** A function as a layer (relu, flatten, ...). */
class Lambda : public Module {
 public:
  explicit Lambda(std::function<Tensor(const Tensor&)> f) : f_(std::move(f)) {}
  Tensor forward(const Tensor& x) override { return f_(x); }

 private:
  std::function<Tensor(const Tensor&)> f_;
};

/** Layers applied in order; children named "0", "1", ... */
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  Sequential& add(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

/** LSTM cell: (h, c) -> (h', c') with gates i, f, g, o as torch.nn.LSTMCell. */
class LSTMCell : public Module {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  Tensor forward(const Tensor& x) override;  ///< h' with zero state
  std::pair<Tensor, Tensor> step(const Tensor& x, const Tensor& h, const Tensor& c);
  Tensor &weight_ih, &weight_hh;
  Tensor *bias_ih = nullptr, *bias_hh = nullptr;

 private:
  int64_t hidden_;
};

}  // namespace tg::nn
