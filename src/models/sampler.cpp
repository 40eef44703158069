// Token sampling on the host (llama.cpp's sampler chain order: temperature,
// top-k, top-p, then a draw).
#include "tg/models/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "tg/error.hpp"

namespace tg::models {

Sampler::Sampler(SamplerConfig cfg) : cfg_(cfg), rng_(cfg.seed) {
  if (cfg.top_k < 0) throw Error("[sampler] top_k must be >= 0 (0: no cut), got " + std::to_string(cfg.top_k));
  if (!(cfg.top_p > 0 && cfg.top_p <= 1)) throw Error("[sampler] top_p must be in (0, 1], got " + std::to_string(cfg.top_p));
  if (std::isnan(cfg.temperature)) throw Error("[sampler] temperature is NaN");
  if (!(cfg.repeat_penalty > 0)) throw Error("[sampler] repeat_penalty must be > 0 (1: none), got " + std::to_string(cfg.repeat_penalty));
  if (cfg.repeat_last_n < 0) throw Error("[sampler] repeat_last_n must be >= 0, got " + std::to_string(cfg.repeat_last_n));
}

int32_t Sampler::sample(std::vector<float> logits, const std::vector<int32_t>& history) {
  if (logits.empty()) throw Error("[sampler] no logits");
  for (float l : logits)
    if (std::isnan(l)) throw Error("[sampler] the logits hold a NaN");
  if (cfg_.repeat_penalty != 1) {  // each distinct recent token once, as llama.cpp's penalties sampler
    std::vector<bool> seen(logits.size());
    size_t from = history.size() > size_t(cfg_.repeat_last_n) ? history.size() - size_t(cfg_.repeat_last_n) : 0;
    for (size_t i = from; i < history.size(); i++) {
      int32_t t = history[i];
      if (t < 0 || size_t(t) >= logits.size() || seen[size_t(t)]) continue;
      seen[size_t(t)] = true;
      float& l = logits[size_t(t)];
      l = l > 0 ? float(l / cfg_.repeat_penalty) : float(l * cfg_.repeat_penalty);
    }
  }
  if (cfg_.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  // descending by logit, ties by index: the order is the same on every platform
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  size_t k = cfg_.top_k > 0 ? std::min(size_t(cfg_.top_k), idx.size()) : idx.size();
  std::partial_sort(idx.begin(), idx.begin() + std::ptrdiff_t(k), idx.end(), by_logit);
  idx.resize(k);
  std::vector<double> p(k);
  double mx = logits[size_t(idx[0])], sum = 0;
  for (size_t i = 0; i < k; i++) sum += p[i] = std::exp((double(logits[size_t(idx[i])]) - mx) / cfg_.temperature);
  size_t keep = k;
  if (cfg_.top_p < 1) {  // the fewest tokens whose probability reaches top_p
    double c = 0;
    for (size_t i = 0; i < k; i++) {
      c += p[i] / sum;
      if (c >= cfg_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(keep), 0.0);
  double u = double(rng_() >> 11) * 0x1p-53 * total;  // uniform in [0, total), from 53 random bits
  for (size_t i = 0; i < keep; i++) {
    if (u < p[i]) return idx[i];
    u -= p[i];
  }
  return idx[keep - 1];
}

}  // namespace tg::models
