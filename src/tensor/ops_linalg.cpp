// Linear algebra: matmul (broadcast multiply + sum over the shared axis, like tinygrad), linear, einsum.
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

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
    prod = i == 0 ? x : Tensor(prod * x);
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

}  // namespace tg
