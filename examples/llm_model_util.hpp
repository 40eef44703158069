#pragma once
// Random-weight LLaMA models as GGUF files, for the tests, the llama.cpp check
// and bench/llm (no weights can be downloaded here): a byte-level SentencePiece
// vocabulary (<unk>, <s>, </s>, the 256 byte tokens, then "▁", letters and a
// few words with scores favouring longer pieces), the llama.* metadata
// llama.cpp reads, and weights drawn from tg's seeded generator at scales that
// keep activations O(1) and logits spread (greedy choices are stable).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tg/models/gpt2.hpp"
#include "tg/models/llama.hpp"
#include "tg/models/tokenizer.hpp"
#include "tg/nn/state.hpp"

namespace llm_util {

struct Vocab {
  std::string model = "llama";  // tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE)
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // gpt2
  int32_t bos = 1, eos = 2, unk = 0;
};

inline Vocab byte_vocab() {
  using TT = tg::models::Tokenizer::TokenType;
  Vocab v;
  auto add = [&](std::string t, float s, TT ty) {
    v.tokens.push_back(std::move(t));
    v.scores.push_back(s);
    v.types.push_back(int32_t(ty));
  };
  add("<unk>", 0, TT::UNKNOWN);
  add("<s>", 0, TT::CONTROL);
  add("</s>", 0, TT::CONTROL);
  for (int b = 0; b < 256; b++) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0, TT::BYTE);
  }
  const std::string sp = "\xE2\x96\x81";
  add(sp, -1, TT::NORMAL);
  for (char c = 'a'; c <= 'z'; c++) add(std::string(1, c), -2, TT::NORMAL);
  for (char c = 'a'; c <= 'z'; c++) add(sp + c, -1.5f, TT::NORMAL);
  for (const char* w : {"he", "th", "the", "in", "an", "er", "on", "at", "ll", "llo", "hello", "wor", "world", "ing", "and"}) {
    add(w, -1.f / float(std::string(w).size()), TT::NORMAL);
    add(sp + w, -0.5f / float(std::string(w).size()), TT::NORMAL);
  }
  return v;
}

/** A GPT-2-style byte-level BPE vocabulary: the 256 byte characters (token i is byte i), one token for each merge
 *  (token 256 + rank), and <|endoftext|> (BOS and EOS). The merges make "hello", " world", " the", " and", "é",
 *  numbers' digit pairs and a few more. */
inline Vocab gpt2_vocab() {
  using TT = tg::models::Tokenizer::TokenType;
  Vocab v;
  v.model = "gpt2";
  for (uint32_t b = 0, next = 256; b < 256; b++) {  // GPT-2's bytes_to_unicode
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    uint32_t cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) s += char(cp);
    else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
    v.tokens.push_back(s);
  }
  v.merges = {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ t", "Ġt h", "Ġth e", "a n", "Ġ an",
              "Ġan d", "1 2", "3 4", "Ã ©", "Ġ Ã©", "' s", "i n", "Ġ in", "Ċ Ċ", "Ġ Ġ"};
  for (const std::string& m : v.merges) {
    size_t sp = m.find(' ');
    v.tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
  }
  v.types.assign(v.tokens.size(), int32_t(TT::NORMAL));
  v.tokens.push_back("<|endoftext|>");
  v.types.push_back(int32_t(TT::CONTROL));
  v.bos = v.eos = int32_t(v.tokens.size()) - 1;
  v.unk = -1;
  return v;
}

/** The GGUF metadata of a LLaMA model with this vocabulary. */
inline std::map<std::string, tg::nn::GGUFValue> metadata(const tg::models::LlamaConfig& c, const Vocab& v) {
  using G = tg::nn::GGUFValue;
  const std::string a = c.arch;
  std::map<std::string, G> md = {
      {"general.architecture", G::str(c.arch)},
      {"general.name", G::str("tg-random-llama")},
      {a + ".context_length", G::u32(uint32_t(c.max_context))},
      {a + ".embedding_length", G::u32(uint32_t(c.dim))},
      {a + ".block_count", G::u32(uint32_t(c.n_layers))},
      {a + ".feed_forward_length", G::u32(uint32_t(c.hidden_dim))},
      {a + ".attention.head_count", G::u32(uint32_t(c.n_heads))},
      {a + ".attention.head_count_kv", G::u32(uint32_t(c.n_kv_heads))},
      {a + ".attention.layer_norm_rms_epsilon", G::f32(float(c.norm_eps))},
      {a + ".rope.freq_base", G::f32(float(c.rope_theta))},
      {a + ".rope.dimension_count", G::u32(uint32_t(c.head_dim()))},
      {a + ".vocab_size", G::u32(uint32_t(v.tokens.size()))},
  };
  if (c.n_experts > 0) {
    md[a + ".expert_count"] = G::u32(uint32_t(c.n_experts));
    md[a + ".expert_used_count"] = G::u32(uint32_t(c.n_experts_used));
  }
  md["tokenizer.ggml.model"] = G::str(v.model);
  md["tokenizer.ggml.tokens"] = G::strings(v.tokens);
  md["tokenizer.ggml.token_type"] = G::ints(v.types);
  md["tokenizer.ggml.bos_token_id"] = G::u32(uint32_t(v.bos));
  md["tokenizer.ggml.eos_token_id"] = G::u32(uint32_t(v.eos));
  if (v.model == "gpt2") {
    md["tokenizer.ggml.pre"] = G::str("gpt-2");
    md["tokenizer.ggml.merges"] = G::strings(v.merges);
    md["tokenizer.ggml.add_bos_token"] = G::boolean(false);
  } else {
    md["tokenizer.ggml.scores"] = G::floats(v.scores);
    md["tokenizer.ggml.unknown_token_id"] = G::u32(uint32_t(v.unk));
    md["tokenizer.ggml.add_bos_token"] = G::boolean(true);
  }
  return md;
}

/** Random weights by llama.cpp's names (vocab_size from the config), from tg's
 * generator seeded with `seed`. */
inline std::map<std::string, tg::Tensor> random_weights(const tg::models::LlamaConfig& c, uint64_t seed) {
  using tg::Tensor;
  Tensor::manual_seed(seed);
  int64_t kvd = c.n_kv_heads * c.head_dim();
  auto lin = [](int64_t out, int64_t in, double gain = 1.0) {
    double b = gain * std::sqrt(3.0 / double(in));  // variance gain^2 / in
    return Tensor::uniform({out, in}, -b, b).realize();
  };
  auto norm = [](int64_t n) { return Tensor::uniform({n}, 0.8, 1.2).realize(); };
  std::map<std::string, Tensor> w;
  w["token_embd.weight"] = Tensor::uniform({c.vocab_size, c.dim}, -1.0, 1.0).realize();
  w["output_norm.weight"] = norm(c.dim);
  w["output.weight"] = lin(c.vocab_size, c.dim, 3.0);
  for (int64_t i = 0; i < c.n_layers; i++) {
    std::string p = "blk." + std::to_string(i) + ".";
    w[p + "attn_norm.weight"] = norm(c.dim);
    w[p + "attn_q.weight"] = lin(c.dim, c.dim, 2.0);
    w[p + "attn_k.weight"] = lin(kvd, c.dim, 2.0);
    w[p + "attn_v.weight"] = lin(kvd, c.dim);
    if (c.qkv_bias()) {
      w[p + "attn_q.bias"] = Tensor::uniform({c.dim}, -0.5, 0.5).realize();
      w[p + "attn_k.bias"] = Tensor::uniform({kvd}, -0.5, 0.5).realize();
      w[p + "attn_v.bias"] = Tensor::uniform({kvd}, -0.5, 0.5).realize();
    }
    w[p + "attn_output.weight"] = lin(c.dim, c.dim, 0.5);
    w[p + "ffn_norm.weight"] = norm(c.dim);
    if (c.n_experts > 0) {  // Mixtral's layout: a router and the experts stacked on a first axis
      int64_t E = c.n_experts;
      w[p + "ffn_gate_inp.weight"] = lin(E, c.dim, 2.0);
      w[p + "ffn_gate_exps.weight"] = lin(E * c.hidden_dim, c.dim).reshape({E, c.hidden_dim, c.dim}).contiguous().realize();
      w[p + "ffn_up_exps.weight"] = lin(E * c.hidden_dim, c.dim).reshape({E, c.hidden_dim, c.dim}).contiguous().realize();
      w[p + "ffn_down_exps.weight"] = lin(E * c.dim, c.hidden_dim, 0.5).reshape({E, c.dim, c.hidden_dim}).contiguous().realize();
      continue;
    }
    w[p + "ffn_gate.weight"] = lin(c.hidden_dim, c.dim);
    w[p + "ffn_up.weight"] = lin(c.hidden_dim, c.dim);
    w[p + "ffn_down.weight"] = lin(c.dim, c.hidden_dim, 0.5);
  }
  return w;
}

/** Whether tg's GGUF writer has no quantiser for `type` (q4_1, q4_K, q5_K, q6_K): random_blocks makes its weights. */
inline bool blocks_only(const std::string& type) { return type == "q4_1" || type == "q4_K" || type == "q5_K" || type == "q6_K"; }

/** Random blocks of a quantised GGML type ("q8_0", "q4_0", "q4_1", "q4_K", "q5_K", "q6_K") for an (out, in) weight,
 * as GGUF stores them: uint8 (out, in / block, bytes per block). The quants and packed scales are random bytes;
 * the f16 scales are set so that the weights lie within about +-bound. */
inline tg::Tensor random_blocks(const std::string& type, int64_t out, int64_t in, double bound, std::mt19937_64& rng) {
  struct Layout {
    int64_t block, bytes;
    std::vector<std::pair<int, double>> f16s;  // (byte offset, value in units of bound)
  };
  Layout l = type == "q8_0"   ? Layout{32, 34, {{0, 1.0 / 127}}}
             : type == "q4_0" ? Layout{32, 18, {{0, 1.0 / 8}}}
             : type == "q4_1" ? Layout{32, 20, {{0, 2.0 / 15}, {2, -1.0}}}
             : type == "q4_K" ? Layout{256, 144, {{0, 2.0 / (15 * 63)}, {2, 1.0 / 63}}}
             : type == "q5_K" ? Layout{256, 176, {{0, 2.0 / (31 * 63)}, {2, 1.0 / 63}}}
             : type == "q6_K" ? Layout{256, 210, {{208, 1.0 / (32 * 127)}}}
                              : Layout{0, 0, {}};
  if (l.block == 0 || in % l.block != 0) throw tg::Error("[random_blocks] cannot make " + type + " blocks of rows of " + std::to_string(in));
  std::vector<uint8_t> b(size_t(out * in / l.block * l.bytes));
  for (uint8_t& x : b) x = uint8_t(rng());
  for (size_t i = 0; i < b.size(); i += size_t(l.bytes))
    for (auto [off, v] : l.f16s) {
      uint16_t h = tg::float_to_half_bits(float(v * bound * (0.5 + double(rng() % 1024) / 1024)));
      std::memcpy(&b[i + size_t(off)], &h, 2);
    }
  return tg::Tensor::from_blob(b.data(), {out, in / l.block, l.bytes}, tg::dtypes::uint8);
}

/** Write a random LLaMA GGUF with vocabulary `v`: matrices stored as `type` ("f32", "f16", "q8_0", "q4_0"
 * quantised from random_weights, stacked experts too; "q4_1", "q4_K", "q5_K", "q6_K" as random blocks of the same
 * spread, experts then f32), norms as f32. */
inline void write_random_llama(const std::string& path, tg::models::LlamaConfig c, uint64_t seed, const std::string& type = "f32",
                               const Vocab& v = byte_vocab()) {
  c.vocab_size = int64_t(v.tokens.size());
  std::map<std::string, tg::Tensor> w = random_weights(c, seed);
  std::map<std::string, std::string> types;
  std::mt19937_64 rng(seed);
  for (auto& [name, t] : w) {
    if (t.ndim() == 1 || (t.ndim() == 3 && blocks_only(type))) continue;  // stacked experts: f16, q8_0, q4_0 only
    types[name] = type;
    if (!blocks_only(type)) continue;
    int64_t in = t.shape()[1];
    double gain = name.find("output.") != std::string::npos                                               ? 3.0
                  : name.find("attn_q") != std::string::npos || name.find("attn_k") != std::string::npos ? 2.0
                  : name.find("attn_output") != std::string::npos || name.find("ffn_down") != std::string::npos ? 0.5
                                                                                                            : 1.0;
    double bound = name == "token_embd.weight" ? 1.0 : gain * std::sqrt(3.0 / double(in));
    t = random_blocks(type, t.shape()[0], in, bound, rng);
  }
  tg::nn::gguf_save(path, metadata(c, v), w, types);
}

/** Random GPT-2 weights by Hugging Face's names (Conv1D layout (in, out); `prefix` "transformer." as GPT2LMHeadModel
 *  writes them), from tg's generator seeded with `seed`, at scales that keep logits spread. */
inline std::map<std::string, tg::Tensor> random_gpt2_weights(const tg::models::GPT2Config& c, uint64_t seed,
                                                            const std::string& prefix = "") {
  using tg::Tensor;
  Tensor::manual_seed(seed);
  auto lin = [](int64_t in, int64_t out, double gain = 1.0) {
    double b = gain * std::sqrt(3.0 / double(in));
    return Tensor::uniform({in, out}, -b, b).realize();
  };
  auto vec = [](int64_t n, double lo, double hi) { return Tensor::uniform({n}, lo, hi).realize(); };
  int64_t D = c.dim, F = c.hidden_dim;
  std::map<std::string, Tensor> w;
  w[prefix + "wte.weight"] = Tensor::uniform({c.vocab_size, D}, -1.0, 1.0).realize();
  w[prefix + "wpe.weight"] = Tensor::uniform({c.n_positions, D}, -0.5, 0.5).realize();
  w[prefix + "ln_f.weight"] = vec(D, 0.8, 1.2);
  w[prefix + "ln_f.bias"] = vec(D, -0.1, 0.1);
  for (int64_t i = 0; i < c.n_layers; i++) {
    std::string p = prefix + "h." + std::to_string(i) + ".";
    w[p + "ln_1.weight"] = vec(D, 0.8, 1.2);
    w[p + "ln_1.bias"] = vec(D, -0.1, 0.1);
    w[p + "attn.c_attn.weight"] = lin(D, 3 * D, 1.5);
    w[p + "attn.c_attn.bias"] = vec(3 * D, -0.2, 0.2);
    w[p + "attn.c_proj.weight"] = lin(D, D, 0.5);
    w[p + "attn.c_proj.bias"] = vec(D, -0.1, 0.1);
    w[p + "ln_2.weight"] = vec(D, 0.8, 1.2);
    w[p + "ln_2.bias"] = vec(D, -0.1, 0.1);
    w[p + "mlp.c_fc.weight"] = lin(D, F);
    w[p + "mlp.c_fc.bias"] = vec(F, -0.2, 0.2);
    w[p + "mlp.c_proj.weight"] = lin(F, D, 0.5);
    w[p + "mlp.c_proj.bias"] = vec(D, -0.1, 0.1);
  }
  return w;
}

/** Write a random GPT-2 as a safetensors file and, beside it, the config.json Hugging Face keeps with it (n_head,
 *  n_embd, n_layer, n_positions, vocab_size, layer_norm_epsilon). */
inline void write_random_gpt2(const std::string& path, const tg::models::GPT2Config& c, uint64_t seed, const std::string& prefix = "") {
  tg::nn::safe_save(random_gpt2_weights(c, seed, prefix), path, {{"format", "pt"}});
  std::ofstream f(std::filesystem::path(path).parent_path() / "config.json");
  f << "{\"model_type\": \"gpt2\", \"n_head\": " << c.n_heads << ", \"n_embd\": " << c.dim << ", \"n_layer\": " << c.n_layers
    << ", \"n_positions\": " << c.n_positions << ", \"vocab_size\": " << c.vocab_size << ", \"layer_norm_epsilon\": " << c.norm_eps
    << "}\n";
  if (!f) throw tg::Error("[write_random_gpt2] cannot write config.json beside " + path);
}

}  // namespace llm_util
