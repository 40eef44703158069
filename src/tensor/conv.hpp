#pragma once
// The convolution's window product, shared by Tensor::conv and the layout stage's rule for its input gradient.
#include "ops_util.hpp"

namespace tg::detail {

/** The convolution of a window view x (N, C, *o, *k) (pool_windows) with w (Cout, C / groups, *k): (N, Cout, *o), the
 *  product (N, G, Cout/G, *o, C/G, *k) summed over (C/G, *k). Tensor::conv builds it; the layout stage rebuilds its
 *  input gradient to recognise it. */
Tensor window_conv(const Tensor& x, const Tensor& w, int64_t groups);

}  // namespace tg::detail
