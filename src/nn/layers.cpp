// nn layers: parameters, initialisation, forward passes.
#include <cmath>

#include "tg/nn/nn.hpp"

namespace tg::nn {

// ---------------------------------------------------------------- Module

Tensor& Module::param(const std::string& name, Tensor t) {
  t = t.contiguous();
  t.realize();
  t.requires_grad_(true);
  owned_.push_back(std::make_unique<Tensor>(t));
  entries_.push_back({name, owned_.back().get(), true});
  return *owned_.back();
}

Tensor& Module::buffer(const std::string& name, Tensor t) {
  t = t.contiguous();
  t.realize();
  owned_.push_back(std::make_unique<Tensor>(t));
  entries_.push_back({name, owned_.back().get(), false});
  return *owned_.back();
}

void Module::child(const std::string& name, std::shared_ptr<Module> m) { children_.emplace_back(name, std::move(m)); }

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Entry>>& out) {
  for (auto& e : entries_) out.emplace_back(prefix + e.name, e);
  for (auto& [n, c] : children_) c->collect(prefix + n + ".", out);
}

std::map<std::string, Tensor> Module::state_dict() {
  std::vector<std::pair<std::string, Entry>> all;
  collect("", all);
  std::map<std::string, Tensor> out;
  for (auto& [n, e] : all) out.emplace(n, *e.t);
  return out;
}

std::vector<Tensor> Module::parameters() {
  std::vector<std::pair<std::string, Entry>> all;
  collect("", all);
  std::vector<Tensor> out;
  for (auto& [n, e] : all)
    if (e.trainable) out.push_back(*e.t);
  return out;
}

std::vector<Tensor> Module::buffers() {
  std::vector<std::pair<std::string, Entry>> all;
  collect("", all);
  std::vector<Tensor> out;
  for (auto& [n, e] : all)
    if (!e.trainable) out.push_back(*e.t);
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& sd, bool strict) {
  std::vector<std::pair<std::string, Entry>> all;
  collect("", all);
  std::vector<Tensor*> dst;
  std::vector<Tensor> src;
  for (auto& [n, e] : all) {
    auto it = sd.find(n);
    if (it == sd.end()) {
      if (strict) throw Error("[load_state_dict] missing key '" + n + "' (shape " + shape_str(e.t->shape()) + ")");
      continue;
    }
    if (it->second.shape() != e.t->shape())
      throw Error("[load_state_dict] '" + n + "' has shape " + shape_str(it->second.shape()) + ", the model expects " +
                  shape_str(e.t->shape()));
    dst.push_back(e.t);
    src.push_back(it->second);
  }
  if (strict)
    for (auto& [k, v] : sd) {
      bool known = false;
      for (auto& [n, e] : all) known |= n == k;
      if (!known) throw Error("[load_state_dict] unexpected key '" + k + "' " + shape_str(v.shape()));
    }
  for (size_t i = 0; i < dst.size(); i++) dst[i]->assign(src[i].to(dst[i]->device()));
  Tensor::realize_all(dst);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::apply(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (auto& [n, c] : children_) c->apply(fn);
}

// ---------------------------------------------------------------- layers

namespace {
double prod(const std::vector<int64_t>& v, size_t from = 0) {
  double p = 1;
  for (size_t i = from; i < v.size(); i++) p *= double(v[i]);
  return p;
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool has_bias)
    : weight(param("weight", Tensor::kaiming_uniform({out, in}, std::sqrt(5.0)))) {
  if (in <= 0 || out <= 0) throw Error("[Linear] sizes must be positive, got " + std::to_string(in) + ", " + std::to_string(out));
  double bound = 1.0 / std::sqrt(double(in));
  if (has_bias) bias = &param("bias", Tensor::uniform({out}, -bound, bound));
}

Tensor Linear::forward(const Tensor& x) {
  return bias ? x.linear(weight, *bias) : x.linear(weight);
}

ConvNd::ConvNd(int dims, int64_t in, int64_t out, std::vector<int64_t> k, IntArg stride, ConvPadding padding, IntArg dilation,
               int64_t groups, bool has_bias, std::string mode)
    : weight(param("weight", [&] {
        if (int(k.size()) != dims) throw Error("[Conv] kernel needs " + std::to_string(dims) + " sizes");
        if (groups <= 0 || in % groups || out % groups)
          throw Error("[Conv] channels " + std::to_string(in) + " -> " + std::to_string(out) + " do not divide into " +
                      std::to_string(groups) + " groups");
        Shape ws{out, in / groups};
        ws.insert(ws.end(), k.begin(), k.end());
        return Tensor::kaiming_uniform(ws, std::sqrt(5.0));
      }())),
      stride_(std::move(stride)), dilation_(std::move(dilation)), padding_(std::move(padding)), groups_(groups),
      mode_(std::move(mode)) {
  double bound = 1.0 / std::sqrt(prod(weight.shape(), 1));
  if (has_bias) bias = &param("bias", Tensor::uniform({out}, -bound, bound));
}

Tensor ConvNd::forward(const Tensor& x) {
  std::optional<Tensor> b;
  if (bias) b = *bias;
  return x.conv(weight, b, stride_, padding_, dilation_, groups_, mode_);
}

ConvTransposeNd::ConvTransposeNd(int dims, int64_t in, int64_t out, std::vector<int64_t> k, IntArg stride, IntArg padding,
                                 IntArg output_padding, IntArg dilation, int64_t groups, bool has_bias)
    : weight(param("weight", [&] {
        if (int(k.size()) != dims)
          throw Error("[ConvTranspose" + std::to_string(dims) + "d] kernel needs " + std::to_string(dims) + " sizes, got " +
                      std::to_string(k.size()));
        if (in <= 0 || out <= 0 || groups <= 0 || in % groups || out % groups)
          throw Error("[ConvTranspose" + std::to_string(dims) + "d] channels " + std::to_string(in) + " -> " +
                      std::to_string(out) + " do not divide into " + std::to_string(groups) + " groups");
        for (int64_t v : k)
          if (v <= 0) throw Error("[ConvTranspose" + std::to_string(dims) + "d] kernel sizes must be positive");
        Shape ws{in, out / groups};
        ws.insert(ws.end(), k.begin(), k.end());
        return Tensor::kaiming_uniform(ws, std::sqrt(5.0));  // fan_in = prod(ws[1:]) = out/groups * prod(k), as torch
      }())),
      stride_(std::move(stride)), padding_(std::move(padding)), output_padding_(std::move(output_padding)),
      dilation_(std::move(dilation)), groups_(groups) {
  double bound = 1.0 / std::sqrt(prod(weight.shape(), 1));
  if (has_bias) bias = &param("bias", Tensor::uniform({out}, -bound, bound));
}

Tensor ConvTransposeNd::forward(const Tensor& x) {
  std::optional<Tensor> b;
  if (bias) b = *bias;
  return x.conv_transpose(weight, b, stride_, padding_, output_padding_, groups_, dilation_);
}

BatchNorm::BatchNorm(int64_t n, double eps, bool affine, bool track, double momentum) : n_(n), eps_(eps), momentum_(momentum) {
  if (affine) {
    weight = &param("weight", Tensor::ones({n}));
    bias = &param("bias", Tensor::zeros({n}));
  }
  if (track) {
    running_mean = &buffer("running_mean", Tensor::zeros({n}));
    running_var = &buffer("running_var", Tensor::ones({n}));
  }
}

Tensor BatchNorm::forward(const Tensor& x) {
  if (x.ndim() < 2 || x.shape()[1] != n_)
    throw Error("[BatchNorm] expects (N, " + std::to_string(n_) + ", ...), got " + shape_str(x.shape()));
  // Tensor::batch_norm: batch statistics when training or without running ones (then updated in place), else the
  // running ones; 16-bit floats in float32.
  std::optional<Tensor> w, b, rm, rv;
  if (weight) w = *weight, b = *bias;
  bool batch_stats = training_ || !running_mean;
  if (sync_ && training_) return forward_synced(x);  // as torch: eval without running statistics does not sync
  if (running_mean && (training_ || !batch_stats)) rm = *running_mean, rv = *running_var;
  return x.batch_norm(rm, rv, w, b, batch_stats, momentum_, eps_);
}

void BatchNorm::sync_statistics(std::function<Tensor(const Tensor&)> sum_over_replicas, int64_t replicas) {
  if (replicas < 1) throw Error("[BatchNorm] sync_statistics needs replicas >= 1, got " + std::to_string(replicas));
  sync_ = std::move(sum_over_replicas), replicas_ = replicas;
}

// Tensor::batch_norm's training path with the sums taken over every replica's share of the batch (two passes, as
// there: the mean, then the mean squared deviation).
Tensor BatchNorm::forward_synced(const Tensor& x) {
  DType out = dtypes::is_float(x.dtype()) ? x.dtype() : dtypes::float32;
  Tensor xf = out.itemsize() < 4 ? x.cast(dtypes::float32) : x.cast(out);  // 16-bit floats in float32
  std::vector<int64_t> axes{0};
  for (int64_t i = 2; i < x.ndim(); i++) axes.push_back(i);
  int64_t n = x.numel() / n_ * replicas_;
  if (n <= 1) throw Error("[BatchNorm] training needs more than one value per channel, input " + shape_str(x.shape()));
  Tensor mean = sync_(xf.sum(axes, true)) / double(n);
  Tensor d = xf - mean;
  Tensor var = sync_((d * d).sum(axes, true)) / double(n);
  if (running_mean) {  // in place, outside autograd, unbiased variance (torch)
    Tensor m = mean.detach().reshape({n_}), v = var.detach().reshape({n_}) * (double(n) / double(n - 1));
    running_mean->assign((*running_mean * (1 - momentum_) + m * momentum_).cast(running_mean->dtype()));
    running_var->assign((*running_var * (1 - momentum_) + v * momentum_).cast(running_var->dtype()));
  }
  Shape cs(size_t(x.ndim()), 1);
  cs[1] = n_;
  Tensor y = d * (var + eps_).rsqrt();
  if (weight) y = y * weight->reshape(cs) + bias->reshape(cs);
  return y.cast(out);
}

LayerNorm::LayerNorm(std::vector<int64_t> shape, double eps, bool affine) : shape_(std::move(shape)), eps_(eps) {
  if (affine) {
    weight = &param("weight", Tensor::ones(shape_));
    bias = &param("bias", Tensor::zeros(shape_));
  }
}
Tensor LayerNorm::forward(const Tensor& x) {
  std::optional<Tensor> w, b;
  if (weight) w = *weight, b = *bias;
  return x.layer_norm(shape_, w, b, eps_);
}

RMSNorm::RMSNorm(int64_t dim, double eps) : weight(param("weight", Tensor::ones({dim}))), dim_(dim), eps_(eps) {}
Tensor RMSNorm::forward(const Tensor& x) { return x.rms_norm({dim_}, weight, eps_); }

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps, bool affine) : groups_(groups), eps_(eps) {
  if (groups <= 0 || channels % groups)
    throw Error("[GroupNorm] " + std::to_string(channels) + " channels do not divide into " + std::to_string(groups) + " groups");
  if (affine) {
    weight = &param("weight", Tensor::ones({channels}));
    bias = &param("bias", Tensor::zeros({channels}));
  }
}
Tensor GroupNorm::forward(const Tensor& x) {
  std::optional<Tensor> w, b;
  if (weight) w = *weight, b = *bias;
  return x.group_norm(groups_, w, b, eps_);
}

Embedding::Embedding(int64_t num, int64_t dim) : weight(param("weight", Tensor::randn({num, dim}))) {}
Tensor Embedding::forward(const Tensor& idx) { return embedding(idx, weight); }

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers) {
  for (auto& l : layers) add(l);
}
Sequential& Sequential::add(std::shared_ptr<Module> m) {
  child(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
  return *this;
}
Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& l : layers_) y = l->forward(y);
  return y;
}

LSTMCell::LSTMCell(int64_t input, int64_t hidden, bool has_bias)
    : weight_ih(param("weight_ih", Tensor::uniform({4 * hidden, input}, -1 / std::sqrt(double(hidden)), 1 / std::sqrt(double(hidden))))),
      weight_hh(param("weight_hh", Tensor::uniform({4 * hidden, hidden}, -1 / std::sqrt(double(hidden)), 1 / std::sqrt(double(hidden))))),
      hidden_(hidden) {
  double b = 1 / std::sqrt(double(hidden));
  if (has_bias) {
    bias_ih = &param("bias_ih", Tensor::uniform({4 * hidden}, -b, b));
    bias_hh = &param("bias_hh", Tensor::uniform({4 * hidden}, -b, b));
  }
}
std::pair<Tensor, Tensor> LSTMCell::step(const Tensor& x, const Tensor& h, const Tensor& c) {
  Tensor gates = x.linear(weight_ih) + h.linear(weight_hh);
  if (bias_ih) gates = gates + *bias_ih + *bias_hh;
  auto ch = gates.chunk(4, -1);
  Tensor i = ch[0].sigmoid(), f = ch[1].sigmoid(), g = ch[2].tanh(), o = ch[3].sigmoid();
  Tensor c2 = f * c + i * g;
  return {o * c2.tanh(), c2};
}
Tensor LSTMCell::forward(const Tensor& x) {
  Shape hs{x.shape()[0], hidden_};
  return step(x, Tensor::zeros(hs), Tensor::zeros(hs)).first;
}

}  // namespace tg::nn
