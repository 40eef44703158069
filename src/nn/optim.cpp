// Optimisers as lazy assigns (per parameter, or over one flat buffer in fused mode); learning-rate schedules.
#include "tg/nn/optim.hpp"

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "tg/multi.hpp"
#include "tg/schedule.hpp"

namespace tg::nn::optim {

namespace {
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
// r1 > 0 and r2 > 0 ? ratio : 1 (a trust ratio that is 1 where a norm vanishes)
Tensor guarded_ratio(const Tensor& r1, const Tensor& r2, const Tensor& ratio) {
  return (r1 > 0).where((r2 > 0).where(ratio, 1.0), 1.0);
}
}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr, bool fused)
    : params_(std::move(params)), lr_value_(lr), fused_(fused) {
  if (params_.empty()) throw Error("[optimizer] no parameters given");
  if (!(lr >= 0)) throw Error("[optimizer] learning rate must be >= 0, got " + num(lr));
  offsets_.push_back(0);
  for (auto& p : params_) {
    if (!dtypes::is_float(p.dtype())) throw Error("[optimizer] parameters must be float, got " + p.dtype().name());
    p.requires_grad_(true);
    offsets_.push_back(offsets_.back() + p.numel());
  }
  lr_ = Tensor::full({1}, lr, dtypes::float32, params_[0].device()).contiguous();
  lr_.realize();
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
  if (!(lr >= 0)) throw Error("[optimizer] learning rate must be >= 0, got " + num(lr));
  lr_value_ = lr;
  lr_.assign(Tensor::full({1}, lr, dtypes::float32, lr_.device()));
  lr_.realize();
}

void Optimizer::refuse_fused(const char* name, const char* why) const {
  if (fused_)
    throw Error(std::string("[") + name + "] fused mode is not supported: " + why +
                ", and over one flat buffer it would mix all parameters; use fused=false");
}

std::vector<Tensor> Optimizer::new_state() const {
  std::vector<Tensor> out;
  if (fused_) out.push_back(Tensor::zeros({offsets_.back()}, dtypes::float32, params_[0].device()).contiguous());
  else
    for (auto& p : params_) out.push_back(Tensor::zeros(p.shape(), dtypes::float32, p.device()).contiguous());
  std::vector<Tensor*> ptrs;
  for (auto& t : out) ptrs.push_back(&t);
  Tensor::realize_all(ptrs);
  return out;
}

std::vector<Tensor> Optimizer::schedule_step() {
  NoGrad ng;
  std::vector<Tensor*> unrealised;
  for (auto& t : pending_)  // realised: a buffer, or on several devices (sharded parameters) a buffer on each
    if (!contiguous_buffer(t.uop().get()) && !detail::multi_realized(t.uop().get())) unrealised.push_back(&t);
  if (!unrealised.empty()) {
    if (!warned_)
      std::fprintf(stderr, "tg: warning: [optimizer] schedule_step() was called again before the updates of the last call "
                           "were realised; realising them now (realise what schedule_step returns, e.g. with the loss)\n");
    warned_ = true;
    Tensor::realize_all(unrealised);
  }
  std::vector<Tensor> ps, gs;
  for (size_t i = 0; i < params_.size(); i++) {
    if (!params_[i].has_grad())
      throw Error("[optimizer] parameter " + std::to_string(i) + " " + shape_str(params_[i].shape()) +
                  " has no gradient: call backward() on a loss that uses it");
    ps.push_back(params_[i].detach().cast(dtypes::float32));
    gs.push_back(params_[i].grad().detach().cast(dtypes::float32));
  }
  Step s;
  std::vector<Tensor> updates;
  if (fused_) {
    // one flat parameter and gradient; the flat update is split back by offset
    std::vector<Tensor> fp, fg;
    for (size_t i = 0; i < ps.size(); i++) {
      fp.push_back(ps[i].flatten());
      fg.push_back(gs[i].flatten());
    }
    s = compute_step({cat(fp)}, {cat(fg)});
    // the flat update is computed once into a buffer (one kernel), then each parameter subtracts its slice
    Tensor up = s.updates[0].contiguous();
    for (size_t i = 0; i < params_.size(); i++)
      updates.push_back(up.shrink({{offsets_[i], offsets_[i + 1]}}).reshape(params_[i].shape()));
  } else {
    s = compute_step(ps, gs);
    updates = s.updates;
  }
  std::vector<Tensor> out = s.state;
  for (size_t i = 0; i < params_.size(); i++) {
    Tensor& p = params_[i];
    p.assign(p.detach() - updates[i].cast(p.dtype()));
    out.push_back(p);
  }
  pending_ = out;
  return out;
}

void Optimizer::step() {
  std::vector<Tensor> ts = schedule_step();
  std::vector<Tensor*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  Tensor::realize_all(ptrs);
}

// ---------------------------------------------------------------- LARS, SGD, Muon

Tensor newton_schulz(const Tensor& g, int steps, const std::vector<double>& coef, double eps) {
  if (g.ndim() != 2) throw Error("[newton_schulz] needs a 2-d tensor, got " + shape_str(g.shape()));
  if (steps < 0 || coef.empty())
    throw Error("[newton_schulz] needs steps >= 0 and at least one coefficient, got " + std::to_string(steps) + " steps, " +
                std::to_string(coef.size()) + " coefficients");
  if (g.shape()[0] > g.shape()[1]) return newton_schulz(g.T(), steps, coef, eps).T();
  Tensor G = g / (g.square().sum().sqrt() + eps);
  for (int s = 0; s < steps; s++) {
    // sum_i c_i (G G^T)^i G
    Tensor A = G.matmul(G.T()), term = G, acc = G * coef[0];
    for (size_t i = 1; i < coef.size(); i++) {
      term = A.matmul(term);
      acc = acc + term * coef[i];
    }
    G = acc;
  }
  return G;
}

LARS::LARS(std::vector<Tensor> params, double lr, double momentum, double weight_decay, bool nesterov, bool classic,
           double tcoef, bool fused)
    : LARS(std::move(params), lr, momentum, weight_decay, nesterov, classic, tcoef, true, 0, {}, fused, "LARS") {}

LARS::LARS(std::vector<Tensor> params, double lr, double momentum, double weight_decay, bool nesterov, bool classic,
           double tcoef, bool pre_wd, int ns_steps, std::vector<double> ns_coefficients, bool fused, const char* name)
    : Optimizer(std::move(params), lr, fused), momentum_(momentum), wd_(weight_decay), tcoef_(tcoef), nesterov_(nesterov),
      classic_(classic), pre_wd_(pre_wd), ns_steps_(ns_steps), ns_coef_(std::move(ns_coefficients)) {
  std::string n = std::string("[") + name + "] ";
  if (!(momentum >= 0)) throw Error(n + "momentum must be >= 0, got " + num(momentum));
  if (!(weight_decay >= 0)) throw Error(n + "weight_decay must be >= 0, got " + num(weight_decay));
  if (nesterov && momentum == 0) throw Error(n + "nesterov needs momentum > 0");
  if (tcoef != 0) refuse_fused(name, "the trust ratio is a per-parameter norm");
  if (ns_steps != 0 || !ns_coef_.empty()) {
    refuse_fused(name, "Newton-Schulz orthogonalises each parameter's update as a matrix");
    if (ns_steps < 1 || ns_coef_.empty())
      throw Error(n + "needs ns_steps >= 1 and at least one Newton-Schulz coefficient, got " + std::to_string(ns_steps) +
                  " steps and " + std::to_string(ns_coef_.size()) + " coefficients");
    for (auto& p : params_)
      if (p.ndim() == 0) throw Error(n + "parameters need at least one dim (the update is reshaped to (shape[0], -1))");
  }
  if (momentum_ != 0) buf_ = new_state();
}

Optimizer::Step LARS::compute_step(const std::vector<Tensor>& ps, const std::vector<Tensor>& gs) {
  Step s;
  Tensor lr = lr_scalar();
  for (size_t i = 0; i < ps.size(); i++) {
    const Tensor& p = ps[i];
    Tensor g = gs[i];
    std::optional<Tensor> r;
    if (tcoef_ != 0) {
      Tensor r1 = p.square().sum().sqrt(), r2 = g.square().sum().sqrt();
      r = guarded_ratio(r1, r2, (r1 * tcoef_) / (r2 + r1 * wd_));
    }
    auto scale = [&](const Tensor& x) { return r ? (x * *r * lr) : (x * lr); };
    if (pre_wd_ && wd_ > 0) g = g + p * wd_;
    if (classic_) g = scale(g);  // classic momentum: lr inside the buffer
    if (momentum_ != 0) {
      Tensor& b = buf_[i];
      b.assign(b * momentum_ + g);
      s.state.push_back(b);
      g = nesterov_ ? (g + b * momentum_) : b;
    }
    if (ns_steps_ > 0) g = newton_schulz(g.reshape({g.shape()[0], -1}), ns_steps_, ns_coef_).reshape(p.shape());
    if (!classic_) g = scale(g);
    if (!pre_wd_ && wd_ > 0) g = g + p * (lr * wd_);  // decoupled: p - g = p*(1 - lr*wd) - lr*update
    s.updates.push_back(g);
  }
  return s;
}

SGD::SGD(std::vector<Tensor> params, double lr, double momentum, double weight_decay, bool nesterov, bool classic, bool fused)
    : LARS(std::move(params), lr, momentum, weight_decay, nesterov, classic, 0.0, true, 0, {}, fused, "SGD") {}

Muon::Muon(std::vector<Tensor> params, double lr, double momentum, double weight_decay, int ns_steps,
           std::vector<double> ns_coefficients, bool nesterov)
    : LARS(std::move(params), lr, momentum, weight_decay, nesterov, false, 0.0, false, ns_steps, std::move(ns_coefficients),
           false, "Muon") {}

// ---------------------------------------------------------------- LAMB / Adam

LAMB::LAMB(std::vector<Tensor> params, double lr, double b1, double b2, double eps, double weight_decay, bool adam, bool fused)
    : Optimizer(std::move(params), lr, fused), b1_(b1), b2_(b2), eps_(eps), wd_(weight_decay), adam_(adam) {
  const char* name = adam ? "Adam" : "LAMB";
  if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
    throw Error(std::string("[") + name + "] betas must be in [0, 1), got " + num(b1) + ", " + num(b2));
  if (!(eps >= 0)) throw Error(std::string("[") + name + "] eps must be >= 0, got " + num(eps));
  if (!(weight_decay >= 0)) throw Error(std::string("[") + name + "] weight_decay must be >= 0, got " + num(weight_decay));
  if (!adam) refuse_fused(name, "the trust ratio is a per-parameter norm");
  b1_t_ = Tensor::ones({1}, dtypes::float32, params_[0].device()).contiguous();
  b2_t_ = Tensor::ones({1}, dtypes::float32, params_[0].device()).contiguous();
  Tensor::realize_all({&b1_t_, &b2_t_});
  m_ = new_state();
  v_ = new_state();
}

Optimizer::Step LAMB::compute_step(const std::vector<Tensor>& ps, const std::vector<Tensor>& gs) {
  Step s;
  b1_t_.assign(b1_t_ * b1_);
  b2_t_.assign(b2_t_ * b2_);
  s.state = {b1_t_, b2_t_};
  Tensor lr = lr_scalar(), c1 = (1.0 - b1_t_).reshape({}), c2 = (1.0 - b2_t_).reshape({});
  for (size_t i = 0; i < ps.size(); i++) {
    const Tensor &p = ps[i], &g = gs[i];
    m_[i].assign(m_[i] * b1_ + g * (1.0 - b1_));
    v_[i].assign(v_[i] * b2_ + g * g * (1.0 - b2_));
    s.state.push_back(m_[i]);
    s.state.push_back(v_[i]);
    // bias correction with the powers after this step's update
    Tensor m_hat = m_[i] / c1, v_hat = v_[i] / c2;
    Tensor up = m_hat / (v_hat.sqrt() + eps_);
    if (wd_ != 0) up = up + p * wd_;  // (no p*0 term: it would still read the parameter)
    if (!adam_) {
      Tensor r1 = p.square().sum().sqrt(), r2 = up.square().sum().sqrt();
      up = up * guarded_ratio(r1, r2, r1 / r2);
    }
    s.updates.push_back(up * lr);
  }
  return s;
}

Adam::Adam(std::vector<Tensor> params, double lr, double b1, double b2, double eps, bool fused)
    : LAMB(std::move(params), lr, b1, b2, eps, 0.0, true, fused) {}
AdamW::AdamW(std::vector<Tensor> params, double lr, double b1, double b2, double eps, double wd, bool fused)
    : LAMB(std::move(params), lr, b1, b2, eps, wd, true, fused) {}

// ---------------------------------------------------------------- schedules

StepLR::StepLR(Optimizer& o, int64_t step_size, double gamma) : LRScheduler(o), step_(step_size), gamma_(gamma) {
  if (step_size <= 0) throw Error("[StepLR] step_size must be positive, got " + std::to_string(step_size));
}
double StepLR::lr_at(int64_t e) const { return base_ * std::pow(gamma_, double(e / step_)); }
CosineAnnealingLR::CosineAnnealingLR(Optimizer& o, int64_t t_max, double eta_min) : LRScheduler(o), tmax_(t_max), min_(eta_min) {
  if (t_max <= 0) throw Error("[CosineAnnealingLR] t_max must be positive, got " + std::to_string(t_max));
}
double CosineAnnealingLR::lr_at(int64_t e) const {
  return min_ + (base_ - min_) * (1 + std::cos(M_PI * double(std::min(e, tmax_)) / double(tmax_))) / 2;
}
OneCycleLR::OneCycleLR(Optimizer& o, double max_lr, int64_t total, double pct, double div, double final_div)
    : LRScheduler(o), max_(max_lr), total_(double(total)), pct_(pct), div_(div), final_(final_div) {
  if (total <= 0 || !(pct >= 0 && pct <= 1) || !(div > 0) || !(final_div > 0))
    throw Error("[OneCycleLR] needs total_steps > 0, pct_start in [0, 1], positive div factors; got " + std::to_string(total) +
                ", " + num(pct) + ", " + num(div) + ", " + num(final_div));
  o.set_lr(max_lr / div);
}
double OneCycleLR::lr_at(int64_t e) const {
  double start = max_ / div_, end = start / final_, up = pct_ * total_, t = double(e);
  auto cos_anneal = [](double a, double b, double frac) { return b + (a - b) * (1 + std::cos(M_PI * frac)) / 2; };
  if (t <= up) return cos_anneal(start, max_, t / std::max(up, 1.0));
  return cos_anneal(max_, end, (std::min(t, total_) - up) / std::max(total_ - up, 1.0));
}

}  // namespace tg::nn::optim
