// Creation helpers, elementwise math, activations, comparisons, logical and bitwise ops: compositions of the
// elementwise primitives (alu, cast, where) only.
#include <cmath>
#include <limits>

#include "ops_util.hpp"

namespace tg {
using namespace detail;

// ---------------------------------------------------------------- creation

Tensor Tensor::linspace(double start, double stop, int64_t steps, DType dtype, const std::string& device) {
  if (steps < 0) fail("linspace", "steps must be non-negative, got " + std::to_string(steps));
  if (dtypes::is_bool(dtype)) fail("linspace", "bool dtype is not supported");
  if (steps == 0) return zeros({0}, dtype, device);
  // Like ATen: the first half counts up from start, the second half down from stop.
  std::vector<double> v(static_cast<size_t>(steps));
  int64_t half = steps / 2;
  if (dtype == dtypes::float32) {
    float s = float(start), e = float(stop), step = steps > 1 ? (e - s) / float(steps - 1) : 0.f;
    for (int64_t i = 0; i < steps; i++) v[size_t(i)] = i < half ? s + step * float(i) : e - step * float(steps - i - 1);
  } else {
    double step = steps > 1 ? (stop - start) / double(steps - 1) : 0.0;
    for (int64_t i = 0; i < steps; i++) v[size_t(i)] = i < half ? start + step * double(i) : stop - step * double(steps - i - 1);
  }
  if (steps == 1) v[0] = start;
  Tensor t = from_vector(v, {steps}, device);
  return t.cast(dtype);
}

Tensor Tensor::uniform(const Shape& shape, double low, double high, DType dtype, const std::string& device) {
  if (!(low < high)) fail("uniform", "needs low < high, got " + std::to_string(low) + ", " + std::to_string(high));
  return (rand(shape, dtypes::float32, device) * (high - low) + low).cast(dtype);
}

Tensor Tensor::normal(const Shape& shape, double mean, double std, DType dtype, const std::string& device) {
  if (std < 0) fail("normal", "std must be non-negative, got " + std::to_string(std));
  return (randn(shape, dtypes::float32, device) * std + mean).cast(dtype);
}

namespace {
double prod_from(const Shape& s, size_t i, const char* op) {
  if (s.size() <= i) fail(op, "needs a shape with at least " + std::to_string(i + 1) + " dims, got " + shape_str(s));
  double p = 1;
  for (size_t j = i; j < s.size(); j++) p *= double(s[j]);
  return p;
}
}  // namespace

Tensor Tensor::scaled_uniform(const Shape& shape, DType dtype, const std::string& device) {
  return (uniform(shape, -1, 1, dtypes::float32, device) * std::pow(prod_from(shape, 0, "scaled_uniform"), -0.5)).cast(dtype);
}
Tensor Tensor::glorot_uniform(const Shape& shape, DType dtype, const std::string& device) {
  double fan = prod_from(shape, 1, "glorot_uniform");
  double bound = std::sqrt(6.0 / (double(shape[0]) + fan));
  return uniform(shape, -bound, bound, dtype, device);
}
Tensor Tensor::kaiming_uniform(const Shape& shape, double a, DType dtype, const std::string& device) {
  double bound = std::sqrt(6.0 / (1 + a * a) / prod_from(shape, 1, "kaiming_uniform"));
  return uniform(shape, -bound, bound, dtype, device);
}
Tensor Tensor::kaiming_normal(const Shape& shape, double a, DType dtype, const std::string& device) {
  double std = std::sqrt(2.0 / (1 + a * a) / prod_from(shape, 1, "kaiming_normal"));
  return normal(shape, 0.0, std, dtype, device);
}

Tensor Tensor::const_(double b, std::optional<DType> dtype) {
  if (dtype) return full({}, b, *dtype);
  if (b == std::trunc(b) && std::abs(b) <= double(std::numeric_limits<int32_t>::max())) return Tensor(int(b));
  return Tensor(b);
}
Tensor Tensor::ufix(double x) const { return const_like(*this, x); }
Tensor Tensor::usum(const std::vector<Tensor>& others) const {
  Tensor r = *this;
  for (const Tensor& o : others) r = dtypes::is_bool(dtype()) ? r.logical_or(o) : (r + o);
  return r;
}
Tensor Tensor::uprod(const std::vector<Tensor>& others) const {
  Tensor r = *this;
  for (const Tensor& o : others) r = dtypes::is_bool(dtype()) ? r.logical_and(o) : (r * o);
  return r;
}

Tensor Tensor::full_like(double value, std::optional<DType> dtype) const {
  return full(shape(), value, dtype.value_or(dtypes::strong(this->dtype())), device());
}
Tensor Tensor::zeros_like(std::optional<DType> dtype) const { return full_like(0, dtype); }
Tensor Tensor::ones_like(std::optional<DType> dtype) const { return full_like(1, dtype); }
Tensor Tensor::rand_like(std::optional<DType> dtype) const {
  DType d = dtype.value_or(dtypes::strong(this->dtype()));
  if (!dtypes::is_float(d)) fail("rand_like", "needs a float dtype, got " + d.name());
  return rand(shape(), d, device());
}
Tensor Tensor::randn_like(std::optional<DType> dtype) const {
  DType d = dtype.value_or(dtypes::strong(this->dtype()));
  if (!dtypes::is_float(d)) fail("randn_like", "needs a float dtype, got " + d.name());
  return randn(shape(), d, device());
}

namespace {
// (r, c) bool: arange(r)[:, None] + diagonal <= arange(c)[None, :]
Tensor tri_mask(const Tensor& x, int64_t diagonal, const char* op) {
  if (x.ndim() < 2) fail(op, "needs at least 2 dims, got shape " + shape_str(x.shape()));
  int64_t r = x.shape()[size_t(x.ndim() - 2)], c = x.shape()[size_t(x.ndim() - 1)];
  Tensor rows = Tensor::arange(0, double(r), 1, dtypes::int64, x.device()).reshape({r, 1});
  Tensor cols = Tensor::arange(0, double(c), 1, dtypes::int64, x.device()).reshape({1, c});
  return (rows + const_of(x, double(diagonal), dtypes::int64)).le(cols);
}
}  // namespace

Tensor Tensor::triu(int64_t diagonal) const { return tri_mask(*this, diagonal, "triu").where(*this, const_like(*this, 0)); }
Tensor Tensor::tril(int64_t diagonal) const {
  return tri_mask(*this, diagonal + 1, "tril").where(const_like(*this, 0), *this);
}

// ---------------------------------------------------------------- math

namespace {
// c0 + x*(c1 + x*(c2 + ...)) (Horner), coefficients from the highest power down.
Tensor horner(const Tensor& x, std::initializer_list<double> coeffs) {
  auto it = coeffs.begin();
  double top = *it++;
  Tensor r = x * top + *it++;
  for (; it != coeffs.end(); ++it) r = r * x + *it;
  return r;
}
}  // namespace

Tensor Tensor::tan() const { return sin() / cos(); }

Tensor Tensor::asin() const {
  // Abramowitz-Stegun 4.4.46 (|error| <= 2e-8): pi/2 - sqrt(1 - |x|) * poly(|x|), odd in x.
  Tensor x = to_float(*this), a = x.abs();
  Tensor p = horner(a, {-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874,
                        -0.2145988016, 1.5707963050});
  Tensor r = M_PI / 2 - (1.0 - a).sqrt() * p;
  return x.sign() * r;
}
Tensor Tensor::acos() const { return M_PI / 2 - asin(); }
Tensor Tensor::atan() const {
  Tensor x = to_float(*this);
  return (x / (x * x + 1.0).sqrt()).asin();
}
Tensor Tensor::sinh() const {
  Tensor x = to_float(*this);
  return (x.exp() - (-x).exp()) * 0.5;
}
Tensor Tensor::cosh() const {
  Tensor x = to_float(*this);
  return (x.exp() + (-x).exp()) * 0.5;
}
Tensor Tensor::tanh() const {
  Tensor x = to_float(*this);
  return (x * 2.0).sigmoid() * 2.0 - 1.0;
}
Tensor Tensor::asinh() const {
  Tensor x = to_float(*this), a = x.abs();
  return x.sign() * (a + (a * a + 1.0).sqrt()).log();
}
Tensor Tensor::acosh() const {
  Tensor x = to_float(*this);
  return (x + (x * x - 1.0).sqrt()).log();
}
Tensor Tensor::atanh() const {
  Tensor x = to_float(*this);
  return ((1.0 + x) / (1.0 - x)).log() * 0.5;
}

Tensor Tensor::erf() const {
  // |x| < 0.5: Taylor series (to x^13); else 1 - erfc with Numerical Recipes' Chebyshev fit (relative error
  // < 1.2e-7). Both pieces are smooth, so their derivatives match 2/sqrt(pi) exp(-x^2) to ~3e-7.
  Tensor x = to_float(*this), a = x.abs(), x2 = x * x;
  Tensor series = x * horner(x2, {-1.0 / 75600, 1.0 / 9360, -1.0 / 1320, 1.0 / 216, -1.0 / 42, 1.0 / 10, -1.0 / 3, 1.0}) *
                  (2.0 / std::sqrt(M_PI));
  Tensor t = 1.0 / (a * 0.5 + 1.0);
  Tensor poly = horner(t, {0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
                           0.37409196, 1.00002368, -1.26551223});
  Tensor erfc = t * (poly - a * a).exp();
  Tensor big = x.sign() * (1.0 - erfc);
  return (a < 0.5).where(series, big);
}

Tensor Tensor::log10() const { return log2() * (M_LN2 / M_LN10); }
Tensor Tensor::log1p() const { return (1.0 + to_float(*this)).log(); }
Tensor Tensor::expm1() const { return exp() - 1.0; }
Tensor Tensor::rsqrt() const { return sqrt().reciprocal(); }
Tensor Tensor::square() const { return *this * *this; }

namespace {
// x ** e by square-and-multiply: exact for ints, a few roundings for floats (like torch's integer fast paths).
Tensor integer_pow(const Tensor& x, int64_t e) {
  int64_t n = e < 0 ? -e : e;
  if (n == 0) return x.ones_like();
  Tensor base = x, r;
  bool have = false;
  for (int64_t k = n; k > 0; k >>= 1) {
    if (k & 1) {
      r = have ? (r * base) : base;
      have = true;
    }
    if (k > 1) base = base * base;
  }
  return e < 0 ? r.reciprocal() : r;
}
}  // namespace

Tensor Tensor::pow(int e) const {
  if (dtypes::is_float(dtype())) return pow(double(e));
  if (e < 0) fail("pow", "integers to negative integer powers are not allowed");
  return integer_pow(dtypes::is_bool(dtype()) ? cast(dtypes::int64) : *this, e);
}

Tensor Tensor::pow(double e) const {
  bool integral = std::isfinite(e) && e == std::floor(e) && std::fabs(e) <= 64;
  if (integral) return integer_pow(to_float(*this), int64_t(e));
  if (e == 0.5) return to_float(*this).sqrt();
  if (e == -0.5) return to_float(*this).rsqrt();
  Tensor x = to_float(*this);
  return x.pow(Tensor::full({}, e, x.dtype(), device()));
}

Tensor Tensor::sign() const {
  if (dtypes::is_bool(dtype())) return *this;
  Tensor one = const_like(*this, 1), zero = const_like(*this, 0);
  Tensor neg = dtypes::is_unsigned(dtype()) ? one : const_like(*this, -1);
  return (*this != 0).where((*this < 0).where(neg, one), zero);
}
Tensor Tensor::floor() const {
  if (!dtypes::is_float(dtype())) return *this;
  Tensor b = trunc();
  return (*this < b).where(b - 1.0, b);
}
Tensor Tensor::ceil() const {
  if (!dtypes::is_float(dtype())) return *this;
  Tensor b = trunc();
  return (*this > b).where(b + 1.0, b);
}
Tensor Tensor::round() const {
  if (!dtypes::is_float(dtype())) return *this;
  // Half to even: x > 0 with an even integer part rounds x - 0.5 up, otherwise x + 0.5 down (mirrored below 0).
  Tensor b = trunc() * 0.5;
  Tensor even = b.trunc() == b;
  return (*this > 0.0).eq(even).where((*this - 0.5).ceil(), (*this + 0.5).floor());
}

namespace {
// A bound for clamp: exact in the tensor's dtype when the tensor is int and the bound integral.
Tensor bound_of(const Tensor& x, double v) {
  if (!dtypes::is_float(x.dtype()) && v == std::floor(v) && std::fabs(v) < 9e15) return const_like(x, v);
  return v;
}
}  // namespace

Tensor Tensor::clamp(double min, double max) const { return clamp_min(min).clamp_max(max); }
Tensor Tensor::clamp(const Tensor& min, const Tensor& max) const {
  (void)broadcast_shape(broadcast_shape(shape(), min.shape(), "clamp"), max.shape(), "clamp");
  Tensor r = (*this < min).where(min, *this);
  return (r > max).where(max, r);
}
Tensor Tensor::clamp_min(double min) const {
  if (std::isnan(min)) fail("clamp", "min is NaN");
  Tensor lo = bound_of(*this, min);
  return (*this < lo).where(lo, *this);
}
Tensor Tensor::clamp_max(double max) const {
  if (std::isnan(max)) fail("clamp", "max is NaN");
  Tensor hi = bound_of(*this, max);
  return (*this > hi).where(hi, *this);
}
Tensor Tensor::lerp(const Tensor& end, const Tensor& weight) const {
  if (!dtypes::is_float(dtype()) || !dtypes::is_float(end.dtype()))
    fail("lerp", "needs float tensors, got " + dtype().name() + " and " + end.dtype().name());
  (void)broadcast_shape(broadcast_shape(shape(), end.shape(), "lerp"), weight.shape(), "lerp");
  return *this + (end - *this) * weight;
}
Tensor Tensor::isnan() const {
  if (!dtypes::is_float(dtype())) return full_like(0, dtypes::bool_);
  return *this != *this;
}
Tensor Tensor::isinf() const {
  if (!dtypes::is_float(dtype())) return full_like(0, dtypes::bool_);
  return (*this == INFINITY) | (*this == -INFINITY);
}
Tensor Tensor::isinf(bool detect_positive, bool detect_negative) const {
  if (!dtypes::is_float(dtype()) || (!detect_positive && !detect_negative)) return full_like(0, dtypes::bool_);
  if (!detect_negative) return *this == INFINITY;
  if (!detect_positive) return *this == -INFINITY;
  return isinf();
}
Tensor Tensor::isfinite() const {
  if (!dtypes::is_float(dtype())) return full_like(1, dtypes::bool_);
  return (isinf() | isnan()).logical_not();
}

// ---------------------------------------------------------------- activations

Tensor Tensor::relu6() const { return relu() - (*this - 6).relu(); }
Tensor Tensor::leaky_relu(double slope) const { return (*this > 0).where(*this, *this * slope); }
Tensor Tensor::elu(double alpha) const {
  Tensor x = to_float(*this);
  return (x > 0.0).where(x, x.expm1() * alpha);
}
Tensor Tensor::celu(double alpha) const {
  if (alpha == 0) fail("celu", "alpha must not be 0");
  Tensor x = to_float(*this);
  return (x > 0.0).where(x, (x / alpha).expm1() * alpha);
}
Tensor Tensor::selu() const {
  constexpr double alpha = 1.6732632423543772848170429916717, scale = 1.0507009873554804934193349852946;
  return elu(alpha) * scale;
}
Tensor Tensor::gelu(const std::string& approximate) const {
  Tensor x = to_float(*this);
  if (approximate == "none") return x * 0.5 * (1.0 + (x * M_SQRT1_2).erf());
  if (approximate == "tanh") {
    Tensor inner = ((x + x * x * x * 0.044715) * std::sqrt(2.0 / M_PI)).tanh();
    return x * 0.5 * (1.0 + inner);
  }
  fail("gelu", "approximate must be 'none' or 'tanh', got '" + approximate + "'");
}
Tensor Tensor::quick_gelu() const { return *this * (*this * 1.702).sigmoid(); }
Tensor Tensor::silu() const { return *this * sigmoid(); }
Tensor Tensor::mish() const { return *this * softplus().tanh(); }
Tensor Tensor::softplus(double beta, double threshold) const {
  if (beta == 0) fail("softplus", "beta must not be 0");
  Tensor x = to_float(*this), bx = x * beta;
  // log(1 + e^bx) = max(bx, 0) + log(1 + e^-|bx|), stable for large |bx|
  Tensor sp = (bx.relu() + (1.0 + (-bx.abs()).exp()).log()) / beta;
  return (bx > threshold).where(x, sp);
}
Tensor Tensor::softsign() const { return *this / (1.0 + abs()); }
Tensor Tensor::hardsigmoid() const { return (*this + 3.0).relu6() / 6.0; }
Tensor Tensor::hardsigmoid(double alpha, double beta) const {
  Tensor y = *this * alpha + beta;
  return y.relu() - (y - 1.0).relu();  // clamp(y, 0, 1) with tinygrad's gradient (0 outside, alpha inside)
}
Tensor Tensor::hardswish() const { return *this * (*this + 3.0).relu6() / 6.0; }
Tensor Tensor::hardtanh(double min_val, double max_val) const {
  if (min_val > max_val) fail("hardtanh", "min_val " + std::to_string(min_val) + " > max_val " + std::to_string(max_val));
  return clamp(min_val, max_val);
}
Tensor Tensor::logsigmoid() const { return -(-*this).softplus(); }

// ---------------------------------------------------------------- comparisons, logical, bitwise

namespace {
// Binary ops check broadcasting under their own name (alu would report the primitive's).
const Tensor& bcast_checked(const Tensor& a, const Tensor& b, const char* op) {
  (void)Tensor::broadcast_shape(a.shape(), b.shape(), op);
  return a;
}
Tensor bitwise(const Tensor& a, const Tensor& b, Ops o, const char* op) {
  if (dtypes::is_float(a.dtype()) || dtypes::is_float(b.dtype()))
    fail(op, "needs int or bool tensors, got " + a.dtype().name() + " and " + b.dtype().name());
  return bcast_checked(a, b, op).alu(o, b);
}
}  // namespace

Tensor Tensor::eq(const Tensor& b) const { return bcast_checked(*this, b, "eq").alu(Ops::CMPEQ, b); }
Tensor Tensor::ne(const Tensor& b) const { return bcast_checked(*this, b, "ne").alu(Ops::CMPNE, b); }
Tensor Tensor::lt(const Tensor& b) const { return bcast_checked(*this, b, "lt").alu(Ops::CMPLT, b); }
Tensor Tensor::gt(const Tensor& b) const { return bcast_checked(b, *this, "gt").alu(Ops::CMPLT, *this); }
Tensor Tensor::le(const Tensor& b) const { return lt(b) | eq(b); }
Tensor Tensor::ge(const Tensor& b) const { return gt(b) | eq(b); }

Tensor Tensor::logical_and(const Tensor& b) const { return bitwise(cast(dtypes::bool_), b.cast(dtypes::bool_), Ops::AND, "logical_and"); }
Tensor Tensor::logical_or(const Tensor& b) const { return bitwise(cast(dtypes::bool_), b.cast(dtypes::bool_), Ops::OR, "logical_or"); }
Tensor Tensor::logical_xor(const Tensor& b) const { return bitwise(cast(dtypes::bool_), b.cast(dtypes::bool_), Ops::XOR, "logical_xor"); }
Tensor Tensor::bitwise_and(const Tensor& b) const { return bitwise(*this, b, Ops::AND, "bitwise_and"); }
Tensor Tensor::bitwise_or(const Tensor& b) const { return bitwise(*this, b, Ops::OR, "bitwise_or"); }
Tensor Tensor::bitwise_xor(const Tensor& b) const { return bitwise(*this, b, Ops::XOR, "bitwise_xor"); }
Tensor Tensor::bitwise_not() const {
  if (dtypes::is_float(dtype())) fail("bitwise_not", "needs an int or bool tensor, got " + dtype().name());
  if (dtypes::is_bool(dtype())) return logical_not();
  return alu(Ops::XOR, -1);
}
Tensor Tensor::lshift(const Tensor& b) const {
  if (!dtypes::is_int(dtype())) fail("lshift", "needs an int tensor, got " + dtype().name());
  return alu(Ops::SHL, b);
}
Tensor Tensor::rshift(const Tensor& b) const {
  if (!dtypes::is_int(dtype())) fail("rshift", "needs an int tensor, got " + dtype().name());
  return alu(Ops::SHR, b);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, CallLoc loc) {
  CallSite site(loc); return cond.where(a, b); }

// ---------------------------------------------------------------- the rest of tinygrad's elementwise API

int64_t Tensor::element_size() const { return dtype().itemsize(); }
int64_t Tensor::nbytes() const { return numel() * element_size(); }
bool Tensor::is_floating_point() const { return dtypes::is_float(dtype()); }
int64_t Tensor::max_numel() const {
  int64_t n = 1;
  for (int64_t d : max_shape()) n *= d;
  return n;
}
Tensor Tensor::empty_like(std::optional<DType> dtype) const { return empty(shape(), dtype.value_or(this->dtype()), device()); }
Tensor Tensor::invalids(const Shape& shape, DType dtype, const std::string& device) { return empty(shape, dtype, device); }
Tensor Tensor::const_like(double value, std::optional<DType> dtype) const { return full_like(value, dtype); }
Tensor Tensor::const_like(const Tensor& t, double v) { return detail::const_like(t, v); }
Tensor Tensor::half() const { return cast(dtypes::float16); }
Tensor Tensor::bfloat16() const { return cast(dtypes::bfloat16); }
Tensor Tensor::float_() const { return cast(dtypes::float32); }
Tensor Tensor::double_() const { return cast(dtypes::float64); }
Tensor Tensor::int_() const { return cast(dtypes::int32); }
Tensor Tensor::long_() const { return cast(dtypes::int64); }
Tensor Tensor::short_() const { return cast(dtypes::int16); }
Tensor Tensor::bool_() const { return cast(dtypes::bool_); }
Tensor Tensor::add(const Tensor& b) const { return *this + b; }
Tensor Tensor::sub(const Tensor& b) const { return *this - b; }
Tensor Tensor::mul(const Tensor& b) const { return *this * b; }
Tensor Tensor::contiguous_backward() const {
  return Tensor(UOp::make(Ops::CONTIGUOUS_BACKWARD, dtype(), {uop()}), max_shape(), device());
}

Tensor Tensor::fmod(const Tensor& b) const {
  DType d = least_upper_dtype({dtype(), b.dtype()});
  if (!dtypes::is_float(d)) return alu(Ops::MOD, b);  // C's %, x % 0 = 0
  if (!(opmath_dtype(d) == d)) return cast(opmath_dtype(d)).fmod(b.cast(opmath_dtype(d))).cast(d);  // 16-bit floats in float32
  return *this - div(b, "trunc") * b;  // d/db = -trunc(a / b), as torch
}

Tensor Tensor::copysign(const Tensor& b) const {
  Tensor mag = to_float(*this).abs();
  Tensor neg = b < 0;
  if (dtypes::is_float(b.dtype())) neg = neg | (b.reciprocal() < 0);  // -0.0 counts as negative
  Tensor r = neg.where(-mag, mag);
  return r.cast(float_dtype(least_upper_dtype({dtype(), b.dtype()})));
}

Tensor Tensor::logaddexp(const Tensor& b) const {
  Tensor x = to_float(*this), y = to_float(b);
  Tensor m = x.maximum(y).detach();
  m = m.isfinite().where(m, const_like(m, 0));  // both -inf: -inf; an inf: inf
  return ((x - m).exp() + (y - m).exp()).log() + m;
}

Tensor Tensor::isclose(const Tensor& b, double rtol, double atol, bool equal_nan) const {
  DType d = least_upper_dtype({dtype(), b.dtype()});
  Tensor same = cast(d) == b.cast(d);
  if (!dtypes::is_float(d)) return same;  // integers: close only when equal (as torch for tolerances below 1)
  Tensor x = cast(d), y = b.cast(d);
  Tensor close = same | (x.isfinite() & y.isfinite() & ((x - y).abs() <= (y.abs() * rtol + atol)));
  return equal_nan ? (close | (x.isnan() & y.isnan())) : close;
}

Tensor Tensor::allclose(const Tensor& b, double rtol, double atol, bool equal_nan) const {
  return isclose(b, rtol, atol, equal_nan).all();
}

Tensor Tensor::randperm(int64_t n, DType dtype, const std::string& device) {
  if (n < 0) fail("randperm", "n must be non-negative, got " + std::to_string(n));
  if (!dtypes::is_int(dtype)) fail("randperm", "needs an int dtype, got " + dtype.name());
  return rand({n}, dtypes::float32, device).argsort(0).cast(dtype);
}

Tensor Tensor::multinomial(int64_t num_samples, bool replacement) const {
  if (ndim() < 1 || ndim() > 2 || num_samples <= 0)
    fail("multinomial", "needs a 1-D or 2-D tensor of weights and num_samples > 0, got shape " + shape_str(shape()) +
                            " and " + std::to_string(num_samples));
  Tensor w = ndim() == 1 ? unsqueeze(0) : *this;
  int64_t rows = w.shape()[0], c = w.shape()[1];
  if (c == 0) fail("multinomial", "needs at least one category, got shape " + shape_str(shape()));
  if (!replacement && num_samples > c)
    fail("multinomial", "cannot draw " + std::to_string(num_samples) + " samples without replacement from " + std::to_string(c) + " categories");
  Tensor idx;
  if (replacement || num_samples == 1) {
    Tensor cw = to_float(w).cast(dtypes::float32).cumsum(1);
    Tensor cdf = cw / cw.shrink({{0, rows}, {c - 1, c}});
    Tensor u = Tensor::rand({num_samples, rows, 1}, dtypes::float32, device());
    idx = (u >= cdf).cast(dtypes::int64).sum(2).permute({1, 0});  // how many cdf steps lie at or below u
    idx = idx.minimum(Tensor::full({}, double(c - 1), dtypes::int64, device()));
  } else {  // Efraimidis-Spirakis: the largest log(u) / w
    Tensor keys = to_float(w).cast(dtypes::float32);
    keys = keys.rand_like(dtypes::float32).log2() / keys;
    idx = keys.topk(num_samples, 1).second;
  }
  return ndim() == 1 ? idx.squeeze(0) : idx;
}

}  // namespace tg
