#pragma once
// Choosing the next token from logits, on the host: greedy (temperature 0, the
// first of equal maxima), or temperature, then top-k, then top-p (nucleus),
// drawn with a seeded generator (the same seed gives the same tokens).
// Thread-safety: a Sampler is used from one thread (its generator is state).
#include "tg/config.hpp"

#include <cstdint>
#include <random>
#include <vector>


namespace tg::models {

struct SamplerConfig {
  double temperature = 0;  // <= 0: greedy
  int64_t top_k = 0;       // 0: all tokens
  double top_p = 1;        // 1: no cut
  uint64_t seed = 0;
};

class Sampler {
 public:
  /** A bad setting (negative top_k, top_p outside (0, 1]) is a tg::Error naming
   * it. */
  explicit Sampler(SamplerConfig cfg);
  /** The next token: an index into `logits` (a NaN logit or an empty vector is
   * a tg::Error). */
  int32_t sample(const std::vector<float>& logits);

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
};

}  // namespace tg::models
