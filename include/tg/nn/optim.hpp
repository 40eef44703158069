#pragma once
// Optimisers: SGD (momentum, nesterov, weight decay), Adam, AdamW, LAMB; learning-rate schedules.
// Updates are lazy assigns into the parameters' buffers: step() realises them (with the grads) in one schedule,
// schedule_step() returns them so they realise together with the loss. The learning rate is a tensor, so a
// schedule changes it without recompiling a kernel.
// Thread-safety: an optimiser is used from one thread.
#include <memory>
#include <vector>

#include "tg/tensor.hpp"

namespace tg::nn::optim {

/** Base of all optimisers: parameters, their state buffers, the learning rate. */
class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  /** Drop every parameter's gradient. */
  void zero_grad();
  /** The updates (assigns into parameters and state) as lazy tensors, to realise with the loss. */
  std::vector<Tensor> schedule_step();
  /** Apply one update now. */
  void step();
  /** The learning rate (a 1-element float32 tensor); set_lr assigns it. */
  const Tensor& lr() const { return lr_; }
  void set_lr(double lr);
  double lr_value() const { return lr_value_; }
  const std::vector<Tensor>& params() const { return params_; }

 protected:
  /** Per-parameter update: returns the tensors to realise (assigns). grad is the parameter's gradient. */
  virtual std::vector<Tensor> update(size_t i, Tensor& param, const Tensor& grad) = 0;
  /** Called once per step before the per-parameter updates. */
  virtual std::vector<Tensor> begin_step() { return {}; }
  std::vector<Tensor> params_;
  Tensor lr_;
  double lr_value_;
};

/** SGD with optional momentum, nesterov and (L2) weight decay, as torch.optim.SGD. */
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double lr = 0.001, double momentum = 0, double weight_decay = 0, bool nesterov = false);

 protected:
  std::vector<Tensor> update(size_t i, Tensor& p, const Tensor& g) override;

 private:
  double momentum_, wd_;
  bool nesterov_;
  std::vector<Tensor> buf_;
};

/** LAMB (You et al.); with adam=true it is Adam/AdamW (decoupled weight decay), as in tinygrad. */
class LAMB : public Optimizer {
 public:
  LAMB(std::vector<Tensor> params, double lr = 0.001, double b1 = 0.9, double b2 = 0.999, double eps = 1e-6,
       double weight_decay = 0, bool adam = false);

 protected:
  std::vector<Tensor> begin_step() override;
  std::vector<Tensor> update(size_t i, Tensor& p, const Tensor& g) override;

 private:
  double b1_, b2_, eps_, wd_;
  bool adam_;
  Tensor b1_t_, b2_t_;
  std::vector<Tensor> m_, v_;
};

/** Adam (torch defaults): LAMB without the trust ratio and without weight decay. */
std::unique_ptr<Optimizer> Adam(std::vector<Tensor> params, double lr = 0.001, double b1 = 0.9, double b2 = 0.999,
                                double eps = 1e-8);
/** AdamW: Adam with decoupled weight decay. */
std::unique_ptr<Optimizer> AdamW(std::vector<Tensor> params, double lr = 0.001, double b1 = 0.9, double b2 = 0.999,
                                 double eps = 1e-8, double weight_decay = 0.01);

/** Learning-rate schedules: call step() once per optimiser step; they set the optimiser's lr. */
class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& opt) : opt_(opt), base_(opt.lr_value()) {}
  virtual ~LRScheduler() = default;
  void step() { opt_.set_lr(lr_at(++epoch_)); }
  virtual double lr_at(int64_t epoch) const = 0;

 protected:
  Optimizer& opt_;
  double base_;
  int64_t epoch_ = 0;
};
/** lr * gamma^(epoch // step_size). */
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& o, int64_t step_size, double gamma = 0.1) : LRScheduler(o), step_(step_size), gamma_(gamma) {}
  double lr_at(int64_t e) const override;

 private:
  int64_t step_;
  double gamma_;
};
/** Cosine annealing from lr to eta_min over t_max steps. */
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& o, int64_t t_max, double eta_min = 0) : LRScheduler(o), tmax_(t_max), min_(eta_min) {}
  double lr_at(int64_t e) const override;

 private:
  int64_t tmax_;
  double min_;
};
/** One-cycle: warm up from max_lr/div_factor to max_lr over pct_start, then anneal (cosine) to max_lr/final_div. */
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& o, double max_lr, int64_t total_steps, double pct_start = 0.25, double div_factor = 25,
             double final_div_factor = 1e4);
  double lr_at(int64_t e) const override;

 private:
  double max_, total_, pct_, div_, final_;
};

}  // namespace tg::nn::optim
