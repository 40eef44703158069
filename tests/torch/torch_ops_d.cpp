// Case table for the rest of tinygrad's API (tinygrad a9069c177a) and the options added with it: fmod, copysign,
// logaddexp, isclose, normalize, diag, unfold, rearrange, pad_to/shrink_to, div rounding modes, sum(dtype),
// scatter(reduce), max_pool2d indices and max_unpool2d, asymmetric pool padding, enable_gqa, the bitonic sort,
// QR and SVD, layernorm and batchnorm; forward and backward, in float32, float64, float16 and ints.
#include <cmath>

#include "harness.hpp"

namespace tt {
using tg::dtypes::int32;
using tg::dtypes::int64;
namespace F_ = torch::nn::functional;

namespace {
constexpr double kSum = 1e-5;  // summation order differs from torch's
// divisors away from 0 (fmod and rounding divisions are discontinuous where a / b is an integer)
Values away_from_zero(double lo, double hi) {
  return [lo, hi](const tg::Shape& s, std::mt19937& g) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = (g() % 2 ? 1 : -1) * u(g);
    return v;
  };
}
// distinct values (a sort's order, and so its gradient, is then unique)
Values distinct(double scale) {
  return [scale](const tg::Shape& s, std::mt19937& g) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) v[size_t(i)] = (double(i) - double(n) / 2) * scale;
    std::shuffle(v.begin(), v.end(), g);
    return v;
  };
}
}  // namespace

std::vector<Case> api_cases() {
  std::vector<Case> c;
  // elementwise
  for (auto d : {tg::dtypes::float32, tg::dtypes::float64}) {
    std::string t = d == tg::dtypes::float32 ? "" : "_f64";
    c.push_back(op2("fmod" + t, {In{{3, 5}, d, -6, 6, true, {}}, V({3, 5}, d, away_from_zero(0.7, 2.3), true)},
                    [](TG& x) { return x[0].fmod(x[1]); }, [](TH& x) { return torch::fmod(x[0], x[1]); }));
    c.push_back(op2("copysign" + t, {In{{3, 5}, d, -3, 3, true, {}}, In{{5}, d, -3, 3, false, {}}},
                    [](TG& x) { return x[0].copysign(x[1]); }, [](TH& x) { return torch::copysign(x[0], x[1]); }));
    c.push_back(op2("logaddexp" + t, {In{{3, 5}, d, -30, 30, true, {}}, In{{3, 1}, d, -30, 30, true, {}}},
                    [](TG& x) { return x[0].logaddexp(x[1]); }, [](TH& x) { return torch::logaddexp(x[0], x[1]); }));
    c.push_back(op2("div_trunc" + t, {In{{3, 5}, d, -6, 6, true, {}}, V({3, 5}, d, away_from_zero(0.7, 2.3))},
                    [](TG& x) { return x[0].div(x[1], "trunc"); }, [](TH& x) { return torch::div(x[0], x[1], "trunc"); }));
    c.push_back(op2("div_floor" + t, {In{{3, 5}, d, -6, 6, true, {}}, V({3, 5}, d, away_from_zero(0.7, 2.3))},
                    [](TG& x) { return x[0].div(x[1], "floor"); }, [](TH& x) { return torch::div(x[0], x[1], "floor"); }));
    c.push_back(op2("normalize" + t, {In{{4, 6}, d, -2, 2, true, {}}},
                    [](TG& x) { return x[0].normalize(); }, [](TH& x) { return F_::normalize(x[0], F_::NormalizeFuncOptions()); }).tol(kSum, kSum));
  }
  // tinygrad's IMAGE formulations: conv2d with channels padded to multiples of 4, dot as a 1x1 conv
  c.push_back(op2("image_conv2d", {F({2, 3, 7, 6}), F({6, 3, 3, 3}), F({6})}, [](TG& x) { return x[0].image_conv2d(x[1], x[2], 1, 2, 1, 1); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 2, 1); }).tol(kSum, kSum));
  c.push_back(op2("image_conv2d_groups", {F({1, 4, 5, 5}), F({6, 2, 3, 3})}, [](TG& x) { return x[0].image_conv2d(x[1], std::nullopt, 2, 1, 2); },
                  [](TH& x) { return F_::conv2d(x[0], x[1], F_::Conv2dFuncOptions().dilation(2).groups(2)); }).tol(kSum, kSum));
  c.push_back(op2("image_dot", {F({5, 7}), F({7, 6})}, [](TG& x) { return x[0].image_dot(x[1]); },
                  [](TH& x) { return torch::matmul(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("image_dot_batched", {F({2, 3, 5}), F({2, 5, 4})}, [](TG& x) { return x[0].image_dot(x[1]); },
                  [](TH& x) { return torch::matmul(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("image_dot_vec", {F({7}), F({7, 3})}, [](TG& x) { return x[0].image_dot(x[1]); },
                  [](TH& x) { return torch::matmul(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("fmod_int", {I({3, 5}, -20, 20, int32), V({3, 5}, int32, away_from_zero(1, 6))},
                  [](TG& x) { return x[0].fmod(x[1]); }, [](TH& x) { return torch::fmod(x[0], x[1]); }));
  c.push_back(op2("fmod_half", {H({3, 5}, -6, 6), V({3, 5}, tg::dtypes::float16, away_from_zero(0.7, 2.3))},
                  [](TG& x) { return x[0].fmod(x[1]); }, [](TH& x) { return torch::fmod(x[0], x[1]); }).fwd_only().tol(0x1p-10, 0x1p-10));
  c.push_back(op2("div_trunc_int", {I({3, 5}, -20, 20), V({3, 5}, int64, away_from_zero(1, 6))},
                  [](TG& x) { return x[0].div(x[1], "trunc"); }, [](TH& x) { return torch::div(x[0], x[1], "trunc"); }));
  c.push_back(op2("div_floor_int", {I({3, 5}, -20, 20, int32), V({3, 5}, int32, away_from_zero(1, 6))},
                  [](TG& x) { return x[0].div(x[1], "floor"); }, [](TH& x) { return torch::div(x[0], x[1], "floor"); }));
  c.push_back(op2("copysign_int", {I({3, 5}, -9, 9, int32), I({5}, -3, 3, int32)},
                  [](TG& x) { return x[0].copysign(x[1]); }, [](TH& x) { return torch::copysign(x[0], x[1]); }));
  c.push_back(op2("logaddexp_half", {H({3, 5}, -5, 5), H({3, 5}, -5, 5)},
                  [](TG& x) { return x[0].logaddexp(x[1]); }, [](TH& x) { return torch::logaddexp(x[0], x[1]); }).tol(0x1p-10, 0x1p-10));
  c.push_back(op2("isclose", {F({4, 5}, -1, 1), F({4, 5}, -1, 1)},
                  [](TG& x) { return x[0].isclose((x[0] + x[1] * 1e-5).cast(tg::dtypes::float32), 1e-5, 1e-6); },
                  [](TH& x) { return torch::isclose(x[0], x[0] + x[1] * 1e-5, 1e-5, 1e-6); }).fwd_only());
  c.push_back(op2("normalize_p1_dim0", {F({4, 6})}, [](TG& x) { return x[0].normalize(1, 0); },
                  [](TH& x) { return F_::normalize(x[0], F_::NormalizeFuncOptions().p(1).dim(0)); }).tol(kSum, kSum));
  c.push_back(op2("normalize_p3", {F({4, 6})}, [](TG& x) { return x[0].normalize(3, -1); },
                  [](TH& x) { return F_::normalize(x[0], F_::NormalizeFuncOptions().p(3).dim(-1)); }).tol(1e-4, 1e-5));
  // reductions
  c.push_back(op2("sum_dtype_f64", {F({4, 6})}, [](TG& x) { return x[0].sum({1}, false, tg::dtypes::float64); },
                  [](TH& x) { return x[0].sum(1, false, torch::kFloat64); }));
  c.push_back(op2("sum_dtype_int32", {I({4, 6}, -100, 100, tg::dtypes::int8)}, [](TG& x) { return x[0].sum({0}, true, int32); },
                  [](TH& x) { return x[0].sum(0, true, torch::kInt32); }));
  c.push_back(op2("sum_dtype_half", {H({4, 6})}, [](TG& x) { return x[0].sum({1}, false, tg::dtypes::float32).cast(tg::dtypes::float16); },
                  [](TH& x) { return x[0].sum(1, false, torch::kFloat32); }));
  // movement
  c.push_back(op("diag_1d", {F({5})}, [](auto& x) { return x[0].diag(); }));
  c.push_back(op("diag_2d", {F({4, 6})}, [](auto& x) { return x[0].diag(); }));
  c.push_back(op("diag_int", {I({4}, -5, 5, int32)}, [](auto& x) { return x[0].diag(); }));
  c.push_back(op("unfold", {F({10})}, [](auto& x) { return x[0].unfold(0, 3, 2); }));
  c.push_back(op("unfold_mid", {F({2, 9, 3})}, [](auto& x) { return x[0].unfold(1, 4, 1); }));
  c.push_back(op("unfold_last_f64", {D({3, 8})}, [](auto& x) { return x[0].unfold(-1, 2, 3); }));
  c.push_back(op("unfold_half", {H({3, 8})}, [](auto& x) { return x[0].unfold(1, 8, 1); }));
  c.push_back(op2("rearrange", {F({2, 6, 4})}, [](TG& x) { return x[0].rearrange("b (h w) c -> b c h w", {{"h", 2}}); },
                  [](TH& x) { return x[0].reshape({2, 2, 3, 4}).permute({0, 3, 1, 2}); }));
  c.push_back(op2("rearrange_merge", {F({2, 3, 4})}, [](TG& x) { return x[0].rearrange("a b c -> (c a) b"); },
                  [](TH& x) { return x[0].permute({2, 0, 1}).reshape({8, 3}); }));
  c.push_back(op2("pad_to", {F({2, 3})}, [](TG& x) { return x[0].pad_to({4, -1}, 1.5); },
                  [](TH& x) { return F_::pad(x[0], F_::PadFuncOptions({0, 0, 0, 2}).value(1.5)); }));
  c.push_back(op2("shrink_to", {F({4, 5})}, [](TG& x) { return x[0].shrink_to({2, 3}); },
                  [](TH& x) { return x[0].slice(0, 0, 2).slice(1, 0, 3); }));
  c.push_back(op2("scatter_add", {F({3, 5}), I({3, 4}, 0, 4), F({3, 4})}, [](TG& x) { return x[0].scatter(1, x[1], x[2], "add"); },
                  [](TH& x) { return x[0].scatter(1, x[1], x[2], "add"); }).fwd_only());  // torch: no derivative with reduce
  c.push_back(op2("scatter_multiply", {F({3, 5}), I({3, 4}, 0, 4), F({3, 4})}, [](TG& x) { return x[0].scatter(1, x[1], x[2], "multiply"); },
                  [](TH& x) { return x[0].scatter(1, x[1], x[2], "multiply"); }).fwd_only());
  c.push_back(op2("scatter_add_int", {I({5, 3}, -9, 9, int32), I({4, 3}, 0, 4), I({4, 3}, -9, 9, int32)},
                  [](TG& x) { return x[0].scatter(0, x[1], x[2], "add"); }, [](TH& x) { return x[0].scatter(0, x[1], x[2], "add"); }).fwd_only());
  // sort: lengths that are not powers of 2, both directions, values with their gradient and the indices
  for (int64_t n : {5, 12, 33}) {
    c.push_back(op2("sort_values_" + std::to_string(n), {V({3, n}, tg::dtypes::float32, distinct(0.25), true)},
                    [](TG& x) { return x[0].sort(-1).first; }, [](TH& x) { return std::get<0>(x[0].sort(-1)); }));
    c.push_back(op2("sort_desc_dim0_" + std::to_string(n), {V({n, 2}, tg::dtypes::float64, distinct(0.5), true)},
                    [](TG& x) { return x[0].sort(0, true).first; }, [](TH& x) { return std::get<0>(x[0].sort(0, true)); }));
    c.push_back(op2("argsort_int_" + std::to_string(n), {I({2, n}, -4, 4, int32)},
                    [](TG& x) { return x[0].argsort(-1, true); }, [](TH& x) { return std::get<1>(x[0].sort(true, -1, true)); }));
  }
  c.push_back(op2("sort_half", {H({2, 9})}, [](TG& x) { return x[0].sort(1).first; }, [](TH& x) { return std::get<0>(x[0].sort(1)); }));
  c.push_back(op2("topk_7_of_20", {V({2, 20}, tg::dtypes::float32, distinct(0.1), true)}, [](TG& x) { return x[0].topk(7, 1).first; },
                  [](TH& x) { return std::get<0>(x[0].topk(7, 1)); }));
  // pools
  c.push_back(op2("max_pool2d_indices", {V({2, 3, 6, 7}, tg::dtypes::float32, distinct(0.01))},
                  [](TG& x) { return x[0].max_pool2d_with_indices(3, 2, 1).indices; },
                  [](TH& x) { return std::get<1>(torch::max_pool2d_with_indices(x[0], 3, 2, 1)); }));
  c.push_back(op2("max_pool2d_indices_ceil_dil", {V({1, 2, 7, 7}, tg::dtypes::float32, distinct(0.01))},
                  [](TG& x) { return x[0].max_pool2d_with_indices(2, 2, 0, 2, true).indices; },
                  [](TH& x) { return std::get<1>(torch::max_pool2d_with_indices(x[0], 2, 2, 0, 2, true)); }));
  c.push_back(op2("max_pool2d_values", {V({2, 3, 6, 7}, tg::dtypes::float32, distinct(0.01), true)},
                  [](TG& x) { return x[0].max_pool2d_with_indices(3, 2, 1).values; },
                  [](TH& x) { return std::get<0>(torch::max_pool2d_with_indices(x[0], 3, 2, 1)); }));
  c.push_back(op2("max_unpool2d", {V({2, 3, 6, 8}, tg::dtypes::float32, distinct(0.01), true)},
                  [](TG& x) { return x[0].max_pool2d(2).max_unpool2d(x[0].max_pool2d_with_indices(2).indices, 2); },
                  [](TH& x) {
                    auto vi = torch::max_pool2d_with_indices(x[0], 2);
                    return torch::max_unpool2d(std::get<0>(vi), std::get<1>(vi), {6, 8});
                  }));
  c.push_back(op2("max_pool2d_asym_pad", {F({2, 3, 6, 7})}, [](TG& x) { return x[0].max_pool2d(3, 2, {1, 0, 0, 1}); },
                  [](TH& x) { return torch::max_pool2d(F_::pad(x[0], F_::PadFuncOptions({0, 1, 1, 0}).value(-INFINITY)), 3, 2); }));
  c.push_back(op2("avg_pool2d_asym_pad", {F({2, 3, 6, 7})}, [](TG& x) { return x[0].avg_pool2d(3, 2, {0, 1, 1, 1}); },
                  [](TH& x) { return torch::avg_pool2d(F_::pad(x[0], F_::PadFuncOptions({1, 1, 0, 1})), 3, 2); }));
  c.push_back(op2("avg_pool1d_asym_pad_f64", {D({2, 3, 9})}, [](TG& x) { return x[0].avg_pool1d(4, 3, {2, 1}); },
                  [](TH& x) { return torch::avg_pool1d(F_::pad(x[0], F_::PadFuncOptions({2, 1})), 4, 3); }));
  // attention with grouped key/value heads: torch 1.13 has no enable_gqa; its reference repeats each head
  c.push_back(op2("sdpa_gqa", {F({2, 4, 3, 8}), F({2, 2, 5, 8}), F({2, 2, 5, 8})},
                  [](TG& x) { return x[0].scaled_dot_product_attention(x[1], x[2], std::nullopt, 0.0, false, std::nullopt, true); },
                  [](TH& x) {
                    auto k = x[1].repeat_interleave(2, 1), v = x[2].repeat_interleave(2, 1);
                    return torch::matmul(torch::softmax(torch::matmul(x[0], k.transpose(-2, -1)) / std::sqrt(8.0), -1), v);
                  }).tol(kSum, kSum));
  c.push_back(op2("sdpa_gqa_causal_f64", {D({1, 6, 4, 4}), D({1, 3, 4, 4}), D({1, 3, 4, 4})},
                  [](TG& x) { return x[0].scaled_dot_product_attention(x[1], x[2], std::nullopt, 0.0, true, std::nullopt, true); },
                  [](TH& x) {
                    auto k = x[1].repeat_interleave(2, 1), v = x[2].repeat_interleave(2, 1);
                    auto s = torch::matmul(x[0], k.transpose(-2, -1)) / 2.0;
                    s = s.masked_fill(torch::ones({4, 4}, torch::kBool).triu(1), -INFINITY);
                    return torch::matmul(torch::softmax(s, -1), v);
                  }).tol(kSum, kSum));
  // tinygrad's normalisations
  c.push_back(op2("layernorm", {F({3, 4, 6})}, [](TG& x) { return x[0].layernorm({-1}); },
                  [](TH& x) { return torch::layer_norm(x[0], {6}); }).tol(kSum, kSum));
  c.push_back(op2("layernorm_2axes_f64", {D({3, 4, 6})}, [](TG& x) { return x[0].layernorm({1, 2}); },
                  [](TH& x) { return torch::layer_norm(x[0], {4, 6}); }).tol(kSum, kSum));
  c.push_back(op2("batchnorm", {F({2, 3, 4}), F({3}), F({3}), C({3}), C({3}, 0.5, 2)},
                  [](TG& x) { return x[0].batchnorm(x[1], x[2], x[3], (x[4] + 1e-5).rsqrt()); },
                  [](TH& x) { return torch::batch_norm(x[0], x[1], x[2], x[3], x[4], false, 0.1, 1e-5, false); }).tol(kSum, kSum));
  // decompositions: QR in LAPACK's sign convention; SVD's singular values (U and V are unique up to signs)
  c.push_back(op2("qr_R", {D({4, 3})}, [](TG& x) { return x[0].qr().second; },
                  [](TH& x) { return std::get<1>(torch::linalg_qr(x[0], "complete")); }).fwd_only().tol(1e-10, 1e-10));
  c.push_back(op2("qr_Q_square", {D({2, 3, 3})}, [](TG& x) { return x[0].qr().first; },
                  [](TH& x) { return std::get<0>(torch::linalg_qr(x[0], "complete")); }).tol(1e-9, 1e-9));
  c.push_back(op2("qr_R_square_f32", {F({3, 3})}, [](TG& x) { return x[0].qr().second; },
                  [](TH& x) { return std::get<1>(torch::linalg_qr(x[0])); }).tol(1e-4, 1e-5));
  c.push_back(op2("svd_S", {D({4, 3})}, [](TG& x) { return std::get<1>(x[0].svd()); },
                  [](TH& x) { return torch::linalg_svdvals(x[0]); }).tol(1e-7, 1e-7));
  c.push_back(op2("svd_S_wide_batched", {D({2, 3, 5})}, [](TG& x) { return std::get<1>(x[0].svd(false)); },
                  [](TH& x) { return torch::linalg_svdvals(x[0]); }).tol(1e-7, 1e-7));
  // options of tinygrad's signatures: prod/softmax/log_softmax/softmin/matmul/linear(dtype=), isinf(detect_*),
  // hardsigmoid(alpha, beta), binary_crossentropy_logits(pos_weight=) (a float16 case computed in
  // float32 is rounded to float16 at the end, as the harness compares float16 inputs in float16)
  c.push_back(op2("prod_dtype_f64", {F({4, 5}, 0.5, 1.5)}, [](TG& x) { return x[0].prod({1}, false, tg::dtypes::float64); },
                  [](TH& x) { return x[0].prod(1, false, torch::kFloat64); }));
  c.push_back(op2("prod_dtype_int64", {I({3, 4}, -5, 5, int32)}, [](TG& x) { return x[0].prod({0}, true, int64); },
                  [](TH& x) { return x[0].prod(0, true, torch::kInt64); }));
  c.push_back(op2("softmax_dtype_f64", {F({3, 7})}, [](TG& x) { return x[0].softmax(1, tg::dtypes::float64); },
                  [](TH& x) { return torch::softmax(x[0], 1, torch::kFloat64); }));
  c.push_back(op2("softmax_dtype_half_in_f32", {H({3, 7})}, [](TG& x) { return x[0].softmax(-1, tg::dtypes::float32).cast(tg::dtypes::float16); },
                  [](TH& x) { return torch::softmax(x[0], -1, torch::kFloat32); }).tol(kSum, kSum));
  c.push_back(op2("log_softmax_dtype_f64", {F({3, 7})}, [](TG& x) { return x[0].log_softmax(0, tg::dtypes::float64); },
                  [](TH& x) { return torch::log_softmax(x[0], 0, torch::kFloat64); }));
  c.push_back(op2("softmin_dtype_f64", {F({3, 7})}, [](TG& x) { return x[0].softmin(1, tg::dtypes::float64); },
                  [](TH& x) { return torch::softmax(-x[0].to(torch::kFloat64), 1); }));
  for (auto d : {tg::dtypes::float32, tg::dtypes::float64}) {
    std::string t = d == tg::dtypes::float32 ? "" : "_f64";
    Values infs = [](const tg::Shape&, std::mt19937&) { return std::vector<double>{1, INFINITY, -INFINITY, NAN, -2, INFINITY}; };
    c.push_back(op2("isinf_positive" + t, {V({6}, d, infs)}, [](TG& x) { return x[0].isinf(true, false); },
                    [](TH& x) { return torch::isposinf(x[0]); }).fwd_only());
    c.push_back(op2("isinf_negative" + t, {V({6}, d, infs)}, [](TG& x) { return x[0].isinf(false, true); },
                    [](TH& x) { return torch::isneginf(x[0]); }).fwd_only());
    c.push_back(op2("isinf_neither" + t, {V({6}, d, infs)}, [](TG& x) { return x[0].isinf(false, false); },
                    [](TH& x) { return torch::zeros_like(x[0], torch::kBool); }).fwd_only());
    c.push_back(op2("hardsigmoid_alpha_beta" + t, {In{{4, 6}, d, -6, 6, true, {}}}, [](TG& x) { return x[0].hardsigmoid(0.3, 0.4); },
                    [](TH& x) { return torch::clamp(x[0] * 0.3 + 0.4, 0, 1); }));
  }
  c.push_back(op2("matmul_dtype_half_in_f32", {H({4, 9}), H({9, 3})}, [](TG& x) { return x[0].matmul(x[1], tg::dtypes::float32).cast(tg::dtypes::float16); },
                  [](TH& x) { return torch::matmul(x[0].to(torch::kFloat32), x[1].to(torch::kFloat32)); }).tol(kSum, kSum));
  c.push_back(op2("dot_dtype_f64", {F({2, 3, 5}), F({5, 4})}, [](TG& x) { return x[0].dot(x[1], tg::dtypes::float64); },
                  [](TH& x) { return torch::matmul(x[0].to(torch::kFloat64), x[1].to(torch::kFloat64)); }));
  c.push_back(op2("linear_dtype_half_in_f32", {H({3, 8}), H({5, 8}), H({5})},
                  [](TG& x) { return x[0].linear(x[1], x[2], tg::dtypes::float32).cast(tg::dtypes::float16); },
                  [](TH& x) { return F_::linear(x[0].to(torch::kFloat32), x[1].to(torch::kFloat32), x[2].to(torch::kFloat32)); })
                  .tol(kSum, kSum));
  c.push_back(op2("bce_logits_pos_weight", {F({3, 4}, -6, 6), C({3, 4}, 0, 1), C({4}, 0.5, 3)},
                  [](TG& x) { return x[0].binary_crossentropy_logits(x[1], "mean", x[2]); },
                  [](TH& x) { return torch::binary_cross_entropy_with_logits(x[0], x[1], {}, x[2]); }).tol(kSum, kSum));
  // Gradients at the edges, from the gradient rules of the ops each is built from (issue 16: no hand-written
  // backward): relu at 0 and infinities; sigmoid where exp(-x) overflows or s (1 - s) underflows; pow at zero
  // bases and exponents and negative bases; sort with ties (torch's stable sort: the gradient follows the indices).
  // float16 computes in float32 and rounds once; its gradient graph rounds per op (a few float16 ulps).
  for (auto d : {tg::dtypes::float32, tg::dtypes::float16}) {
    std::string t = d == tg::dtypes::float32 ? "" : "_half";
    double tol = d == tg::dtypes::float32 ? 1e-6 : 2e-3;
    auto vals = [](std::vector<double> v) { return [v](const tg::Shape&, std::mt19937&) { return v; }; };
    c.push_back(op2("relu_edges" + t, {V({8}, d, vals({-2, -0.0, 0, 0, 1e-3, 3, -INFINITY, INFINITY}), true)},
                    [](TG& x) { return x[0].relu(); }, [](TH& x) { return torch::relu(x[0]); }));
    c.push_back(op2("sigmoid_edges" + t, {V({12}, d, vals({-1000, -100, -88.8, -50, -20, -1, 0, 1, 20, 50, 100, 1000}), true)},
                    [](TG& x) { return x[0].sigmoid(); }, [](TH& x) { return torch::sigmoid(x[0]); }).tol(tol, tol));
    c.push_back(op2("pow_edges" + t,
                    {V({9}, d, vals({0, 0, -2, -2, 0, 2, -3, 0, 0}), true), V({9}, d, vals({0, 2, 3, 0.5, -1, 0, 2, 0.5, 1}), true)},
                    [](TG& x) { return x[0].pow(x[1]); }, [](TH& x) { return torch::pow(x[0], x[1]); }).tol(tol, tol));
    c.push_back(op2("sort_ties" + t, {V({2, 7}, d, vals({3, 1, 3, 2, 1, 3, 0, -1, -1, 5, 5, 5, -1, 2}), true)},
                    [](TG& x) { return x[0].sort(1).first; }, [](TH& x) { return std::get<0>(x[0].sort(true, 1, false)); }));
    c.push_back(op2("sort_ties_desc" + t, {V({2, 7}, d, vals({3, 1, 3, 2, 1, 3, 0, -1, -1, 5, 5, 5, -1, 2}), true)},
                    [](TG& x) { return x[0].sort(1, true).first; }, [](TH& x) { return std::get<0>(x[0].sort(true, 1, true)); }));
  }
  // Axes at the edges (issue 24): a 0-d tensor's one axis (softmax segfaulted), zero-size axes (cummax and softmax
  // threw), a negative convolution padding (tinygrad crops; torch refuses it: compared with torch on the cropped input)
  c.push_back(op2("softmax_0d", {F({})}, [](TG& x) { return x[0].softmax(0); }, [](TH& x) { return x[0].softmax(0); }));
  c.push_back(op2("log_softmax_0d", {F({})}, [](TG& x) { return x[0].log_softmax(-1); }, [](TH& x) { return x[0].log_softmax(-1); }));
  c.push_back(op2("cumsum_0d", {F({})}, [](TG& x) { return x[0].cumsum(0); }, [](TH& x) { return x[0].cumsum(0); }));
  c.push_back(op2("softmax_empty_axis", {F({3, 0})}, [](TG& x) { return x[0].softmax(1); }, [](TH& x) { return x[0].softmax(1); }).fwd_only());
  c.push_back(op2("cummax_empty_axis", {F({3, 0})}, [](TG& x) { return x[0].cummax(1).first; },
                  [](TH& x) { return std::get<0>(x[0].cummax(1)); }).fwd_only());
  c.push_back(op2("cummin_empty_axis_indices", {F({0, 4})}, [](TG& x) { return x[0].cummin(0).second; },
                  [](TH& x) { return std::get<1>(x[0].cummin(0)); }).fwd_only());
  c.push_back(op2("conv2d_negative_pad", {F({2, 3, 7, 6}), F({4, 3, 3, 2})}, [](TG& x) { return x[0].conv2d(x[1], {}, 1, {-1, 0, 1, -2}); },
                  [](TH& x) { return torch::conv2d(F_::pad(x[0], F_::PadFuncOptions({1, -2, -1, 0})), x[1]); }).tol(kSum, kSum));
  return c;
}

}  // namespace tt
