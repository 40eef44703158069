// GPT-2 (see tg/models/gpt2.hpp): the graph of Hugging Face's GPT2LMHeadModel (and OpenAI's gpt-2 model.py) in tg's
// Tensor ops, with Llama's KV cache under TinyJit (src/models/llama.cpp).
#include "tg/models/gpt2.hpp"

#include "kv_cache.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "tg/device.hpp"
#include "tg/error.hpp"
#include "tg/nn/state.hpp"

namespace tg::models {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("[gpt2] " + what); }

const Tensor* find(const std::map<std::string, Tensor>& w, const std::string& name) {
  auto it = w.find(name);
  return it == w.end() ? nullptr : &it->second;
}

std::string layer(int64_t i) { return "h." + std::to_string(i) + "."; }

}  // namespace

GPT2Config GPT2Config::from_weights(const std::map<std::string, Tensor>& w, const std::string& file, int64_t n_heads,
                                    int64_t max_context, double norm_eps) {
  auto need = [&](const std::string& name, int ndim) -> const Tensor& {
    const Tensor* t = find(w, name);
    if (!t) fail(file + ": tensor '" + name + "' is missing");
    if (t->ndim() != ndim)
      fail(file + ": tensor '" + name + "' has shape " + shape_str(t->shape()) + ", expected " + std::to_string(ndim) + " dimensions");
    return *t;
  };
  GPT2Config c;
  const Tensor& wte = need("wte.weight", 2);
  c.vocab_size = wte.shape()[0], c.dim = wte.shape()[1];
  c.n_positions = need("wpe.weight", 2).shape()[0];
  while (find(w, layer(c.n_layers) + "ln_1.weight")) c.n_layers++;
  if (c.n_layers == 0) fail(file + ": tensor 'h.0.ln_1.weight' is missing (no transformer block)");
  c.hidden_dim = need("h.0.mlp.c_fc.weight", 2).shape()[1];
  c.n_heads = n_heads, c.norm_eps = norm_eps;
  c.max_context = max_context > 0 ? max_context : c.n_positions;
  if (n_heads <= 0 || c.dim % n_heads != 0)
    fail(file + ": " + std::to_string(n_heads) + " heads do not divide the embedding width " + std::to_string(c.dim));
  if (c.max_context > c.n_positions)
    fail(file + ": a context of " + std::to_string(c.max_context) + " is past the model's " + std::to_string(c.n_positions) +
         " positions (wpe.weight)");
  return c;
}

GPT2::GPT2(GPT2Config cfg, std::map<std::string, Tensor> w, int64_t batch, int64_t slots)
    : cfg_(cfg), batch_(batch), start_pos_("start_pos", 0, std::max<int64_t>(cfg.max_context - 1, 0)) {
  const GPT2Config& c = cfg_;
  if (c.max_context <= 0 || c.max_context > c.n_positions)
    fail("max_context must be in 1.." + std::to_string(c.n_positions) + " (the positions), got " + std::to_string(c.max_context));
  if (batch <= 0) fail("batch must be positive, got " + std::to_string(batch));
  if (c.n_heads <= 0 || c.dim % c.n_heads != 0)
    fail(std::to_string(c.n_heads) + " heads do not divide the embedding width " + std::to_string(c.dim));
  auto take = [&](const std::string& name, const Shape& shape) {
    const Tensor* t = find(w, name);
    if (!t) fail("weight '" + name + "' is missing");
    if (t->shape() != shape) fail("weight '" + name + "' has shape " + shape_str(t->shape()) + ", expected " + shape_str(shape));
    if (!dtypes::is_float(t->dtype())) fail("weight '" + name + "' is " + t->dtype().name() + ", expected a float type");
    return t->dtype() == dtypes::float32 ? *t : t->cast(dtypes::float32);  // other floats: cast inside the kernels
  };
  int64_t D = c.dim, F = c.hidden_dim;
  wte_ = take("wte.weight", {c.vocab_size, D});
  wpe_ = take("wpe.weight", {c.n_positions, D});
  head_ = find(w, "lm_head.weight") ? take("lm_head.weight", {c.vocab_size, D}) : wte_;
  lnf_w_ = take("ln_f.weight", {D});
  lnf_b_ = take("ln_f.bias", {D});
  for (int64_t i = 0; i < c.n_layers; i++) {
    std::string p = layer(i);
    Layer l;
    l.ln1_w = take(p + "ln_1.weight", {D});
    l.ln1_b = take(p + "ln_1.bias", {D});
    l.attn_w = take(p + "attn.c_attn.weight", {D, 3 * D});
    l.attn_b = take(p + "attn.c_attn.bias", {3 * D});
    l.proj_w = take(p + "attn.c_proj.weight", {D, D});
    l.proj_b = take(p + "attn.c_proj.bias", {D});
    l.ln2_w = take(p + "ln_2.weight", {D});
    l.ln2_b = take(p + "ln_2.bias", {D});
    l.fc_w = take(p + "mlp.c_fc.weight", {D, F});
    l.fc_b = take(p + "mlp.c_fc.bias", {F});
    l.fc_proj_w = take(p + "mlp.c_proj.weight", {F, D});
    l.fc_proj_b = take(p + "mlp.c_proj.bias", {D});
    layers_.push_back(std::move(l));
  }
  if (find(w, layer(c.n_layers) + "ln_1.weight"))
    fail("the weights have more blocks than the " + std::to_string(c.n_layers) + " layers configured (" + layer(c.n_layers) + "ln_1.weight)");
  if (slots <= 0) fail("slots must be positive, got " + std::to_string(slots));
  caches_.resize(size_t(slots));
  for (Cache& cache : caches_)
    for (int64_t i = 0; i < c.n_layers; i++) {
      cache.k.push_back(Tensor::zeros({batch, c.max_context, c.n_heads, c.head_dim()}).contiguous().realize());
      cache.v.push_back(Tensor::zeros({batch, c.max_context, c.n_heads, c.head_dim()}).contiguous().realize());
    }
}

std::map<std::string, Tensor> GPT2::load_weights(const std::string& path) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : nn::safe_load(path, "DISK")) {
    const std::string prefix = "transformer.";
    std::string n = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
    if (out.count(n)) fail(path + ": tensor '" + n + "' appears with and without the 'transformer.' prefix");
    out.emplace(n, t);
  }
  return out;
}

std::unique_ptr<GPT2> GPT2::from_safetensors(const std::string& path, int64_t n_heads, int64_t max_context, int64_t batch,
                                             int64_t slots) {
  std::map<std::string, Tensor> w = load_weights(path);
  double eps = 1e-5;
  std::filesystem::path cfg_path = std::filesystem::path(path).parent_path() / "config.json";
  nlohmann::json j;  // config.json, read when the head count is not given
  if (n_heads <= 0) {
    if (!std::filesystem::exists(cfg_path))
      fail(path + ": the head count is not given and there is no " + cfg_path.string() + " (its \"n_head\")");
    try {
      std::ifstream f(cfg_path);
      j = nlohmann::json::parse(f);
      if (!j.contains("n_head")) fail(cfg_path.string() + ": \"n_head\" is missing");
      n_heads = j.at("n_head").get<int64_t>();
      if (j.contains("layer_norm_epsilon")) eps = j.at("layer_norm_epsilon").get<double>();
    } catch (const nlohmann::json::exception& e) {
      fail(cfg_path.string() + ": " + e.what());
    }
  }
  GPT2Config c = GPT2Config::from_weights(w, path, n_heads, max_context, eps);
  auto agree = [&](const char* key, const char* what, int64_t have) {
    if (j.is_object() && j.contains(key) && j.at(key).is_number_integer() && j.at(key).get<int64_t>() != have)
      fail(cfg_path.string() + ": \"" + key + "\" " + std::to_string(j.at(key).get<int64_t>()) + " differs from " + path + "'s " + what +
           " (" + std::to_string(have) + ")");
  };
  agree("n_embd", "width of wte.weight", c.dim);
  agree("n_layer", "block count", c.n_layers);
  agree("n_positions", "rows of wpe.weight", c.n_positions);
  agree("vocab_size", "rows of wte.weight", c.vocab_size);
  std::vector<Tensor*> all;  // each tensor copied once out of the mapping onto the default device
  for (auto& [name, t] : w) {
    t = t.to(default_device());
    all.push_back(&t);
  }
  Tensor::realize_all(all);
  try {
    return std::make_unique<GPT2>(c, std::move(w), batch, slots);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + path + ")");
  }
}

GPT2::Cache& GPT2::cache(int64_t slot, const char* op) {
  if (slot < 0 || slot >= slots())
    fail(std::string(op) + ": slot " + std::to_string(slot) + " out of range (the model has " + std::to_string(slots()) + ")");
  return caches_[size_t(slot)];
}

Tensor GPT2::forward(const Tensor& tokens, const sint& start, bool last_only, int64_t slot) {
  const GPT2Config& c = cfg_;
  Cache& kv = cache(slot, "forward");
  if (tokens.ndim() != 2 || tokens.shape()[0] != batch_)
    fail("forward: tokens must be (batch=" + std::to_string(batch_) + ", T), got " + shape_str(tokens.sym_shape()));
  int64_t B = batch_, T = tokens.shape()[1], D = c.dim, H = c.n_heads, hd = c.head_dim(), M = c.max_context;
  if (T < 1) fail("forward: no tokens");
  if (T > 1 && !start.is_int()) fail("forward: " + std::to_string(T) + " tokens need a concrete start position, got " + start.str());
  if (start.min() < 0 || start.max() + T > M)
    fail("forward: positions " + start.str() + ".." + start.str() + "+" + std::to_string(T - 1) + " can reach " +
         std::to_string(start.max() + T - 1) + ", past the KV cache (max_context " + std::to_string(M) + ")");
  Tensor pos = wpe_.shrink({{start, start + T}, {sint(0), sint(D)}}).reshape({1, T, D});
  Tensor x = wte_.index_select(0, tokens.reshape({B * T})).reshape({B, T, D}) + pos;
  sint L = start + T;
  for (size_t i = 0; i < layers_.size(); i++) {
    Layer& l = layers_[i];
    Tensor& ck = kv.k[i];
    Tensor& cv = kv.v[i];
    Tensor qkv = x.layer_norm({D}, l.ln1_w, l.ln1_b, c.norm_eps).matmul(l.attn_w) + l.attn_b;  // (B, T, 3D)
    auto part = [&](int64_t j) { return qkv.shrink({{0, B}, {0, T}, {j * D, (j + 1) * D}}).reshape({B, T, H, hd}); };
    // rows start..start+T-1 of both caches written in place (assigns into views of their buffers)
    Tensor q = part(0), kw = detail::cache_rows(ck, part(1), start), vw = detail::cache_rows(cv, part(2), start);
    Tensor::realize_all({&kw, &vw, &x});
    auto heads = [&](const Tensor& cache) {  // (B, H, L, hd) of positions 0..start+T-1
      return cache.shrink({{sint(0), sint(B)}, {sint(0), L}, {sint(0), sint(H)}, {sint(0), sint(hd)}}).permute({0, 2, 1, 3});
    };
    Tensor scores = q.permute({0, 2, 1, 3}).matmul(heads(ck).permute({0, 1, 3, 2})) * (1.0 / std::sqrt(double(hd)));
    if (T > 1) {
      int64_t s = start.value();
      scores = scores + Tensor::full({T, s + T}, -std::numeric_limits<double>::infinity()).triu(s + 1);
    }
    Tensor att = scores.softmax(-1).matmul(heads(cv)).permute({0, 2, 1, 3}).reshape({B, T, D});
    x = x + (att.matmul(l.proj_w) + l.proj_b);
    Tensor f = (x.layer_norm({D}, l.ln2_w, l.ln2_b, c.norm_eps).matmul(l.fc_w) + l.fc_b).gelu("tanh");
    x = x + (f.matmul(l.fc_proj_w) + l.fc_proj_b);
  }
  if (last_only && T > 1) x = x.shrink({{0, B}, {T - 1, T}, {0, D}});
  return x.layer_norm({D}, lnf_w_, lnf_b_, c.norm_eps).matmul(head_.T());
}

void GPT2::check_tokens(const std::vector<int32_t>& tokens, const char* op) const {
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.vocab_size)
      fail(std::string(op) + ": token " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(cfg_.vocab_size - 1) + ")");
}

Tensor GPT2::prefill(const std::vector<int32_t>& tokens, int64_t start_pos, bool last_only, int64_t slot) {
  if (tokens.empty() || int64_t(tokens.size()) % batch_ != 0)
    fail("prefill: " + std::to_string(tokens.size()) + " tokens do not make " + std::to_string(batch_) + " equal sequences");
  check_tokens(tokens, "prefill");
  Tensor tok = Tensor::from_vector(tokens, {batch_, int64_t(tokens.size()) / batch_});
  return forward(tok, sint(start_pos), last_only, slot).realize();
}

Tensor GPT2::decode(const std::vector<int32_t>& tokens, int64_t pos, int64_t slot) {
  Cache& kv = cache(slot, "decode");
  if (int64_t(tokens.size()) != batch_)
    fail("decode: " + std::to_string(tokens.size()) + " tokens for a batch of " + std::to_string(batch_));
  check_tokens(tokens, "decode");
  if (pos < 0 || pos >= cfg_.max_context)
    fail("decode: position " + std::to_string(pos) + " is past the KV cache (max_context " + std::to_string(cfg_.max_context) + ")");
  if (!kv.jit)
    kv.jit = std::make_unique<TinyJit>(TinyJit::FnVars([this, slot](const std::vector<Tensor>& in, const std::vector<sint>& vars) {
      return std::vector<Tensor>{forward(in[0], vars[0], false, slot).reshape({batch_, cfg_.vocab_size}).contiguous()};
    }));
  Tensor tok = Tensor::from_vector(tokens, {batch_, 1}).realize();
  return (*kv.jit)({tok}, {start_pos_.bind(pos)})[0];
}

void GPT2::reset() {
  for (Cache& kv : caches_)
    for (size_t i = 0; i < kv.k.size(); i++) {
      kv.k[i].assign(Tensor::zeros(kv.k[i].shape()));
      kv.v[i].assign(Tensor::zeros(kv.v[i].shape()));
      Tensor::realize_all({&kv.k[i], &kv.v[i]});
    }
}

}  // namespace tg::models
