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

// t with the rows x cols matrix applied along `axis` (size cols -> rows), materialised: a reduce over the cols
// values of t times the matrix, a small buffer (one pass per axis: rows x cols multiply-adds per output). The
// matrix as folded constants (each row a sum of slices, the rows concatenated, as tinygrad) made one kernel with a
// gated sum per row: every output evaluated all rows of both axes, 2.3 s for the 5x5 benchmark's input transform.
Tensor apply_matrix(const Tensor& t, const Mat& mat, int64_t axis) {
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
  return (t.unsqueeze(axis) * m).sum(axis + 1).contiguous();
}

}  // namespace

int64_t winograd_tile(int64_t r) { return r == 3 || r == 5 ? 4 : 0; }

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
  // input tiles (N, C, ty, a, tx, a): the K x K views of whole tiles shifted by 0..K-1 tiles, concatenated and cut
  // to a, not a pool view of overlapping windows, whose gradient was a gated sum over every window (641 ms for the
  // 5x5 benchmark's input gradient); then (a, a, C, N, ty, tx) and B^T d B: (a, a, C, N * ty * tx)
  Tensor xt = pad_last(x, p).reshape({bs, cin, tiles[0] + kt - 1, m, tiles[1] + kt - 1, m});
  std::vector<Tensor> rows;
  for (int64_t qa = 0; qa < kt; qa++) {
    std::vector<Tensor> cols;
    for (int64_t qb = 0; qb < kt; qb++)
      cols.push_back(xt.shrink({{0, bs}, {0, cin}, {qa, qa + tiles[0]}, {0, m}, {qb, qb + tiles[1]}, {0, m}}));
    rows.push_back(cat(cols, 5));
  }
  Tensor d = cat(rows, 3).shrink({{0, bs}, {0, cin}, {0, tiles[0]}, {0, a}, {0, tiles[1]}, {0, a}});
  int64_t np = bs * tiles[0] * tiles[1];
  // B^T d B in the tiles' own layout, the innermost axis first (each pass reads and writes along it), then moved to
  // (a, a, C, N * ty * tx) for the matmuls: transforming in that layout read the tiles 64 floats apart (19 ms for
  // the 5x5 benchmark's first pass against 2 ms for the others)
  Tensor v = apply_matrix(apply_matrix(d, mats.bt, 5), mats.bt, 3)
                 .permute({3, 5, 1, 0, 2, 4})
                 .contiguous()
                 .reshape({a, a, groups, 1, cin / groups, np});
  // weights (Cout, C/G, r, r) -> (r, r, Cout, C/G), then G g G^T: (a, a, G, Cout/G, C/G, 1)
  Tensor u = apply_matrix(apply_matrix(w.permute({2, 3, 0, 1}), mats.g, 0), mats.g, 1)
                 .reshape({a, a, groups, cout / groups, cin / groups, 1});
  // the a x a products summed over the input channels: a batched matmul (a^2 of them) in the Winograd domain
  Tensor mm = (u * v).sum(4).reshape({a, a, cout, bs, tiles[0], tiles[1]});
  // A^T M A: (m, m, Cout, N, ty, tx) -> (N, Cout, ty, m, tx, m) -> the output, the tiles' padding cut
  Tensor y = apply_matrix(apply_matrix(mm, mats.at, 0), mats.at, 1)
                 .permute({3, 2, 4, 0, 5, 1})
                 .reshape({bs, cout, tiles[0] * m, tiles[1] * m})
                 .shrink({{0, bs}, {0, cout}, {0, o[0]}, {0, o[1]}});
  if (bias) y = y + bias->reshape({1, cout, 1, 1});
  // stored in the output's own layout: read through the view, every row of a consumer's reduce (mnist's batch norm
  // over its convolution) gathered from 16 planes (20 ms a kernel against 1 ms for the direct convolution's output)
  return y.contiguous();
}

}  // namespace tg::detail
