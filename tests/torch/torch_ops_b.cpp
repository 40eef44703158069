// Case tables: reductions and scans, nn functional ops, losses and linear algebra.
#include <cmath>

#include "harness.hpp"
#include "tg/env.hpp"

namespace tt {
using tg::dtypes::bool_;
using tg::dtypes::int32;
using tg::dtypes::int64;
namespace F_ = torch::nn::functional;

namespace {
constexpr double kSum = 1e-5;  // summation order differs from torch's (BLAS, mkldnn, vectorised loops)
// Winograd F(4x4, r x r) in fp32 (Lavin's points 0, +-1, +-2 and for r = 5 also +-1/2): the transforms' entries (up
// to 5 in B^T, 8 in A^T, products of up to 8 x 8 terms) amplify the rounding of each tile's a^2 products; measured
// |diff| / max|torch| up to 2.1e-6 (3x3) and 4.7e-6 (5x5) over these cases' forwards and gradients, against
// about 1e-6 for the direct convolution; the tolerances (relative to max|torch|, the harness's atol) about 2x that.
constexpr double kWino3 = 4e-6, kWino5 = 1e-5;

// tg's side of a case with WINO=1 (Winograd wherever it applies) while its graph is built; WINO restored after
// (tg caches parsed variables: the cache is reset on both ends).
template <class Fn>
auto wino(Fn f) {
  return [f](TG& x) -> tg::Tensor {
    struct Guard {
      std::optional<std::string> old;
      Guard() {
        if (const char* v = std::getenv("WINO")) old = v;
        setenv("WINO", "1", 1);
        tg::env_reset_cache();
      }
      ~Guard() {
        old ? setenv("WINO", old->c_str(), 1) : unsetenv("WINO");
        tg::env_reset_cache();
      }
    } guard;
    return f(x);
  };
}
}

std::vector<Case> reduce_cases() {
  std::vector<Case> c;
  using V64 = std::vector<int64_t>;
  c.push_back(op("sum_axes", {F({2, 3, 4})}, [](auto& x) { return x[0].sum(V64{0, 2}); }));
  c.push_back(op("sum_keepdim", {F({2, 3, 4})}, [](auto& x) { return x[0].sum(V64{1}, true); }));
  c.push_back(op2("sum_all", {F({3, 5})}, [](TG& x) { return x[0].sum(); }, [](TH& x) { return x[0].sum(); }));
  c.push_back(op2("sum_int", {I({3, 5}, -9, 9, int32)}, [](TG& x) { return x[0].sum(1); }, [](TH& x) { return x[0].sum(1); }));
  c.push_back(op2("sum_bool", {B({3, 5})}, [](TG& x) { return x[0].sum(0); }, [](TH& x) { return x[0].sum(0); }));
  c.push_back(op2("mean", {F({3, 5})}, [](TG& x) { return x[0].mean(-1); }, [](TH& x) { return x[0].mean(-1); }));
  c.push_back(op2("max_dim", {F({3, 5})}, [](TG& x) { return x[0].max(1); }, [](TH& x) { return std::get<0>(x[0].max(1)); }));
  c.push_back(op2("min_all", {F({3, 5})}, [](TG& x) { return x[0].min(); }, [](TH& x) { return x[0].min(); }));
  c.push_back(op2("max_int", {I({3, 5}, -99, 99, int32)}, [](TG& x) { return x[0].max(0); }, [](TH& x) { return std::get<0>(x[0].max(0)); }));
  c.push_back(op2("prod", {F({3, 4}, 0.5, 1.5)}, [](TG& x) { return x[0].prod(1); }, [](TH& x) { return x[0].prod(1); }));
  for (double corr : {0.0, 1.0, 2.0}) {
    std::string s = std::to_string(int(corr));
    c.push_back(op2("var_c" + s, {F({3, 5})}, [corr](TG& x) { return x[0].var({1}, false, corr); },
                    [corr](TH& x) { return torch::var(x[0], V64{1}, c10::optional<int64_t>(int64_t(corr)), false); }));
  }
  c.push_back(op2("var_all_keep", {F({2, 3, 4})}, [](TG& x) { return x[0].var({0, 2}, true); },
                  [](TH& x) { return torch::var(x[0], V64{0, 2}, c10::optional<int64_t>(1), true); }));
  c.push_back(op2("std", {F({4, 6})}, [](TG& x) { return x[0].std({0}); }, [](TH& x) { return torch::std(x[0], V64{0}, c10::optional<int64_t>(1), false); }));
  c.push_back(op2("std_int", {I({4, 6}, -9, 9, int32)}, [](TG& x) { return x[0].std({1}); },
                  [](TH& x) { return torch::std(x[0].to(torch::kFloat), V64{1}, c10::optional<int64_t>(1), false); }));
  c.push_back(op2("var_mean", {F({3, 5})}, [](TG& x) { auto [v, m] = x[0].var_mean({1}); return tg::stack({v, m}); },
                  [](TH& x) { auto [v, m] = torch::var_mean(x[0], V64{1}, c10::optional<int64_t>(1), false); return torch::stack({v, m}); }));
  c.push_back(op2("std_mean", {F({3, 5})}, [](TG& x) { auto [v, m] = x[0].std_mean({0}, false, 0); return tg::cat({v, m}); },
                  [](TH& x) { auto [v, m] = torch::std_mean(x[0], V64{0}, c10::optional<int64_t>(0), false); return torch::cat({v, m}); }));
  c.push_back(op2("argmax", {F({3, 5})}, [](TG& x) { return x[0].argmax(1); }, [](TH& x) { return x[0].argmax(1); }));
  c.push_back(op2("argmax_keep", {F({3, 5, 2})}, [](TG& x) { return x[0].argmax(0, true); }, [](TH& x) { return x[0].argmax(0, true); }));
  c.push_back(op2("argmax_flat", {F({3, 5})}, [](TG& x) { return x[0].argmax(); }, [](TH& x) { return x[0].argmax(); }));
  c.push_back(op2("argmax_ties_int", {I({4, 6}, 0, 2, int32)}, [](TG& x) { return x[0].argmax(1); }, [](TH& x) { return x[0].argmax(1); }));
  c.push_back(op2("argmin", {F({3, 5})}, [](TG& x) { return x[0].argmin(0); }, [](TH& x) { return x[0].argmin(0); }));
  c.push_back(op2("argmin_int", {I({4, 6}, -3, 3, int32)}, [](TG& x) { return x[0].argmin(-1); }, [](TH& x) { return x[0].argmin(-1); }));
  c.push_back(op2("any", {B({3, 4})}, [](TG& x) { return x[0].any({1}); }, [](TH& x) { return x[0].any(1); }));
  c.push_back(op2("any_all_float", {F({3, 4}, -1, 1)}, [](TG& x) { return x[0].relu().any(); }, [](TH& x) { return x[0].relu().any(); }));
  c.push_back(op2("all", {B({3, 4})}, [](TG& x) { return x[0].all({0}, true); }, [](TH& x) { return x[0].all(0, true); }));
  c.push_back(op2("all_int", {I({3, 4}, 0, 3, int32)}, [](TG& x) { return x[0].all({1}); }, [](TH& x) { return x[0].all(1); }));
  c.push_back(op2("cumsum", {F({3, 5})}, [](TG& x) { return x[0].cumsum(1); }, [](TH& x) { return x[0].cumsum(1); }));
  c.push_back(op2("cumsum_dim0", {F({4, 3})}, [](TG& x) { return x[0].cumsum(0); }, [](TH& x) { return x[0].cumsum(0); }));
  c.push_back(op2("cumsum_long", {F({2, 700})}, [](TG& x) { return x[0].cumsum(1); }, [](TH& x) { return x[0].cumsum(1); }).tol(kSum, kSum));
  c.push_back(op2("cumsum_int", {I({3, 5}, -9, 9, int32)}, [](TG& x) { return x[0].cumsum(1); }, [](TH& x) { return x[0].cumsum(1); }));
  c.push_back(op2("cumprod", {F({3, 5}, 0.5, 1.5)}, [](TG& x) { return x[0].cumprod(1); }, [](TH& x) { return x[0].cumprod(1); }));
  c.push_back(op2("cummax_values", {F({3, 6})}, [](TG& x) { return x[0].cummax(1).first; }, [](TH& x) { return std::get<0>(x[0].cummax(1)); }));
  c.push_back(op2("cummax_indices", {F({3, 6})}, [](TG& x) { return x[0].cummax(1).second; }, [](TH& x) { return std::get<1>(x[0].cummax(1)); }));
  c.push_back(op2("cummax_ties_int", {I({3, 8}, 0, 3, int32)}, [](TG& x) { return x[0].cummax(1).second; }, [](TH& x) { return std::get<1>(x[0].cummax(1)); }));
  c.push_back(op2("cummin_values", {F({5, 2})}, [](TG& x) { return x[0].cummin(0).first; }, [](TH& x) { return std::get<0>(x[0].cummin(0)); }));
  c.push_back(op2("cummin_indices", {F({5, 2})}, [](TG& x) { return x[0].cummin(0).second; }, [](TH& x) { return std::get<1>(x[0].cummin(0)); }));
  c.push_back(op2("logsumexp", {F({3, 5}, -5, 5)}, [](TG& x) { return x[0].logsumexp({1}); }, [](TH& x) { return x[0].logsumexp(1); }));
  c.push_back(op2("logsumexp_keep", {F({2, 3, 4}, -5, 5)}, [](TG& x) { return x[0].logsumexp({0, 2}, true); }, [](TH& x) { return x[0].logsumexp(at::IntArrayRef{0, 2}, true); }));
  c.push_back(op2("logcumsumexp", {F({3, 5}, -5, 5)}, [](TG& x) { return x[0].logcumsumexp(1); }, [](TH& x) { return x[0].logcumsumexp(1); }));
  c.push_back(op2("logcumsumexp_dim0", {F({4, 2}, -5, 5)}, [](TG& x) { return x[0].logcumsumexp(0); }, [](TH& x) { return x[0].logcumsumexp(0); }));
  c.push_back(op2("softmax", {F({3, 5}, -5, 5)}, [](TG& x) { return x[0].softmax(1); }, [](TH& x) { return x[0].softmax(1); }));
  c.push_back(op2("softmax_dim0", {F({4, 3, 2}, -5, 5)}, [](TG& x) { return x[0].softmax(0); }, [](TH& x) { return x[0].softmax(0); }));
  c.push_back(op2("log_softmax", {F({3, 5}, -5, 5)}, [](TG& x) { return x[0].log_softmax(-1); }, [](TH& x) { return x[0].log_softmax(-1); }));
  c.push_back(op2("log_softmax_dim1", {F({2, 4, 3}, -5, 5)}, [](TG& x) { return x[0].log_softmax(1); }, [](TH& x) { return x[0].log_softmax(1); }));
  c.push_back(op2("softmin", {F({3, 5})}, [](TG& x) { return x[0].softmin(1); }, [](TH& x) { return torch::softmax(-x[0], 1); }));
  c.push_back(op2("sort_values", {F({3, 7})}, [](TG& x) { return x[0].sort(1).first; }, [](TH& x) { return std::get<0>(x[0].sort(1)); }));
  c.push_back(op2("sort_indices", {F({3, 7})}, [](TG& x) { return x[0].sort(1).second; }, [](TH& x) { return std::get<1>(x[0].sort(1)); }));
  c.push_back(op2("sort_desc_dim0", {F({6, 2})}, [](TG& x) { return x[0].sort(0, true).first; }, [](TH& x) { return std::get<0>(x[0].sort(0, true)); }));
  c.push_back(op2("sort_stable_ties", {I({2, 9}, 0, 3, int32)}, [](TG& x) { return x[0].sort(1).second; },
                  [](TH& x) { return std::get<1>(x[0].sort(true, 1, false)); }));
  c.push_back(op2("sort_stable_ties_desc", {I({2, 9}, 0, 3, int32)}, [](TG& x) { return x[0].sort(1, true).second; },
                  [](TH& x) { return std::get<1>(x[0].sort(true, 1, true)); }));
  c.push_back(op2("argsort", {F({4, 5})}, [](TG& x) { return x[0].argsort(0); }, [](TH& x) { return x[0].argsort(int64_t(0), false); }));
  c.push_back(op2("topk_values", {F({3, 8})}, [](TG& x) { return x[0].topk(3).first; }, [](TH& x) { return std::get<0>(x[0].topk(3)); }));
  c.push_back(op2("topk_indices", {F({3, 8})}, [](TG& x) { return x[0].topk(3).second; }, [](TH& x) { return std::get<1>(x[0].topk(3)); }));
  c.push_back(op2("cumsum_bool", {B({3, 5})}, [](TG& x) { return x[0].cumsum(1); }, [](TH& x) { return x[0].cumsum(1); }));
  c.push_back(op2("cumprod_int", {I({3, 5}, -3, 3, int32)}, [](TG& x) { return x[0].cumprod(1); }, [](TH& x) { return x[0].cumprod(1); }));
  c.push_back(op2("logsumexp_neg_inf", {V({2, 3}, tg::dtypes::float32, [](const tg::Shape&, std::mt19937&) { return std::vector<double>{-INFINITY, -INFINITY, -INFINITY, 1, 2, -INFINITY}; })},
                  [](TG& x) { return x[0].logsumexp({1}); }, [](TH& x) { return x[0].logsumexp(1); }));
  c.push_back(op2("sort_64", {F({2, 64})}, [](TG& x) { return x[0].sort(-1, true).first; }, [](TH& x) { return std::get<0>(x[0].sort(-1, true)); }));
  c.push_back(op2("topk_mid_dim", {F({2, 6, 3})}, [](TG& x) { return x[0].topk(4, 1).first; }, [](TH& x) { return std::get<0>(x[0].topk(4, 1)); }));
  c.push_back(op2("var_f64", {D({4, 5})}, [](TG& x) { return x[0].var({0}); }, [](TH& x) { return torch::var(x[0], V64{0}, c10::optional<int64_t>(1), false); }).tol(1e-12, 1e-13));
  c.push_back(op2("mean_int", {I({3, 5}, -9, 9, int32)}, [](TG& x) { return x[0].mean(1); }, [](TH& x) { return x[0].to(torch::kFloat).mean(1); }));
  c.push_back(op2("softmax_size1", {F({3, 1})}, [](TG& x) { return x[0].softmax(1); }, [](TH& x) { return x[0].softmax(1); }));
  c.push_back(op2("log_softmax_odd", {F({1, 13}, -20, 20)}, [](TG& x) { return x[0].log_softmax(1); }, [](TH& x) { return x[0].log_softmax(1); }));
  // the same reductions over more shapes (odd, size-1 and 1-d), along the last and the first dim
  for (tg::Shape sh : {tg::Shape{7}, tg::Shape{4, 1, 3}, tg::Shape{2, 5, 3}}) {
    for (int64_t ax : {int64_t(-1), int64_t(0)}) {
      std::string n = "@" + std::to_string(ax);
      c.push_back(op2("sum" + n, {F(sh)}, [ax](TG& x) { return x[0].sum(ax); }, [ax](TH& x) { return x[0].sum(ax); }));
      c.push_back(op2("max" + n, {F(sh)}, [ax](TG& x) { return x[0].max(ax, true); }, [ax](TH& x) { return std::get<0>(x[0].max(ax, true)); }));
      c.push_back(op2("prod" + n, {F(sh, 0.5, 1.5)}, [ax](TG& x) { return x[0].prod(ax); }, [ax](TH& x) { return x[0].prod(ax); }));
      c.push_back(op2("var" + n, {F(sh)}, [ax](TG& x) { return x[0].var({ax}, false, 0); },
                      [ax](TH& x) { return torch::var(x[0], V64{ax}, c10::optional<int64_t>(0), false); }).tol(kSum, kSum));
      c.push_back(op2("argmax" + n, {F(sh)}, [ax](TG& x) { return x[0].argmax(ax); }, [ax](TH& x) { return x[0].argmax(ax); }));
      c.push_back(op2("argmin" + n, {F(sh)}, [ax](TG& x) { return x[0].argmin(ax, true); }, [ax](TH& x) { return x[0].argmin(ax, true); }));
      c.push_back(op2("cumsum" + n, {F(sh)}, [ax](TG& x) { return x[0].cumsum(ax); }, [ax](TH& x) { return x[0].cumsum(ax); }));
      c.push_back(op2("cumprod" + n, {F(sh, 0.5, 1.5)}, [ax](TG& x) { return x[0].cumprod(ax); }, [ax](TH& x) { return x[0].cumprod(ax); }));
      c.push_back(op2("cummax" + n, {F(sh)}, [ax](TG& x) { return x[0].cummax(ax).first; }, [ax](TH& x) { return std::get<0>(x[0].cummax(ax)); }));
      c.push_back(op2("logsumexp" + n, {F(sh)}, [ax](TG& x) { return x[0].logsumexp({ax}); }, [ax](TH& x) { return x[0].logsumexp(ax); }));
      c.push_back(op2("logcumsumexp" + n, {F(sh)}, [ax](TG& x) { return x[0].logcumsumexp(ax); }, [ax](TH& x) { return x[0].logcumsumexp(ax); }));
      c.push_back(op2("softmax" + n, {F(sh)}, [ax](TG& x) { return x[0].softmax(ax); }, [ax](TH& x) { return x[0].softmax(ax); }));
      c.push_back(op2("log_softmax" + n, {F(sh)}, [ax](TG& x) { return x[0].log_softmax(ax); }, [ax](TH& x) { return x[0].log_softmax(ax); }));
      c.push_back(op2("sort" + n, {F(sh)}, [ax](TG& x) { return x[0].sort(ax).first; }, [ax](TH& x) { return std::get<0>(x[0].sort(ax)); }));
      c.push_back(op2("argsort" + n, {F(sh)}, [ax](TG& x) { return x[0].argsort(ax, true); }, [ax](TH& x) { return x[0].argsort(ax, true); }));
      c.push_back(op2("topk1" + n, {F(sh)}, [ax](TG& x) { return x[0].topk(1, ax).first; }, [ax](TH& x) { return std::get<0>(x[0].topk(1, ax)); }));
      c.push_back(op2("any" + n, {B(sh)}, [ax](TG& x) { return x[0].any({ax}); }, [ax](TH& x) { return x[0].any(ax); }));
      c.push_back(op2("all" + n, {B(sh)}, [ax](TG& x) { return x[0].all({ax}); }, [ax](TH& x) { return x[0].all(ax); }));
    }
  }
  c.push_back(op2("topk_smallest_dim0", {F({6, 3})}, [](TG& x) { return x[0].topk(2, 0, false).first; },
                  [](TH& x) { return std::get<0>(x[0].topk(2, 0, false)); }));
  return c;
}

// ================================================================ nn functional

std::vector<Case> nn_cases() {
  std::vector<Case> c;
  // conv2d: stride, padding (int, per-dim, same, valid), dilation, groups, padding modes, bias
  c.push_back(op2("conv2d_basic", {F({2, 3, 7, 6}), F({4, 3, 3, 3}), F({4})}, [](TG& x) { return x[0].conv2d(x[1], x[2]); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2]); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_stride_pad", {F({2, 3, 7, 6}), F({4, 3, 3, 2})}, [](TG& x) { return x[0].conv2d(x[1], {}, 2, 1); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 2, 1); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_tuple_args", {F({1, 2, 8, 7}), F({3, 2, 3, 3})}, [](TG& x) { return x[0].conv2d(x[1], {}, {2, 1}, {1, 2}, {1, 2}); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, {2, 1}, {1, 2}, {1, 2}); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_groups", {F({2, 4, 5, 5}), F({6, 2, 3, 3}), F({6})}, [](TG& x) { return x[0].conv2d(x[1], x[2], 1, 1, 1, 2); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 1, 1, 1, 2); }).tol(kSum, kSum));
  // Winograd F(4x4, 3x3) and F(4x4, 5x5) (WINO=1): padding 0/1/2, outputs not a multiple of the tile, 1-32 channels,
  // groups, bias, asymmetric and negative padding, an unbatched input; the gradients come from autograd through the
  // transforms
  for (int64_t p : {0, 1, 2}) {
    c.push_back(op2("conv2d_wino3_pad" + std::to_string(p), {F({2, 3, 7, 9}), F({4, 3, 3, 3})}, wino([p](TG& x) { return x[0].conv2d(x[1], {}, 1, p); }),
                    [p](TH& x) { return torch::conv2d(x[0], x[1], {}, 1, p); }).tol(kWino3, kWino3));
    c.push_back(op2("conv2d_wino5_pad" + std::to_string(p), {F({2, 3, 9, 11}), F({4, 3, 5, 5})}, wino([p](TG& x) { return x[0].conv2d(x[1], {}, 1, p); }),
                    [p](TH& x) { return torch::conv2d(x[0], x[1], {}, 1, p); }).tol(kWino5, kWino5));
  }
  c.push_back(op2("conv2d_wino3_wide_bias", {F({2, 16, 10, 11}), F({8, 16, 3, 3}), F({8})}, wino([](TG& x) { return x[0].conv2d(x[1], x[2], 1, 1); }),
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 1, 1); }).tol(kWino3, kWino3));
  c.push_back(op2("conv2d_wino5_wide", {F({2, 32, 12, 13}), F({8, 32, 5, 5})}, wino([](TG& x) { return x[0].conv2d(x[1], {}, 1, 2); }),
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 1, 2); }).tol(kWino5, kWino5));
  c.push_back(op2("conv2d_wino5_one_channel", {F({3, 1, 8, 8}), F({5, 1, 5, 5}), F({5})}, wino([](TG& x) { return x[0].conv2d(x[1], x[2]); }),
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2]); }).tol(kWino5, kWino5));
  c.push_back(op2("conv2d_wino3_groups", {F({2, 4, 8, 7}), F({6, 2, 3, 3}), F({6})}, wino([](TG& x) { return x[0].conv2d(x[1], x[2], 1, 1, 1, 2); }),
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 1, 1, 1, 2); }).tol(kWino3, kWino3));
  c.push_back(op2("conv2d_wino3_asym_pad", {F({1, 3, 6, 9}), F({2, 3, 3, 3})}, wino([](TG& x) { return x[0].conv2d(x[1], {}, 1, std::vector<int64_t>{2, 0, 1, -1}); }),
                  [](TH& x) { return torch::conv2d(F_::pad(x[0], F_::PadFuncOptions({1, -1, 2, 0})), x[1]); }).tol(kWino3, kWino3));
  c.push_back(op2("conv2d_wino5_unbatched", {F({3, 6, 7}), F({2, 3, 5, 5})}, wino([](TG& x) { return x[0].conv2d(x[1], {}, 1, 1); }),
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 1, 1); }).tol(kWino5, kWino5));
  // 16 input channels or more: the weight gradient is summed from channels-last copies (ops_nn.cpp)
  // one weight in two convolutions (stride 1 and 2): its gradient is the sum of both (issue 16: the hand-written
  // backward that preceded pm_gradient's rules gave 62 of 64 values wrong here)
  c.push_back(op2("conv2d_shared_weight", {F({2, 3, 7, 6}), F({2, 3, 9, 7}), F({4, 3, 3, 3})},
                  [](TG& x) { return x[0].conv2d(x[2]) + x[1].conv2d(x[2], {}, 2, 1); },
                  [](TH& x) { return torch::conv2d(x[0], x[2]) + torch::conv2d(x[1], x[2], {}, 2, 1); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_wide_cin", {F({2, 16, 9, 8}), F({5, 16, 3, 3}), F({5})}, [](TG& x) { return x[0].conv2d(x[1], x[2], 1, 1); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 1, 1); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_wide_cin_strided", {F({2, 17, 11, 10}), F({4, 17, 3, 2})}, [](TG& x) { return x[0].conv2d(x[1], {}, 2, {1, 0}, {1, 2}); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 2, {1, 0}, {1, 2}); }).tol(kSum, kSum));
  // 16+ channels on both sides: the forward, the transposed convolution of the input gradient and the weight
  // gradient all take the channels-last paths (a 3-d one too)
  c.push_back(op2("conv2d_wide_both", {F({2, 16, 7, 6}), F({18, 16, 3, 3}), F({18})}, [](TG& x) { return x[0].conv2d(x[1], x[2], 1, 1); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 1, 1); }).tol(kSum, kSum));
  c.push_back(op2("conv_transpose2d_wide", {F({2, 16, 4, 5}), F({16, 17, 3, 3})}, [](TG& x) { return x[0].conv_transpose2d(x[1], {}, 2, 1, 1); },
                  [](TH& x) { return torch::conv_transpose2d(x[0], x[1], {}, 2, 1, 1); }).tol(kSum, kSum));
  c.push_back(op2("conv3d_wide", {F({1, 16, 4, 5, 4}), F({16, 16, 2, 3, 2})}, [](TG& x) { return x[0].conv3d(x[1], {}, 1, {1, 0, 1}); },
                  [](TH& x) { return torch::conv3d(x[0], x[1], {}, 1, {1, 0, 1}); }).tol(kSum, kSum));
  c.push_back(op2("conv1d_wide_cin", {F({3, 20, 12}), F({6, 20, 3})}, [](TG& x) { return x[0].conv1d(x[1], {}, 1, 2); },
                  [](TH& x) { return torch::conv1d(x[0], x[1], {}, 1, 2); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_depthwise", {F({1, 3, 5, 6}), F({3, 1, 3, 3})}, [](TG& x) { return x[0].conv2d(x[1], {}, 1, 0, 1, 3); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 1, at::IntArrayRef{0}, 1, 3); }).tol(kSum, kSum));
  // 16+ channels: the channels-last depthwise convolution (one input channel per group; with 2 outputs per group
  // too), and a 3-channel stem with 16 outputs (the channels-last matmul over 27 taps)
  c.push_back(op2("conv2d_depthwise_wide", {F({2, 16, 7, 6}), F({16, 1, 3, 3}), F({16})}, [](TG& x) { return x[0].conv2d(x[1], x[2], 1, 1, 1, 16); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 1, 1, 1, 16); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_depthwise_mult_strided", {F({1, 8, 9, 7}), F({16, 1, 5, 5})}, [](TG& x) { return x[0].conv2d(x[1], {}, 2, 2, 1, 8); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 2, 2, 1, 8); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_stem_wide_cout", {F({2, 3, 9, 8}), F({16, 3, 3, 3}), F({16})}, [](TG& x) { return x[0].conv2d(x[1], x[2], 2, 1); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 2, 1); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_same", {F({1, 2, 6, 5}), F({3, 2, 4, 3})}, [](TG& x) { return x[0].conv2d(x[1], {}, 1, "same", {2, 1}); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 1, "same", {2, 1}); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_valid", {F({1, 2, 6, 5}), F({3, 2, 2, 2})}, [](TG& x) { return x[0].conv2d(x[1], {}, 1, "valid"); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 1, "valid"); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_1x1", {F({2, 5, 3, 3}), F({2, 5, 1, 1})}, [](TG& x) { return x[0].conv2d(x[1]); },
                  [](TH& x) { return torch::conv2d(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_unbatched", {F({2, 5, 4}), F({3, 2, 2, 2})}, [](TG& x) { return x[0].conv2d(x[1]); },
                  [](TH& x) { return torch::conv2d(x[0], x[1]); }).tol(kSum, kSum));
  for (std::string mode : {"reflect", "replicate", "circular"})
    c.push_back(op2("conv2d_pad_" + mode, {F({1, 2, 5, 6}), F({3, 2, 3, 3})}, [mode](TG& x) { return x[0].conv2d(x[1], {}, 1, {1, 2}, 1, 1, mode); },
                    [mode](TH& x) {
                      auto o = F_::PadFuncOptions({2, 2, 1, 1});
                      if (mode == "reflect") o.mode(torch::kReflect);
                      if (mode == "replicate") o.mode(torch::kReplicate);
                      if (mode == "circular") o.mode(torch::kCircular);
                      return torch::conv2d(F_::pad(x[0], o), x[1]);
                    }).tol(kSum, kSum));
  c.push_back(op2("conv1d", {F({2, 3, 9}), F({4, 3, 3}), F({4})}, [](TG& x) { return x[0].conv1d(x[1], x[2], 2, 1, 2); },
                  [](TH& x) { return torch::conv1d(x[0], x[1], x[2], 2, 1, 2); }).tol(kSum, kSum));
  c.push_back(op2("conv1d_groups_same", {F({1, 4, 7}), F({4, 2, 4})}, [](TG& x) { return x[0].conv1d(x[1], {}, 1, "same", 1, 2); },
                  [](TH& x) { return torch::conv1d(x[0], x[1], {}, 1, "same", 1, 2); }).tol(kSum, kSum));
  c.push_back(op2("conv3d", {F({1, 2, 4, 5, 4}), F({3, 2, 2, 3, 2}), F({3})}, [](TG& x) { return x[0].conv3d(x[1], x[2], {1, 2, 1}, 1); },
                  [](TH& x) { return torch::conv3d(x[0], x[1], x[2], {1, 2, 1}, 1); }).tol(kSum, kSum));
  c.push_back(op2("conv_transpose2d", {F({2, 3, 4, 5}), F({3, 2, 3, 3}), F({2})}, [](TG& x) { return x[0].conv_transpose2d(x[1], x[2]); },
                  [](TH& x) { return torch::conv_transpose2d(x[0], x[1], x[2]); }).tol(kSum, kSum));
  c.push_back(op2("conv_transpose2d_stride", {F({1, 2, 3, 4}), F({2, 3, 3, 2})},
                  [](TG& x) { return x[0].conv_transpose2d(x[1], {}, {2, 3}, {1, 0}, {1, 2}); },
                  [](TH& x) { return torch::conv_transpose2d(x[0], x[1], {}, {2, 3}, {1, 0}, {1, 2}); }).tol(kSum, kSum));
  c.push_back(op2("conv_transpose2d_groups_dil", {F({1, 4, 3, 3}), F({4, 1, 2, 3}), F({2})},
                  [](TG& x) { return x[0].conv_transpose2d(x[1], x[2], 2, 1, 0, 2, 2); },
                  [](TH& x) { return torch::conv_transpose2d(x[0], x[1], x[2], 2, 1, 0, 2, 2); }).tol(kSum, kSum));
  // stride equal to the kernel, no padding: a matmul and a pixel shuffle (an FPN's 2x2 upsampling)
  c.push_back(op2("conv_transpose2d_kernel_stride", {F({2, 16, 5, 6}), F({16, 8, 2, 2}), F({8})},
                  [](TG& x) { return x[0].conv_transpose2d(x[1], x[2], 2); },
                  [](TH& x) { return torch::conv_transpose2d(x[0], x[1], x[2], 2); }).tol(kSum, kSum));
  c.push_back(op2("conv_transpose1d_kernel_stride", {F({2, 3, 5}), F({3, 4, 3})}, [](TG& x) { return x[0].conv_transpose1d(x[1], {}, 3); },
                  [](TH& x) { return torch::conv_transpose1d(x[0], x[1], {}, 3); }).tol(kSum, kSum));
  c.push_back(op2("conv_transpose1d", {F({2, 3, 5}), F({3, 4, 3})}, [](TG& x) { return x[0].conv_transpose1d(x[1], {}, 3, 2, 1); },
                  [](TH& x) { return torch::conv_transpose1d(x[0], x[1], {}, 3, 2, 1); }).tol(kSum, kSum));
  // pools
  c.push_back(op2("max_pool2d", {F({2, 3, 6, 6})}, [](TG& x) { return x[0].max_pool2d(2); }, [](TH& x) { return torch::max_pool2d(x[0], 2); }));
  c.push_back(op2("max_pool2d_stride_pad", {F({1, 2, 7, 5})}, [](TG& x) { return x[0].max_pool2d(3, 2, 1); },
                  [](TH& x) { return torch::max_pool2d(x[0], 3, 2, 1); }));
  c.push_back(op2("max_pool2d_ceil", {F({1, 2, 7, 6})}, [](TG& x) { return x[0].max_pool2d(3, 2, 0, 1, true); },
                  [](TH& x) { return torch::max_pool2d(x[0], 3, 2, 0, 1, true); }));
  c.push_back(op2("max_pool2d_ceil_pad_dil", {F({1, 1, 8, 9})}, [](TG& x) { return x[0].max_pool2d({3, 2}, {2, 3}, {1, 1}, {2, 1}, true); },
                  [](TH& x) { return torch::max_pool2d(x[0], {3, 2}, {2, 3}, {1, 1}, {2, 1}, true); }));
  c.push_back(op2("max_pool1d", {F({2, 3, 9})}, [](TG& x) { return x[0].max_pool1d(3, 2, 1); }, [](TH& x) { return torch::max_pool1d(x[0], 3, 2, 1); }));
  c.push_back(op2("max_pool2d_int", {I({1, 2, 4, 4}, -50, 50, int32)}, [](TG& x) { return x[0].max_pool2d(2); },
                  [](TH& x) { return torch::max_pool2d(x[0].to(torch::kFloat), 2).to(torch::kInt); }));
  c.push_back(op2("avg_pool2d", {F({2, 3, 6, 6})}, [](TG& x) { return x[0].avg_pool2d(2); }, [](TH& x) { return torch::avg_pool2d(x[0], 2); }));
  c.push_back(op2("avg_pool2d_pad", {F({1, 2, 7, 5})}, [](TG& x) { return x[0].avg_pool2d(3, 2, 1); },
                  [](TH& x) { return torch::avg_pool2d(x[0], 3, 2, 1); }));
  c.push_back(op2("avg_pool2d_pad_exclude", {F({1, 2, 7, 5})}, [](TG& x) { return x[0].avg_pool2d(3, 2, 1, false, false); },
                  [](TH& x) { return torch::avg_pool2d(x[0], 3, 2, 1, false, false); }));
  c.push_back(op2("avg_pool2d_ceil", {F({1, 2, 7, 6})}, [](TG& x) { return x[0].avg_pool2d({3, 2}, 2, {1, 0}, true); },
                  [](TH& x) { return torch::avg_pool2d(x[0], {3, 2}, 2, {1, 0}, true); }));
  c.push_back(op2("avg_pool2d_ceil_exclude", {F({1, 2, 7, 6})}, [](TG& x) { return x[0].avg_pool2d(3, 2, 1, true, false); },
                  [](TH& x) { return torch::avg_pool2d(x[0], 3, 2, 1, true, false); }));
  c.push_back(op2("avg_pool1d", {F({2, 3, 9})}, [](TG& x) { return x[0].avg_pool1d(4, 3, 2, true); },
                  [](TH& x) { return torch::avg_pool1d(x[0], 4, 3, 2, true); }));
  c.push_back(op2("adaptive_avg_pool2d_div", {F({2, 3, 6, 4})}, [](TG& x) { return x[0].adaptive_avg_pool2d({3, 2}); },
                  [](TH& x) { return torch::adaptive_avg_pool2d(x[0], {3, 2}); }));
  c.push_back(op2("adaptive_avg_pool2d_odd", {F({1, 2, 7, 5})}, [](TG& x) { return x[0].adaptive_avg_pool2d({3, 4}); },
                  [](TH& x) { return torch::adaptive_avg_pool2d(x[0], {3, 4}); }));
  c.push_back(op2("adaptive_avg_pool2d_1", {F({2, 3, 5, 5})}, [](TG& x) { return x[0].adaptive_avg_pool2d(1); },
                  [](TH& x) { return torch::adaptive_avg_pool2d(x[0], {1, 1}); }));
  c.push_back(op2("adaptive_max_pool2d_odd", {F({1, 2, 7, 5})}, [](TG& x) { return x[0].adaptive_max_pool2d({3, 4}); },
                  [](TH& x) { return std::get<0>(torch::adaptive_max_pool2d(x[0], {3, 4})); }));
  c.push_back(op2("adaptive_max_pool1d", {F({2, 3, 8})}, [](TG& x) { return x[0].adaptive_max_pool1d(4); },
                  [](TH& x) { return std::get<0>(torch::adaptive_max_pool1d(x[0], {4})); }));
  c.push_back(op2("adaptive_avg_pool1d_odd", {F({2, 3, 7})}, [](TG& x) { return x[0].adaptive_avg_pool1d(3); },
                  [](TH& x) { return torch::adaptive_avg_pool1d(x[0], {3}); }));
  c.push_back(op2("conv2d_mnist_like", {F({2, 1, 12, 12}), F({4, 1, 5, 5}), F({4})}, [](TG& x) { return x[0].conv2d(x[1], x[2]).relu().max_pool2d(2); },
                  [](TH& x) { return torch::max_pool2d(torch::relu(torch::conv2d(x[0], x[1], x[2])), 2); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_stride3_dil2_groups", {F({1, 4, 11, 10}), F({2, 2, 3, 2})}, [](TG& x) { return x[0].conv2d(x[1], {}, 3, {2, 1}, 2, 2); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, 3, {2, 1}, 2, 2); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_asym_pad", {F({1, 2, 5, 5}), F({3, 2, 2, 2})}, [](TG& x) { return x[0].conv2d(x[1], {}, 1, {0, 1, 1, 0}); },
                  [](TH& x) { return torch::conv2d(F_::pad(x[0], F_::PadFuncOptions({1, 0, 0, 1})), x[1]); }).tol(kSum, kSum));
  c.push_back(op2("conv3d_groups_dil", {F({1, 4, 5, 5, 5}), F({2, 2, 2, 2, 2})}, [](TG& x) { return x[0].conv3d(x[1], {}, 1, 0, 2, 2); },
                  [](TH& x) { return torch::conv3d(x[0], x[1], {}, 1, at::IntArrayRef{0}, 2, 2); }).tol(kSum, kSum));
  c.push_back(op2("conv_transpose2d_outpad_dil", {F({1, 2, 4, 3}), F({2, 3, 2, 3})},
                  [](TG& x) { return x[0].conv_transpose2d(x[1], {}, 3, 1, {2, 1}, 1, 2); },
                  [](TH& x) { return torch::conv_transpose2d(x[0], x[1], {}, 3, 1, {2, 1}, 1, 2); }).tol(kSum, kSum));
  c.push_back(op2("conv2d_k_below_stride", {F({1, 2, 8, 7}), F({3, 2, 2, 1})}, [](TG& x) { return x[0].conv2d(x[1], {}, {3, 2}, 1); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], {}, {3, 2}, 1); }).tol(kSum, kSum));
  c.push_back(op2("max_pool2d_k2_s3_ceil", {F({1, 2, 8, 7})}, [](TG& x) { return x[0].max_pool2d(2, 3, 1, 1, true); },
                  [](TH& x) { return torch::max_pool2d(x[0], 2, 3, 1, 1, true); }));
  c.push_back(op2("max_pool2d_unbatched_rect", {F({3, 7, 8})}, [](TG& x) { return x[0].max_pool2d({2, 3}, 1); },
                  [](TH& x) { return torch::max_pool2d(x[0], {2, 3}, 1); }));
  c.push_back(op2("avg_pool2d_stride1_pad", {F({1, 1, 5, 5})}, [](TG& x) { return x[0].avg_pool2d(3, 1, 1); },
                  [](TH& x) { return torch::avg_pool2d(x[0], 3, 1, 1); }));
  // norms
  c.push_back(op2("batch_norm_train", {F({4, 3, 2, 2}), F({3}), F({3})}, [](TG& x) { return x[0].batch_norm({}, {}, x[1], x[2], true); },
                  [](TH& x) { return torch::batch_norm(x[0], x[1], x[2], {}, {}, true, 0.1, 1e-5, false); }).tol(kSum, kSum));
  c.push_back(op2("batch_norm_train_2d", {F({5, 4})}, [](TG& x) { return x[0].batch_norm({}, {}, {}, {}, true); },
                  [](TH& x) { return torch::batch_norm(x[0], {}, {}, {}, {}, true, 0.1, 1e-5, false); }).tol(kSum, kSum));
  c.push_back(op2("batch_norm_eval", {F({2, 3, 4}), C({3}), C({3}, 0.5, 2), F({3}), F({3})},
                  [](TG& x) { return x[0].batch_norm(x[1], x[2], x[3], x[4], false); },
                  [](TH& x) { return torch::batch_norm(x[0], x[3], x[4], x[1], x[2], false, 0.1, 1e-5, false); }));
  c.push_back(op2("layer_norm", {F({2, 3, 4}), F({4}), F({4})}, [](TG& x) { return x[0].layer_norm({4}, x[1], x[2]); },
                  [](TH& x) { return torch::layer_norm(x[0], {4}, x[1], x[2]); }).tol(kSum, kSum));
  c.push_back(op2("layer_norm_2d", {F({2, 3, 4}), F({3, 4})}, [](TG& x) { return x[0].layer_norm({3, 4}, x[1], {}, 1e-3); },
                  [](TH& x) { return torch::layer_norm(x[0], {3, 4}, x[1], {}, 1e-3); }).tol(kSum, kSum));
  c.push_back(op2("group_norm", {F({2, 6, 3}), F({6}), F({6})}, [](TG& x) { return x[0].group_norm(3, x[1], x[2]); },
                  [](TH& x) { return torch::group_norm(x[0], 3, x[1], x[2]); }).tol(kSum, kSum));
  c.push_back(op2("group_norm_4d", {F({1, 4, 3, 2})}, [](TG& x) { return x[0].group_norm(2); },
                  [](TH& x) { return torch::group_norm(x[0], 2); }).tol(kSum, kSum));
  c.push_back(op2("rms_norm", {F({2, 3, 4}), F({4})}, [](TG& x) { return x[0].rms_norm({4}, x[1]); },
                  [](TH& x) { return x[0] * torch::rsqrt(x[0].pow(2).mean(-1, true) + 1.1920928955078125e-07) * x[1]; }).tol(kSum, kSum));
  c.push_back(op2("batch_norm_train_3d_affine", {F({3, 2, 5}), F({2}), F({2})}, [](TG& x) { return x[0].batch_norm({}, {}, x[1], x[2], true, 0.1, 1e-3); },
                  [](TH& x) { return torch::batch_norm(x[0], x[1], x[2], {}, {}, true, 0.1, 1e-3, false); }).tol(kSum, kSum));
  c.push_back(op2("layer_norm_no_affine", {F({4, 7})}, [](TG& x) { return x[0].layer_norm({7}); },
                  [](TH& x) { return torch::layer_norm(x[0], {7}); }).tol(kSum, kSum));
  c.push_back(op2("group_norm_1_and_c", {F({2, 4, 3})}, [](TG& x) { return x[0].group_norm(1) + x[0].group_norm(4); },
                  [](TH& x) { return torch::group_norm(x[0], 1) + torch::group_norm(x[0], 4); }).tol(kSum, kSum));
  c.push_back(op2("dropout_eval", {F({3, 4})}, [](TG& x) { return x[0].dropout(0.5, false); }, [](TH& x) { return torch::dropout(x[0], 0.5, false); }));
  c.push_back(op2("dropout_p0", {F({3, 4})}, [](TG& x) { return x[0].dropout(0.0, true); }, [](TH& x) { return torch::dropout(x[0], 0.0, true); }));
  // attention: softmax(q k^T / sqrt(E) + mask) v, written out for torch 1.13 (no F.scaled_dot_product_attention)
  auto sdpa_ref = [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor mask, bool causal) {
    auto s = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
    if (causal) mask = torch::ones({q.size(-2), k.size(-2)}, torch::kBool).tril();
    if (mask.defined()) s = mask.scalar_type() == torch::kBool ? s.masked_fill(mask.logical_not(), -INFINITY) : s + mask;
    return s.softmax(-1).matmul(v);
  };
  c.push_back(op2("sdpa", {F({2, 3, 4}), F({2, 5, 4}), F({2, 5, 6})}, [](TG& x) { return x[0].scaled_dot_product_attention(x[1], x[2]); },
                  [sdpa_ref](TH& x) { return sdpa_ref(x[0], x[1], x[2], {}, false); }).tol(kSum, kSum));
  c.push_back(op2("sdpa_causal", {F({1, 2, 4, 3}), F({1, 2, 4, 3}), F({1, 2, 4, 3})},
                  [](TG& x) { return x[0].scaled_dot_product_attention(x[1], x[2], {}, 0.0, true); },
                  [sdpa_ref](TH& x) { return sdpa_ref(x[0], x[1], x[2], {}, true); }).tol(kSum, kSum));
  c.push_back(op2("sdpa_bool_mask", {F({2, 3, 4}), F({2, 5, 4}), F({2, 5, 2}),
                                     V({3, 5}, bool_, [](const tg::Shape&, std::mt19937& g) { std::vector<double> v; for (int i = 0; i < 15; i++) v.push_back(i % 5 == 0 ? 1 : double(g() & 1)); return v; })},
                  [](TG& x) { return x[0].scaled_dot_product_attention(x[1], x[2], x[3]); },
                  [sdpa_ref](TH& x) { return sdpa_ref(x[0], x[1], x[2], x[3], false); }).tol(kSum, kSum));
  c.push_back(op2("sdpa_float_mask", {F({2, 3, 4}), F({2, 5, 4}), F({2, 5, 2}), F({2, 1, 5})},
                  [](TG& x) { return x[0].scaled_dot_product_attention(x[1], x[2], x[3]); },
                  [sdpa_ref](TH& x) { return sdpa_ref(x[0], x[1], x[2], x[3], false); }).tol(kSum, kSum));
  c.push_back(op2("embedding", {I({2, 3}, 0, 4), F({5, 3})}, [](TG& x) { return tg::embedding(x[0], x[1]); },
                  [](TH& x) { return torch::embedding(x[1], x[0]); }));
  // interpolate
  auto interp = [](std::vector<int64_t> size, torch::nn::functional::InterpolateFuncOptions::mode_t mode, std::optional<bool> ac) {
    return [=](TH& x) {
      auto o = F_::InterpolateFuncOptions().size(size).mode(mode);
      if (ac) o.align_corners(*ac);
      return F_::interpolate(x[0], o);
    };
  };
  c.push_back(op2("interpolate_nearest", {F({1, 2, 3, 4})}, [](TG& x) { return x[0].interpolate({5, 7}); },
                  interp({5, 7}, torch::kNearest, std::nullopt)));
  c.push_back(op2("interpolate_nearest_down", {F({1, 2, 7, 5})}, [](TG& x) { return x[0].interpolate({3, 2}); },
                  interp({3, 2}, torch::kNearest, std::nullopt)));
  c.push_back(op2("interpolate_bilinear", {F({1, 2, 3, 4})}, [](TG& x) { return x[0].interpolate({5, 7}, "bilinear"); },
                  interp({5, 7}, torch::kBilinear, false)));
  c.push_back(op2("interpolate_bilinear_ac", {F({2, 1, 4, 3})}, [](TG& x) { return x[0].interpolate({7, 5}, "bilinear", true); },
                  interp({7, 5}, torch::kBilinear, true)));
  c.push_back(op2("interpolate_nearest_1d_up2", {F({2, 3, 4})}, [](TG& x) { return x[0].interpolate({8}); },
                  interp({8}, torch::kNearest, std::nullopt)));
  c.push_back(op2("interpolate_nearest_3d", {F({1, 1, 2, 3, 4})}, [](TG& x) { return x[0].interpolate({3, 5, 2}); },
                  interp({3, 5, 2}, torch::kNearest, std::nullopt)));
  c.push_back(op2("interpolate_trilinear", {F({1, 1, 2, 3, 4})}, [](TG& x) { return x[0].interpolate({3, 5, 2}, "trilinear"); },
                  interp({3, 5, 2}, torch::kTrilinear, false)));
  c.push_back(op2("interpolate_linear_ac", {F({1, 2, 5})}, [](TG& x) { return x[0].interpolate({9}, "linear", true); },
                  interp({9}, torch::kLinear, true)));
  c.push_back(op2("interpolate_linear_down", {F({2, 3, 9})}, [](TG& x) { return x[0].interpolate({4}, "linear"); },
                  interp({4}, torch::kLinear, false)));
  return c;
}

std::vector<Case> big_cases() {
  std::vector<Case> c;
  c.push_back(op2("big_conv2d", {F({4, 3, 28, 28}), F({8, 3, 5, 5}), F({8})}, [](TG& x) { return x[0].conv2d(x[1], x[2], 1, 2); },
                  [](TH& x) { return torch::conv2d(x[0], x[1], x[2], 1, 2); }).tol(kSum, kSum));
  c.push_back(op2("big_maxpool", {F({4, 8, 28, 28})}, [](TG& x) { return x[0].max_pool2d(2); }, [](TH& x) { return torch::max_pool2d(x[0], 2); }));
  c.push_back(op("big_matmul", {F({64, 128}), F({128, 96})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op2("big_sort", {F({3, 200})}, [](TG& x) { return x[0].sort(1).first; }, [](TH& x) { return std::get<0>(x[0].sort(1)); }));
  c.push_back(op2("big_cumsum", {F({2, 3000})}, [](TG& x) { return x[0].cumsum(1); }, [](TH& x) { return x[0].cumsum(1); }).tol(1e-4, 1e-4));
  c.push_back(op2("big_softmax", {F({16, 1000})}, [](TG& x) { return x[0].softmax(1); }, [](TH& x) { return x[0].softmax(1); }));
  c.push_back(op2("big_ce", {F({64, 10}), I({64}, 0, 9)}, [](TG& x) { return x[0].cross_entropy(x[1]); }, [](TH& x) { return torch::cross_entropy_loss(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("big_bn", {F({16, 8, 14, 14})}, [](TG& x) { return x[0].batch_norm({}, {}, {}, {}, true); },
                  [](TH& x) { return torch::batch_norm(x[0], {}, {}, {}, {}, true, 0.1, 1e-5, false); }).tol(kSum, kSum));
  c.push_back(op2("big_embedding", {I({4, 7}, 0, 499), F({500, 16})}, [](TG& x) { return tg::embedding(x[0], x[1]); }, [](TH& x) { return torch::embedding(x[1], x[0]); }));
  c.push_back(op2("big_bilinear", {F({1, 3, 16, 16})}, [](TG& x) { return x[0].interpolate({33, 21}, "bilinear"); },
                  [](TH& x) { return F_::interpolate(x[0], F_::InterpolateFuncOptions().size(std::vector<int64_t>{33, 21}).mode(torch::kBilinear).align_corners(false)); }));
  return c;
}

// ================================================================ losses and linear algebra

std::vector<Case> loss_linalg_cases() {
  std::vector<Case> c;
  // matmul in all torch shapes
  c.push_back(op("matmul_2d", {F({3, 4}), F({4, 5})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_vec_vec", {F({6}), F({6})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_mat_vec", {F({3, 4}), F({4})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_vec_mat", {F({4}), F({4, 3})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_batched", {F({2, 3, 4}), F({2, 4, 5})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_broadcast", {F({2, 1, 3, 4}), F({3, 4, 2})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_batch_vec", {F({2, 3, 4}), F({4})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_vec_batch", {F({4}), F({2, 4, 3})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_int", {I({3, 4}, -5, 5), I({4, 2}, -5, 5)}, [](auto& x) { return x[0].matmul(x[1]); }));
  c.push_back(op("matmul_size1", {F({1, 4}), F({4, 1})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_bcast_both", {F({3, 1, 2, 5}), F({1, 4, 5, 3})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(kSum, kSum));
  c.push_back(op("matmul_f64", {D({3, 7}), D({7, 2})}, [](auto& x) { return x[0].matmul(x[1]); }).tol(1e-12, 1e-13));
  c.push_back(op("dot", {F({7}), F({7})}, [](auto& x) { return x[0].dot(x[1]); }).tol(kSum, kSum));
  c.push_back(op2("linear", {F({2, 3, 4}), F({5, 4}), F({5})}, [](TG& x) { return x[0].linear(x[1], x[2]); },
                  [](TH& x) { return torch::linear(x[0], x[1], x[2]); }).tol(kSum, kSum));
  auto es = [](std::string f) {
    return std::make_pair([f](TG& x) { return tg::einsum(f, x); }, [f](TH& x) { return torch::einsum(f, x); });
  };
  struct E {
    std::string f;
    std::vector<In> ins;
  };
  for (auto& e : std::vector<E>{{"ij,jk->ik", {F({3, 4}), F({4, 2})}},
                                {"bij,bjk->bik", {F({2, 3, 4}), F({2, 4, 2})}},
                                {"ij->ji", {F({3, 4})}},
                                {"ii->i", {F({4, 4})}},
                                {"ii", {F({3, 3})}},
                                {"iij->j", {F({3, 3, 2})}},
                                {"i,j->ij", {F({3}), F({4})}},
                                {"ij,ij->", {F({3, 4}), F({3, 4})}},
                                {"bhqd,bhkd->bhqk", {F({1, 2, 3, 4}), F({1, 2, 5, 4})}},
                                {"...ij,...jk", {F({2, 3, 4}), F({4, 5})}},
                                {"b...,b->...", {F({2, 3, 4}), F({2})}},
                                {"ij,jk,kl->il", {F({2, 3}), F({3, 4}), F({4, 2})}},
                                {"ij,j", {F({3, 4}), F({4})}},
                                {"bii->b", {F({2, 3, 3})}},
                                {"i,i->", {F({5}), F({5})}},
                                {"bn,anm,bm->ba", {F({2, 3}), F({4, 3, 5}), F({2, 5})}},
                                {"ij,kj->ikj", {F({3, 1}), F({2, 4})}}}) {
    auto [ft, fh] = es(e.f);
    c.push_back(op2("einsum " + e.f, e.ins, ft, fh).tol(kSum, kSum));
  }
  // cross entropy family
  using R = at::Reduction::Reduction;
  auto red = [](const std::string& r) -> int64_t { return r == "mean" ? R::Mean : r == "sum" ? R::Sum : R::None; };
  for (std::string r : {"mean", "sum", "none"}) {
    c.push_back(op2("cross_entropy_" + r, {F({4, 5}, -3, 3), I({4}, 0, 4)}, [r](TG& x) { return x[0].cross_entropy(x[1], r); },
                    [r, red](TH& x) { return torch::cross_entropy_loss(x[0], x[1], {}, red(r)); }).tol(kSum, kSum));
  }
  c.push_back(op2("cross_entropy_smooth_ignore", {F({6, 4}, -3, 3), I({6}, -1, 3)},
                  [](TG& x) { return x[0].cross_entropy(x[1], "mean", 0.2, -1); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1], {}, R::Mean, -1, 0.2); }).tol(kSum, kSum));
  c.push_back(op2("cross_entropy_weight", {F({5, 3}, -3, 3), I({5}, 0, 2), C({3}, 0.5, 2)},
                  [](TG& x) { return x[0].cross_entropy(x[1], "mean", 0.1, -100, x[2]); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1], x[2], R::Mean, -100, 0.1); }).tol(kSum, kSum));
  c.push_back(op2("cross_entropy_spatial", {F({2, 3, 4, 2}, -3, 3), I({2, 4, 2}, 0, 2)},
                  [](TG& x) { return x[0].cross_entropy(x[1]); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("cross_entropy_1d", {F({5}, -3, 3), I({}, 0, 4)}, [](TG& x) { return x[0].cross_entropy(x[1]); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("cross_entropy_probs", {F({4, 5}, -3, 3), C({4, 5}, 0, 1)}, [](TG& x) { return x[0].cross_entropy(x[1], "mean", 0.1); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1], {}, R::Mean, -100, 0.1); }).tol(kSum, kSum));
  c.push_back(op2("cross_entropy_probs_sum", {F({4, 5}, -3, 3), C({4, 5}, 0, 1)}, [](TG& x) { return x[0].cross_entropy(x[1], "sum"); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1], {}, R::Sum); }).tol(kSum, kSum));
  c.push_back(op2("cross_entropy_smooth_none_ignore", {F({5, 4}, -3, 3), I({5}, 0, 3)},
                  [](TG& x) { return x[0].cross_entropy(x[1], "none", 0.3, 2); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1], {}, R::None, 2, 0.3); }).tol(kSum, kSum));
  c.push_back(op2("cross_entropy_spatial_weight_smooth", {F({2, 3, 4}, -3, 3), I({2, 4}, 0, 2), C({3}, 0.5, 2)},
                  [](TG& x) { return x[0].cross_entropy(x[1], "mean", 0.1, 1, x[2]); },
                  [](TH& x) { return torch::cross_entropy_loss(x[0], x[1], x[2], R::Mean, 1, 0.1); }).tol(kSum, kSum));
  c.push_back(op2("nll_loss_1d", {F({5}, -3, 0), I({}, 0, 4)}, [](TG& x) { return x[0].nll_loss(x[1]); },
                  [](TH& x) { return torch::nll_loss(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("nll_loss", {F({4, 5}, -3, 0), I({4}, 0, 4)}, [](TG& x) { return x[0].nll_loss(x[1]); },
                  [](TH& x) { return torch::nll_loss(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("nll_loss_weight_ignore", {F({6, 3}, -3, 0), I({6}, 0, 2), C({3}, 0.5, 2)},
                  [](TG& x) { return x[0].nll_loss(x[1], x[2], 1, "sum"); },
                  [](TH& x) { return torch::nll_loss(x[0], x[1], x[2], R::Sum, 1); }).tol(kSum, kSum));
  c.push_back(op2("nll_loss_spatial_none", {F({2, 3, 4}, -3, 0), I({2, 4}, 0, 2)},
                  [](TG& x) { return x[0].nll_loss(x[1], {}, -100, "none"); },
                  [](TH& x) { return torch::nll_loss2d(x[0].unsqueeze(-1), x[1].unsqueeze(-1), {}, R::None).squeeze(-1); }).tol(kSum, kSum));
  c.push_back(op2("sparse_categorical_crossentropy", {F({3, 2, 5}, -3, 3), I({3, 2}, -1, 4)},
                  [](TG& x) { return x[0].sparse_categorical_crossentropy(x[1], -1, 0.1); },
                  [](TH& x) {
                    auto lp = x[0].log_softmax(-1), valid = x[1].ne(-1).to(torch::kFloat);
                    auto tgt = torch::where(x[1].ne(-1), x[1], torch::zeros_like(x[1]));
                    auto picked = lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1);
                    auto loss = -(picked * 0.9 + lp.mean(-1) * 0.1) * valid;
                    return loss.sum() / valid.sum();
                  }).tol(kSum, kSum));
  c.push_back(op2("binary_crossentropy", {F({3, 4}, 0.02, 0.98), C({3, 4}, 0, 1)}, [](TG& x) { return x[0].binary_crossentropy(x[1]); },
                  [](TH& x) { return torch::binary_cross_entropy(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("binary_crossentropy_none", {F({5}, 0.02, 0.98), C({5}, 0, 1)}, [](TG& x) { return x[0].binary_crossentropy(x[1], "none"); },
                  [](TH& x) { return torch::binary_cross_entropy(x[0], x[1], {}, R::None); }).tol(kSum, kSum));
  c.push_back(op2("bce_with_logits", {F({3, 4}, -6, 6), C({3, 4}, 0, 1)}, [](TG& x) { return x[0].binary_crossentropy_with_logits(x[1]); },
                  [](TH& x) { return torch::binary_cross_entropy_with_logits(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("bce_with_logits_pos_weight", {F({3, 4}, -6, 6), C({3, 4}, 0, 1), C({4}, 0.5, 3)},
                  [](TG& x) { return x[0].binary_crossentropy_with_logits(x[1], "sum", x[2]); },
                  [](TH& x) { return torch::binary_cross_entropy_with_logits(x[0], x[1], {}, x[2], R::Sum); }).tol(kSum, kSum));
  for (std::string r : {"mean", "sum", "none"}) {
    c.push_back(op2("mse_" + r, {F({3, 4}), F({3, 4})}, [r](TG& x) { return x[0].mse_loss(x[1], r); },
                    [r, red](TH& x) { return torch::mse_loss(x[0], x[1], red(r)); }).tol(kSum, kSum));
    c.push_back(op2("l1_" + r, {F({3, 4}), F({3, 4})}, [r](TG& x) { return x[0].l1_loss(x[1], r); },
                    [r, red](TH& x) { return torch::l1_loss(x[0], x[1], red(r)); }).tol(kSum, kSum));
  }
  c.push_back(op2("smooth_l1", {F({3, 4}), F({3, 4})}, [](TG& x) { return x[0].smooth_l1_loss(x[1]); },
                  [](TH& x) { return torch::smooth_l1_loss(x[0], x[1]); }).tol(kSum, kSum));
  c.push_back(op2("smooth_l1_beta", {F({3, 4}), F({3, 4})}, [](TG& x) { return x[0].smooth_l1_loss(x[1], "sum", 0.5); },
                  [](TH& x) { return torch::smooth_l1_loss(x[0], x[1], R::Sum, 0.5); }).tol(kSum, kSum));
  return c;
}

}  // namespace tt
