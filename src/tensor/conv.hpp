#pragma once
// The convolution's window product, shared by Tensor::conv and the layout stage's rule for its input gradient.
#include "ops_util.hpp"
#include "tg/device.hpp"

namespace tg::detail {

/** The convolution of a window view x (N, C, *o, *k) (pool_windows) with w (Cout, C / groups, *k): (N, Cout, *o), the
 *  product (N, G, Cout/G, *o, C/G, *k) summed over (C/G, *k). Tensor::conv builds it; the layout stage rebuilds its
 *  input gradient to recognise it. */
Tensor window_conv(const Tensor& x, const Tensor& w, int64_t groups);

/** The output tile m of the Winograd F(m x m, r x r) conv2d_winograd uses for an r x r kernel; 0 where it has none. */
int64_t winograd_tile(int64_t r);

/** Whether conv2d_winograd is expected to be faster than the direct convolution on a CPU of the machine model mm:
 *  a batch of `batch` images of cin channels, cout output channels in `groups` groups, an r x r kernel (stride 1,
 *  dilation 1) and out[0] x out[1] outputs an image, its forward and (`backward`) its gradients; its
 *  multiplications, the elements its passes move and the kernels it adds against the direct convolution's
 *  multiplications (winograd.cpp says how). */
bool winograd_pays(int64_t batch, int64_t cin, int64_t cout, int64_t groups, int64_t r, const int64_t out[2],
                   bool backward, const MachineModel& mm);

/** conv2d (stride 1, dilation 1) of x (N, C, H, W) with w (Cout, C / groups, r, r), r with a winograd_tile, and
 *  explicit (begin, end) pads (negative: a crop) by Winograd's minimal filtering in tensor ops: the input and weight
 *  transforms, a^2 batched matmuls over C / groups, the output transform. Shapes are checked by the caller. */
Tensor conv2d_winograd(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
                       const std::vector<std::pair<int64_t, int64_t>>& pads, int64_t groups);

}  // namespace tg::detail
