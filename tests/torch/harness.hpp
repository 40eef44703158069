#pragma once
// Table-driven op checks against libtorch (ggml test-backend-ops style): each case names its inputs (shape,
// dtype, value range), a function on tg tensors and the same function on torch tensors. The harness makes
// identical random inputs, compares the forward results, then feeds the same random upstream gradient to both
// backward passes and compares the gradients of every float input.
// Tolerance: |tg - torch| <= atol * max(1, max|torch|) + rtol * |torch| element by element (ints and bools exact);
// float16: tg gets float16 buffers and torch the same values in float32 (libtorch 1.13 lacks most CPU float16
// kernels); torch's result rounded once to float16 is the reference, and the tolerance is at least kHalfTol.
// Each case is its own doctest test case, named by op, input dtypes and shapes ("tan (float32 3x5)"), and points
// at the line that defines it; a case marked second_order() also compares the gradient of its gradient.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <functional>
#include <random>
#include <source_location>
#include <string>
#include <vector>

#include "tg/tensor.hpp"

namespace tt {

using TG = const std::vector<tg::Tensor>;
using TH = const std::vector<torch::Tensor>;
using Values = std::function<std::vector<double>(const tg::Shape&, std::mt19937&)>;

/** One input: its shape and dtype, how its values are drawn, and whether its gradient is checked. */
struct In {
  tg::Shape shape;
  tg::DType dtype = tg::dtypes::float32;
  double lo = -2, hi = 2;  // uniform in [lo, hi) for floats, integers in [lo, hi] for ints
  bool grad = true;        // floats only
  Values gen;              // custom values (overrides lo/hi)
};
/** A float input with a checked gradient, uniform in [lo, hi). */
inline In F(tg::Shape s, double lo = -2, double hi = 2) { return In{std::move(s), tg::dtypes::float32, lo, hi, true, {}}; }
/** A float64 input with a checked gradient. */
inline In D(tg::Shape s, double lo = -2, double hi = 2) { return In{std::move(s), tg::dtypes::float64, lo, hi, true, {}}; }
/** A float16 input with a checked gradient (values drawn in float32, rounded to float16 in both libraries). */
inline In H(tg::Shape s, double lo = -2, double hi = 2) { return In{std::move(s), tg::dtypes::float16, lo, hi, true, {}}; }
/** A float input without a gradient (a constant of the op, e.g. a target). */
inline In C(tg::Shape s, double lo = -2, double hi = 2) { return In{std::move(s), tg::dtypes::float32, lo, hi, false, {}}; }
/** An int input, integers in [lo, hi]. */
inline In I(tg::Shape s, int64_t lo, int64_t hi, tg::DType d = tg::dtypes::int64) {
  return In{std::move(s), d, double(lo), double(hi), false, {}};
}
/** A bool input. */
inline In B(tg::Shape s) { return In{std::move(s), tg::dtypes::bool_, 0, 1, false, {}}; }
/** An input with custom values. */
inline In V(tg::Shape s, tg::DType d, Values gen, bool grad = false) {
  return In{std::move(s), d, 0, 0, grad && tg::dtypes::is_float(d), std::move(gen)};
}
/** Per-row permutations of 0..n-1 along the last dim (unique indices for scatter), kept to the first k. */
Values perm_rows(int64_t n);

/** Relative and absolute floor of the tolerance for float16 results: one fp16 rounding (11 significant bits). */
inline constexpr double kHalfTol = 0x1p-11;

struct Case {
  std::string name;
  std::vector<In> ins;
  std::function<tg::Tensor(TG&)> tg_fn;
  std::function<torch::Tensor(TH&)> th_fn;
  std::source_location where;
  double rtol = 1e-5, atol = 1e-6, grtol = 1e-5, gatol = 1e-6;
  bool backward = true, second = false;
  Case& tol(double r, double a) { rtol = grtol = r; atol = gatol = a; return *this; }
  Case& gtol(double r, double a) { grtol = r; gatol = a; return *this; }
  Case& fwd_only() { backward = false; return *this; }
  /** Also compare d/dx of sum(gradient * random seed): the gradient graph differentiated again. */
  Case& second_order() { second = true; return *this; }
};

/** A case whose function is written once for both libraries (a generic lambda). */
template <class Fn>
Case op(std::string name, std::vector<In> ins, Fn f, std::source_location w = std::source_location::current()) {
  return Case{std::move(name), std::move(ins), [f](TG& x) -> tg::Tensor { return f(x); },
              [f](TH& x) -> torch::Tensor { return f(x); }, w};
}
/** A case with separate tg and torch functions. */
template <class Ft, class Fh>
Case op2(std::string name, std::vector<In> ins, Ft ft, Fh fh, std::source_location w = std::source_location::current()) {
  return Case{std::move(name), std::move(ins), [ft](TG& x) -> tg::Tensor { return ft(x); },
              [fh](TH& x) -> torch::Tensor { return fh(x); }, w};
}

/** x[a:b:step] along dim, written the same way for both libraries (non-contiguous views in the cases). */
inline tg::Tensor slice_dim(const tg::Tensor& x, int64_t dim, int64_t a, int64_t b, int64_t step = 1) {
  std::vector<tg::Slice> s(size_t(dim < 0 ? dim + x.ndim() : dim), tg::Slice::all());
  s.push_back(tg::Slice{a, b, step});
  return x.slice(s);
}
inline torch::Tensor slice_dim(const torch::Tensor& x, int64_t dim, int64_t a, int64_t b, int64_t step = 1) {
  return x.slice(dim, a, b, step);
}

// Case tables (one per translation unit).
std::vector<Case> math_cases();
std::vector<Case> movement_cases();
std::vector<Case> reduce_cases();
std::vector<Case> nn_cases();
std::vector<Case> loss_linalg_cases();
std::vector<Case> big_cases();
std::vector<Case> coverage_cases();  // float16, size-0 dims, non-contiguous inputs, second order
std::vector<Case> api_cases();       // the rest of tinygrad's API and its options (torch_ops_d.cpp)

}  // namespace tt
