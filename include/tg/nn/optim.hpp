#pragma once
// Optimisers: SGD (momentum, nesterov, weight decay), LARS, Muon, Adam, AdamW, LAMB; learning-rate schedules.
// Updates are lazy assigns into the parameters' buffers: step() realises them (with the grads) in one schedule,
// schedule_step() returns them so they realise together with the loss. The learning rate is a tensor, so a
// schedule changes it without recompiling a kernel. Optimiser state (momentum, m, v) is float32.
// Fused mode (tinygrad's FUSE_OPTIM): the gradients are concatenated into one flat tensor, the state is one flat
// buffer per kind, the update is computed once over the flat tensor and split back into the parameters, so a
// step launches a few kernels for the whole model instead of a few per parameter. Optimisers whose update depends
// on a per-parameter norm (LAMB, LARS with a trust ratio, Muon) refuse fused mode: over one flat buffer the norm
// would mix all layers.
// Thread-safety: an optimiser is used from one thread.
#include "tg/config.hpp"

#include <memory>
#include <utility>
#include <vector>

#include "tg/tensor.hpp"

namespace tg::nn::optim {

/** Base of all optimisers: parameters, their state buffers, the learning rate. */
class Optimizer {
 public:
  /// optimises `params` with learning rate lr; fused: one flat state buffer and update for all of them
  Optimizer(std::vector<Tensor> params, double lr, bool fused = false);
  virtual ~Optimizer() = default;
  /** Drop every parameter's gradient. */
  void zero_grad();
  /** The updates (assigns into parameters and state) as lazy tensors, to realise with the loss. Updates of an
   *  earlier call that were never realised are realised first, with a warning on stderr (once per optimiser):
   *  stacked unrealised steps would make every later step recompute them all. */
  std::vector<Tensor> schedule_step();
  /** Apply one update now. */
  void step();
  /** The learning rate (a 1-element float32 tensor); set_lr assigns it. */
  const Tensor& lr() const { return lr_; }
  /// assigns a new learning rate (the next step uses it; no recompile)
  void set_lr(double lr);
  /// the learning rate as last set, on the host
  double lr_value() const { return lr_value_; }
  /// the optimised parameters
  const std::vector<Tensor>& params() const { return params_; }
  /// whether the parameters share one flat state buffer
  bool fused() const { return fused_; }

 protected:
  /** What one step computes: the value subtracted from each parameter, and the state tensors it assigned. */
  struct Step {
    /// the value subtracted from each parameter, and the new values of the state tensors
    ///@{
    std::vector<Tensor> updates, state;
    ///@}
  };
  /** The step for these (detached, float32) parameter values and gradients: one pair per parameter, or a single
   *  flat pair in fused mode. */
  virtual Step compute_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) = 0;
  /** One zero float32 state buffer per parameter, or one flat buffer over all of them in fused mode. */
  std::vector<Tensor> new_state() const;
  /** The learning rate as a 0-d tensor (broadcasts against any parameter shape). */
  Tensor lr_scalar() const { return lr_.reshape({}); }
  /** Throws when fused mode was asked for: `why` says what the update needs per parameter. */
  void refuse_fused(const char* name, const char* why) const;
  /// the optimised parameters
  std::vector<Tensor> params_;
  /// the learning rate, a 1-element float32 tensor
  Tensor lr_;
  /// the learning rate on the host (what lr_ holds)
  double lr_value_;
  /// fused mode: one flat state buffer over all parameters
  bool fused_;
  std::vector<int64_t> offsets_;  ///< fused mode: parameter i is flat[offsets_[i], offsets_[i+1])
  std::vector<Tensor> pending_;   ///< the last schedule_step's updates
  bool warned_ = false;           ///< the unrealised-updates warning was printed
};

/** LARS's arguments by name: `nn::optim::LARS opt(params, {.lr = 0.1, .tcoef = 0.002});`. */
struct LARSOptions {
  /// learning rate, momentum factor and weight decay
  ///@{
  double lr = 0.001, momentum = 0.9, weight_decay = 1e-4;
  ///@}
  /// Nesterov momentum; classic: lr and the trust ratio applied before the momentum buffer (see LARS)
  ///@{
  bool nesterov = false, classic = true;
  ///@}
  /// trust coefficient of the layer-wise ratio (0: plain SGD)
  double tcoef = 0.001;
  /// one flat state buffer and update kernel for all parameters
  bool fused = false;
};

/** LARS (You et al., arXiv:1708.03888), as tinygrad's: the gradient (plus weight_decay * p) is scaled by the
 *  trust ratio r = tcoef*|p| / (|g| + weight_decay*|p|) (1 where a norm is 0). classic: g*r*lr goes into the
 *  momentum buffer (b = momentum*b + g*r*lr, p -= b); otherwise lr and r are applied after the momentum.
 *  nesterov uses g + momentum*b. With tcoef = 0 it is SGD. */
class LARS : public Optimizer {
 public:
  /// LARS over `params` with positional settings (see LARSOptions)
  LARS(std::vector<Tensor> params, double lr = 0.001, double momentum = 0.9, double weight_decay = 1e-4,
       bool nesterov = false, bool classic = true, double tcoef = 0.001, bool fused = false);
  /// LARS over `params` with named settings
  LARS(std::vector<Tensor> params, const LARSOptions& o)
      : LARS(std::move(params), o.lr, o.momentum, o.weight_decay, o.nesterov, o.classic, o.tcoef, o.fused) {}

 protected:
  /** The general form shared by SGD and Muon: ns_coefficients non-empty orthogonalises each update with
   *  ns_steps Newton-Schulz iterations; pre_wd=false applies the weight decay after the momentum, decoupled. */
  LARS(std::vector<Tensor> params, double lr, double momentum, double weight_decay, bool nesterov, bool classic,
       double tcoef, bool pre_wd, int ns_steps, std::vector<double> ns_coefficients, bool fused, const char* name);
  Step compute_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) override;

 private:
  double momentum_, wd_, tcoef_;
  bool nesterov_, classic_, pre_wd_;
  int ns_steps_;
  std::vector<double> ns_coef_;
  std::vector<Tensor> buf_;
};

/** SGD's arguments by name: `nn::optim::SGD opt(params, {.lr = 0.01, .momentum = 0.9, .nesterov = true});`. */
struct SGDOptions {
  /// learning rate, momentum factor (0: none) and L2 weight decay added to the gradient
  ///@{
  double lr = 0.001, momentum = 0, weight_decay = 0;
  ///@}
  /// Nesterov momentum; classic: lr inside the momentum buffer (b = m*b + lr*g); fused: one flat state buffer
  ///@{
  bool nesterov = false, classic = false, fused = false;
  ///@}
};

/** SGD with optional momentum, nesterov and (L2) weight decay, as torch.optim.SGD (no dampening): LARS without
 *  the trust ratio. classic puts lr inside the momentum buffer (the same for a constant lr). */
class SGD : public LARS {
 public:
  /// SGD over `params` with positional settings (torch's defaults except lr)
  SGD(std::vector<Tensor> params, double lr = 0.001, double momentum = 0, double weight_decay = 0, bool nesterov = false,
      bool classic = false, bool fused = false);
  /// SGD over `params` with named settings
  SGD(std::vector<Tensor> params, const SGDOptions& o)
      : SGD(std::move(params), o.lr, o.momentum, o.weight_decay, o.nesterov, o.classic, o.fused) {}
};

/** Muon (Jordan et al.; arXiv:2502.16982), as tinygrad's: momentum (nesterov by default), then each parameter's
 *  update reshaped to (shape[0], -1) is orthogonalised with ns_steps Newton-Schulz iterations of the odd polynomial
 *  sum_i c_i (G G^T)^i G (G first scaled to unit Frobenius norm), then scaled by lr; weight decay is decoupled,
 *  p *= 1 - lr*weight_decay. (tinygrad's code computes that decay into a local it then drops; tg applies it.) */
class Muon : public LARS {
 public:
  /// Muon over `params`: momentum, then ns_steps Newton-Schulz iterations with these coefficients on each update
  Muon(std::vector<Tensor> params, double lr = 0.001, double momentum = 0.95, double weight_decay = 0.1, int ns_steps = 5,
       std::vector<double> ns_coefficients = {3.4445, -4.775, 2.0315}, bool nesterov = true);
};

/** The Newton-Schulz iteration Muon uses, on a 2-d tensor (tinygrad's Tensor.newton_schulz). */
Tensor newton_schulz(const Tensor& g, int steps, const std::vector<double>& coefficients, double eps = 1e-7);

/** LAMB's arguments by name: `nn::optim::LAMB opt(params, {.lr = 0.01, .weight_decay = 0.01});`. */
struct LAMBOptions {
  /// learning rate, first and second moment decay rates, epsilon added to the denominator, weight decay
  ///@{
  double lr = 0.001, b1 = 0.9, b2 = 0.999, eps = 1e-6, weight_decay = 0;
  ///@}
  /// adam: no trust ratio (Adam/AdamW); fused: one flat state buffer
  ///@{
  bool adam = false, fused = false;
  ///@}
};
/** Adam's arguments by name: `nn::optim::Adam opt(params, {.lr = 3e-4, .b2 = 0.95});`. */
struct AdamOptions {
  /// learning rate, first and second moment decay rates, epsilon added to the denominator
  ///@{
  double lr = 0.001, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  ///@}
  /// one flat state buffer and update kernel for all parameters
  bool fused = false;
};
/** AdamW's arguments by name: `nn::optim::AdamW opt(params, {.lr = 3e-4, .weight_decay = 0.1});`. */
struct AdamWOptions {
  /// learning rate, moment decay rates, epsilon, and decoupled weight decay
  ///@{
  double lr = 0.001, b1 = 0.9, b2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  ///@}
  /// one flat state buffer and update kernel for all parameters
  bool fused = false;
};

/** LAMB (You et al.); with adam=true it is Adam/AdamW (decoupled weight decay), as in tinygrad. */
class LAMB : public Optimizer {
 public:
  /// LAMB over `params` with positional settings
  LAMB(std::vector<Tensor> params, double lr = 0.001, double b1 = 0.9, double b2 = 0.999, double eps = 1e-6,
       double weight_decay = 0, bool adam = false, bool fused = false);
  /// LAMB over `params` with named settings
  LAMB(std::vector<Tensor> params, const LAMBOptions& o)
      : LAMB(std::move(params), o.lr, o.b1, o.b2, o.eps, o.weight_decay, o.adam, o.fused) {}

 protected:
  Step compute_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) override;

 private:
  double b1_, b2_, eps_, wd_;
  bool adam_;
  Tensor b1_t_, b2_t_;
  std::vector<Tensor> m_, v_;
};

/** Adam (torch defaults): LAMB without the trust ratio and without weight decay. `nn::optim::Adam opt(params, lr)`.
 *  operator-> keeps code written for the former factory function (`auto opt = Adam(...); opt->step();`) working. */
class Adam : public LAMB {
 public:
  /// Adam over `params` with positional settings
  Adam(std::vector<Tensor> params, double lr = 0.001, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8,
       bool fused = false);
  /// Adam over `params` with named settings
  Adam(std::vector<Tensor> params, const AdamOptions& o) : Adam(std::move(params), o.lr, o.b1, o.b2, o.eps, o.fused) {}
  /// `opt->step()` as well as `opt.step()` (code written for the old factory's pointer keeps compiling)
  Adam* operator->() { return this; }
};
/** AdamW: Adam with decoupled weight decay. */
class AdamW : public LAMB {
 public:
  /// AdamW over `params` with positional settings
  AdamW(std::vector<Tensor> params, double lr = 0.001, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8,
        double weight_decay = 0.01, bool fused = false);
  /// AdamW over `params` with named settings
  AdamW(std::vector<Tensor> params, const AdamWOptions& o)
      : AdamW(std::move(params), o.lr, o.b1, o.b2, o.eps, o.weight_decay, o.fused) {}
  /// `opt->step()` as well as `opt.step()` (code written for the old factory's pointer keeps compiling)
  AdamW* operator->() { return this; }
};

/** Learning-rate schedules: call step() once per optimiser step; they set the optimiser's lr. A step count that
 *  is not positive is an error. */
class LRScheduler {
 public:
  /// schedules opt's learning rate; the rate it has now is the base
  explicit LRScheduler(Optimizer& opt) : opt_(opt), base_(opt.lr_value()) {}
  virtual ~LRScheduler() = default;
  /// advances one step and sets the optimiser's rate to lr_at(step)
  void step() { opt_.set_lr(lr_at(++epoch_)); }
  /// the learning rate at step `epoch` (1 after the first step())
  virtual double lr_at(int64_t epoch) const = 0;

 protected:
  /// the optimiser whose rate is set
  Optimizer& opt_;
  /// the optimiser's learning rate when the schedule was made
  double base_;
  /// steps taken
  int64_t epoch_ = 0;
};
/** lr * gamma^(epoch // step_size). */
class StepLR : public LRScheduler {
 public:
  /// multiplies the rate by gamma every step_size steps
  StepLR(Optimizer& o, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t e) const override;

 private:
  int64_t step_;
  double gamma_;
};
/** Cosine annealing from lr to eta_min over t_max steps. */
class CosineAnnealingLR : public LRScheduler {
 public:
  /// anneals from the base rate to eta_min over t_max steps
  CosineAnnealingLR(Optimizer& o, int64_t t_max, double eta_min = 0);
  double lr_at(int64_t e) const override;

 private:
  int64_t tmax_;
  double min_;
};
/** One-cycle: warm up from max_lr/div_factor to max_lr over pct_start, then anneal (cosine) to max_lr/final_div. */
class OneCycleLR : public LRScheduler {
 public:
  /// one cycle over total_steps, peaking at max_lr after pct_start of them
  OneCycleLR(Optimizer& o, double max_lr, int64_t total_steps, double pct_start = 0.25, double div_factor = 25,
             double final_div_factor = 1e4);
  double lr_at(int64_t e) const override;

 private:
  double max_, total_, pct_, div_, final_;
};

}  // namespace tg::nn::optim
