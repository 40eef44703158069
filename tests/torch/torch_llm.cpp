// The LLaMA model (tg/models/llama.hpp) against a libtorch reference
// implementation of the same architecture, written here from llama.cpp's
// description (RMSNorm, "normal" RoPE on adjacent pairs, grouped-query
// attention with query head h reading KV head h / (heads / kv_heads), SwiGLU,
// output head) and run in float64 on the whole sequence without a cache. tg
// runs float32 from a GGUF file written by nn::gguf_save: the prefill of the
// whole prompt, a prefill in two chunks, and decode steps through the KV cache
// and TinyJit; logits are compared at every position. (torch's headers bring
// glog's CHECK macro: the doctest macros are spelled DOCTEST_CHECK here.) Also: a mixture of experts (top-k by
// torch's topk), models::llama_logits (the cache-free training forward), and GPT-2 from a Hugging Face-style
// safetensors file against a reference of GPT2LMHeadModel's graph.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "../../examples/llm_model_util.hpp"
#include "../scoped_env.hpp"
#include "tg/device.hpp"
#include "tg/models/gpt2.hpp"
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
    if (c.n_experts == 0) {
      torch::Tensor f = torch::silu(h.matmul(W(p + "ffn_gate.weight").t())) * h.matmul(W(p + "ffn_up.weight").t());
      x = x + f.matmul(W(p + "ffn_down.weight").t());
      continue;
    }
    // Mixtral: per token, the top-k experts by router logit, weighted by the softmax over those k, summed
    torch::Tensor logits = h.matmul(W(p + "ffn_gate_inp.weight").t());  // (T, E)
    auto [top, idx] = logits.topk(c.n_experts_used, -1);
    torch::Tensor wts = torch::softmax(top, -1);
    torch::Tensor y = torch::zeros_like(x);
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < c.n_experts_used; j++) {
        int64_t e = idx[t][j].item<int64_t>();
        torch::Tensor ht = h[t];
        torch::Tensor f = torch::silu(W(p + "ffn_gate_exps.weight")[e].matmul(ht)) * W(p + "ffn_up_exps.weight")[e].matmul(ht);
        y[t] += wts[t][j] * W(p + "ffn_down_exps.weight")[e].matmul(f);
      }
    x = x + y;
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
  // dequantises them inside its kernels, Llama::from_gguf's default; INT_DOT=0: float products, as the reference's,
  // where the default quantises x to q8_0 blocks as llama.cpp does, compared with llama.cpp in the llm suite)
  ScopedEnv float_products("INT_DOT", "0");
  std::vector<Model> models;
  LlamaConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 128, c.max_context = 32;
  c.rope_theta = 500000.0, c.norm_eps = 1e-5;
  models.push_back({c, "f32"});
  c.n_kv_heads = 1, c.rope_theta = 10000.0;
  models.push_back({c, "q8_0"});
  c.arch = "qwen2", c.n_kv_heads = 2;  // RoPE on halves, q/k/v biases
  models.push_back({c, "f32"});
  c.arch = "llama", c.n_experts = 4, c.n_experts_used = 2;  // a mixture of 4 experts, 2 a token (Mixtral's layout)
  models.push_back({c, "f32"});
  models.push_back({c, "q8_0"});  // the stacked experts' q8_0 blocks dequantised in the kernels
  std::vector<int32_t> toks = {1, 300, 17, 45, 290, 3, 311, 88, 259, 260, 301, 150};
  int64_t T = int64_t(toks.size());
  for (const Model& m : models) {
    DOCTEST_CAPTURE(m.type);
    DOCTEST_CAPTURE(m.cfg.n_kv_heads);
    DOCTEST_CAPTURE(m.cfg.arch);
    DOCTEST_CAPTURE(m.cfg.n_experts);
    std::string path =
        (std::filesystem::temp_directory_path() / ("tg_llama_" + std::to_string(getpid()) + "_" + m.cfg.arch + "_" + m.type + std::to_string(m.cfg.n_experts) + ".gguf")).string();
    llm_util::write_random_llama(path, m.cfg, 7, m.type);
    tg::nn::GGUFFile f = tg::nn::gguf_load(path);
    std::map<std::string, torch::Tensor> tw;
    for (const auto& [name, t] : f.tensors) tw[name] = to_torch64(t);
    LlamaConfig lc = LlamaConfig::from_gguf(f, path);
    DOCTEST_CHECK(lc.max_context == m.cfg.max_context);
    DOCTEST_CHECK(lc.rope_theta == m.cfg.rope_theta);
    DOCTEST_CHECK(lc.n_experts == m.cfg.n_experts);
    DOCTEST_CHECK(lc.n_experts_used == m.cfg.n_experts_used);
    torch::Tensor ref = reference_logits(tw, lc, toks);  // (T, vocab)
    {  // the cache-free, differentiable forward (training: examples/llm_train) on the same weights
      std::vector<float> lg = tg::models::llama_logits(lc, f.tensors, tg::Tensor::from_vector(toks, {1, int64_t(toks.size())})).to_vector<float>();
      int64_t V = lc.vocab_size;
      for (int64_t t = 0; t < int64_t(toks.size()); t++) {
        DOCTEST_CAPTURE(t);
        DOCTEST_CHECK(row_err(std::vector<float>(lg.begin() + t * V, lg.begin() + (t + 1) * V), ref[t]) < 5e-6);
      }
    }
    // a float32 KV cache: the reference keeps keys and values exact (the default float16 cache is checked against
    // llama.cpp's in the llm suite)
    auto llm = tg::models::Llama::from_gguf(path, 0, 1, false, 1, tg::dtypes::float32);
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

namespace {

using tg::models::GPT2Config;

// GPT-2's reference (Hugging Face's GPT2LMHeadModel, eval mode): logits (T, vocab) of the whole sequence, float64;
// `w` by Hugging Face's names without the "transformer." prefix, linear weights (in, out).
torch::Tensor gpt2_reference(const std::map<std::string, torch::Tensor>& w, const GPT2Config& c, const std::vector<int32_t>& toks) {
  int64_t T = int64_t(toks.size()), D = c.dim, H = c.n_heads, hd = c.head_dim();
  auto W = [&](const std::string& n) { return w.at(n); };
  auto ln = [&](const torch::Tensor& x, const std::string& n) {
    return torch::layer_norm(x, {D}, W(n + ".weight"), W(n + ".bias"), c.norm_eps);
  };
  auto lin = [&](const torch::Tensor& x, const std::string& n) { return x.matmul(W(n + ".weight")) + W(n + ".bias"); };
  std::vector<int64_t> ids(toks.begin(), toks.end());
  torch::Tensor x = W("wte.weight").index_select(0, torch::tensor(ids, torch::kLong)) + W("wpe.weight").narrow(0, 0, T);
  torch::Tensor causal = torch::full({T, T}, -INFINITY, torch::kDouble).triu(1);
  for (int64_t i = 0; i < c.n_layers; i++) {
    std::string p = "h." + std::to_string(i) + ".";
    torch::Tensor qkv = lin(ln(x, p + "ln_1"), p + "attn.c_attn");
    std::vector<torch::Tensor> parts = qkv.split(D, -1);
    torch::Tensor q = parts[0].view({T, H, hd}), k = parts[1].view({T, H, hd}), v = parts[2].view({T, H, hd});
    torch::Tensor s = torch::einsum("thd,shd->hts", {q, k}) / std::sqrt(double(hd)) + causal;
    torch::Tensor o = torch::einsum("hts,shd->thd", {torch::softmax(s, -1), v}).reshape({T, D});
    x = x + lin(o, p + "attn.c_proj");
    x = x + lin(torch::gelu(lin(ln(x, p + "ln_2"), p + "mlp.c_fc"), "tanh"), p + "mlp.c_proj");
  }
  return ln(x, "ln_f").matmul(W("wte.weight").t());
}

}  // namespace

TEST_CASE("GPT-2 from a Hugging Face-style safetensors file matches a libtorch reference: prefill, chunked prefill, "
          "KV-cache decode under TinyJit") {
  // 3 blocks, width 48 in 4 heads, MLP 192, vocab 300, 24 positions (a 16-position cache); names with GPT2LMHeadModel's
  // "transformer." prefix, n_head from the config.json beside the file
  GPT2Config c;
  c.dim = 48, c.n_layers = 3, c.n_heads = 4, c.hidden_dim = 192, c.vocab_size = 300, c.n_positions = 24, c.norm_eps = 1e-5;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tg_gpt2_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "model.safetensors").string();
  llm_util::write_random_gpt2(path, c, 11, "transformer.");
  std::map<std::string, torch::Tensor> tw;
  for (const auto& [name, t] : tg::models::GPT2::load_weights(path)) tw[name] = to_torch64(t.to(tg::default_device()));
  auto gpt = tg::models::GPT2::from_safetensors(path, 0, 16, 1, 1, tg::dtypes::float32);  // a float32 cache (default float16)
  std::filesystem::remove_all(dir);
  DOCTEST_CHECK(gpt->config().n_heads == 4);
  DOCTEST_CHECK(gpt->config().n_layers == 3);
  DOCTEST_CHECK(gpt->config().max_context == 16);
  std::vector<int32_t> toks = {5, 299, 17, 140, 3, 77, 250, 0, 64, 199, 12, 100, 42};
  int64_t T = int64_t(toks.size()), V = c.vocab_size;
  torch::Tensor ref = gpt2_reference(tw, gpt->config(), toks);
  constexpr double kTol = 5e-6;
  std::vector<float> all = gpt->prefill(toks).to_vector<float>();
  for (int64_t t = 0; t < T; t++) {
    DOCTEST_CAPTURE(t);
    DOCTEST_CHECK(row_err(std::vector<float>(all.begin() + t * V, all.begin() + (t + 1) * V), ref[t]) < kTol);
  }
  for (int seq = 0; seq < 2; seq++) {  // a prefill of 4 (its last row), then decode steps; TinyJit replays from the 4th
    DOCTEST_CAPTURE(seq);
    gpt->reset();
    DOCTEST_CHECK(row_err(gpt->prefill(std::vector<int32_t>(toks.begin(), toks.begin() + 4), 0, true).to_vector<float>(), ref[3]) < kTol);
    for (int64_t t = 4; t < T; t++) {
      DOCTEST_CAPTURE(t);
      DOCTEST_CHECK(row_err(gpt->decode({toks[size_t(t)]}, t).to_vector<float>(), ref[t]) < kTol);
    }
  }
  DOCTEST_CHECK(gpt->decode_jit()->replaying());
  gpt->reset();  // a prefill in two chunks: the second attends over the first through the cache
  gpt->prefill(std::vector<int32_t>(toks.begin(), toks.begin() + 6));
  std::vector<float> rest = gpt->prefill(std::vector<int32_t>(toks.begin() + 6, toks.end()), 6).to_vector<float>();
  for (int64_t t = 6; t < T; t++) {
    DOCTEST_CAPTURE(t);
    DOCTEST_CHECK(row_err(std::vector<float>(rest.begin() + (t - 6) * V, rest.begin() + (t - 5) * V), ref[t]) < kTol);
  }
}
