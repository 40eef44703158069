#pragma once
// Choosing the next token from logits, on the host, in llama.cpp's order: the repetition penalty over the last tokens,
// then greedy (temperature 0: the first of equal maxima), or temperature, top-k, top-p (nucleus) and a draw from a
// seeded generator (the same seed gives the same tokens).
// Thread-safety: a Sampler is used from one thread (its generator is state).
#include "tg/config.hpp"

#include <cstdint>
#include <random>
#include <vector>

namespace tg::models {

/// How the next token is picked from logits: temperature, top-k, top-p, seed and repetition penalty.
struct SamplerConfig {
  double temperature = 0;      ///< <= 0: greedy
  int64_t top_k = 0;           ///< 0: all tokens
  double top_p = 1;            ///< 1: no cut
  /// seed of the random generator (same seed and logits: same tokens)
  uint64_t seed = 0;
  double repeat_penalty = 1;   ///< a token among the last repeat_last_n: logit / penalty if > 0, else logit * penalty
  /// how many of the latest tokens the repetition penalty looks at
  int64_t repeat_last_n = 64;
};

/// Picks the next token from logits with a SamplerConfig's settings; holds its random generator.
class Sampler {
 public:
  /** A bad setting (negative top_k, top_p outside (0, 1], a penalty <= 0) is a tg::Error naming it. */
  explicit Sampler(SamplerConfig cfg);
  /** The next token: an index into `logits`; `history` holds the tokens so far (for the repetition penalty). A NaN
   *  logit or an empty vector is a tg::Error. */
  int32_t sample(std::vector<float> logits, const std::vector<int32_t>& history = {});

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
};

}  // namespace tg::models
