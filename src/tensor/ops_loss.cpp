// Losses (this is the prediction): cross entropy family, binary cross entropy, regression losses.
#include "ops_util.hpp"

namespace tg {
using namespace detail;

namespace {
// Class indices against logits/log-probs x (N, C, *) or (C,): the expected target shape, checked.
int64_t class_dim_checked(const Tensor& x, const Tensor& target, const char* op) {
  if (x.ndim() == 0) fail(op, "input must have a class dim, got a 0-d tensor");
  int64_t cdim = x.ndim() == 1 ? 0 : 1;
  Shape want = x.shape();
  want.erase(want.begin() + cdim);
  if (target.shape() != want)
    fail(op, "class-index target " + shape_str(target.shape()) + " must be " + shape_str(want) + " for input " +
                 shape_str(x.shape()));
  return cdim;
}
void check_weight(const std::optional<Tensor>& weight, int64_t c, const char* op) {
  if (weight && weight->shape() != Shape{c})
    fail(op, "weight " + shape_str(weight->shape()) + " must be (" + std::to_string(c) + ",), one per class");
}
// (C,) -> broadcastable along the class dim of an n-d input
Tensor along(const Tensor& w, int64_t cdim, int64_t n) {
  Shape s(size_t(n), 1);
  s[size_t(cdim)] = w.shape()[0];
  return w.reshape(s);
}
// Weighted NLL of class indices (without the smoothing term): per-sample loss and the weight of each sample.
std::pair<Tensor, Tensor> nll_terms(const Tensor& logp, const Tensor& target, int64_t cdim, const std::optional<Tensor>& weight,
                                    int64_t ignore_index, const char* op) {
  int64_t c = logp.shape()[size_t(cdim)];
  Tensor valid = target.ne(Tensor::full({}, double(ignore_index), dtypes::strong(target.dtype()), target.device()));
  Tensor hot = mark_index_check(
      target.unsqueeze(cdim).eq(arange_at(c, cdim, logp.ndim(), logp.device(), dtypes::strong(target.dtype()))), op,
      ignore_index);
  Tensor w = weight ? along(weight->cast(logp.dtype()), cdim, logp.ndim()) : Tensor::ones({}, logp.dtype(), logp.device());
  Tensor wy = hot.where(w, const_like(logp, 0)).sum(cdim) * valid.cast(logp.dtype());  // weight of each sample
  Tensor nll = -hot.where(logp * w, const_like(logp, 0)).sum(cdim) * valid.cast(logp.dtype());
  return {nll, wy};
}
void check_same(const Tensor& x, const Tensor& target, const char* op) {
  Shape s = Tensor::broadcast_shape(x.shape(), target.shape(), op);
  if (s != x.shape()) fail(op, "target " + shape_str(target.shape()) + " does not broadcast to input " + shape_str(x.shape()));
}
}  // namespace

Tensor Tensor::nll_loss(const Tensor& target, const std::optional<Tensor>& weight, int64_t ignore_index,
                        const std::string& reduction) const {
  check_reduction(reduction, "nll_loss");
  if (!dtypes::is_int(target.dtype())) fail("nll_loss", "target must hold class indices (int), got " + target.dtype().name());
  int64_t cdim = class_dim_checked(*this, target, "nll_loss");
  check_weight(weight, shape()[size_t(cdim)], "nll_loss");
  auto [nll, wy] = nll_terms(to_float(*this), target, cdim, weight, ignore_index, "nll_loss");
  if (reduction == "mean") return nll.sum() / wy.sum();
  return reduction == "sum" ? nll.sum() : nll;
}

Tensor Tensor::cross_entropy(const Tensor& target, const std::string& reduction, double label_smoothing,
                             int64_t ignore_index, const std::optional<Tensor>& weight, CallLoc loc) const {
  CallSite site(loc);
  check_reduction(reduction, "cross_entropy");
  if (!(label_smoothing >= 0 && label_smoothing <= 1))
    fail("cross_entropy", "label_smoothing must be in [0, 1], got " + std::to_string(label_smoothing));
  if (ndim() == 0) fail("cross_entropy", "input must have a class dim, got a 0-d tensor");
  int64_t cdim = ndim() == 1 ? 0 : 1, c = shape()[size_t(cdim)];
  check_weight(weight, c, "cross_entropy");
  Tensor logp = log_softmax(cdim);
  double eps = label_smoothing;
  if (dtypes::is_float(target.dtype())) {  // class probabilities
    if (target.shape() != shape())
      fail("cross_entropy", "probability target " + shape_str(target.shape()) + " must match input " + shape_str(shape()));
    Tensor y = eps > 0 ? (target * (1 - eps) + eps / double(c)) : target;
    Tensor t = weight ? (logp * y * along(*weight, cdim, ndim())) : (logp * y);
    Tensor loss = -t.sum(cdim);
    if (reduction == "mean") return loss.sum() / double(std::max<int64_t>(1, numel() / std::max<int64_t>(c, 1)));
    return reduction == "sum" ? loss.sum() : loss;
  }
  if (!dtypes::is_int(target.dtype())) fail("cross_entropy", "target must be class indices (int) or probabilities (float)");
  class_dim_checked(*this, target, "cross_entropy");
  auto [nll, wy] = nll_terms(logp, target, cdim, weight, ignore_index, "cross_entropy");
  Tensor loss = nll;
  if (eps > 0) {
    Tensor valid = target.ne(Tensor::full({}, double(ignore_index), dtypes::strong(target.dtype()), device())).cast(logp.dtype());
    Tensor lw = weight ? (logp * along(*weight, cdim, ndim())) : logp;
    Tensor smooth = -lw.sum(cdim) * valid;
    loss = nll * (1 - eps) + smooth * (eps / double(c));
  }
  if (reduction == "mean") return loss.sum() / wy.sum();
  return reduction == "sum" ? loss.sum() : loss;
}

Tensor Tensor::sparse_categorical_crossentropy(const Tensor& target, int64_t ignore_index, double label_smoothing,
                                               const std::string& reduction) const {
  const char* op = "sparse_categorical_crossentropy";
  check_reduction(reduction, op);
  if (!(label_smoothing >= 0 && label_smoothing <= 1))
    fail(op, "label_smoothing must be in [0, 1], got " + std::to_string(label_smoothing));
  if (!dtypes::is_int(target.dtype())) fail(op, "target must hold class indices (int), got " + target.dtype().name());
  if (ndim() == 0) fail(op, "input must have a class dim (last), got a 0-d tensor");
  Shape want(shape().begin(), shape().end() - 1);
  if (target.shape() != want)
    fail(op, "target " + shape_str(target.shape()) + " must be " + shape_str(want) + " for input " + shape_str(shape()));
  Tensor logp = log_softmax(-1);
  Tensor valid = target.ne(Tensor::full({}, double(ignore_index), dtypes::strong(target.dtype()), device())).cast(logp.dtype());
  Tensor y = one_hot_mask(target, shape().back()).where(1.0, 0.0).cast(logp.dtype());
  Tensor picked = (logp * y).sum(-1);
  Tensor loss = -((picked * (1 - label_smoothing) + logp.mean(-1) * label_smoothing) * valid);
  if (reduction == "mean") return loss.sum() / valid.sum();
  return reduction == "sum" ? loss.sum() : loss;
}

Tensor Tensor::binary_crossentropy(const Tensor& target, const std::string& reduction) const {
  check_reduction(reduction, "binary_crossentropy");
  check_same(*this, target, "binary_crossentropy");
  Tensor p = to_float(*this);
  Tensor lp = p.log().clamp_min(-100), lq = (1.0 - p).log().clamp_min(-100);
  return reduce_loss(-(target * lp + (1.0 - target) * lq), reduction, "binary_crossentropy");
}

Tensor Tensor::binary_crossentropy_with_logits(const Tensor& target, const std::string& reduction,
                                               const std::optional<Tensor>& pos_weight) const {
  const char* op = "binary_crossentropy_with_logits";
  check_reduction(reduction, op);
  check_same(*this, target, op);
  Tensor x = to_float(*this);
  Tensor pos = target * x.logsigmoid();
  if (pos_weight) pos = pos * *pos_weight;
  return reduce_loss(-(pos + (1.0 - target) * (-x).logsigmoid()), reduction, op);
}

Tensor Tensor::mse_loss(const Tensor& target, const std::string& reduction) const {
  check_same(*this, target, "mse_loss");
  Tensor d = *this - target;
  return reduce_loss(d * d, reduction, "mse_loss");
}
Tensor Tensor::l1_loss(const Tensor& target, const std::string& reduction) const {
  check_same(*this, target, "l1_loss");
  return reduce_loss((*this - target).abs(), reduction, "l1_loss");
}
Tensor Tensor::smooth_l1_loss(const Tensor& target, const std::string& reduction, double beta) const {
  check_same(*this, target, "smooth_l1_loss");
  if (beta < 0) fail("smooth_l1_loss", "beta must be non-negative, got " + std::to_string(beta));
  Tensor d = (*this - target).abs();
  if (beta == 0) return reduce_loss(d, reduction, "smooth_l1_loss");
  return reduce_loss((d < beta).where(d * d * (0.5 / beta), d - 0.5 * beta), reduction, "smooth_l1_loss");
}

}  // namespace tg
