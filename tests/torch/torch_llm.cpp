// The LLaMA model (tg/models/llama.hpp) against a libtorch reference
// implementation of the same architecture, written here from llama.cpp's
// description (RMSNorm, "normal" RoPE on adjacent pairs, grouped-query
// attention with query head h reading KV head h / (heads / kv_heads), SwiGLU,
// output head) and run in float64 on the whole sequence without a cache. tg
// runs float32 from a GGUF file written by nn::gguf_save: the prefill of the
// whole prompt, a prefill in two chunks, and decode steps through the KV cache
// and TinyJit; logits are compared at every position. (torch's headers bring
// glog's CHECK macro: the doctest macros are spelled DOCTEST_CHECK here.)
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "../../examples/llm_model_util.hpp"
#include "tg/models/llama.hpp"

namespace {

using tg::models::LlamaConfig;

torch::Tensor to_torch64(const tg::Tensor& x) {
  std::vector<float> v = x.cast(tg::dtypes::float32).to_vector<float>();
  std::vector<int64_t> s(x.shape().begin(), x.shape().end());
  return torch::from_blob(v.data(), s, torch::kFloat).clone().to(torch::kDouble);
}

// The reference: logits (T, vocab) of the whole token sequence, float64.
torch::Tensor reference_logits(const std::map<std::string, torch::Tensor>& w, const LlamaConfig& c, const std::vector<int32_t>& toks) {
  int64_t T = int64_t(toks.size()), D = c.dim, H = c.n_heads, KVH = c.n_kv_heads, hd = c.head_dim();
  auto W = [&](const std::string& n) { return w.at(n); };
  auto rms = [&](const torch::Tensor& x, const torch::Tensor& g) { return x * torch::rsqrt(x.pow(2).mean({-1}, true) + c.norm_eps) * g; };
  torch::Tensor pos = torch::arange(T, torch::kDouble).unsqueeze(1);
  torch::Tensor inv = torch::pow(c.rope_theta, -torch::arange(0, hd, 2, torch::kDouble) / double(hd)).unsqueeze(0);
  torch::Tensor cs = torch::cos(pos * inv).view({T, 1, hd / 2}), sn = torch::sin(pos * inv).view({T, 1, hd / 2});
  auto rope = [&](const torch::Tensor& x, int64_t nh) {
    if (c.rope_halves()) {  // NEOX: (x[i], x[i + hd/2])
      torch::Tensor a = x.narrow(-1, 0, hd / 2), b = x.narrow(-1, hd / 2, hd / 2);
      return torch::cat({a * cs - b * sn, a * sn + b * cs}, -1);
    }
    torch::Tensor p = x.view({T, nh, hd / 2, 2}), a = p.select(-1, 0), b = p.select(-1, 1);
    return torch::stack({a * cs - b * sn, a * sn + b * cs}, -1).view({T, nh, hd});
  };
  std::vector<int64_t> ids(toks.begin(), toks.end());
  torch::Tensor x = W("token_embd.weight").index_select(0, torch::tensor(ids, torch::kLong));
  torch::Tensor causal = torch::full({T, T}, -INFINITY, torch::kDouble).triu(1);
  for (int64_t i = 0; i < c.n_layers; i++) {
    std::string p = "blk." + std::to_string(i) + ".";
    torch::Tensor h = rms(x, W(p + "attn_norm.weight"));
    auto proj = [&](const std::string& n) {
      torch::Tensor y = h.matmul(W(p + n + ".weight").t());
      return c.qkv_bias() ? y + W(p + n + ".bias") : y;
    };
    torch::Tensor q = rope(proj("attn_q").view({T, H, hd}), H);
    torch::Tensor k = rope(proj("attn_k").view({T, KVH, hd}), KVH).repeat_interleave(H / KVH, 1);
    torch::Tensor v = proj("attn_v").view({T, KVH, hd}).repeat_interleave(H / KVH, 1);
    torch::Tensor s = torch::einsum("thd,shd->hts", {q, k}) / std::sqrt(double(hd)) + causal;
    torch::Tensor o = torch::einsum("hts,shd->thd", {torch::softmax(s, -1), v}).reshape({T, D});
    x = x + o.matmul(W(p + "attn_output.weight").t());
    h = rms(x, W(p + "ffn_norm.weight"));
    torch::Tensor f = torch::silu(h.matmul(W(p + "ffn_gate.weight").t())) * h.matmul(W(p + "ffn_up.weight").t());
    x = x + f.matmul(W(p + "ffn_down.weight").t());
  }
  return rms(x, W("output_norm.weight")).matmul(W("output.weight").t());
}

// max |tg - ref| relative to the largest |ref| of the row (float32 against
// float64 through the whole model)
double row_err(const std::vector<float>& got, const torch::Tensor& ref_row) {
  DOCTEST_REQUIRE(int64_t(got.size()) == ref_row.numel());
  torch::Tensor g = torch::from_blob(const_cast<float*>(got.data()), {int64_t(got.size())}, torch::kFloat).to(torch::kDouble);
  return ((g - ref_row).abs().max() / ref_row.abs().max().clamp_min(1.0)).item<double>();
}

struct Model {
  LlamaConfig cfg;
  std::string type;
};

}  // namespace

TEST_CASE(
    "LLaMA from a tg-written GGUF matches a libtorch reference: prefill, "
    "chunked prefill, KV-cache decode under TinyJit") {
  // 2 layers, dim 64, 4 query heads over 2 KV heads (and over 1: multi-query),
  // SwiGLU 128, vocab 320; f32 and q8_0 files (the q8_0 reference uses the
  // dequantised weights the file holds; tg keeps the q8_0 blocks and
  // dequantises them inside its kernels, Llama::from_gguf's default)
  std::vector<Model> models;
  LlamaConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 128, c.max_context = 32;
  c.rope_theta = 500000.0, c.norm_eps = 1e-5;
  models.push_back({c, "f32"});
  c.n_kv_heads = 1, c.rope_theta = 10000.0;
  models.push_back({c, "q8_0"});
  c.arch = "qwen2", c.n_kv_heads = 2;  // RoPE on halves, q/k/v biases
  models.push_back({c, "f32"});
  std::vector<int32_t> toks = {1, 300, 17, 45, 290, 3, 311, 88, 259, 260, 301, 150};
  int64_t T = int64_t(toks.size());
  for (const Model& m : models) {
    DOCTEST_CAPTURE(m.type);
    DOCTEST_CAPTURE(m.cfg.n_kv_heads);
    DOCTEST_CAPTURE(m.cfg.arch);
    std::string path =
        (std::filesystem::temp_directory_path() / ("tg_llama_" + std::to_string(getpid()) + "_" + m.cfg.arch + "_" + m.type + ".gguf")).string();
    llm_util::write_random_llama(path, m.cfg, 7, m.type);
    tg::nn::GGUFFile f = tg::nn::gguf_load(path);
    std::map<std::string, torch::Tensor> tw;
    for (const auto& [name, t] : f.tensors) tw[name] = to_torch64(t);
    LlamaConfig lc = LlamaConfig::from_gguf(f, path);
    DOCTEST_CHECK(lc.max_context == m.cfg.max_context);
    DOCTEST_CHECK(lc.rope_theta == m.cfg.rope_theta);
    torch::Tensor ref = reference_logits(tw, lc, toks);  // (T, vocab)
    auto llm = tg::models::Llama::from_gguf(path);
    std::filesystem::remove(path);
    constexpr double kTol = 5e-6;  // seen: 6.4e-7
    // the whole prompt in one step, no cache read before it: every position
    std::vector<float> all = llm->prefill(toks).to_vector<float>();
    int64_t V = lc.vocab_size;
    for (int64_t t = 0; t < T; t++) {
      DOCTEST_CAPTURE(t);
      DOCTEST_CHECK(row_err(std::vector<float>(all.begin() + t * V, all.begin() + (t + 1) * V), ref[t]) < kTol);
    }
    // two sequences through the cache: a prefill of 5 (its last row), then
    // decode steps (TinyJit replays from the 4th)
    for (int seq = 0; seq < 2; seq++) {
      DOCTEST_CAPTURE(seq);
      llm->reset();
      std::vector<int32_t> head(toks.begin(), toks.begin() + 5);
      DOCTEST_CHECK(row_err(llm->prefill(head, 0, true).to_vector<float>(), ref[4]) < kTol);
      for (int64_t t = 5; t < T; t++) {
        DOCTEST_CAPTURE(t);
        DOCTEST_CHECK(row_err(llm->decode({toks[size_t(t)]}, t).to_vector<float>(), ref[t]) < kTol);
      }
    }
    DOCTEST_CHECK(llm->decode_jit()->replaying());
    // a prefill in two chunks: the second attends over the first through the
    // cache
    llm->reset();
    llm->prefill(std::vector<int32_t>(toks.begin(), toks.begin() + 7));
    std::vector<float> rest = llm->prefill(std::vector<int32_t>(toks.begin() + 7, toks.end()), 7).to_vector<float>();
    for (int64_t t = 7; t < T; t++) {
      DOCTEST_CAPTURE(t);
      DOCTEST_CHECK(row_err(std::vector<float>(rest.begin() + (t - 7) * V, rest.begin() + (t - 6) * V), ref[t]) < kTol);
    }
  }
}
