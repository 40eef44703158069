// Optimisers as lazy assigns; learning-rate schedules.
#include "tg/nn/optim.hpp"

#include <cmath>

namespace tg::nn::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_value_(lr) {
  if (params_.empty()) throw Error("[optimizer] no parameters given");
  for (auto& p : params_) {
    if (!dtypes::is_float(p.dtype())) throw Error("[optimizer] parameters must be float, got " + p.dtype().name());
    p.requires_grad_(true);
  }
  lr_ = Tensor::full({1}, lr, dtypes::float32, params_[0].device()).contiguous();
  lr_.realize();
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
  lr_value_ = lr;
  lr_.assign(Tensor::full({1}, lr, dtypes::float32, lr_.device()));
  lr_.realize();
}

std::vector<Tensor> Optimizer::schedule_step() {
  NoGrad ng;
  std::vector<Tensor> out = begin_step();
  for (size_t i = 0; i < params_.size(); i++) {
    if (!params_[i].has_grad())
      throw Error("[optimizer] parameter " + std::to_string(i) + " " + shape_str(params_[i].shape()) +
                  " has no gradient: call backward() on a loss that uses it");
    auto u = update(i, params_[i], params_[i].grad().detach());
    out.insert(out.end(), u.begin(), u.end());
  }
  return out;
}

void Optimizer::step() {
  std::vector<Tensor> ts = schedule_step();
  std::vector<Tensor*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  Tensor::realize_all(ptrs);
}

// ---------------------------------------------------------------- SGD

SGD::SGD(std::vector<Tensor> params, double lr, double momentum, double weight_decay, bool nesterov)
    : Optimizer(std::move(params), lr), momentum_(momentum), wd_(weight_decay), nesterov_(nesterov) {
  if (nesterov && momentum <= 0) throw Error("[SGD] nesterov needs momentum > 0");
  if (momentum_ != 0)
    for (auto& p : params_) {
      Tensor b = Tensor::zeros(p.shape(), p.dtype(), p.device()).contiguous();
      b.realize();
      buf_.push_back(b);
    }
}

std::vector<Tensor> SGD::update(size_t i, Tensor& p, const Tensor& grad) {
  Tensor g = grad;
  if (wd_ != 0) g = g + p.detach() * wd_;
  std::vector<Tensor> out;
  if (momentum_ != 0) {
    Tensor& b = buf_[i];
    b.assign(Tensor(b * momentum_ + g));  // torch: buf = momentum*buf + g (no dampening)
    out.push_back(b);
    g = nesterov_ ? Tensor(g + b * momentum_) : b;
  }
  p.assign(Tensor(p.detach() - g * lr_.cast(p.dtype())));
  out.push_back(p);
  return out;
}

// ---------------------------------------------------------------- LAMB / Adam

LAMB::LAMB(std::vector<Tensor> params, double lr, double b1, double b2, double eps, double weight_decay, bool adam)
    : Optimizer(std::move(params), lr), b1_(b1), b2_(b2), eps_(eps), wd_(weight_decay), adam_(adam) {
  b1_t_ = Tensor::ones({1}, dtypes::float32, params_[0].device()).contiguous();
  b2_t_ = Tensor::ones({1}, dtypes::float32, params_[0].device()).contiguous();
  std::vector<Tensor*> init{&b1_t_, &b2_t_};
  for (auto& p : params_) {
    m_.push_back(Tensor::zeros(p.shape(), dtypes::float32, p.device()).contiguous());
    v_.push_back(Tensor::zeros(p.shape(), dtypes::float32, p.device()).contiguous());
  }
  for (auto& t : m_) init.push_back(&t);
  for (auto& t : v_) init.push_back(&t);
  Tensor::realize_all(init);
}

std::vector<Tensor> LAMB::begin_step() {
  b1_t_.assign(Tensor(b1_t_ * b1_));
  b2_t_.assign(Tensor(b2_t_ * b2_));
  return {b1_t_, b2_t_};
}

std::vector<Tensor> LAMB::update(size_t i, Tensor& p, const Tensor& grad) {
  Tensor g = grad.cast(dtypes::float32);
  Tensor pd = p.detach().cast(dtypes::float32);
  m_[i].assign(Tensor(m_[i] * b1_ + g * (1.0 - b1_)));
  v_[i].assign(Tensor(v_[i] * b2_ + g * g * (1.0 - b2_)));
  // bias correction with the powers after this step's update (b1_t_, b2_t_ are assigned in begin_step)
  Tensor m_hat = m_[i] / Tensor(1.0 - b1_t_);
  Tensor v_hat = v_[i] / Tensor(1.0 - b2_t_);
  Tensor up = Tensor(m_hat / Tensor(v_hat.sqrt() + eps_)) + pd * wd_;
  Tensor r = Tensor::ones({1}, dtypes::float32, p.device());
  if (!adam_) {
    Tensor r1 = Tensor(pd * pd).sum().sqrt(), r2 = Tensor(up * up).sum().sqrt();
    r = Tensor(r1 > 0).where(Tensor(r2 > 0).where(r1 / r2, Tensor(1.0)), Tensor(1.0));
  }
  p.assign(Tensor(pd - lr_ * r * up).cast(p.dtype()));
  return {m_[i], v_[i], p};
}

std::unique_ptr<Optimizer> Adam(std::vector<Tensor> params, double lr, double b1, double b2, double eps) {
  return std::make_unique<LAMB>(std::move(params), lr, b1, b2, eps, 0.0, true);
}
std::unique_ptr<Optimizer> AdamW(std::vector<Tensor> params, double lr, double b1, double b2, double eps, double wd) {
  return std::make_unique<LAMB>(std::move(params), lr, b1, b2, eps, wd, true);
}

// ---------------------------------------------------------------- schedules

double StepLR::lr_at(int64_t e) const { return base_ * std::pow(gamma_, double(e / step_)); }
double CosineAnnealingLR::lr_at(int64_t e) const {
  return min_ + (base_ - min_) * (1 + std::cos(M_PI * double(std::min(e, tmax_)) / double(tmax_))) / 2;
}
OneCycleLR::OneCycleLR(Optimizer& o, double max_lr, int64_t total, double pct, double div, double final_div)
    : LRScheduler(o), max_(max_lr), total_(double(total)), pct_(pct), div_(div), final_(final_div) {
  o.set_lr(max_lr / div);
}
double OneCycleLR::lr_at(int64_t e) const {
  double start = max_ / div_, end = start / final_, up = pct_ * total_, t = double(e);
  auto cos_anneal = [](double a, double b, double frac) { return b + (a - b) * (1 + std::cos(M_PI * frac)) / 2; };
  if (t <= up) return cos_anneal(start, max_, t / std::max(up, 1.0));
  return cos_anneal(max_, end, (t - up) / std::max(total_ - up, 1.0));
}

}  // namespace tg::nn::optim
