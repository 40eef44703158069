#pragma once
// Training a small character-level LLaMA with tg's autograd and AdamW (examples/llm_train and tests/llm_tests.cpp):
// a vocabulary of one token per printable ASCII character ("▁" for the space) with byte tokens for everything else,
// random windows of the corpus, next-token cross-entropy through models::llama_logits, a TinyJit-replayed step,
// and the result as a GGUF file that Llama, the llm CLI and llama.cpp read.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "llm_model_util.hpp"
#include "tg/jit.hpp"
#include "tg/nn/optim.hpp"

namespace llm_util {

/** A character vocabulary (SentencePiece kind, so llama.cpp reads it): <unk>, <s>, </s>, the 256 byte tokens, "▁"
 *  (space), then the printable ASCII characters '!'..'~' as tokens of their own; no pair merges into a token, so each
 *  character is one token, other bytes (new lines, UTF-8) byte tokens. */
inline Vocab char_vocab() {
  using TT = tg::models::Tokenizer::TokenType;
  Vocab v = byte_vocab();
  v.tokens.resize(3 + 256), v.scores.resize(3 + 256), v.types.resize(3 + 256);
  v.tokens.push_back("\xE2\x96\x81");
  for (char ch = '!'; ch <= '~'; ch++) v.tokens.push_back(std::string(1, ch));
  v.scores.resize(v.tokens.size(), 0.f);
  v.types.resize(v.tokens.size(), int32_t(TT::NORMAL));
  return v;
}

/** The GGUF metadata of a model with the character vocabulary: no BOS and no space prefix added (text in, text out). */
inline std::map<std::string, tg::nn::GGUFValue> char_metadata(const tg::models::LlamaConfig& c) {
  auto md = metadata(c, char_vocab());
  md["general.name"] = tg::nn::GGUFValue::str("tg-trained-char-llama");
  md["tokenizer.ggml.add_bos_token"] = tg::nn::GGUFValue::boolean(false);
  md["tokenizer.ggml.add_space_prefix"] = tg::nn::GGUFValue::boolean(false);
  return md;
}

/** The tokenizer of char_metadata's vocabulary. */
inline tg::models::Tokenizer char_tokenizer() {
  Vocab v = char_vocab();
  return tg::models::Tokenizer(v.tokens, v.scores, v.types, v.bos, v.eos, v.unk, false, false);
}

struct TrainOptions {
  tg::models::LlamaConfig cfg;  // vocab_size is set from char_vocab; max_context is the training window
  int64_t steps = 400, batch = 16;
  double lr = 1e-2, weight_decay = 0.01;
  uint64_t seed = 1;
  std::function<void(int64_t step, double loss)> progress;  // after each step
};

struct Trained {
  tg::models::LlamaConfig cfg;
  std::map<std::string, tg::Tensor> weights;
  std::vector<double> losses;  // per step
};

/** Train on the token ids `data` (at least max_context + 1 of them): each step takes `batch` random windows of
 *  max_context + 1 tokens and predicts every next token; AdamW with a linear warm-up over the first 10% of the steps
 *  and a cosine decay to a tenth of lr. */
inline Trained train_char_llama(const std::vector<int32_t>& data, TrainOptions o) {
  using tg::Tensor;
  tg::models::LlamaConfig c = o.cfg;
  c.vocab_size = int64_t(char_vocab().tokens.size());
  int64_t B = o.batch, T = c.max_context;
  if (int64_t(data.size()) < T + 1)
    throw tg::Error("[llm_train] the corpus has " + std::to_string(data.size()) + " tokens, fewer than a window of " + std::to_string(T + 1));
  Tensor::manual_seed(o.seed);
  int64_t kvd = c.n_kv_heads * c.head_dim();
  auto lin = [](int64_t out, int64_t in, double gain) {
    double b = gain * std::sqrt(3.0 / double(in));
    return Tensor::uniform({out, in}, -b, b);
  };
  std::map<std::string, Tensor> w;
  w["token_embd.weight"] = Tensor::uniform({c.vocab_size, c.dim}, -0.5, 0.5);
  w["output_norm.weight"] = Tensor::ones({c.dim});
  w["output.weight"] = lin(c.vocab_size, c.dim, 0.5);
  for (int64_t i = 0; i < c.n_layers; i++) {
    std::string p = "blk." + std::to_string(i) + ".";
    w[p + "attn_norm.weight"] = Tensor::ones({c.dim});
    w[p + "attn_q.weight"] = lin(c.dim, c.dim, 1.0);
    w[p + "attn_k.weight"] = lin(kvd, c.dim, 1.0);
    w[p + "attn_v.weight"] = lin(kvd, c.dim, 1.0);
    w[p + "attn_output.weight"] = lin(c.dim, c.dim, 0.5);
    w[p + "ffn_norm.weight"] = Tensor::ones({c.dim});
    w[p + "ffn_gate.weight"] = lin(c.hidden_dim, c.dim, 1.0);
    w[p + "ffn_up.weight"] = lin(c.hidden_dim, c.dim, 1.0);
    w[p + "ffn_down.weight"] = lin(c.dim, c.hidden_dim, 0.5);
  }
  std::vector<Tensor> params;
  for (auto& [name, t] : w) {
    t = t.contiguous().realize();
    t.requires_grad_(true);
    params.push_back(t);
  }
  tg::nn::optim::AdamW opt(params, o.lr, 0.9, 0.99, 1e-8, o.weight_decay);
  tg::TinyJit step([&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    opt.zero_grad();
    Tensor logits = tg::models::llama_logits(c, w, in[0]);
    Tensor loss = logits.reshape({B * T, c.vocab_size}).sparse_categorical_crossentropy(in[1].reshape({B * T}));
    loss.backward();
    std::vector<Tensor> out = opt.schedule_step();
    out.push_back(loss);
    return out;
  });
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<size_t> start(0, data.size() - size_t(T) - 1);
  Trained r{c, {}, {}};
  int64_t warm = std::max<int64_t>(1, o.steps / 10);
  for (int64_t s = 0; s < o.steps; s++) {
    double frac = double(s - warm) / double(std::max<int64_t>(1, o.steps - warm));
    opt.set_lr(s < warm ? o.lr * double(s + 1) / double(warm) : o.lr * (0.1 + 0.45 * (1 + std::cos(std::numbers::pi * frac))));
    std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
    for (int64_t b = 0; b < B; b++) {
      size_t at = start(rng);
      std::copy_n(data.begin() + std::ptrdiff_t(at), T, x.begin() + b * T);
      std::copy_n(data.begin() + std::ptrdiff_t(at + 1), T, y.begin() + b * T);
    }
    std::vector<Tensor> out = step({Tensor::from_vector(x, {B, T}).realize(), Tensor::from_vector(y, {B, T}).realize()});
    r.losses.push_back(double(out.back().item<float>()));
    if (o.progress) o.progress(s, r.losses.back());
  }
  for (auto& [name, t] : w) r.weights[name] = t.detach();
  return r;
}

/** Write a trained model as a float32 GGUF with the character vocabulary. */
inline void save_char_llama(const std::string& path, const Trained& t) {
  tg::nn::gguf_save(path, char_metadata(t.cfg), t.weights);
}

}  // namespace llm_util
