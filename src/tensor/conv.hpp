#pragma once
// The convolution's window product, shared by Tensor::conv and the layout stage's rule for its input gradient.
#include "ops_util.hpp"

namespace tg::detail {

/** The convolution of a window view x (N, C, *o, *k) (pool_windows) with w (Cout, C / groups, *k): (N, Cout, *o), the
 *  product (N, G, Cout/G, *o, C/G, *k) summed over (C/G, *k). Tensor::conv builds it; the layout stage rebuilds its
 *  input gradient to recognise it. */
Tensor window_conv(const Tensor& x, const Tensor& w, int64_t groups);

/** The output tile m of the Winograd F(m x m, r x r) conv2d_winograd uses for an r x r kernel; 0 where it has none. */
int64_t winograd_tile(int64_t r);

/** conv2d (stride 1, dilation 1) of x (N, C, H, W) with w (Cout, C / groups, r, r), r with a winograd_tile, and
 *  explicit (begin, end) pads (negative: a crop) by Winograd's minimal filtering in tensor ops: the input and weight
 *  transforms, a^2 batched matmuls over C / groups, the output transform. Shapes are checked by the caller. */
Tensor conv2d_winograd(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
                       const std::vector<std::pair<int64_t, int64_t>>& pads, int64_t groups);

}  // namespace tg::detail
