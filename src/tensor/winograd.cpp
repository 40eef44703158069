// Winograd minimal filtering F(m x m, r x r) for stride-1, dilation-1 2-d convolutions (Lavin & Gray, "Fast
// Algorithms for Convolutional Neural Networks", arXiv 1509.09308), written with tensor ops as tinygrad's
// _conv2d_winograd, so autograd differentiates the transforms and the backward runs in the Winograd domain too.
// Each m x m output tile costs (m + r - 1)^2 multiplications per input channel instead of m^2 r^2: F(4x4, 3x3)
// 36 against 144, F(4x4, 5x5) 64 against 400.
#include <cmath>

#include "conv.hpp"

namespace tg::detail {
namespace {

using Mat = std::vector<std::vector<double>>;

// The transforms of F(m, r) from the Toom-Cook points 0, 1, -1, 2, -2, 1/2, -1/2, ... and infinity: the filter y
// = A^T [(G g) . (B^T d)] is the transpose of the linear convolution s = g * h evaluated at the points (E_r g,
// E_m h) and interpolated (E_a^-1): A^T = E_m^T, G = E_r, B^T = E_a^-T, each row j of B^T scaled by prod_{l != j}
// (p_j - p_l) and G's row divided by it (integer-ish B^T, as Lavin's tables: F(4, 3) gives tinygrad's matrices).
struct WinoMats {
  Mat at, g, bt;  // m x a, a x r, a x a
};

WinoMats wino_mats(int64_t m, int64_t r) {
  const double pts_all[] = {0, 1, -1, 2, -2, 0.5, -0.5, 3, -3};
  size_t a = size_t(m + r - 1);
  if (a - 1 > std::size(pts_all))
    throw Error("[conv2d] no Winograd points for F(" + std::to_string(m) + ", " + std::to_string(r) + ")");
  std::vector<double> p(pts_all, pts_all + a - 1);
  auto eval = [&](size_t n) {  // a x n: row j the powers of p_j, the last row (infinity) picks the leading coefficient
    Mat e(a, std::vector<double>(n, 0));
    for (size_t j = 0; j + 1 < a; j++)
      for (size_t k = 0; k < n; k++) e[j][k] = std::pow(p[j], double(k));
    e[a - 1][n - 1] = 1;
    return e;
  };
  // E_a^-1 by Gauss-Jordan with partial pivoting (a <= 10; the points keep it well conditioned)
  Mat e = eval(a), inv(a, std::vector<double>(a, 0));
  for (size_t i = 0; i < a; i++) inv[i][i] = 1;
  for (size_t c = 0; c < a; c++) {
    size_t piv = c;
    for (size_t i = c + 1; i < a; i++)
      if (std::abs(e[i][c]) > std::abs(e[piv][c])) piv = i;
    std::swap(e[c], e[piv]), std::swap(inv[c], inv[piv]);
    double d = e[c][c];
    for (size_t k = 0; k < a; k++) e[c][k] /= d, inv[c][k] /= d;
    for (size_t i = 0; i < a; i++)
      if (i != c && e[i][c] != 0) {
        double f = e[i][c];
        for (size_t k = 0; k < a; k++) e[i][k] -= f * e[c][k], inv[i][k] -= f * inv[c][k];
      }
  }
  // the entries are rationals with small denominators: snap away the elimination's rounding
  auto snap = [](double v) {
    double q = std::round(v * 5040 * 64) / (5040 * 64);
    return std::abs(v - q) < 1e-9 ? q : v;
  };
  WinoMats w{Mat(size_t(m), std::vector<double>(a, 0)), eval(size_t(r)), Mat(a, std::vector<double>(a, 0))};
  Mat em = eval(size_t(m));
  for (size_t i = 0; i < size_t(m); i++)
    for (size_t j = 0; j < a; j++) w.at[i][j] = em[j][i];
  for (size_t j = 0; j < a; j++) {
    double f = 1;
    for (size_t l = 0; j + 1 < a && l + 1 < a; l++)
      if (l != j) f *= p[j] - p[l];
    for (size_t k = 0; k < a; k++) w.bt[j][k] = snap(inv[k][j] * f);
    for (size_t k = 0; k < size_t(r); k++) w.g[j][k] = w.g[j][k] / f;
  }
  return w;
}

// t with the rows x cols matrix applied along `axis` (size cols -> rows), materialised in the order `perm` gives
// (none: t's own): a reduce over the cols values of t times the matrix, a small buffer (one pass per axis: rows x
// cols multiply-adds per output). The matrix as folded constants (each row a sum of slices, the rows concatenated,
// as tinygrad) made one kernel with a gated sum per row: every output evaluated all rows of both axes, 2.3 s for the
// 5x5 benchmark's input transform.
Tensor apply_matrix(const Tensor& t, const Mat& mat, int64_t axis, const std::vector<int64_t>& perm = {}) {
  int64_t rows = int64_t(mat.size()), cols = int64_t(mat[0].size());
  // float32's matrix stored as float32: a float64 one cast in the kernel loaded and converted a double a product
  std::vector<double> v;
  for (const auto& row : mat) v.insert(v.end(), row.begin(), row.end());
  Shape ms(size_t(t.ndim()) + 1, 1);
  ms[size_t(axis)] = rows, ms[size_t(axis) + 1] = cols;
  Tensor m = t.dtype() == dtypes::float32
                 ? Tensor::from_vector(std::vector<float>(v.begin(), v.end()), {rows, cols}, t.device())
                 : Tensor::from_vector(v, {rows, cols}, t.device()).cast(t.dtype());
  m = m.reshape(ms);
  Tensor r = (t.unsqueeze(axis) * m).sum(axis + 1);
  return (perm.empty() ? r : r.permute(perm)).contiguous();
}

}  // namespace

int64_t winograd_tile(int64_t r) { return r == 3 || r == 5 ? 4 : 0; }

// The cost model, in multiplications of the direct convolution's time (FMA lanes):
//  - direct: o0 o1 r^2 (C/G) Cout an image;
//  - Winograd: its batched matmuls' T a^2 (C/G) Cout (T tiles of m x m), plus every element its passes move: the
//    domain's T a^2 (C + Cout) and the channels-last copies of the padded input and of the output, each worth
//    lambda multiplications. lambda = kCyclesPerElement x the FMA lanes a cycle issues (the vector's float lanes x
//    the FMAs issued a cycle, as measured on the host: memory passes take cycles a core could have spent on that
//    many multiplications) + 2a (each element's two transform passes of a multiply-adds);
//  - a forward alone (nothing requires a gradient) moves its elements at kForwardOnly x lambda: the backward's
//    matmuls are twice the forward's, its passes fewer than twice;
//  - kFixedKernels more kernels than the direct convolution, each ~kLaunchCycles to start and join its threads.
// The two fitted constants come from Zen 5 (two 512-bit FMAs a cycle, 32 lanes; TG_CPU=haswell two 256-bit, 16),
// direct against Winograd alternated in one process, NCHW inputs: forward+backward at 512 images 32 -> 32 5x5
// 24x24 1.04x / 1.53x (the model: 1.12x / 1.59x), 64 -> 64 3x3 10x10 1.06x / 1.52x (1.05x / 1.47x), 32 -> 64 3x3
// 12x12 0.65x / 0.90x (0.61x / 0.87x), 1 -> 32 5x5 28x28 0.38x / 0.31x (0.09x / 0.13x: one input channel shares no
// transform); the forward alone of 128 images 32 -> 32 5x5 28x28 (torch_compare conv) 0.90x / 1.15x (0.85x / 1.23x).
// Zen 4 issues one 512-bit FMA a cycle (16 lanes, as its AVX2 does): natively there the same cases measured 1.96x,
// 1.48x, 1.04x, 0.29x and 1.51x (the model: as Zen 5's haswell column), TG_CPU=haswell 1.31x, 1.42x, 0.97x, 0.26x and
// 1.12x. It picks Winograd for the faster ones, all but Zen 4's native 32 -> 64 3x3 (1.04x: the model 0.87x).
bool winograd_pays(int64_t batch, int64_t cin, int64_t cout, int64_t groups, int64_t r, const int64_t out[2],
                   bool backward, const MachineModel& mm) {
  constexpr double kCyclesPerElement = 1.25, kForwardOnly = 1.4, kLaunchCycles = 15000;
  constexpr int64_t kFixedKernels = 16;
  const int64_t m = winograd_tile(r);
  if (m == 0 || out[0] < 1 || out[1] < 1 || groups < 1) return false;  // no tile for r: nothing to divide by
  int64_t a = m + r - 1, kt = (a + m - 1) / m, t0 = (out[0] + m - 1) / m, t1 = (out[1] + m - 1) / m;
  const double issue = mm.fma_measured_per_cycle > 0 ? mm.fma_measured_per_cycle : mm.fma_per_cycle;
  const double lanes = double(std::max(1, mm.vector_bits / 32)) * std::max(0.5, issue);
  double lambda = kCyclesPerElement * lanes + 2.0 * double(a);
  if (!backward) lambda *= kForwardOnly;
  double cpg = double(cin / groups), co = double(cout), tiles = double(t0 * t1);
  double direct = double(out[0] * out[1]) * double(r * r) * cpg * co;
  double moved = tiles * double(a * a) * double(cin + cout) +
                 double((t0 + kt - 1) * m * (t1 + kt - 1) * m) * double(cin) + double(out[0] * out[1]) * co;
  double wino = tiles * double(a * a) * cpg * co + lambda * moved;
  double fixed = double(kFixedKernels) * kLaunchCycles * lanes * double(std::max(1, mm.cores));
  return double(batch) * (direct - wino) > fixed;
}

Tensor conv2d_winograd(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
                       const std::vector<std::pair<int64_t, int64_t>>& pads, int64_t groups) {
  int64_t r = w.shape()[2], m = winograd_tile(r), a = m + r - 1;
  int64_t bs = x.shape()[0], cin = x.shape()[1], cout = w.shape()[0];
  WinoMats mats = wino_mats(m, r);
  // output size, the tiles covering it, and the padding that rounds the input up to whole tiles: K = a / m
  // (rounded up) tiles of m cover a window, so the input is tiles + K - 1 tiles
  int64_t kt = (a + m - 1) / m;
  std::vector<std::pair<int64_t, int64_t>> p = pads;
  int64_t o[2], tiles[2];
  for (size_t i = 0; i < 2; i++) {
    int64_t in = x.shape()[2 + i] + pads[i].first + pads[i].second;
    o[i] = in - r + 1;
    tiles[i] = (o[i] + m - 1) / m;
    p[i].second += (tiles[i] + kt - 1) * m - in;
  }
  // The Winograd domain is channels-last: every pass (the transforms, their adjoints, the batched matmuls) moves
  // vectors along the channels, contiguous on both sides, and the output is stored as a direct convolution's
  // (N, H, W, Cout), which a batch norm's sums read along the channels. In the (a, a, C, N * ty * tx) domain the
  // transforms read the tiles' rows and an input gradient's adjoint gathered across 64 planes, and the output was
  // NCHW: mnist's 5x5 convolution by Winograd took longer than the direct one there (README, conv2d).
  // The input copied channels-last (contiguous_backward: its gradient is summed channels-last, then copied back),
  // cut into tiles (N, ty, a, tx, a, C): the K x K views of whole tiles shifted by 0..K-1 tiles, concatenated and
  // cut to a, not a pool view of overlapping windows, whose gradient was a gated sum over every window (641 ms for
  // the 5x5 benchmark's input gradient); then B^T d B, along the tile's rows first, the columns' pass stored as
  // (a, a, N * ty * tx, C): it reads a tile row's a x C floats contiguous, where the rows' pass so stored read a
  // column's (1.43 against 2.98 ms for the 5x5 benchmark's)
  Tensor xt = pad_last(x, p)
                  .permute({0, 2, 3, 1})
                  .contiguous()
                  .contiguous_backward()
                  .reshape({bs, tiles[0] + kt - 1, m, tiles[1] + kt - 1, m, cin});
  std::vector<Tensor> rows;
  for (int64_t qa = 0; qa < kt; qa++) {
    std::vector<Tensor> cols;
    for (int64_t qb = 0; qb < kt; qb++)
      cols.push_back(xt.shrink({{0, bs}, {qa, qa + tiles[0]}, {0, m}, {qb, qb + tiles[1]}, {0, m}, {0, cin}}));
    rows.push_back(cat(cols, 4));
  }
  Tensor d = cat(rows, 2).shrink({{0, bs}, {0, tiles[0]}, {0, a}, {0, tiles[1]}, {0, a}, {0, cin}});
  int64_t np = bs * tiles[0] * tiles[1];
  Tensor v = apply_matrix(apply_matrix(d, mats.bt, 2), mats.bt, 4, {2, 4, 0, 1, 3, 5})
                 .reshape({a, a, np, groups, cin / groups})
                 .permute({0, 1, 3, 2, 4})
                 .reshape({a, a, groups, np, cin / groups, 1});
  // weights (Cout, C/G, r, r) -> (r, r, C/G, Cout), then G g G^T: (a, a, G, C/G, 1, Cout/G)
  Tensor u = apply_matrix(apply_matrix(w.permute({2, 3, 1, 0}), mats.g, 0), mats.g, 1)
                 .reshape({a, a, cin / groups, groups, cout / groups})
                 .permute({0, 1, 3, 2, 4})
                 .reshape({a, a, groups, 1, cin / groups, cout / groups});
  // the a x a products summed over the input channels: a batched matmul (a^2 G of them) in the Winograd domain, the
  // output channels innermost: (a, a, N * ty * tx, Cout), each tile's input channels broadcast against the weights'
  // vectors of output channels
  Tensor mm = (v * u).sum(4).reshape({a, a, groups, np, cout / groups}).permute({0, 1, 3, 2, 4})
                  .reshape({a, a, bs, tiles[0], tiles[1], cout});
  // A^T M A: (m, m, N, ty, tx, Cout), the second pass stored channels-last as (N, ty, m, tx, m, Cout); the tiles'
  // padding cut, the output's gradient copied channels-last before the adjoints read it (contiguous_backward: an
  // NCHW gradient read through the view gathered along the channels, 1.38 against 0.48 ms for the 5x5 benchmark's)
  Tensor y = apply_matrix(apply_matrix(mm, mats.at, 0), mats.at, 1, {2, 3, 0, 4, 1, 5})
                 .reshape({bs, tiles[0] * m, tiles[1] * m, cout})
                 .shrink({{0, bs}, {0, o[0]}, {0, o[1]}, {0, cout}})
                 .contiguous_backward()
                 .permute({0, 3, 1, 2});
  if (bias) y = y + bias->reshape({1, cout, 1, 1});
  return y;
}

}  // namespace tg::detail
