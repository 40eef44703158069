// Linear algebra: matmul (broadcast multiply + sum over the shared axis, like tinygrad), linear, einsum.
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <tuple>

#include "ops_util.hpp"
#include "tg/env.hpp"

namespace tg {
using namespace detail;

Tensor Tensor::matmul(const Tensor& b, CallLoc loc) const {
  CallSite site(loc);
  int64_t dx = ndim(), dw = b.ndim();
  if (dx == 0 || dw == 0)
    fail("matmul", "both operands need at least 1 dim, got " + shape_str(shape()) + " and " + shape_str(b.shape()));
  int64_t axis_w = dw - std::min<int64_t>(dw, 2);  // the contracted dim of b
  if (is_symbolic() || b.is_symbolic()) {  // the same product on sints (a symbolic dim on either side, or contracted)
    SymShape as = sym_shape(), bs = b.sym_shape();
    sint k = as.back();
    if (!(k == bs[size_t(axis_w)]))
      fail("matmul", "cannot multiply " + shape_str(as) + " and " + shape_str(bs) + ": inner dims " + k.str() + " and " +
                         bs[size_t(axis_w)].str() + " differ");
    int64_t ones = std::min<int64_t>({dx - 1, dw - 1, 1});
    SymShape xs(as.begin(), as.end() - 1), ws(bs.begin(), bs.begin() + axis_w);
    xs.insert(xs.end(), size_t(ones), sint(1));
    xs.push_back(k);
    ws.insert(ws.end(), size_t(ones), sint(1));
    ws.insert(ws.end(), bs.begin() + axis_w, bs.end());
    Tensor x = reshape(xs), w = b.reshape(ws).transpose(-1, -std::min<int64_t>(dw, 2));
    return (x * w).sum(-1).cast(dtypes::strong(least_upper_dtype({dtype(), b.dtype()})));
  }
  int64_t k = shape().back();
  if (k != b.shape()[size_t(axis_w)])
    fail("matmul", "cannot multiply " + shape_str(shape()) + " and " + shape_str(b.shape()) + ": inner dims " +
                       std::to_string(k) + " and " + std::to_string(b.shape()[size_t(axis_w)]) + " differ");
  Shape xb(shape().begin(), shape().end() - std::min<int64_t>(dx, 2)), wb(b.shape().begin(), b.shape().begin() + axis_w);
  (void)broadcast_shape(xb, wb, "matmul");  // batch dims must broadcast
  int64_t ones = std::min<int64_t>({dx - 1, dw - 1, 1});
  Shape xs(shape().begin(), shape().end() - 1);
  xs.insert(xs.end(), size_t(ones), 1);
  xs.push_back(k);
  Shape ws(b.shape().begin(), b.shape().begin() + axis_w);
  ws.insert(ws.end(), size_t(ones), 1);
  ws.insert(ws.end(), b.shape().begin() + axis_w, b.shape().end());
  Tensor x = reshape(xs), w = b.reshape(ws).transpose(-1, -std::min<int64_t>(dw, 2));
  DType out = dtypes::strong(least_upper_dtype({dtype(), b.dtype()}));
  return (x * w).sum(-1).cast(out);
}

Tensor Tensor::matmul(const Tensor& b, DType dtype, CallLoc loc) const {
  CallSite site(loc);
  return cast(dtype).matmul(b.cast(dtype)).cast(dtype);
}

Tensor Tensor::linear(const Tensor& weight, const std::optional<Tensor>& bias, DType dtype, CallLoc loc) const {
  CallSite site(loc);
  std::optional<Tensor> b;
  if (bias) b = bias->cast(dtype);
  return cast(dtype).linear(weight.cast(dtype), b).cast(dtype);
}

Tensor Tensor::linear(const Tensor& weight, const std::optional<Tensor>& bias, CallLoc loc) const {
  CallSite site(loc);
  if (weight.ndim() < 1 || weight.ndim() > 2)
    fail("linear", "weight must be (out_features, in_features) or (in_features,), got " + shape_str(weight.shape()));
  if (ndim() == 0 || shape().back() != weight.shape().back())
    fail("linear", "input " + shape_str(shape()) + " needs " + std::to_string(weight.shape().back()) +
                       " features in its last dim, for weight " + shape_str(weight.shape()));
  Tensor y = matmul(weight.ndim() == 2 ? weight.T() : weight);
  if (!bias) return y;
  Shape bs = broadcast_shape(y.shape(), bias->shape(), "linear");
  if (bs != y.shape()) fail("linear", "bias " + shape_str(bias->shape()) + " does not broadcast to output " + shape_str(y.shape()));
  return y + *bias;
}

Tensor einsum(const std::string& formula_in, const std::vector<Tensor>& operands, CallLoc loc) {
  CallSite site(loc);
  std::string f;
  for (char c : formula_in)
    if (c != ' ') f += c;
  for (char c : f)
    if (!std::isalpha(static_cast<unsigned char>(c)) && c != ',' && c != '.' && c != '-' && c != '>')
      fail("einsum", "invalid character '" + std::string(1, c) + "' in \"" + formula_in + "\"");
  size_t arrow = f.find("->");
  bool explicit_out = arrow != std::string::npos;
  std::string lhs = explicit_out ? f.substr(0, arrow) : f, rhs = explicit_out ? f.substr(arrow + 2) : "";
  if (rhs.find("->") != std::string::npos) fail("einsum", "more than one '->' in \"" + formula_in + "\"");
  std::vector<std::string> ins;
  for (size_t p = 0;;) {
    size_t q = lhs.find(',', p);
    ins.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  if (ins.size() != operands.size())
    fail("einsum", "\"" + formula_in + "\" names " + std::to_string(ins.size()) + " operands, got " +
                       std::to_string(operands.size()));
  // "..." -> unused letters, right-aligned across operands (broadcast)
  std::string unused;
  for (char c = 'A'; c <= 'Z'; c++)
    if (f.find(c) == std::string::npos) unused += c;
  for (char c = 'a'; c <= 'z'; c++)
    if (f.find(c) == std::string::npos) unused += c;
  size_t ell_max = 0;
  std::vector<size_t> ell_n(ins.size(), 0);
  for (size_t i = 0; i < ins.size(); i++) {
    size_t pos = ins[i].find("...");
    if (pos == std::string::npos) continue;
    if (ins[i].find("...", pos + 3) != std::string::npos) fail("einsum", "more than one '...' in operand " + std::to_string(i));
    int64_t named = int64_t(ins[i].size()) - 3;
    if (operands[i].ndim() < named)
      fail("einsum", "operand " + std::to_string(i) + " has " + std::to_string(operands[i].ndim()) + " dims, \"" +
                         ins[i] + "\" needs at least " + std::to_string(named));
    ell_n[i] = size_t(operands[i].ndim() - named);
    ell_max = std::max(ell_max, ell_n[i]);
  }
  if (ell_max > unused.size()) fail("einsum", "too many dims under '...'");
  std::string ell = unused.substr(0, ell_max);
  for (size_t i = 0; i < ins.size(); i++) {
    size_t pos = ins[i].find("...");
    if (pos != std::string::npos) ins[i].replace(pos, 3, ell.substr(ell_max - ell_n[i]));
    if (ins[i].find('.') != std::string::npos) fail("einsum", "malformed '...' in \"" + formula_in + "\"");
  }
  if (explicit_out) {
    size_t pos = rhs.find("...");
    if (pos != std::string::npos) rhs.replace(pos, 3, ell);
    if (rhs.find('.') != std::string::npos) fail("einsum", "malformed '...' in the output of \"" + formula_in + "\"");
  } else {
    std::map<char, int> cnt;
    for (auto& s : ins)
      for (char c : s) cnt[c]++;
    rhs = ell;
    for (auto& [c, n] : cnt)
      if (n == 1 && ell.find(c) == std::string::npos) rhs += c;
  }
  // take diagonals for letters repeated within one operand
  std::vector<Tensor> xs = operands;
  for (size_t i = 0; i < ins.size(); i++) {
    std::string& s = ins[i];
    if (int64_t(s.size()) != xs[i].ndim())
      fail("einsum", "operand " + std::to_string(i) + " has shape " + shape_str(xs[i].shape()) + ", subscripts \"" + s +
                         "\" name " + std::to_string(s.size()) + " dims");
    for (bool again = true; again;) {
      again = false;
      for (size_t j = 0; j < s.size() && !again; j++) {
        size_t k = s.find(s[j], j + 1);
        if (k == std::string::npos) continue;
        if (xs[i].shape()[j] != xs[i].shape()[k])
          fail("einsum", "subscript '" + std::string(1, s[j]) + "' repeated in operand " + std::to_string(i) +
                             " over dims of sizes " + std::to_string(xs[i].shape()[j]) + " and " + std::to_string(xs[i].shape()[k]));
        char c = s[j];
        xs[i] = xs[i].diagonal(0, int64_t(j), int64_t(k));
        s.erase(k, 1);
        s.erase(j, 1);
        s += c;
        again = true;
      }
    }
  }
  std::map<char, int64_t> sz;
  for (size_t i = 0; i < ins.size(); i++)
    for (size_t j = 0; j < ins[i].size(); j++) {
      char c = ins[i][j];
      int64_t n = xs[i].shape()[j];
      auto it = sz.find(c);
      if (it == sz.end() || it->second == 1) sz[c] = n;
      else if (n != 1 && n != it->second)
        fail("einsum", "subscript '" + std::string(1, c) + "' has size " + std::to_string(it->second) + " and " +
                           std::to_string(n) + " in different operands");
    }
  for (size_t i = 0; i < rhs.size(); i++) {
    if (!sz.count(rhs[i])) fail("einsum", "output subscript '" + std::string(1, rhs[i]) + "' is not in any input");
    if (rhs.find(rhs[i], i + 1) != std::string::npos)
      fail("einsum", "output subscript '" + std::string(1, rhs[i]) + "' appears more than once");
  }
  std::string alpha;
  for (auto& [c, n] : sz) alpha += c;  // sorted
  Tensor prod;
  for (size_t i = 0; i < ins.size(); i++) {
    const std::string& s = ins[i];
    std::string sorted = s;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> perm;
    for (char c : sorted) perm.push_back(int64_t(s.find(c)));
    Tensor x = xs[i].permute(perm);
    Shape rs;
    for (char c : alpha) {
      size_t p = sorted.find(c);
      rs.push_back(p == std::string::npos ? 1 : x.shape()[p]);
    }
    x = x.reshape(rs);
    prod = i == 0 ? x : (prod * x);
  }
  std::vector<int64_t> red;
  std::string kept;
  for (size_t i = 0; i < alpha.size(); i++) {
    if (rhs.find(alpha[i]) == std::string::npos) red.push_back(int64_t(i));
    else kept += alpha[i];
  }
  Shape full;
  for (char c : alpha) full.push_back(sz[c]);
  prod = prod.expand(full);  // size-1 operands broadcast even when nothing else names the letter
  DType out = prod.dtype();
  if (!red.empty()) prod = prod.sum(red).cast(out);
  std::vector<int64_t> perm;
  for (char c : rhs) perm.push_back(int64_t(kept.find(c)));
  return prod.permute(perm);
}

// ---------------------------------------------------------------- QR, SVD, Newton-Schulz (tinygrad's compositions)

namespace {
Tensor last_col(const Tensor& t, int64_t i) {  // t[..., :, i]
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t d : t.shape()) r.push_back({0, d});
  r.back() = {i, i + 1};
  return t.shrink(r).squeeze(-1);
}
Tensor last2(const Tensor& t, int64_t rows, int64_t cols) {  // t[..., :rows, :cols]
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t d : t.shape()) r.push_back({0, d});
  r[r.size() - 2] = {0, rows};
  r.back() = {0, cols};
  return t.shrink(r);
}
Tensor batched_eye(int64_t n, const Shape& batch, DType d, const std::string& dev) {
  Shape s = batch;
  s.push_back(n), s.push_back(n);
  return Tensor::eye(n, -1, d, dev).expand(s);
}
}  // namespace

std::pair<Tensor, Tensor> Tensor::qr() const {
  if (ndim() < 2) fail("qr", "needs at least 2 dims (..., m, n), got shape " + shape_str(shape()));
  Shape batch(shape().begin(), shape().end() - 2);
  int64_t m = shape()[size_t(ndim() - 2)], n = shape().back();
  Tensor R = to_float(*this), Q = batched_eye(m, batch, R.dtype(), device());
  Tensor idx = Tensor::arange(0, double(m), 1, dtypes::int32, device());
  Tensor zero = const_like(R, 0), one = const_like(R, 1);
  for (int64_t i = 0; i < std::min(m - 1, n); i++) {  // LAPACK's count: no reflector for a last 1-element column
    // a Householder reflector v (zero above row i) with w = tau * v: R -= w (v^T R), Q -= (Q v) w^T
    Tensor at_i = idx == int(i), x = (idx >= int(i)).where(last_col(R, i), zero);
    Tensor norm = x.square().sum(-1, true).sqrt();
    Tensor x0 = at_i.where(x, zero).sum(-1, true);
    Tensor sgn = (x0 != 0).where(x0.sign(), one), active = norm != 0;
    Tensor u0 = x0 + sgn * norm;
    Tensor v = (at_i.where(u0, x) / active.where(u0, one)).unsqueeze(-1);
    Tensor w = active.where(sgn * u0 / active.where(norm, one), zero).unsqueeze(-1) * v;
    R = (R - w.matmul(v.transpose(-2, -1).matmul(R))).contiguous();
    Q = (Q - Q.matmul(v).matmul(w.transpose(-2, -1))).contiguous();
  }
  return {Q, R};
}

std::tuple<Tensor, Tensor, Tensor> Tensor::svd(bool full_matrices) const {
  if (ndim() < 2) fail("svd", "needs at least 2 dims (..., m, n), got shape " + shape_str(shape()));
  Shape batch(shape().begin(), shape().end() - 2);
  int64_t m = shape()[size_t(ndim() - 2)], n = shape().back(), num = std::min(m, n), q_num = std::max(m, n);
  if (num == 0) fail("svd", "needs non-empty matrices, got shape " + shape_str(shape()));
  // QR first; then one-sided Jacobi rotations on R's square block, in round-robin column pairs (LAWN 169, p. 26)
  auto [Q, R] = (m >= n ? to_float(*this) : to_float(*this).transpose(-2, -1)).qr();
  DType dt = R.dtype();
  const std::string& dev = device();
  Tensor U = last2(R, num, num).contiguous(), V = batched_eye(num, batch, dt, dev).contiguous();
  Tensor eye_num = batched_eye(num, batch, dt, dev), one = const_like(U, 1), zero = const_like(U, 0);
  int64_t h = num / 2;
  std::vector<int32_t> perm;  // the pairing: column perm[k] with perm[k + h]
  for (int64_t i = 0; i < h; i++) perm.push_back(int32_t(i));
  for (int64_t i = num - 1; i >= h; i--) perm.push_back(int32_t(i));
  Shape hs = batch, h11 = batch;
  hs.push_back(1), hs.push_back(h);
  h11.push_back(h), h11.push_back(1), h11.push_back(1);
  for (int64_t round = 0; h > 0 && round < 4 * num; round++) {  // classical Jacobi converges in about 4 sweeps
    std::vector<float> p(size_t(num * 2 * h), 0.f);  // P[a][b] = (a == perm[b]) for the paired columns b < 2h
    for (int64_t b = 0; b < 2 * h; b++) p[size_t(perm[size_t(b)] * 2 * h + b)] = 1.f;
    Tensor P = Tensor::from_vector(p, {num, 2 * h}, dev).cast(dt);
    Tensor Up = U.matmul(P);
    auto lr = Up.split(h, -1);
    Tensor gamma = (lr[0] * lr[1]).sum(-2).reshape(hs);
    auto ab = Up.square().sum(-2).unsqueeze(-2).split(h, -1);
    Tensor rot = gamma != 0;
    Tensor tau = (ab[1] - ab[0]) / (rot.where(gamma, one) * 2.0);
    Tensor t = (tau != 0).where(tau.sign(), one) / (tau.abs() + (tau.square() + 1.0).sqrt());
    t = rot.where(t, zero);
    Tensor c = (t.square() + 1.0).rsqrt(), s = c * t;
    auto mij = P.transpose(-2, -1).split(h, -2);  // (h, num) selectors of each pair's two columns
    Tensor Mia = mij[0].unsqueeze(-1), Mib = mij[0].unsqueeze(-2), Mja = mij[1].unsqueeze(-1), Mjb = mij[1].unsqueeze(-2);
    Tensor cc = (c - 1.0).reshape(h11), ss = s.reshape(h11);
    Tensor Rot = eye_num + (cc * (Mia * Mib + Mja * Mjb) + ss * (Mia * Mjb - Mja * Mib)).sum(-3);
    U = U.matmul(Rot).contiguous();
    V = V.matmul(Rot).contiguous();
    if (num % 2 == 1) {
      for (auto& v : perm) v = int32_t((v - 1 + num) % num);
    } else {
      for (size_t k = 1; k < perm.size(); k++) perm[k] = int32_t((perm[k] - 2 + 2 * (num - 1)) % (num - 1) + 1);
    }
  }
  auto [S, order] = U.square().sum(-2).sqrt().sort(-1, true);
  Shape nn = batch;
  nn.push_back(num), nn.push_back(num);
  Tensor gi = order.unsqueeze(-2).expand(nn);
  U = U.gather(-1, gi) / (S != 0).where(S, one).unsqueeze(-2);
  V = V.gather(-1, gi);
  std::vector<std::pair<int64_t, int64_t>> pad(size_t(ndim()), {0, 0});
  pad[pad.size() - 2] = pad.back() = {0, q_num - num};
  U = Q.matmul(U.pad(pad) + batched_eye(q_num, batch, dt, dev) - batched_eye(num, batch, dt, dev).pad(pad));
  if (!full_matrices) U = last2(U, q_num, num);
  if (m >= n) return {U, S, V.transpose(-2, -1)};
  return {V, S, U.transpose(-2, -1)};
}

Tensor Tensor::newton_schulz(int64_t steps, const std::vector<double>& params, double eps) const {
  if (ndim() < 2) fail("newton_schulz", "needs at least 2 dims, got shape " + shape_str(shape()));
  if (shape()[size_t(ndim() - 2)] > shape().back()) return transpose(-2, -1).newton_schulz(steps, params, eps).transpose(-2, -1);
  Tensor G = *this / (square().sum({-2, -1}, true).sqrt() + eps);
  for (int64_t k = 0; k < steps; k++) {  // G = sum_i params[i] (G G^T)^i G
    Tensor GGt = G.matmul(G.transpose(-2, -1)), term = G, acc;
    for (size_t i = 0; i < params.size(); i++) {
      if (i > 0) term = GGt.matmul(term);
      acc = i == 0 ? term * params[i] : acc + term * params[i];
    }
    G = params.empty() ? G * 0.0 : acc;
  }
  return G;
}

}  // namespace tg
