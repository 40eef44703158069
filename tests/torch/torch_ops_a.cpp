// Case tables: elementwise math, activations, comparisons, logical/bitwise ops, movement and indexing.
#include <cmath>

#include "harness.hpp"

namespace tt {
using tg::dtypes::bool_;
using tg::dtypes::int32;
using tg::dtypes::int64;
namespace F_ = torch::nn::functional;
using torch::indexing::Slice;

namespace {
const tg::Shape A{3, 5}, Bs{2, 1, 7}, Z{};  // shapes shared by the unary cases (Z: 0-d)
constexpr double kT = 1e-4;           // transcendental chains (different algorithms in torch)

// values with exact halves (round) and special values (isnan/isinf)
Values halves() {
  return [](const tg::Shape& s, std::mt19937& g) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    std::vector<double> v;
    for (int64_t i = 0; i < n; i++) v.push_back(double(int64_t(g() % 13) - 6) * 0.5 + ((g() & 3) == 0 ? 0.1 : 0.0));
    return v;
  };
}
Values specials() {
  return [](const tg::Shape& s, std::mt19937&) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    std::vector<double> v;
    const double sp[] = {0.0, -1.5, INFINITY, NAN, -INFINITY, 2.0, 1e30};
    for (int64_t i = 0; i < n; i++) v.push_back(sp[i % 7]);
    return v;
  };
}
}  // namespace

#define UNARY(NAME, EXPR, LO, HI, TOL)                                                        \
  for (auto& s : {A, Bs, Z})                                                                  \
    c.push_back(op(NAME, {F(s, LO, HI)}, [](auto& x) { return EXPR; }).tol(TOL, TOL * 0.1));

std::vector<Case> math_cases() {
  std::vector<Case> c;
  // ---- math
  UNARY("tan", x[0].tan(), -1.2, 1.2, kT)
  UNARY("asin", x[0].asin(), -0.95, 0.95, kT)
  UNARY("acos", x[0].acos(), -0.95, 0.95, kT)
  UNARY("atan", x[0].atan(), -4, 4, kT)
  UNARY("sinh", x[0].sinh(), -3, 3, kT)
  UNARY("cosh", x[0].cosh(), -3, 3, kT)
  UNARY("tanh", x[0].tanh(), -3, 3, kT)
  UNARY("asinh", x[0].asinh(), -4, 4, kT)
  UNARY("acosh", x[0].acosh(), 1.1, 5, kT)
  UNARY("atanh", x[0].atanh(), -0.9, 0.9, kT)
  UNARY("erf", x[0].erf(), -3, 3, 1e-5)
  UNARY("exp", x[0].exp(), -3, 3, 1e-5)
  UNARY("log", x[0].log(), 0.05, 5, 1e-5)
  UNARY("log2", x[0].log2(), 0.05, 5, 1e-5)
  UNARY("log10", x[0].log10(), 0.05, 5, 1e-5)
  UNARY("log1p", x[0].log1p(), -0.9, 3, 1e-5)
  UNARY("expm1", x[0].expm1(), -2, 2, 1e-5)
  UNARY("sqrt", x[0].sqrt(), 0.05, 5, 1e-5)
  UNARY("rsqrt", x[0].rsqrt(), 0.05, 5, 1e-5)
  UNARY("sin", x[0].sin(), -4, 4, 1e-5)
  UNARY("cos", x[0].cos(), -4, 4, 1e-5)
  UNARY("square", x[0].square(), -3, 3, 1e-5)
  UNARY("reciprocal", x[0].reciprocal(), 0.2, 3, 1e-5)
  UNARY("sigmoid", x[0].sigmoid(), -5, 5, 1e-5)
  UNARY("abs", x[0].abs(), -3, 3, 1e-5)
  UNARY("neg", x[0].neg(), -3, 3, 1e-5)
  UNARY("sign", x[0].sign(), -3, 3, 1e-5)
  UNARY("floor", x[0].floor(), -3, 3, 1e-5)
  UNARY("ceil", x[0].ceil(), -3, 3, 1e-5)
  UNARY("trunc", x[0].trunc(), -3, 3, 1e-5)
  UNARY("pow2", x[0].pow(2.0), -3, 3, 1e-5)
  UNARY("pow3", x[0].pow(3.0), -3, 3, 1e-5)
  UNARY("pow-2", x[0].pow(-2.0), 0.3, 3, 1e-5)
  UNARY("pow0.5", x[0].pow(0.5), 0.1, 3, 1e-5)
  UNARY("pow1.7", x[0].pow(1.7), 0.1, 3, kT)
  UNARY("clamp", x[0].clamp(-0.7, 1.1), -3, 3, 1e-5)
  c.push_back(op("round_half_even", {V({4, 6}, tg::dtypes::float32, halves())}, [](auto& x) { return x[0].round(); }));
  c.push_back(op("pow_tensor", {F({3, 4}, 0.2, 3), F({4}, -2, 2)}, [](auto& x) { return x[0].pow(x[1]); }).tol(kT, 1e-5));
  c.push_back(op("lerp_scalar", {F({3, 4}), F({3, 4})}, [](auto& x) { return x[0].lerp(x[1], 0.3); }));
  c.push_back(op("lerp_tensor", {F({3, 4}), F({1, 4}), F({3, 1}, 0, 1)}, [](auto& x) { return x[0].lerp(x[1], x[2]); }));
  c.push_back(op("clamp_tensor", {F({3, 4}), C({4}, -1, 0), C({3, 1}, 0, 1)}, [](auto& x) { return x[0].clamp(x[1], x[2]); }));
  c.push_back(op("isnan", {V({2, 7}, tg::dtypes::float32, specials())}, [](auto& x) { return x[0].isnan(); }));
  c.push_back(op("isinf", {V({2, 7}, tg::dtypes::float32, specials())}, [](auto& x) { return x[0].isinf(); }));
  c.push_back(op("isfinite", {V({2, 7}, tg::dtypes::float32, specials())}, [](auto& x) { return x[0].isfinite(); }));
  // ints: exact
  c.push_back(op("abs_int", {I({3, 5}, -9, 9, int32)}, [](auto& x) { return x[0].abs(); }));
  c.push_back(op("sign_int", {I({3, 5}, -9, 9, int32)}, [](auto& x) { return x[0].sign(); }));
  c.push_back(op("clamp_int", {I({3, 5}, -9, 9, int32)}, [](auto& x) { return x[0].clamp(-3, 4); }));
  c.push_back(op("pow3_int", {I({3, 5}, -9, 9, int64)}, [](auto& x) { return x[0].pow(3.0); }));
  c.push_back(op("square_int", {I({3, 5}, -9, 9, int32)}, [](auto& x) { return x[0].square(); }));
  c.push_back(op("sqrt_of_int", {I({3, 5}, 0, 50, int32)}, [](auto& x) { return x[0].sqrt(); }));
  // ---- binary with broadcasting
  c.push_back(op("add_bcast", {F({3, 1}), F({1, 4})}, [](auto& x) { return x[0] + x[1]; }));
  c.push_back(op("sub_bcast", {F({2, 3, 4}), F({4})}, [](auto& x) { return x[0] - x[1]; }));
  c.push_back(op("mul_bcast", {F({3, 1}), F({1, 4})}, [](auto& x) { return x[0] * x[1]; }));
  c.push_back(op("div_bcast", {F({2, 3, 4}), F({3, 1}, 0.5, 2)}, [](auto& x) { return x[0] / x[1]; }));
  c.push_back(op("maximum", {F({3, 4}), F({4})}, [](auto& x) { return x[0].maximum(x[1]); }));
  c.push_back(op("minimum", {F({3, 4}), F({3, 1})}, [](auto& x) { return x[0].minimum(x[1]); }));
  c.push_back(op("scalar_chain", {F({1}), F({5})}, [](auto& x) { return (x[0] * 2.5 - 1.0) / (x[1] * x[1] + 1.0); }));
  c.push_back(op("zero_d", {F({}), F({3})}, [](auto& x) { return x[0] * x[1] + x[0]; }));
  // ---- activations
  UNARY("relu", x[0].relu(), -3, 3, 1e-5)
  c.push_back(op2("relu6", {F(A, -4, 10)}, [](TG& x) { return x[0].relu6(); }, [](TH& x) { return torch::hardtanh(x[0], 0, 6); }));
  c.push_back(op2("leaky_relu", {F(A)}, [](TG& x) { return x[0].leaky_relu(0.05); }, [](TH& x) { return torch::leaky_relu(x[0], 0.05); }));
  c.push_back(op2("elu", {F(A)}, [](TG& x) { return x[0].elu(1.3); }, [](TH& x) { return torch::elu(x[0], 1.3); }).tol(1e-5, 1e-6));
  c.push_back(op2("celu", {F(A)}, [](TG& x) { return x[0].celu(0.7); }, [](TH& x) { return torch::celu(x[0], 0.7); }).tol(1e-5, 1e-6));
  c.push_back(op2("selu", {F(Bs)}, [](TG& x) { return x[0].selu(); }, [](TH& x) { return torch::selu(x[0]); }).tol(1e-5, 1e-6));
  for (auto& s : {A, Bs}) {
    c.push_back(op2("gelu", {F(s, -4, 4)}, [](TG& x) { return x[0].gelu(); }, [](TH& x) { return torch::gelu(x[0]); }));
    c.push_back(op2("gelu_tanh", {F(s, -4, 4)}, [](TG& x) { return x[0].gelu("tanh"); },
                    [](TH& x) { return torch::gelu(x[0], "tanh"); }).tol(kT, 1e-5));
    c.push_back(op2("silu", {F(s, -5, 5)}, [](TG& x) { return x[0].silu(); }, [](TH& x) { return torch::silu(x[0]); }));
    c.push_back(op2("mish", {F(s, -5, 5)}, [](TG& x) { return x[0].mish(); }, [](TH& x) { return torch::mish(x[0]); }).tol(kT, 1e-5));
    c.push_back(op2("softplus", {F(s, -5, 5)}, [](TG& x) { return x[0].softplus(2.0, 6.0); },
                    [](TH& x) { return torch::softplus(x[0], 2.0, 6.0); }));
    c.push_back(op2("logsigmoid", {F(s, -8, 8)}, [](TG& x) { return x[0].logsigmoid(); },
                    [](TH& x) { return torch::log_sigmoid(x[0]); }));
  }
  c.push_back(op2("swish", {F(A)}, [](TG& x) { return x[0].swish(); }, [](TH& x) { return torch::silu(x[0]); }));
  c.push_back(op2("quick_gelu", {F(A)}, [](TG& x) { return x[0].quick_gelu(); }, [](TH& x) { return x[0] * torch::sigmoid(x[0] * 1.702); }));
  c.push_back(op2("softsign", {F(A)}, [](TG& x) { return x[0].softsign(); }, [](TH& x) { return F_::softsign(x[0]); }));
  c.push_back(op2("hardsigmoid", {F(A, -5, 5)}, [](TG& x) { return x[0].hardsigmoid(); }, [](TH& x) { return torch::hardsigmoid(x[0]); }));
  c.push_back(op2("hardswish", {F(A, -5, 5)}, [](TG& x) { return x[0].hardswish(); }, [](TH& x) { return torch::hardswish(x[0]); }));
  c.push_back(op2("hardtanh", {F(A)}, [](TG& x) { return x[0].hardtanh(-0.5, 1.5); }, [](TH& x) { return torch::hardtanh(x[0], -0.5, 1.5); }));
  c.push_back(op2("softplus_default", {F(A, -30, 30)}, [](TG& x) { return x[0].softplus(); }, [](TH& x) { return torch::softplus(x[0]); }));
  // ---- comparisons, where, logical, bitwise
  c.push_back(op("eq", {I({3, 4}, 0, 2, int32), I({4}, 0, 2, int32)}, [](auto& x) { return x[0].eq(x[1]); }));
  c.push_back(op("ne", {I({3, 4}, 0, 2), I({3, 1}, 0, 2)}, [](auto& x) { return x[0].ne(x[1]); }));
  c.push_back(op("lt", {F({3, 4}), F({4})}, [](auto& x) { return x[0].lt(x[1]); }));
  c.push_back(op("le_int", {I({3, 4}, 0, 3, int32), I({4}, 0, 3, int32)}, [](auto& x) { return x[0].le(x[1]); }));
  c.push_back(op("gt", {F({3, 4}), F({3, 1})}, [](auto& x) { return x[0].gt(x[1]); }));
  c.push_back(op("ge_int", {I({3, 4}, 0, 3), I({3, 4}, 0, 3)}, [](auto& x) { return x[0].ge(x[1]); }));
  c.push_back(op("gt_scalar", {F({3, 4})}, [](auto& x) { return x[0].gt(0.5); }));
  c.push_back(op("where", {B({3, 4}), F({3, 4}), F({4})}, [](auto& x) { return where(x[0], x[1], x[2]); }));
  c.push_back(op("where_int", {B({3, 1}), I({3, 4}, -5, 5, int32), I({4}, -5, 5, int32)}, [](auto& x) { return where(x[0], x[1], x[2]); }));
  c.push_back(op("where_scalar", {F({3, 4})}, [](auto& x) { return where(x[0] > 0, x[0], x[0] * 0.1); }));
  c.push_back(op("logical_and", {B({3, 4}), B({4})}, [](auto& x) { return x[0].logical_and(x[1]); }));
  c.push_back(op("logical_or", {B({3, 4}), B({3, 1})}, [](auto& x) { return x[0].logical_or(x[1]); }));
  c.push_back(op("logical_xor", {B({3, 4}), B({3, 4})}, [](auto& x) { return x[0].logical_xor(x[1]); }));
  c.push_back(op("logical_and_float", {F({3, 4}, -1, 1), I({3, 4}, 0, 1)}, [](auto& x) { return x[0].logical_and(x[1]); }));
  c.push_back(op("logical_not", {I({3, 4}, 0, 2, int32)}, [](auto& x) { return x[0].logical_not(); }));
  c.push_back(op("bitwise_and", {I({3, 4}, -100, 100, int32), I({4}, -100, 100, int32)}, [](auto& x) { return x[0].bitwise_and(x[1]); }));
  c.push_back(op("bitwise_or", {I({3, 4}, -100, 100), I({4}, -100, 100)}, [](auto& x) { return x[0].bitwise_or(x[1]); }));
  c.push_back(op("bitwise_xor", {I({3, 4}, -100, 100, int32), I({3, 4}, -100, 100, int32)}, [](auto& x) { return x[0].bitwise_xor(x[1]); }));
  c.push_back(op("bitwise_not", {I({3, 4}, -100, 100, int32)}, [](auto& x) { return x[0].bitwise_not(); }));
  c.push_back(op("bitwise_and_bool", {B({3, 4}), B({4})}, [](auto& x) { return x[0].bitwise_and(x[1]); }));
  c.push_back(op("bitwise_not_bool", {B({3, 4})}, [](auto& x) { return x[0].bitwise_not(); }));
  c.push_back(op("bitwise_or_uint8", {I({3, 4}, 0, 255, tg::dtypes::uint8), I({4}, 0, 255, tg::dtypes::uint8)}, [](auto& x) { return x[0].bitwise_or(x[1]); }));
  c.push_back(op2("shifts", {I({3, 4}, -100, 100, int32)}, [](TG& x) { return x[0].lshift(2).bitwise_xor(x[0].rshift(1)); },
                  [](TH& x) { return torch::bitwise_left_shift(x[0], 2).bitwise_xor(torch::bitwise_right_shift(x[0], 1)); }));
  // ---- float64 and dtype promotion
  c.push_back(op("f64_exp_tanh", {D({3, 4}, -3, 3)}, [](auto& x) { return x[0].exp() * x[0].tanh(); }).tol(1e-6, 1e-7));
  c.push_back(op("f64_erf", {D({3, 4}, -3, 3)}, [](auto& x) { return x[0].erf(); }).tol(1e-6, 1e-7));  // float32-accurate approximation
  c.push_back(op2("f64_gelu_softplus", {D({3, 4}, -3, 3)}, [](TG& x) { return x[0].gelu("tanh") + x[0].softplus(); },
                  [](TH& x) { return torch::gelu(x[0], "tanh") + torch::softplus(x[0]); }).tol(1e-6, 1e-7));
  c.push_back(op("f64_sigmoid_log", {D({5}, 0.1, 3)}, [](auto& x) { return x[0].sigmoid() * x[0].log(); }).tol(1e-12, 1e-13));
  c.push_back(op("promote_int_float", {I({3, 4}, -5, 5, int32), F({4})}, [](auto& x) { return x[0] * x[1] + x[0]; }));
  c.push_back(op("promote_int8_int16", {I({3, 4}, -100, 100, tg::dtypes::int8), I({4}, -1000, 1000, tg::dtypes::int16)}, [](auto& x) { return x[0] * x[1] - x[0]; }));
  c.push_back(op("promote_float_double", {F({3, 4}), D({4})}, [](auto& x) { return x[0] / (x[1] * x[1] + 1.0); }));
  c.push_back(op("promote_bool_int", {B({3, 4}), I({4}, -5, 5, int32)}, [](auto& x) { return x[0] + x[1]; }));
  c.push_back(op("div_int", {I({3, 4}, -9, 9, int32), I({4}, 1, 4, int32)}, [](auto& x) { return x[0] / x[1]; }));
  // ---- creation
  c.push_back(op2("linspace", {}, [](TG&) { return tg::Tensor::linspace(-1, 2, 7); }, [](TH&) { return torch::linspace(-1, 2, 7); }));
  c.push_back(op2("linspace_long", {}, [](TG&) { return tg::Tensor::linspace(0.5, -3, 41); }, [](TH&) { return torch::linspace(0.5, -3, 41); }));
  c.push_back(op2("linspace_int", {}, [](TG&) { return tg::Tensor::linspace(0, 10, 4, int32); },
                  [](TH&) { return torch::linspace(0, 10, 4, torch::kInt); }));
  c.push_back(op2("eye_arange", {}, [](TG&) { return tg::Tensor::eye(3, 4) * tg::Tensor::arange(4).cast(tg::dtypes::float32); },
                  [](TH&) { return torch::eye(3, 4) * torch::arange(4).to(torch::kFloat); }));
  // Float aranges: tg rounds start + i * step (computed in double) once; libtorch's vector loop adds j * step to each
  // block's first value in the dtype, a rounding more (1024.69995 against its 1024.70007 at i = 3414): 2 ulps. Its
  // double one fuses the multiply-add (-3 + 30 x 0.1: 1.7e-16 against tg's 0): an absolute floor of a double ulp.
  c.push_back(op2("arange_float", {}, [](TG&) { return tg::Tensor::arange(0.5, 1200.1, 0.3, tg::dtypes::float32); },
                  [](TH&) { return torch::arange(0.5, 1200.1, 0.3, torch::kFloat); }).tol(2.4e-7, 0));
  c.push_back(op2("arange_double", {}, [](TG&) { return tg::Tensor::arange(-3.0, 7.7, 0.1, tg::dtypes::float64); },
                  [](TH&) { return torch::arange(-3.0, 7.7, 0.1, torch::kDouble); }).tol(4.5e-16, 2.5e-16));
  c.push_back(op2("full_like", {F({2, 3})}, [](TG& x) { return x[0].full_like(1.5) + x[0].zeros_like() + x[0] * x[0].ones_like(); },
                  [](TH& x) { return torch::full_like(x[0], 1.5) + torch::zeros_like(x[0]) + x[0] * torch::ones_like(x[0]); }));
  return c;
}
#undef UNARY

// ================================================================ movement and indexing

std::vector<Case> movement_cases() {
  std::vector<Case> c;
  using tg::NewAxis;
  using tg::Ellipsis;
  auto tgs = [](int64_t a, int64_t b, int64_t st = 1) { return tg::Slice{a, b, st}; };
  c.push_back(op2("cat_dim0", {F({2, 3}), F({1, 3}), F({4, 3})}, [](TG& x) { return tg::cat({x[0], x[1], x[2]}, 0); },
                  [](TH& x) { return torch::cat({x[0], x[1], x[2]}, 0); }));
  c.push_back(op2("cat_dim-1", {F({2, 3, 1}), F({2, 3, 4})}, [](TG& x) { return tg::cat({x[0], x[1]}, -1); },
                  [](TH& x) { return torch::cat({x[0], x[1]}, -1); }));
  c.push_back(op2("cat_int", {I({2, 3}, -9, 9, int32), I({2, 2}, -9, 9, int32)}, [](TG& x) { return tg::cat({x[0], x[1]}, 1); },
                  [](TH& x) { return torch::cat({x[0], x[1]}, 1); }));
  c.push_back(op2("cat_bool", {B({2, 3}), B({1, 3})}, [](TG& x) { return tg::cat({x[0], x[1]}, 0); },
                  [](TH& x) { return torch::cat({x[0], x[1]}, 0); }));
  c.push_back(op2("stack_dim0", {F({2, 3}), F({2, 3})}, [](TG& x) { return tg::stack({x[0], x[1]}, 0); },
                  [](TH& x) { return torch::stack({x[0], x[1]}, 0); }));
  c.push_back(op2("stack_dim2", {F({2, 3}), F({2, 3}), F({2, 3})}, [](TG& x) { return tg::stack({x[0], x[1], x[2]}, 2); },
                  [](TH& x) { return torch::stack({x[0], x[1], x[2]}, 2); }));
  c.push_back(op("repeat", {F({2, 3})}, [](auto& x) { return x[0].repeat({2, 1, 3}); }));
  c.push_back(op("repeat_ones", {F({1, 3})}, [](auto& x) { return x[0].repeat({3, 1}); }));
  c.push_back(op("repeat_int", {I({2, 3}, -5, 5, int32)}, [](auto& x) { return x[0].repeat({2, 2}); }));
  c.push_back(op2("repeat_interleave_dim", {F({2, 3})}, [](TG& x) { return x[0].repeat_interleave(2, 1); },
                  [](TH& x) { return x[0].repeat_interleave(2, 1); }));
  c.push_back(op2("repeat_interleave_flat", {F({2, 3})}, [](TG& x) { return x[0].repeat_interleave(3); },
                  [](TH& x) { return x[0].repeat_interleave(3); }));
  c.push_back(op2("split_size", {F({2, 7})}, [](TG& x) { auto p = x[0].split(3, 1); return tg::cat({p[2], p[0] * 2.0, p[1] * 3.0}, 1); },
                  [](TH& x) { auto p = x[0].split(3, 1); return torch::cat({p[2], p[0] * 2.0, p[1] * 3.0}, 1); }));
  c.push_back(op2("split_sizes", {F({6, 2})}, [](TG& x) { auto p = x[0].split(std::vector<int64_t>{1, 4, 1}, 0); return tg::cat({p[1], p[2] * 5.0}, 0); },
                  [](TH& x) { auto p = x[0].split_with_sizes({1, 4, 1}, 0); return torch::cat({p[1], p[2] * 5.0}, 0); }));
  c.push_back(op2("chunk", {F({3, 5})}, [](TG& x) { auto p = x[0].chunk(3, 1); return tg::cat({p[2], p[1] * 2.0, p[0]}, 1); },
                  [](TH& x) { auto p = x[0].chunk(3, 1); return torch::cat({p[2], p[1] * 2.0, p[0]}, 1); }));
  c.push_back(op2("roll_dims", {F({3, 4})}, [](TG& x) { return x[0].roll({1, -5}, {0, 1}); },
                  [](TH& x) { return x[0].roll({1, -5}, {0, 1}); }));
  c.push_back(op2("roll_flat", {F({3, 4})}, [](TG& x) { return x[0].roll(std::vector<int64_t>{5}); },
                  [](TH& x) { return x[0].roll(5); }));
  c.push_back(op("unflatten", {F({2, 6})}, [](auto& x) { return x[0].unflatten(1, {3, -1}); }));
  c.push_back(op("diagonal", {F({3, 4})}, [](auto& x) { return x[0].diagonal(); }));
  c.push_back(op("diagonal_offset", {F({2, 4, 3})}, [](auto& x) { return x[0].diagonal(1, 1, 2); }));
  c.push_back(op("diagonal_neg", {F({4, 3, 2})}, [](auto& x) { return x[0].diagonal(-1, 0, 1); }));
  c.push_back(op("tril", {F({3, 4})}, [](auto& x) { return x[0].tril(); }));
  c.push_back(op("triu_batch", {F({2, 4, 3})}, [](auto& x) { return x[0].triu(1); }));
  c.push_back(op("tril_neg_int", {I({4, 4}, -5, 5, int32)}, [](auto& x) { return x[0].tril(-1); }));
  // gather / index_select / scatter
  c.push_back(op("gather_dim1", {F({3, 5}), I({3, 4}, 0, 4)}, [](auto& x) { return x[0].gather(1, x[1]); }));
  c.push_back(op("gather_dim0", {F({4, 3}), I({2, 3}, 0, 3)}, [](auto& x) { return x[0].gather(0, x[1]); }));
  c.push_back(op("gather_3d", {F({2, 3, 4}), I({2, 2, 4}, 0, 2)}, [](auto& x) { return x[0].gather(1, x[1]); }));
  c.push_back(op("gather_int", {I({3, 5}, -9, 9, int32), I({3, 2}, 0, 4)}, [](auto& x) { return x[0].gather(1, x[1]); }));
  c.push_back(op("index_select", {F({4, 3}), I({5}, 0, 3)}, [](auto& x) { return x[0].index_select(0, x[1]); }));
  c.push_back(op("index_select_dim1", {F({2, 4, 3}), I({2}, 0, 3)}, [](auto& x) { return x[0].index_select(1, x[1]); }));
  c.push_back(op("scatter", {F({3, 5}), V({3, 4}, int64, perm_rows(5)), F({3, 4})}, [](auto& x) { return x[0].scatter(1, x[1], x[2]); }));
  c.push_back(op("scatter_dim0", {F({4, 3}), V({2, 3}, int64, [](const tg::Shape&, std::mt19937&) { return std::vector<double>{3, 0, 1, 1, 2, 3}; }),
                                  F({2, 3})}, [](auto& x) { return x[0].scatter(0, x[1], x[2]); }));
  c.push_back(op("scatter_src_larger", {F({4, 3}), V({2, 3}, int64, [](const tg::Shape&, std::mt19937&) { return std::vector<double>{3, 0, 1, 1, 2, 3}; }),
                                        F({3, 4})}, [](auto& x) { return x[0].scatter(0, x[1], x[2]); }).fwd_only());  // torch 1.13's backward rejects src > index
  c.push_back(op("scatter_value", {F({3, 5}), V({3, 2}, int64, perm_rows(5))}, [](auto& x) { return x[0].scatter(1, x[1], 2.5); }));
  for (std::string red : {"sum", "prod", "mean", "amax", "amin"})
    for (bool self : {true, false})
      c.push_back(op("scatter_reduce_" + red + (self ? "_self" : ""), {F({3, 4}, 0.5, 2), I({3, 6}, 0, 3), F({3, 6}, 0.5, 2)},
                     [red, self](auto& x) { return x[0].scatter_reduce(1, x[1], x[2], red, self); }));
  c.push_back(op("scatter_reduce_sum_dim0", {F({3, 2}), I({4, 2}, 0, 2), F({4, 2})},
                 [](auto& x) { return x[0].scatter_reduce(0, x[1], x[2], "sum", true); }));
  c.push_back(op2("masked_fill", {F({3, 4}), B({4})}, [](TG& x) { return x[0].masked_fill(x[1], -1.5); },
                  [](TH& x) { return x[0].masked_fill(x[1], -1.5); }));
  c.push_back(op2("masked_fill_int", {I({3, 4}, 0, 9, int32), B({3, 1})}, [](TG& x) { return x[0].masked_fill(x[1], 7); },
                  [](TH& x) { return x[0].masked_fill(x[1], 7); }));
  // indexing
  c.push_back(op2("index_int_slice", {F({4, 5, 3})}, [tgs](TG& x) { return x[0].index({1, tgs(1, 4), -1}); },
                  [](TH& x) { return x[0].index({1, Slice(1, 4), -1}); }));
  c.push_back(op2("index_step_neg", {F({6, 5})}, [tgs](TG& x) { return x[0].index({tgs(1, 6, 2), tg::Slice{std::nullopt, std::nullopt, -2}}); },
                  [](TH& x) { return x[0].index({Slice(1, 6, 2)}).flip(1).index({Slice(), Slice(0, torch::indexing::None, 2)}); }));
  c.push_back(op2("index_newaxis_ellipsis", {F({2, 3, 4})}, [](TG& x) { return x[0].index({Ellipsis, NewAxis, 2}); },
                  [](TH& x) { return x[0].index({torch::indexing::Ellipsis, torch::indexing::None, 2}); }));
  c.push_back(op2("index_tensor", {F({5, 3}), I({4}, -5, 4)}, [](TG& x) { return x[0].index({x[1]}); },
                  [](TH& x) { return x[0].index({x[1]}); }));
  c.push_back(op2("index_two_tensors", {F({4, 5, 3}), I({2, 3}, 0, 3), I({3}, 0, 4)}, [](TG& x) { return x[0].index({x[1], x[2]}); },
                  [](TH& x) { return x[0].index({x[1], x[2]}); }));
  c.push_back(op2("index_tensor_middle", {F({2, 5, 3}), I({4}, 0, 4)}, [](TG& x) { return x[0].index({tg::Slice::all(), x[1]}); },
                  [](TH& x) { return x[0].index({Slice(), x[1]}); }));
  c.push_back(op2("index_tensors_apart", {F({3, 4, 5}), I({2}, 0, 2), I({2}, 0, 4)}, [](TG& x) { return x[0].index({x[1], tg::Slice::all(), x[2]}); },
                  [](TH& x) { return x[0].index({x[1], Slice(), x[2]}); }));
  c.push_back(op2("index_int_and_tensor_apart", {F({3, 4, 5}), I({2}, 0, 4)}, [](TG& x) { return x[0].index({tg::Slice::all(), 1, x[1]}); },
                  [](TH& x) { return x[0].index({Slice(), 1, x[1]}); }));
  c.push_back(op2("index_int_apart_tensor", {F({3, 4, 5}), I({2}, 0, 4)}, [](TG& x) { return x[0].index({1, tg::Slice::all(), x[1]}); },
                  [](TH& x) { return x[0].index({1, Slice(), x[1]}); }));
  c.push_back(op2("index_tensor_int_dtype", {I({4, 3}, -9, 9, int32), I({2, 2}, 0, 3)}, [](TG& x) { return x[0].index({x[1]}); },
                  [](TH& x) { return x[0].index({x[1]}); }));
  c.push_back(op2("set_slice", {F({4, 5}), F({2, 1})}, [tgs](TG& x) { return x[0].set_slice({tgs(1, 3), tgs(0, 5, 2)}, x[1]); },
                  [](TH& x) { auto y = x[0].clone(); y.index_put_({Slice(1, 3), Slice(0, 5, 2)}, x[1]); return y; }));
  c.push_back(op2("set_slice_neg_step", {F({6}), F({3})}, [](TG& x) { return x[0].set_slice({tg::Slice{4, std::nullopt, -2}}, x[1]); },
                  [](TH& x) { auto y = x[0].clone(); y.index_put_({torch::tensor({4, 2, 0})}, x[1]); return y; }));
  c.push_back(op2("set_slice_scalar", {F({3, 4})}, [tgs](TG& x) { return x[0].set_slice({tg::Slice::all(), tgs(-2, 4)}, tg::Tensor(0.5)); },
                  [](TH& x) { auto y = x[0].clone(); y.index_put_({Slice(), Slice(-2, 4)}, 0.5); return y; }));
  c.push_back(op2("index_put_ints", {F({3, 4}), F({4})}, [](TG& x) { return x[0].index_put({1}, x[1]); },
                  [](TH& x) { auto y = x[0].clone(); y.index_put_({1}, x[1]); return y; }));
  c.push_back(op2("index_put_tensor", {F({5, 3}), V({3}, int64, [](const tg::Shape&, std::mt19937&) { return std::vector<double>{4, 0, -3}; }), F({3, 3})},
                  [](TG& x) { return x[0].index_put({x[1]}, x[2]); },
                  [](TH& x) { auto y = x[0].clone(); y.index_put_({x[1]}, x[2]); return y; }));
  c.push_back(op2("index_put_tensor_slice", {F({2, 5, 3}), V({2}, int64, [](const tg::Shape&, std::mt19937&) { return std::vector<double>{1, 3}; }), F({2, 2, 3})},
                  [](TG& x) { return x[0].index_put({tg::Slice::all(), x[1]}, x[2]); },
                  [](TH& x) { auto y = x[0].clone(); y.index_put_({Slice(), x[1]}, x[2]); return y; }));
  // pad modes
  for (std::string mode : {"constant", "reflect", "replicate", "circular"}) {
    c.push_back(op2("pad_" + mode, {F({2, 3, 4, 5})}, [mode](TG& x) { return x[0].pad({{0, 0}, {0, 0}, {1, 2}, {3, 1}}, mode, 0.5); },
                    [mode](TH& x) {
                      auto o = F_::PadFuncOptions({3, 1, 1, 2});
                      if (mode == "constant") o.mode(torch::kConstant).value(0.5);
                      if (mode == "reflect") o.mode(torch::kReflect);
                      if (mode == "replicate") o.mode(torch::kReplicate);
                      if (mode == "circular") o.mode(torch::kCircular);
                      return F_::pad(x[0], o);
                    }));
  }
  c.push_back(op2("pad_reflect_1d_neg", {F({2, 3, 6})}, [](TG& x) { return x[0].pad({{0, 0}, {0, 0}, {2, -1}}, "reflect"); },
                  [](TH& x) { return F_::pad(x[0], F_::PadFuncOptions({2, -1}).mode(torch::kReflect)); }));
  c.push_back(op2("one_hot", {I({2, 3}, 0, 4)}, [](TG& x) { return x[0].one_hot(5); }, [](TH& x) { return torch::one_hot(x[0], 5); }));
  c.push_back(op2("meshgrid_xy", {F({3}), F({4})}, [](TG& x) { auto m = tg::meshgrid({x[0], x[1]}, "xy"); return tg::stack({m[0], m[1] * 2.0}, 0); },
                  [](TH& x) { auto m = torch::meshgrid({x[0], x[1]}, "xy"); return torch::stack({m[0], m[1] * 2.0}, 0); }));
  c.push_back(op("roll_3d", {F({2, 3, 4})}, [](auto& x) { return x[0].roll({-1, 7}, {-1, 1}); }));
  c.push_back(op("repeat_bool", {B({2, 1, 3})}, [](auto& x) { return x[0].repeat({1, 3, 1}); }));
  c.push_back(op("gather_bool", {B({3, 4}), I({3, 2}, 0, 3)}, [](auto& x) { return x[0].gather(1, x[1]); }));
  c.push_back(op("scatter_int", {I({3, 5}, -9, 9, int32), V({3, 4}, int64, perm_rows(5)), I({3, 4}, -9, 9, int32)},
                 [](auto& x) { return x[0].scatter(1, x[1], x[2]); }));
  c.push_back(op("scatter_reduce_amax_int", {I({3, 4}, -9, 9, int32), I({3, 6}, 0, 3), I({3, 6}, -9, 9, int32)},
                 [](auto& x) { return x[0].scatter_reduce(1, x[1], x[2], "amax", false); }));
  c.push_back(op2("pad_constant_neg", {F({3, 4})}, [](TG& x) { return x[0].pad({{-1, 2}, {1, -2}}, "constant", -1.0); },
                  [](TH& x) { return F_::pad(x[0], F_::PadFuncOptions({1, -2, -1, 2}).value(-1.0)); }));
  c.push_back(op2("index_newaxis_tensor", {F({3, 4}), I({2}, 0, 3)}, [](TG& x) { return x[0].index({NewAxis, x[1], Ellipsis}); },
                  [](TH& x) { return x[0].index({torch::indexing::None, x[1], torch::indexing::Ellipsis}); }));
  c.push_back(op2("index_tensor_2d_idx", {F({5, 3}), I({2, 2}, 0, 4), I({2, 1}, 0, 2)}, [](TG& x) { return x[0].index({x[1], x[2]}); },
                  [](TH& x) { return x[0].index({x[1], x[2]}); }));
  c.push_back(op2("flip_permute_expand", {F({2, 1, 3})}, [](TG& x) { return x[0].flip({0, 2}).permute({2, 0, 1}).expand({3, 2, 4}); },
                  [](TH& x) { return x[0].flip({0, 2}).permute({2, 0, 1}).expand({3, 2, 4}); }));
  return c;
}

}  // namespace tt
