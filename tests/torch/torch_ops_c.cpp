// Case tables for what the op tables leave out: float16, int32 and bool variants, size-0 and size-1 dims and
// broadcasting, non-contiguous inputs (made by permute, slice and expand in both libraries), second-order
// gradients, and the ops no other table has (exp2, masked_select).
#include <cmath>

#include "harness.hpp"

namespace tt {
using tg::dtypes::bool_;
using tg::dtypes::int32;
using tg::dtypes::int64;
namespace F_ = torch::nn::functional;

namespace {
constexpr double kSum = 1e-5;  // summation order differs from torch's
constexpr double kT = 1e-4;    // transcendental chains

// float16 is compared with torch's float32 result rounded to float16 (harness.cpp), within one fp16 rounding
// (kHalfTol); two roundings where tg rounds an intermediate to float16: pow (exp2 of log2(x) * e) and the divisor's
// gradient of a broadcast division (a float16 sum over the broadcast dim).
constexpr double kHalfTwo = 0x1p-10;

std::vector<Case> half_cases() {
  std::vector<Case> c;
  const tg::Shape S{3, 5};
  auto un = [&](std::string name, double lo, double hi, auto f, double tol = kHalfTol) {
    c.push_back(op(std::move(name), {H(S, lo, hi)}, f).tol(tol, tol));
  };
  un("exp", -3, 3, [](auto& x) { return x[0].exp(); });
  un("exp2", -3, 3, [](auto& x) { return x[0].exp2(); });
  un("log", 0.05, 5, [](auto& x) { return x[0].log(); });
  un("log2", 0.05, 5, [](auto& x) { return x[0].log2(); });
  un("sqrt", 0.05, 5, [](auto& x) { return x[0].sqrt(); });
  un("rsqrt", 0.2, 5, [](auto& x) { return x[0].rsqrt(); });
  un("reciprocal", 0.2, 3, [](auto& x) { return x[0].reciprocal(); });
  un("sin", -4, 4, [](auto& x) { return x[0].sin(); });
  un("cos", -4, 4, [](auto& x) { return x[0].cos(); });
  un("tanh", -3, 3, [](auto& x) { return x[0].tanh(); });
  un("sigmoid", -5, 5, [](auto& x) { return x[0].sigmoid(); });
  un("erf", -2, 2, [](auto& x) { return x[0].erf(); });
  un("abs", -3, 3, [](auto& x) { return x[0].abs(); });
  un("neg", -3, 3, [](auto& x) { return x[0].neg(); });
  un("square", -3, 3, [](auto& x) { return x[0].square(); });
  un("floor", -3, 3, [](auto& x) { return x[0].floor(); });
  un("relu", -3, 3, [](auto& x) { return x[0].relu(); });
  un("pow2.5", 0.1, 3, [](auto& x) { return x[0].pow(2.5); }, kHalfTwo);
  c.push_back(op2("silu", {H(S, -4, 4)}, [](TG& x) { return x[0].silu(); }, [](TH& x) { return torch::silu(x[0]); }));
  c.push_back(op2("gelu", {H(S, -4, 4)}, [](TG& x) { return x[0].gelu(); }, [](TH& x) { return torch::gelu(x[0]); }));
  c.push_back(op2("softplus", {H(S, -4, 4)}, [](TG& x) { return x[0].softplus(); }, [](TH& x) { return torch::softplus(x[0]); }));
  c.push_back(op2("hardswish", {H(S, -4, 4)}, [](TG& x) { return x[0].hardswish(); }, [](TH& x) { return torch::hardswish(x[0]); }));
  c.push_back(op2("leaky_relu", {H(S)}, [](TG& x) { return x[0].leaky_relu(0.1); }, [](TH& x) { return torch::leaky_relu(x[0], 0.1); }));
  c.push_back(op("add_bcast", {H({3, 1}), H({1, 4})}, [](auto& x) { return x[0] + x[1]; }));
  c.push_back(op("mul_bcast", {H({2, 3, 4}), H({4})}, [](auto& x) { return x[0] * x[1]; }));
  c.push_back(op("div", {H({3, 4}), H({3, 1}, 0.5, 2)}, [](auto& x) { return x[0] / x[1]; }).gtol(kHalfTwo, kHalfTwo));
  c.push_back(op("maximum", {H({3, 4}), H({4})}, [](auto& x) { return x[0].maximum(x[1]); }));
  c.push_back(op("where", {B({3, 4}), H({3, 4}), H({4})}, [](auto& x) { return where(x[0], x[1], x[2]); }));
  c.push_back(op("clamp", {H(S)}, [](auto& x) { return x[0].clamp(-0.5, 0.8); }));
  c.push_back(op("lt", {H({3, 4}), H({4})}, [](auto& x) { return x[0].lt(x[1]); }));
  c.push_back(op("sum", {H({4, 6})}, [](auto& x) { return x[0].sum(1); }));
  c.push_back(op("mean", {H({4, 6})}, [](auto& x) { return x[0].mean(0); }));
  c.push_back(op2("max", {H({4, 6})}, [](TG& x) { return x[0].max(1); }, [](TH& x) { return std::get<0>(x[0].max(1)); }));
  c.push_back(op2("softmax", {H({3, 7}, -4, 4)}, [](TG& x) { return x[0].softmax(1); }, [](TH& x) { return x[0].softmax(1); }));
  c.push_back(op2("log_softmax", {H({3, 7}, -4, 4)}, [](TG& x) { return x[0].log_softmax(1); }, [](TH& x) { return x[0].log_softmax(1); }));
  c.push_back(op2("logsumexp", {H({3, 7}, -4, 4)}, [](TG& x) { return x[0].logsumexp({1}); }, [](TH& x) { return x[0].logsumexp(1); }));
  c.push_back(op2("cumsum", {H({2, 9})}, [](TG& x) { return x[0].cumsum(1); }, [](TH& x) { return x[0].cumsum(1); }));
  c.push_back(op2("var", {H({3, 8})}, [](TG& x) { return x[0].var({1}); }, [](TH& x) { return x[0].var(1); }));
  c.push_back(op("matmul", {H({4, 16}), H({16, 3})}, [](auto& x) { return x[0].matmul(x[1]); }));
  c.push_back(op2("linear", {H({2, 8}), H({5, 8}), H({5})}, [](TG& x) { return x[0].linear(x[1], x[2]); },
                  [](TH& x) { return torch::linear(x[0], x[1], x[2]); }));
  c.push_back(op2("conv2d", {H({1, 2, 6, 6}), H({3, 2, 3, 3}), H({3})}, [](TG& x) { return x[0].conv2d(x[1], x[2], 1, 1); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 1, 1); }));
  c.push_back(op2("max_pool2d", {H({1, 2, 6, 6})}, [](TG& x) { return x[0].max_pool2d(2); }, [](TH& x) { return torch::max_pool2d(x[0], 2); }));
  c.push_back(op2("avg_pool2d", {H({1, 2, 6, 6})}, [](TG& x) { return x[0].avg_pool2d(3, 1, 1); },
                  [](TH& x) { return torch::avg_pool2d(x[0], 3, 1, 1); }));
  c.push_back(op2("layer_norm", {H({3, 8}), H({8}), H({8})}, [](TG& x) { return x[0].layer_norm({8}, x[1], x[2]); },
                  [](TH& x) { return torch::layer_norm(x[0], {8}, x[1], x[2]); }));
  c.push_back(op2("cross_entropy", {H({4, 5}, -3, 3), I({4}, 0, 4)}, [](TG& x) { return x[0].cross_entropy(x[1]); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1]); }));
  c.push_back(op2("mse", {H({3, 4}), H({3, 4})}, [](TG& x) { return x[0].mse_loss(x[1]); },
                  [](TH& x) { return torch::mse_loss(x[0], x[1]); }));
  c.push_back(op2("cat", {H({2, 3}), H({1, 3})}, [](TG& x) { return tg::cat({x[0], x[1]}, 0); }, [](TH& x) { return torch::cat({x[0], x[1]}, 0); }));
  c.push_back(op("permute_pad", {H({2, 3, 4})}, [](auto& x) { return x[0].permute({2, 0, 1}).flip({0}); }));
  c.push_back(op("gather", {H({3, 5}), I({3, 4}, 0, 4)}, [](auto& x) { return x[0].gather(1, x[1]); }));
  c.push_back(op2("sort", {H({3, 7})}, [](TG& x) { return x[0].sort(1).first; }, [](TH& x) { return std::get<0>(x[0].sort(1)); }));
  return c;
}

// int32 and bool variants of ops the other tables check only in float (exact comparison).
std::vector<Case> int_bool_cases() {
  std::vector<Case> c;
  auto i32 = [](tg::Shape s, int64_t lo = -9, int64_t hi = 9) { return I(std::move(s), lo, hi, int32); };
  c.push_back(op("add_int32_bcast", {i32({3, 1}), i32({1, 4})}, [](auto& x) { return x[0] + x[1]; }));
  c.push_back(op("sub_int32", {i32({3, 4}), i32({4})}, [](auto& x) { return x[0] - x[1]; }));
  c.push_back(op("mul_int32", {i32({2, 3}), i32({2, 3})}, [](auto& x) { return x[0] * x[1]; }));
  c.push_back(op("neg_int32", {i32({3, 4})}, [](auto& x) { return x[0].neg(); }));
  c.push_back(op("maximum_int32", {i32({3, 4}), i32({3, 1})}, [](auto& x) { return x[0].maximum(x[1]); }));
  c.push_back(op("minimum_int32", {i32({3, 4}), i32({4})}, [](auto& x) { return x[0].minimum(x[1]); }));
  c.push_back(op2("idiv_int32", {i32({3, 4}), i32({4}, 1, 5)}, [](TG& x) { return x[0].idiv(x[1]); },
                  [](TH& x) { return torch::div(x[0], x[1], "floor"); }));
  c.push_back(op2("mod_int32", {i32({3, 4}), i32({4}, 1, 5)}, [](TG& x) { return x[0].mod(x[1]); },
                  [](TH& x) { return torch::remainder(x[0], x[1]); }));
  c.push_back(op2("prod_int32", {i32({3, 4}, -3, 3)}, [](TG& x) { return x[0].prod(1); }, [](TH& x) { return x[0].prod(1); }));
  c.push_back(op2("min_int32", {i32({3, 4})}, [](TG& x) { return x[0].min(0); }, [](TH& x) { return std::get<0>(x[0].min(0)); }));
  c.push_back(op2("sort_int32", {i32({3, 7}, -50, 50)}, [](TG& x) { return x[0].sort(1, true).first; },
                  [](TH& x) { return std::get<0>(x[0].sort(1, true)); }));
  c.push_back(op2("topk_int32", {i32({3, 7}, -50, 50)}, [](TG& x) { return x[0].topk(2).first; }, [](TH& x) { return std::get<0>(x[0].topk(2)); }));
  c.push_back(op2("flip_int32", {i32({3, 4})}, [](TG& x) { return x[0].flip({1}); }, [](TH& x) { return x[0].flip({1}); }));
  c.push_back(op2("roll_int32", {i32({3, 4})}, [](TG& x) { return x[0].roll(2, 1); }, [](TH& x) { return x[0].roll(2, 1); }));
  c.push_back(op2("stack_int32", {i32({2, 3}), i32({2, 3})}, [](TG& x) { return tg::stack({x[0], x[1]}, 1); },
                  [](TH& x) { return torch::stack({x[0], x[1]}, 1); }));
  c.push_back(op2("pad_int32", {i32({2, 3})}, [](TG& x) { return x[0].pad({{1, 0}, {0, 2}}, "constant", 4); },
                  [](TH& x) { return F_::pad(x[0], F_::PadFuncOptions({0, 2, 1, 0}).value(4)); }));
  c.push_back(op2("pad_reflect_int32", {i32({2, 4})}, [](TG& x) { return x[0].pad({{0, 0}, {2, 1}}, "reflect"); },
                  [](TH& x) {  // torch 1.13 has no int reflection pad: in float, exactly
                    return F_::pad(x[0].unsqueeze(0).to(torch::kFloat), F_::PadFuncOptions({2, 1}).mode(torch::kReflect)).squeeze(0).to(torch::kInt);
                  }));
  c.push_back(op2("repeat_interleave_int32", {i32({2, 3})}, [](TG& x) { return x[0].repeat_interleave(2, 0); },
                  [](TH& x) { return x[0].repeat_interleave(2, 0); }));
  c.push_back(op2("index_select_int32", {i32({4, 3}), I({5}, 0, 3)}, [](TG& x) { return x[0].index_select(0, x[1]); },
                  [](TH& x) { return x[0].index_select(0, x[1]); }));
  c.push_back(op2("one_hot_int32_index", {I({4}, 0, 3, int32)}, [](TG& x) { return x[0].one_hot(4); },
                  [](TH& x) { return torch::one_hot(x[0].to(torch::kLong), 4); }));
  c.push_back(op2("matmul_int32", {i32({3, 4}, -5, 5), i32({4, 2}, -5, 5)}, [](TG& x) { return x[0].matmul(x[1]); },
                  [](TH& x) { return x[0].matmul(x[1]); }));
  c.push_back(op2("transpose_contiguous_int32", {i32({3, 4})}, [](TG& x) { return x[0].transpose(0, 1).contiguous(); },
                  [](TH& x) { return x[0].transpose(0, 1).contiguous(); }));
  c.push_back(op2("cumsum_int32_dim0", {i32({4, 3})}, [](TG& x) { return x[0].cumsum(0); }, [](TH& x) { return x[0].cumsum(0); }));
  c.push_back(op2("argsort_int32", {i32({2, 6}, -50, 50)}, [](TG& x) { return x[0].argsort(1); }, [](TH& x) { return std::get<1>(x[0].sort(true, 1, false)); }));  // ties: stable, as tg
  c.push_back(op2("scatter_reduce_sum_int32", {i32({3, 4}), I({3, 6}, 0, 3), i32({3, 6})},
                  [](TG& x) { return x[0].scatter_reduce(1, x[1], x[2], "sum"); },
                  [](TH& x) { return x[0].scatter_reduce(1, x[1], x[2], "sum"); }));
  c.push_back(op2("masked_select_int32", {i32({2, 5}), B({2, 5})}, [](TG& x) { return x[0].masked_select(x[1]); },
                  [](TH& x) { return x[0].masked_select(x[1]); }));
  // bool
  c.push_back(op2("where_bool_values", {B({3, 4}), B({3, 4}), B({4})}, [](TG& x) { return where(x[0], x[1], x[2]); },
                  [](TH& x) { return torch::where(x[0], x[1], x[2]); }));
  c.push_back(op2("eq_bool", {B({3, 4}), B({4})}, [](TG& x) { return x[0].eq(x[1]); }, [](TH& x) { return x[0].eq(x[1]); }));
  c.push_back(op2("ne_bool", {B({3, 4}), B({3, 1})}, [](TG& x) { return x[0].ne(x[1]); }, [](TH& x) { return x[0].ne(x[1]); }));
  c.push_back(op2("logical_not_bool", {B({3, 4})}, [](TG& x) { return x[0].logical_not(); }, [](TH& x) { return x[0].logical_not(); }));
  c.push_back(op2("flip_bool", {B({3, 4})}, [](TG& x) { return x[0].flip({0, 1}); }, [](TH& x) { return x[0].flip({0, 1}); }));
  c.push_back(op2("stack_bool", {B({2, 3}), B({2, 3})}, [](TG& x) { return tg::stack({x[0], x[1]}); }, [](TH& x) { return torch::stack({x[0], x[1]}); }));
  c.push_back(op2("permute_bool", {B({2, 3, 4})}, [](TG& x) { return x[0].permute({2, 0, 1}).contiguous(); },
                  [](TH& x) { return x[0].permute({2, 0, 1}).contiguous(); }));
  c.push_back(op2("index_select_bool", {B({4, 3}), I({3}, 0, 3)}, [](TG& x) { return x[0].index_select(0, x[1]); },
                  [](TH& x) { return x[0].index_select(0, x[1]); }));
  c.push_back(op2("masked_fill_bool", {B({3, 4}), B({4})}, [](TG& x) { return x[0].masked_fill(x[1], true); },
                  [](TH& x) { return x[0].masked_fill(x[1], true); }));
  c.push_back(op2("bool_to_float_mul", {B({3, 4}), F({3, 4})}, [](TG& x) { return x[0].cast(tg::dtypes::float32) * x[1]; },
                  [](TH& x) { return x[0].to(torch::kFloat) * x[1]; }));
  c.push_back(op2("max_bool", {B({3, 4})}, [](TG& x) { return x[0].max(1); }, [](TH& x) { return std::get<0>(x[0].max(1)); }));
  return c;
}

// size-0 dims (forward and, where the output is float, backward: empty or zero gradients) and size-1 dims.
std::vector<Case> size_cases() {
  std::vector<Case> c;
  c.push_back(op("exp_size0", {F({0, 3})}, [](auto& x) { return x[0].exp(); }));
  c.push_back(op("add_size0_bcast", {F({0, 3}), F({3})}, [](auto& x) { return x[0] + x[1]; }));
  c.push_back(op("mul_size0_bcast", {F({2, 0, 1}), F({1, 4})}, [](auto& x) { return x[0] * x[1]; }));
  c.push_back(op2("sum_size0_dim", {F({0, 3})}, [](TG& x) { return x[0].sum(0); }, [](TH& x) { return x[0].sum(0); }));
  c.push_back(op2("sum_size0_all", {F({0, 3})}, [](TG& x) { return x[0].sum(); }, [](TH& x) { return x[0].sum(); }));
  c.push_back(op2("sum_size0_keep", {F({3, 0})}, [](TG& x) { return x[0].sum(1, true); }, [](TH& x) { return x[0].sum(1, true); }));
  c.push_back(op2("prod_size0", {F({2, 0})}, [](TG& x) { return x[0].prod(1); }, [](TH& x) { return x[0].prod(1); }));
  c.push_back(op2("mean_size0_other_dim", {F({0, 4})}, [](TG& x) { return x[0].mean(1); }, [](TH& x) { return x[0].mean(1); }));
  c.push_back(op2("max_size0_other_dim", {F({0, 4})}, [](TG& x) { return x[0].max(1); }, [](TH& x) { return std::get<0>(x[0].max(1)); }));
  c.push_back(op2("sum_int_size0", {I({0, 3}, 0, 5, int32)}, [](TG& x) { return x[0].sum(0); }, [](TH& x) { return x[0].sum(0); }));
  c.push_back(op2("any_size0", {B({0, 3})}, [](TG& x) { return x[0].any({0}); }, [](TH& x) { return x[0].any(0); }));
  c.push_back(op2("all_size0", {B({0, 3})}, [](TG& x) { return x[0].all({0}); }, [](TH& x) { return x[0].all(0); }));
  c.push_back(op("matmul_size0_inner", {F({2, 0}), F({0, 3})}, [](auto& x) { return x[0].matmul(x[1]); }));
  c.push_back(op("matmul_size0_rows", {F({0, 4}), F({4, 3})}, [](auto& x) { return x[0].matmul(x[1]); }));
  c.push_back(op2("linear_size0_batch", {F({0, 4}), F({3, 4}), F({3})}, [](TG& x) { return x[0].linear(x[1], x[2]); },
                  [](TH& x) { return torch::linear(x[0], x[1], x[2]); }));
  c.push_back(op2("cat_size0", {F({0, 3}), F({2, 3}), F({0, 3})}, [](TG& x) { return tg::cat({x[0], x[1], x[2]}, 0); },
                  [](TH& x) { return torch::cat({x[0], x[1], x[2]}, 0); }));
  c.push_back(op2("stack_size0", {F({0, 3}), F({0, 3})}, [](TG& x) { return tg::stack({x[0], x[1]}, 1); },
                  [](TH& x) { return torch::stack({x[0], x[1]}, 1); }));
  c.push_back(op("reshape_permute_size0", {F({0, 3, 2})}, [](auto& x) { return x[0].permute({2, 0, 1}).reshape({3, 0, 2}); }));
  c.push_back(op2("softmax_size0", {F({0, 5})}, [](TG& x) { return x[0].softmax(1); }, [](TH& x) { return x[0].softmax(1); }));
  c.push_back(op2("log_softmax_size0", {F({0, 5})}, [](TG& x) { return x[0].log_softmax(-1); }, [](TH& x) { return x[0].log_softmax(-1); }));
  c.push_back(op2("cumsum_size0", {F({3, 0})}, [](TG& x) { return x[0].cumsum(1); }, [](TH& x) { return x[0].cumsum(1); }));
  c.push_back(op2("pad_size0", {F({0, 3})}, [](TG& x) { return x[0].pad({{1, 1}, {0, 2}}, "constant", 1.5); },
                  [](TH& x) { return F_::pad(x[0], F_::PadFuncOptions({0, 2, 1, 1}).value(1.5)); }));
  c.push_back(op("where_size0", {B({0, 3}), F({0, 3}), F({3})}, [](auto& x) { return where(x[0], x[1], x[2]); }));
  c.push_back(op("index_select_size0_index", {F({4, 3}), I({0}, 0, 3)}, [](auto& x) { return x[0].index_select(0, x[1]); }));
  c.push_back(op2("masked_select_none", {F({3, 4}), V({3, 4}, bool_, [](const tg::Shape&, std::mt19937&) { return std::vector<double>(12, 0); })},
                  [](TG& x) { return x[0].masked_select(x[1]); }, [](TH& x) { return x[0].masked_select(x[1]); }));
  c.push_back(op2("layer_norm_size0_batch", {F({0, 4}), F({4}), F({4})}, [](TG& x) { return x[0].layer_norm({4}, x[1], x[2]); },
                  [](TH& x) { return torch::layer_norm(x[0], {4}, x[1], x[2]); }));
  c.push_back(op2("conv2d_size0_batch", {F({0, 2, 5, 5}), F({3, 2, 3, 3})}, [](TG& x) { return x[0].conv2d(x[1]); },
                  [](TH& x) { return torch::conv2d(x[0], x[1]); }));
  c.push_back(op2("sort_size0", {F({0})}, [](TG& x) { return x[0].sort(0).first; }, [](TH& x) { return std::get<0>(x[0].sort(0)); }));
  c.push_back(op("expand_size0", {F({1, 3})}, [](auto& x) { return x[0].expand({0, 3}); }));
  // size-1 dims and broadcasting
  c.push_back(op("add_size1_both", {F({1, 1}), F({3, 4})}, [](auto& x) { return x[0] + x[1]; }));
  c.push_back(op("mul_bcast_3d", {F({3, 1, 5}), F({1, 4, 1})}, [](auto& x) { return x[0] * x[1]; }));
  c.push_back(op("sub_rank_bcast", {F({1}), F({2, 3})}, [](auto& x) { return x[0] - x[1]; }));
  c.push_back(op("div_scalar_tensor", {F({}, 0.5, 2), F({3}, 0.5, 2)}, [](auto& x) { return x[0] / x[1]; }));
  c.push_back(op("maximum_bcast_3d", {F({2, 1, 3}), F({4, 1})}, [](auto& x) { return x[0].maximum(x[1]); }));
  c.push_back(op("where_bcast_all", {B({3, 1}), F({1, 4}), F({})}, [](auto& x) { return where(x[0], x[1], x[2]); }));
  c.push_back(op2("sum_size1_dim", {F({3, 1, 4})}, [](TG& x) { return x[0].sum(1); }, [](TH& x) { return x[0].sum(1); }));
  c.push_back(op2("max_size1_dim", {F({3, 1})}, [](TG& x) { return x[0].max(1); }, [](TH& x) { return std::get<0>(x[0].max(1)); }));
  c.push_back(op("matmul_size1", {F({1, 1}), F({1, 5})}, [](auto& x) { return x[0].matmul(x[1]); }));
  c.push_back(op2("conv2d_1x1_image", {F({2, 3, 1, 1}), F({4, 3, 1, 1})}, [](TG& x) { return x[0].conv2d(x[1]); },
                  [](TH& x) { return torch::conv2d(x[0], x[1]); }));
  c.push_back(op2("cumsum_size1", {F({1, 4})}, [](TG& x) { return x[0].cumsum(0); }, [](TH& x) { return x[0].cumsum(0); }));
  c.push_back(op2("layer_norm_size1_feature", {F({3, 2}), F({2})}, [](TG& x) { return x[0].layer_norm({2}, x[1]); },
                  [](TH& x) { return torch::layer_norm(x[0], {2}, x[1]); }).tol(kSum, kSum));
  c.push_back(op2("expand_size1_reduce", {F({1, 3, 1})}, [](TG& x) { return x[0].expand({4, 3, 5}).sum(std::vector<int64_t>{0, 2}); },
                  [](TH& x) { return x[0].expand({4, 3, 5}).sum(std::vector<int64_t>{0, 2}); }));
  return c;
}

// Non-contiguous inputs: each case views its input the same way in both libraries (permute, strided slice,
// expand) before the op; the gradient flows back through the view.
std::vector<Case> strided_cases() {
  std::vector<Case> c;
  c.push_back(op("exp_permuted", {F({5, 3})}, [](auto& x) { return x[0].permute({1, 0}).exp(); }));
  c.push_back(op("tanh_sliced_step", {F({3, 9})}, [](auto& x) { return slice_dim(x[0], 1, 1, 8, 2).tanh(); }).tol(kT, kT));
  c.push_back(op("add_permuted_expanded", {F({4, 3}), F({1, 4})}, [](auto& x) { return x[0].permute({1, 0}) + x[1].expand({3, 4}); }));
  c.push_back(op("mul_sliced_both", {F({6, 4}), F({3, 8})}, [](auto& x) { return slice_dim(x[0], 0, 1, 4) * slice_dim(x[1], 1, 0, 8, 2); }));
  c.push_back(op("maximum_transposed_expanded", {F({4, 3}), F({3, 1})}, [](auto& x) { return x[0].transpose(0, 1).maximum(x[1].expand({3, 4})); }));
  c.push_back(op("where_expanded_cond", {B({1, 4}), F({4, 3}), F({3, 4})}, [](auto& x) { return where(x[0].expand({3, 4}), x[1].transpose(0, 1), x[2]); }));
  c.push_back(op("matmul_transposed", {F({4, 3}), F({5, 4})}, [](auto& x) { return x[0].transpose(0, 1).matmul(x[1].transpose(0, 1)); }).tol(kSum, kSum));
  c.push_back(op("matmul_sliced", {F({5, 8}), F({4, 6})}, [](auto& x) { return slice_dim(x[0], 1, 0, 8, 2).matmul(slice_dim(x[1], 1, 1, 4)); }).tol(kSum, kSum));
  c.push_back(op("matmul_expanded_batch", {F({1, 3, 4}), F({2, 4, 5})}, [](auto& x) { return x[0].expand({2, 3, 4}).matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op2("sum_permuted", {F({2, 3, 4})}, [](TG& x) { return x[0].permute({2, 0, 1}).sum(1); }, [](TH& x) { return x[0].permute({2, 0, 1}).sum(1); }));
  c.push_back(op2("expanded_sum", {F({3, 5})}, [](TG& x) { return x[0].expand({4, 3, 5}).sum(std::vector<int64_t>{0}); },
                  [](TH& x) { return x[0].expand({4, 3, 5}).sum(0); }));
  c.push_back(op2("max_sliced", {F({4, 7})}, [](TG& x) { return slice_dim(x[0], 1, 6, 0, -2).max(1); },
                  [](TH& x) { return std::get<0>(x[0].flip({1}).slice(1, 0, 6, 2).max(1)); }));
  c.push_back(op2("softmax_transposed", {F({5, 3}, -4, 4)}, [](TG& x) { return x[0].transpose(0, 1).softmax(1); },
                  [](TH& x) { return x[0].transpose(0, 1).softmax(1); }));
  c.push_back(op2("log_softmax_sliced", {F({3, 10}, -4, 4)}, [](TG& x) { return slice_dim(x[0], 1, 1, 10, 3).log_softmax(1); },
                  [](TH& x) { return x[0].slice(1, 1, 10, 3).log_softmax(1); }));
  c.push_back(op2("cumsum_permuted", {F({4, 3})}, [](TG& x) { return x[0].permute({1, 0}).cumsum(1); }, [](TH& x) { return x[0].permute({1, 0}).cumsum(1); }));
  c.push_back(op2("var_sliced", {F({4, 9})}, [](TG& x) { return slice_dim(x[0], 1, 0, 9, 2).var({1}); }, [](TH& x) { return x[0].slice(1, 0, 9, 2).var(1); }).tol(kSum, kSum));
  c.push_back(op2("sort_transposed", {F({6, 3})}, [](TG& x) { return x[0].transpose(0, 1).sort(1).first; },
                  [](TH& x) { return std::get<0>(x[0].transpose(0, 1).sort(1)); }));
  c.push_back(op2("gather_permuted", {F({5, 3}), I({3, 2}, 0, 4)}, [](TG& x) { return x[0].permute({1, 0}).gather(1, x[1]); },
                  [](TH& x) { return x[0].permute({1, 0}).gather(1, x[1]); }));
  c.push_back(op2("index_select_expanded", {F({1, 4}), I({3}, 0, 2)}, [](TG& x) { return x[0].expand({3, 4}).index_select(0, x[1]); },
                  [](TH& x) { return x[0].expand({3, 4}).index_select(0, x[1]); }));
  c.push_back(op2("cat_permuted_sliced", {F({3, 2}), F({2, 6})}, [](TG& x) { return tg::cat({x[0].permute({1, 0}), slice_dim(x[1], 1, 0, 6, 2)}, 0); },
                  [](TH& x) { return torch::cat({x[0].permute({1, 0}), x[1].slice(1, 0, 6, 2)}, 0); }));
  c.push_back(op2("conv2d_nhwc_permuted", {F({2, 6, 5, 3}), F({4, 3, 3, 3}), F({4})}, [](TG& x) { return x[0].permute({0, 3, 1, 2}).conv2d(x[1], x[2]); },
                  [](TH& x) { return torch::conv2d(x[0].permute({0, 3, 1, 2}), x[1], x[2]); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_sliced_weight", {F({1, 2, 6, 6}), F({3, 4, 3, 3})}, [](TG& x) { return x[0].conv2d(slice_dim(x[1], 1, 0, 4, 2)); },
                  [](TH& x) { return torch::conv2d(x[0], x[1].slice(1, 0, 4, 2)); }).tol(kSum, kSum));
  c.push_back(op2("max_pool2d_sliced", {F({1, 2, 8, 9})}, [](TG& x) { return slice_dim(x[0], 3, 1, 9).max_pool2d(2); },
                  [](TH& x) { return torch::max_pool2d(x[0].slice(3, 1, 9), 2); }));
  c.push_back(op2("avg_pool2d_permuted", {F({1, 6, 6, 2})}, [](TG& x) { return x[0].permute({0, 3, 1, 2}).avg_pool2d(2); },
                  [](TH& x) { return torch::avg_pool2d(x[0].permute({0, 3, 1, 2}), 2); }));
  c.push_back(op2("layer_norm_permuted", {F({4, 3, 2}), F({4}), F({4})}, [](TG& x) { return x[0].permute({2, 1, 0}).layer_norm({4}, x[1], x[2]); },
                  [](TH& x) { return torch::layer_norm(x[0].permute({2, 1, 0}), {4}, x[1], x[2]); }).tol(kSum, kSum));
  c.push_back(op2("batch_norm_permuted", {F({4, 5, 3})}, [](TG& x) { return x[0].permute({0, 2, 1}).batch_norm({}, {}, {}, {}, true); },
                  [](TH& x) { return torch::batch_norm(x[0].permute({0, 2, 1}), {}, {}, {}, {}, true, 0.1, 1e-5, false); }).tol(kSum, kSum));
  c.push_back(op2("cross_entropy_transposed", {F({5, 4}, -3, 3), I({4}, 0, 4)}, [](TG& x) { return x[0].transpose(0, 1).cross_entropy(x[1]); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0].transpose(0, 1), x[1]); }).tol(kSum, kSum));
  c.push_back(op2("pad_reflect_permuted", {F({5, 2, 3})}, [](TG& x) { return x[0].permute({1, 2, 0}).pad({{0, 0}, {0, 0}, {2, 1}}, "reflect"); },
                  [](TH& x) { return F_::pad(x[0].permute({1, 2, 0}), F_::PadFuncOptions({2, 1}).mode(torch::kReflect)); }));
  c.push_back(op2("interpolate_sliced", {F({1, 2, 4, 8})}, [](TG& x) { return slice_dim(x[0], 3, 0, 8, 2).interpolate({6, 5}, "bilinear"); },
                  [](TH& x) { return F_::interpolate(x[0].slice(3, 0, 8, 2), F_::InterpolateFuncOptions().size(std::vector<int64_t>{6, 5}).mode(torch::kBilinear).align_corners(false)); }));
  c.push_back(op2("sdpa_transposed", {F({2, 4, 3}), F({2, 4, 5}), F({2, 5, 2})},
                  [](TG& x) { return x[0].transpose(1, 2).scaled_dot_product_attention(x[1].transpose(1, 2), x[2]); },
                  [](TH& x) {
                    auto q = x[0].transpose(1, 2), k = x[1].transpose(1, 2);
                    return (q.matmul(k.transpose(-2, -1)) / std::sqrt(4.0)).softmax(-1).matmul(x[2]);
                  }).tol(kSum, kSum));
  c.push_back(op2("einsum_permuted", {F({4, 3}), F({5, 4})}, [](TG& x) { return tg::einsum("ij,jk->ik", {x[0].permute({1, 0}), x[1].permute({1, 0})}); },
                  [](TH& x) { return torch::einsum("ij,jk->ik", {x[0].permute({1, 0}), x[1].permute({1, 0})}); }).tol(kSum, kSum));
  c.push_back(op("exp_permuted_half", {H({5, 3})}, [](auto& x) { return x[0].permute({1, 0}).exp(); }));
  c.push_back(op2("sum_permuted_int32", {I({3, 4}, -9, 9, int32)}, [](TG& x) { return x[0].permute({1, 0}).sum(1); },
                  [](TH& x) { return x[0].permute({1, 0}).sum(1); }));
  return c;
}

// Second-order gradients: d/dx sum(seed2 * d(sum(seed * f(x)))/dx), compared with torch's double backward.
std::vector<Case> second_order_cases() {
  std::vector<Case> c;
  const tg::Shape S{3, 4};
  auto un = [&](std::string name, double lo, double hi, auto f, double tol = 1e-5) {
    c.push_back(op(std::move(name), {F(S, lo, hi)}, f).tol(tol, tol * 0.1).second_order());
  };
  un("exp", -2, 2, [](auto& x) { return x[0].exp(); });
  un("log", 0.2, 3, [](auto& x) { return x[0].log(); });
  un("sqrt", 0.2, 3, [](auto& x) { return x[0].sqrt(); });
  un("reciprocal", 0.3, 3, [](auto& x) { return x[0].reciprocal(); });
  un("sin", -3, 3, [](auto& x) { return x[0].sin(); });
  un("tanh", -2, 2, [](auto& x) { return x[0].tanh(); }, kT);
  un("sigmoid", -4, 4, [](auto& x) { return x[0].sigmoid(); }, kT);
  un("pow3", -2, 2, [](auto& x) { return x[0].pow(3.0); });
  un("erf", -2, 2, [](auto& x) { return x[0].erf(); }, kT);
  un("relu", -2, 2, [](auto& x) { return x[0].relu(); });
  c.push_back(op2("gelu", {F(S, -3, 3)}, [](TG& x) { return x[0].gelu(); }, [](TH& x) { return torch::gelu(x[0]); }).tol(kT, 1e-5).second_order());
  c.push_back(op2("silu", {F(S, -3, 3)}, [](TG& x) { return x[0].silu(); }, [](TH& x) { return torch::silu(x[0]); }).tol(kT, 1e-5).second_order());
  c.push_back(op2("softplus", {F(S, -3, 3)}, [](TG& x) { return x[0].softplus(); }, [](TH& x) { return torch::softplus(x[0]); }).tol(kT, 1e-5).second_order());
  c.push_back(op("mul_div", {F(S), F({4}, 0.5, 2)}, [](auto& x) { return x[0] * x[0] / x[1]; }).second_order());
  c.push_back(op("pow_tensor", {F(S, 0.3, 2), F({4}, -1, 2)}, [](auto& x) { return x[0].pow(x[1]); }).tol(kT, 1e-5).second_order());
  c.push_back(op("matmul", {F({3, 4}), F({4, 2})}, [](auto& x) { return x[0].matmul(x[1]).square(); }).tol(kSum, kSum).second_order());
  c.push_back(op2("softmax", {F(S, -3, 3)}, [](TG& x) { return x[0].softmax(1); }, [](TH& x) { return x[0].softmax(1); }).tol(kSum, kSum).second_order());
  c.push_back(op2("log_softmax", {F(S, -3, 3)}, [](TG& x) { return x[0].log_softmax(1); }, [](TH& x) { return x[0].log_softmax(1); }).tol(kSum, kSum).second_order());
  c.push_back(op2("logsumexp", {F(S, -3, 3)}, [](TG& x) { return x[0].logsumexp({1}); }, [](TH& x) { return x[0].logsumexp(1); }).tol(kSum, kSum).second_order());
  c.push_back(op2("var", {F(S)}, [](TG& x) { return x[0].var({1}); }, [](TH& x) { return x[0].var(1); }).tol(kSum, kSum).second_order());
  c.push_back(op2("prod", {F(S, 0.5, 1.5)}, [](TG& x) { return x[0].prod(1); }, [](TH& x) { return x[0].prod(1); }).tol(kSum, kSum).second_order());
  c.push_back(op2("layer_norm", {F({2, 5}), F({5}), F({5})}, [](TG& x) { return x[0].layer_norm({5}, x[1], x[2]); },
                  [](TH& x) { return torch::layer_norm(x[0], {5}, x[1], x[2]); }).tol(1e-4, 1e-4).second_order());
  c.push_back(op2("cross_entropy", {F({4, 5}, -3, 3), I({4}, 0, 4)}, [](TG& x) { return x[0].cross_entropy(x[1]); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1]); }).tol(kSum, kSum).second_order());
  c.push_back(op2("mse", {F(S), F(S)}, [](TG& x) { return x[0].mse_loss(x[1]); }, [](TH& x) { return torch::mse_loss(x[0], x[1]); }).tol(kSum, kSum).second_order());
  c.push_back(op2("conv2d", {F({1, 2, 5, 5}), F({3, 2, 3, 3})}, [](TG& x) { return x[0].conv2d(x[1]).square(); },
                  [](TH& x) { return torch::conv2d(x[0], x[1]).square(); }).tol(1e-4, 1e-4).second_order());
  c.push_back(op2("sdpa", {F({2, 3, 4}), F({2, 5, 4}), F({2, 5, 3})}, [](TG& x) { return x[0].scaled_dot_product_attention(x[1], x[2]); },
                  [](TH& x) { return (x[0].matmul(x[1].transpose(-2, -1)) / 2.0).softmax(-1).matmul(x[2]); }).tol(1e-4, 1e-4).second_order());
  c.push_back(op2("max_pool2d", {F({1, 1, 4, 4})}, [](TG& x) { return x[0].max_pool2d(2).square(); },
                  [](TH& x) { return torch::max_pool2d(x[0], 2).square(); }).second_order());
  c.push_back(op2("bce_with_logits", {F(S, -4, 4), C(S, 0, 1)}, [](TG& x) { return x[0].binary_crossentropy_with_logits(x[1]); },
                  [](TH& x) { return torch::binary_cross_entropy_with_logits(x[0], x[1]); }).tol(kSum, kSum).second_order());
  return c;
}

}  // namespace

std::vector<Case> coverage_cases() {
  std::vector<Case> c;
  // ops no other table has
  for (auto& s : {tg::Shape{3, 5}, tg::Shape{2, 1, 7}, tg::Shape{}})
    c.push_back(op("exp2", {F(s, -3, 3)}, [](auto& x) { return x[0].exp2(); }));
  c.push_back(op("masked_select", {F({3, 4}), B({4})}, [](auto& x) { return x[0].masked_select(x[1]); }));
  c.push_back(op("masked_select_bcast_self", {F({4}), B({3, 4})}, [](auto& x) { return x[0].masked_select(x[1]); }));
  for (auto* table : {half_cases, int_bool_cases, size_cases, strided_cases, second_order_cases})
    for (auto& k : table()) c.push_back(std::move(k));
  return c;
}

// ---------------------------------------------------------------- random initialisers and dropout
// Random draws cannot match value for value: each compares the distribution of a large sample with torch's
// initialiser for the same shape (support bounds, mean and standard deviation within a few standard errors).
namespace {
struct Moments {
  double lo = 1e300, hi = -1e300, mean = 0, sd = 0;
};
Moments moments(const std::vector<double>& v) {
  Moments m;
  for (double x : v) {
    m.lo = std::min(m.lo, x);
    m.hi = std::max(m.hi, x);
    m.mean += x;
  }
  m.mean /= double(v.size());
  for (double x : v) m.sd += (x - m.mean) * (x - m.mean);
  m.sd = std::sqrt(m.sd / double(v.size()));
  return m;
}
std::vector<double> values(const torch::Tensor& t) {
  torch::Tensor d = t.detach().to(torch::kDouble).contiguous().flatten();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}
// tg's sample and torch's sample of the same initialiser: same support, means and deviations within 5 standard errors.
void same_distribution(const tg::Tensor& t, const torch::Tensor& h, bool bounded) {
  Moments a = moments(t.to_doubles()), b = moments(values(h));
  double n = double(t.numel()), se = b.sd / std::sqrt(n);
  CHECK(t.shape() == std::vector<int64_t>(h.sizes().begin(), h.sizes().end()));
  CHECK_MESSAGE(std::fabs(a.mean - b.mean) <= 5 * std::sqrt(2.0) * se, "means " << a.mean << " vs torch " << b.mean);
  CHECK_MESSAGE(std::fabs(a.sd - b.sd) <= 0.02 * b.sd, "standard deviations " << a.sd << " vs torch " << b.sd);
  if (bounded) {  // both fill [lo, hi): the extremes of 64k draws come within 0.1% of the range of its ends
    double tol = 1e-3 * (b.hi - b.lo);
    CHECK_MESSAGE((std::fabs(a.lo - b.lo) <= tol && std::fabs(a.hi - b.hi) <= tol),
                  "range [" << a.lo << ", " << a.hi << "] vs torch [" << b.lo << ", " << b.hi << "]");
  }
}
}  // namespace

TEST_CASE("uniform and normal match torch's uniform_ and normal_ in distribution") {
  tg::Tensor::manual_seed(1);
  torch::manual_seed(1);
  same_distribution(tg::Tensor::uniform({256, 256}, -3, 5), torch::empty({256, 256}).uniform_(-3, 5), true);
  same_distribution(tg::Tensor::normal({256, 256}, 2, 0.5), torch::empty({256, 256}).normal_(2, 0.5), false);
}

TEST_CASE("kaiming_uniform and kaiming_normal match torch's init (fan_in, leaky_relu gain)") {
  tg::Tensor::manual_seed(2);
  torch::manual_seed(2);
  namespace init = torch::nn::init;
  same_distribution(tg::Tensor::kaiming_uniform({256, 16, 4, 4}, 0.01),
                    init::kaiming_uniform_(torch::empty({256, 16, 4, 4}), 0.01, torch::kFanIn, torch::kLeakyReLU), true);
  same_distribution(tg::Tensor::kaiming_normal({256, 256}, 0.01),
                    init::kaiming_normal_(torch::empty({256, 256}), 0.01, torch::kFanIn, torch::kLeakyReLU), false);
}

TEST_CASE("glorot_uniform matches torch's xavier_uniform_; scaled_uniform is uniform(-1, 1) / sqrt(numel)") {
  tg::Tensor::manual_seed(3);
  torch::manual_seed(3);
  same_distribution(tg::Tensor::glorot_uniform({128, 512}), torch::nn::init::xavier_uniform_(torch::empty({128, 512})), true);
  // glorot_uniform of a conv weight: torch's fan_out is shape[0] * receptive field; tinygrad's (and tg's) is shape[0]
  same_distribution(tg::Tensor::scaled_uniform({256, 256}), torch::empty({256, 256}).uniform_(-1, 1) / 256.0, true);
}

TEST_CASE("dropout in training matches torch: about p zeroed, the rest scaled by 1/(1-p), the gradient masked the same way") {
  tg::Tensor::manual_seed(4);
  torch::manual_seed(4);
  const double p = 0.3;
  tg::Tensor x = tg::Tensor::full({200, 200}, 1.5);
  x.requires_grad_();
  tg::Tensor y = x.dropout(p, true);
  tg::Tensor g = y.sum().gradient({x})[0];
  tg::Tensor::realize_all({&y, &g});
  torch::Tensor hx = torch::full({200, 200}, 1.5).requires_grad_();
  torch::Tensor hy = torch::dropout(hx, p, true);
  auto yv = y.to_doubles(), gv = g.to_doubles(), hv = values(hy);
  double zeros = 0, hzeros = 0, bad = 0, hbad = 0, bad_grad = 0;
  const double kept = 1.5 / (1 - p);
  for (size_t i = 0; i < yv.size(); i++) {
    zeros += yv[i] == 0;
    hzeros += hv[i] == 0;
    bad += yv[i] != 0 && std::fabs(yv[i] - kept) > 1e-6 * kept;
    hbad += hv[i] != 0 && std::fabs(hv[i] - kept) > 1e-6 * kept;
    bad_grad += std::fabs(gv[i] - yv[i] / 1.5) > 1e-6;  // d/dx of the kept, scaled elements; 0 for the dropped
  }
  CHECK(bad == 0);
  CHECK(hbad == 0);
  CHECK(bad_grad == 0);
  double n = double(yv.size()), se = std::sqrt(p * (1 - p) / n);
  CHECK(std::fabs(zeros / n - p) <= 5 * se);
  CHECK(std::fabs(hzeros / n - p) <= 5 * se);
}

}  // namespace tt
