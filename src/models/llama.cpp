// The LLaMA-family decoder (see tg/models/llama.hpp): llama.cpp's graph
// (llama.cpp src/llama-model.cpp, build_llama) written with tg's Tensor ops,
// and tinygrad's examples/llama3.py for the KV cache under TinyJit.
#include "tg/models/llama.hpp"

#include "kv_cache.hpp"

#include <cmath>
#include <limits>
#include <set>

#include <sys/mman.h>
#include <unistd.h>

#include "tg/device.hpp"
#include "tg/error.hpp"
#include "tg/schedule.hpp"

namespace tg::models {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("[llama] " + what); }

const nn::GGUFValue* find_key(const nn::GGUFFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  return it == f.metadata.end() ? nullptr : &it->second;
}

// The file mapping's pages under a range dropped from this process (a private mapping's clean pages: read again
// from the file if touched, the page cache keeping them for the next load): the pages of a weight copied out of it
// stop counting in the resident set.
void release_pages(const void* p, size_t n) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE)), b = (uintptr_t(p) + page - 1) / page * page, e = (uintptr_t(p) + n) / page * page;
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

// The decode matvecs' weights (every 2-D q8_0 and q4_0 tensor but the token embedding, whose rows are picked) copied
// row-interleaved by the rows of the device's matvec tile where this machine reads that layout faster
// (nn::ggml_decode_interleave, measured once; INTERLEAVE_ROWS=0 keeps the file's layout, =1 interleaves without
// measuring) and replaced by views of the copies, each copy realised on its own and the file's pages it was read from
// handed back, so the load holds one copy of the weights at a time. Zen 4, 1 thread, quiet, weights from memory
// (bench/qmatvec 8192 x 2048 QMV_MATS=64, the layouts alternated): q8_0 12.6-13.0 -> 24.0-24.6 GB/s, q4_0 8.9-9.1 ->
// 11.1 GB/s (q4_0 is then compute-bound: 11.4 GB/s in cache).
// Once any weight is interleaved, the rest that view the mapping (norms, the token embedding) are copied out of it too
// and the whole mapping is handed back: the page cache may hold the file in 2 MiB folios, mapped whole on a touch,
// so each norm read between two released weights kept its 2 MiB resident (bench/llm ~1B q4_0: 65 MB of the file,
// "FilePmdMapped" in /proc/self/smaps, after the run 1.19-1.21x the file).
void interleave_linears(nn::GGUFFile& f) {
  auto in_mapping = [&](const Tensor& t) -> std::shared_ptr<Buffer> {
    const UOp* b = contiguous_buffer(t.uop().get());
    std::shared_ptr<Buffer> buf = b && !f.mapped.empty() ? buffer_of(b) : nullptr;
    if (!buf || !buf->dev().allocator().host_memory()) return nullptr;
    const auto* p = static_cast<const uint8_t*>(buf->ptr());
    return p >= f.mapped.data() && p + buf->nbytes() <= f.mapped.data() + f.mapped.size() ? buf : nullptr;
  };
  bool any = false;
  for (auto& [name, t] : f.tensors) {
    auto type = f.tensor_types.find(name);
    if (name == "token_embd.weight" || type == f.tensor_types.end() || t.ndim() != 3 || t.dtype() != dtypes::uint8) continue;
    const int64_t rows = nn::ggml_decode_interleave(type->second, t.device());
    if (rows < 2) continue;
    Tensor stored = nn::ggml_interleave_rows(t, rows).realize();
    // only memory inside the file's mapping: a copy elsewhere (an unaligned tensor, gguf_load_bytes) may be shared
    if (std::shared_ptr<Buffer> buf = in_mapping(t)) release_pages(buf->ptr(), buf->nbytes());
    t = nn::ggml_interleaved_view(stored, t.shape()[0]);
    any = true;
  }
  if (!any || f.mapped.empty()) return;
  for (auto& [name, t] : f.tensors)  // through the host: clone().realize() of these left them on the mapping
    if (std::shared_ptr<Buffer> buf = in_mapping(t); buf && int64_t(buf->nbytes()) == t.numel() * int64_t(t.dtype().itemsize()))
      t = Tensor::from_blob(buf->ptr(), t.shape(), t.dtype(), t.device()).realize();
  release_pages(f.mapped.data(), f.mapped.size());
}

}  // namespace

LlamaConfig LlamaConfig::from_gguf(const nn::GGUFFile& f, const std::string& file, int64_t max_context) {
  const nn::GGUFValue* arch = find_key(f, "general.architecture");
  if (!arch) fail(file + ": general.architecture is missing");
  const std::string& a = arch->as_string();
  if (a != "llama" && a != "qwen2") fail(file + ": architecture '" + a + "' is not supported (this model reads \"llama\" and \"qwen2\")");
  auto need = [&](const std::string& k) -> const nn::GGUFValue& {
    const nn::GGUFValue* v = find_key(f, a + "." + k);
    if (!v) fail(file + ": metadata key " + a + "." + k + " is missing");
    return *v;
  };
  LlamaConfig c;
  c.arch = a;
  c.dim = need("embedding_length").as_int();
  c.n_layers = need("block_count").as_int();
  c.hidden_dim = need("feed_forward_length").as_int();
  c.n_heads = need("attention.head_count").as_int();
  const nn::GGUFValue* kv = find_key(f, a + ".attention.head_count_kv");
  c.n_kv_heads = kv ? kv->as_int() : c.n_heads;
  if (const nn::GGUFValue* e = find_key(f, a + ".attention.layer_norm_rms_epsilon")) c.norm_eps = e->as_double();
  if (const nn::GGUFValue* t = find_key(f, a + ".rope.freq_base")) c.rope_theta = t->as_double();
  if (const nn::GGUFValue* s = find_key(f, a + ".rope.scaling.type"); s && s->as_string() != "none")
    fail(file + ": rope scaling '" + s->as_string() + "' is not supported yet");
  c.max_context = max_context > 0 ? max_context : need("context_length").as_int();
  if (const nn::GGUFValue* e = find_key(f, a + ".expert_count"); e && e->as_int() > 0) {
    c.n_experts = e->as_int();
    c.n_experts_used = need("expert_used_count").as_int();
    if (c.n_experts_used <= 0 || c.n_experts_used > c.n_experts)
      fail(file + ": " + a + ".expert_used_count " + std::to_string(c.n_experts_used) + " is not in 1.." + std::to_string(c.n_experts) +
           " (" + a + ".expert_count)");
  }
  auto emb = f.tensors.find("token_embd.weight");
  if (emb == f.tensors.end()) fail(file + ": tensor 'token_embd.weight' is missing");
  c.vocab_size = emb->second.shape().at(0);
  if (c.n_heads <= 0 || c.n_kv_heads <= 0 || c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0 || c.head_dim() % 2 != 0)
    fail(file + ": " + std::to_string(c.n_heads) + " heads, " + std::to_string(c.n_kv_heads) + " KV heads and embedding length " +
         std::to_string(c.dim) +
         " do not fit (heads must divide the length into an even head size, KV "
         "heads the heads)");
  if (const nn::GGUFValue* r = find_key(f, a + ".rope.dimension_count"); r && r->as_int() != c.head_dim())
    fail(file + ": " + a + ".rope.dimension_count " + std::to_string(r->as_int()) + " differs from the head size " +
         std::to_string(c.head_dim()) + " (partial RoPE is not supported)");
  return c;
}

Llama::Llama(LlamaConfig cfg, std::map<std::string, Tensor> w, int64_t batch, const std::map<std::string, std::string>& types,
             int64_t slots)
    : cfg_(cfg), batch_(batch), start_pos_("start_pos", 0, std::max<int64_t>(cfg.max_context - 1, 0)) {
  const LlamaConfig& c = cfg_;
  if (c.max_context <= 0) fail("max_context must be positive, got " + std::to_string(c.max_context));
  if (batch <= 0) fail("batch must be positive, got " + std::to_string(batch));
  if (slots <= 0) fail("slots must be positive, got " + std::to_string(slots));
  if (c.cache_dtype != dtypes::float16 && c.cache_dtype != dtypes::float32)
    fail("cache_dtype must be float16 or float32, got " + c.cache_dtype.name());
  int64_t hd = c.head_dim(), kvd = c.n_kv_heads * hd;
  auto type_of = [&](const std::string& name) {
    auto it = types.find(name);
    return it == types.end() ? std::string("f32") : it->second;
  };
  // the weight's value: a float32 tensor as given, or the lazy dequantisation of the stored form (fused into the
  // kernels that read it)
  auto take = [&](const std::string& name, const Shape& shape) {
    auto it = w.find(name);
    if (it == w.end()) fail("weight '" + name + "' is missing");
    std::string type = type_of(name);
    Tensor v;
    try {
      v = type == "f32" ? it->second : nn::ggml_dequantize(it->second, type);
    } catch (const Error& e) {
      fail("weight '" + name + "': " + e.what());
    }
    if (v.shape() != shape) fail("weight '" + name + "' has shape " + shape_str(v.shape()) + ", expected " + shape_str(shape));
    stored_.push_back(it->second);
    return v;
  };
  tok_embd_ = take("token_embd.weight", {c.vocab_size, c.dim});
  tok_embd_type_ = type_of("token_embd.weight");
  output_ = w.count("output.weight") ? take("output.weight", {c.vocab_size, c.dim}) : tok_embd_;
  if (tok_embd_type_ != "f32") tok_embd_ = w.at("token_embd.weight");  // rows are picked from the stored form
  output_norm_ = take("output_norm.weight", {c.dim});
  for (int64_t i = 0; i < c.n_layers; i++) {
    std::string p = "blk." + std::to_string(i) + ".";
    Layer l;
    l.attn_norm = take(p + "attn_norm.weight", {c.dim});
    l.wq = take(p + "attn_q.weight", {c.dim, c.dim});
    l.wk = take(p + "attn_k.weight", {kvd, c.dim});
    l.wv = take(p + "attn_v.weight", {kvd, c.dim});
    if (c.qkv_bias()) {
      l.bq = take(p + "attn_q.bias", {c.dim});
      l.bk = take(p + "attn_k.bias", {kvd});
      l.bv = take(p + "attn_v.bias", {kvd});
    }
    l.wo = take(p + "attn_output.weight", {c.dim, c.dim});
    l.ffn_norm = take(p + "ffn_norm.weight", {c.dim});
    if (c.n_experts > 0) {
      int64_t E = c.n_experts;
      l.router = take(p + "ffn_gate_inp.weight", {E, c.dim});
      l.w_gate = take(p + "ffn_gate_exps.weight", {E, c.hidden_dim, c.dim});
      l.w_up = take(p + "ffn_up_exps.weight", {E, c.hidden_dim, c.dim});
      l.w_down = take(p + "ffn_down_exps.weight", {E, c.dim, c.hidden_dim});
    } else {
      l.w_gate = take(p + "ffn_gate.weight", {c.hidden_dim, c.dim});
      l.w_up = take(p + "ffn_up.weight", {c.hidden_dim, c.dim});
      l.w_down = take(p + "ffn_down.weight", {c.dim, c.hidden_dim});
    }
    layers_.push_back(std::move(l));
  }
  caches_.resize(size_t(slots));
  for (Cache& kv : caches_)
    for (int64_t i = 0; i < c.n_layers; i++) {
      // unwritten (not zeros): each row is written before any step reads it, and untouched pages stay unallocated
      kv.k.push_back(Tensor::empty({batch, c.max_context, c.n_kv_heads, hd}, c.cache_dtype).realize());
      kv.v.push_back(Tensor::empty({batch, c.max_context, c.n_kv_heads, hd}, c.cache_dtype).realize());
    }
  // RoPE tables: angle(p, i) = p * theta^(-2i/head_dim), i < head_dim/2
  std::vector<float> cs(size_t(c.max_context * hd / 2)), sn(cs.size());
  for (int64_t p = 0; p < c.max_context; p++)
    for (int64_t i = 0; i < hd / 2; i++) {
      double a = double(p) * std::pow(c.rope_theta, -2.0 * double(i) / double(hd));
      cs[size_t(p * hd / 2 + i)] = float(std::cos(a));
      sn[size_t(p * hd / 2 + i)] = float(std::sin(a));
    }
  rope_cos_ = Tensor::from_vector(cs, {c.max_context, hd / 2}).realize();
  rope_sin_ = Tensor::from_vector(sn, {c.max_context, hd / 2}).realize();
}

std::unique_ptr<Llama> Llama::from_gguf(const std::string& path, int64_t max_context, int64_t batch, bool dequantise,
                                        int64_t slots, DType cache_dtype) {
  // kept as stored: a device computing in host memory views the file's mapping (no copy); another (CL, CUDA) gets
  // one copy of each tensor out of the DISK mapping
  bool host = get_device(default_device()).allocator().host_memory();
  return from_file(dequantise ? nn::gguf_load(path) : nn::gguf_load(path, host ? "" : "DISK", false), path, max_context, batch,
                   slots, cache_dtype);
}

std::unique_ptr<Llama> Llama::from_file(nn::GGUFFile f, const std::string& path, int64_t max_context, int64_t batch,
                                        int64_t slots, DType cache_dtype) {
  LlamaConfig c = LlamaConfig::from_gguf(f, path, max_context);
  c.cache_dtype = cache_dtype;
  std::map<std::string, std::string> types;
  bool kept = false, mapped = false;  // tensors as stored (read with dequantise = false), views of the mapping
  for (auto& [name, t] : f.tensors) {
    kept |= t.dtype() != dtypes::float32;
    mapped |= !get_device(t.device()).runs_kernels();
  }
  if (mapped) {  // each tensor copied once out of the mapping onto the default device, which is then unmapped
    std::vector<Tensor*> all;
    for (auto& [name, t] : f.tensors) {
      t = t.to(default_device());
      all.push_back(&t);
    }
    Tensor::realize_all(all);
  }
  if (kept) types = f.tensor_types;
  interleave_linears(f);
  try {
    return std::make_unique<Llama>(c, std::move(f.tensors), batch, types, slots);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + path + ")");
  }
}

namespace {

// RoPE on x (B, T, heads, hd): llama.cpp's "normal" mode rotates the pairs (x[2i], x[2i+1]), its NEOX mode (halves)
// the pairs (x[i], x[i + hd/2]), each by the angle of (position, i).
Tensor rope(const Tensor& x, const Tensor& cos_t, const Tensor& sin_t, const sint& start, int64_t T, bool halves) {
  int64_t B = x.shape()[0], nh = x.shape()[2], hd = x.shape()[3], h2 = hd / 2;
  Tensor c = cos_t.shrink({{start, start + T}, {sint(0), sint(h2)}}).reshape({1, T, 1, h2});
  Tensor s = sin_t.shrink({{start, start + T}, {sint(0), sint(h2)}}).reshape({1, T, 1, h2});
  if (halves) {
    Tensor x0 = x.shrink({{0, B}, {0, T}, {0, nh}, {0, h2}}), x1 = x.shrink({{0, B}, {0, T}, {0, nh}, {h2, hd}});
    return cat({x0 * c - x1 * s, x0 * s + x1 * c}, -1);
  }
  Tensor xr = x.reshape({B, T, nh, h2, 2});
  Tensor x0 = xr.shrink({{0, B}, {0, T}, {0, nh}, {0, h2}, {0, 1}}).reshape({B, T, nh, h2});
  Tensor x1 = xr.shrink({{0, B}, {0, T}, {0, nh}, {0, h2}, {1, 2}}).reshape({B, T, nh, h2});
  Tensor r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
  return stack({r0, r1}, -1).reshape({B, T, nh, hd});
}

// The MLP of normed x (B, T, D): SwiGLU with w_gate, w_up (hidden, D) and w_down (D, hidden); or, with a router
// (E, D), a mixture of E such experts stacked on a first axis: each token takes the k experts of its largest router
// logits (ties: the lower index), weighted by the softmax of those k logits. Every expert is computed for every token
// and the others weighted 0 (dense: for tiny expert counts; the selection stays elementwise and differentiable).
Tensor swiglu_ffn(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down, const std::optional<Tensor>& router,
                  int64_t k) {
  if (!router) return (x.matmul(w_gate.T()).silu() * x.matmul(w_up.T())).matmul(w_down.T());
  int64_t B = x.shape()[0], T = x.shape()[1], D = x.shape()[2], E = router->shape()[0], N = B * T;
  Tensor logits = x.reshape({N, D}).matmul(router->T());  // (N, E)
  // rank of expert i = #experts j with a larger logit, or an equal one and j < i; expert i is taken when rank < k
  Tensor li = logits.reshape({N, E, 1}), lj = logits.reshape({N, 1, E});
  Tensor j_first = (Tensor::arange(E).reshape({1, E}) < Tensor::arange(E).reshape({E, 1})).reshape({1, E, E});
  Tensor ahead = (lj > li).logical_or((lj == li).logical_and(j_first));
  Tensor taken = ahead.cast(dtypes::int32).sum(2) < Tensor(int(k));  // (N, E)
  Tensor m = logits.max(1, true).detach();
  Tensor e = taken.where((logits - m).exp(), Tensor(0.0f));
  Tensor weight = (e / e.sum(1, true)).reshape({N, E, 1, 1});
  Tensor xs = x.reshape({N, 1, 1, D});
  Tensor h = xs.matmul(w_gate.permute({0, 2, 1})).silu() * xs.matmul(w_up.permute({0, 2, 1}));  // (N, E, 1, hidden)
  Tensor y = h.matmul(w_down.permute({0, 2, 1}));                                                   // (N, E, 1, D)
  return (y * weight).sum(1).reshape({B, T, D});
}

}  // namespace

Tensor llama_logits(const LlamaConfig& c, const std::map<std::string, Tensor>& w, const Tensor& tokens) {
  if (tokens.ndim() != 2) fail("llama_logits: tokens must be (batch, T), got " + shape_str(tokens.sym_shape()));
  int64_t B = tokens.shape()[0], T = tokens.shape()[1], D = c.dim, H = c.n_heads, KVH = c.n_kv_heads, hd = c.head_dim();
  if (T < 1 || T > c.max_context) fail("llama_logits: " + std::to_string(T) + " positions, expected 1.." + std::to_string(c.max_context));
  auto W = [&](const std::string& name, const Shape& shape) -> const Tensor& {
    auto it = w.find(name);
    if (it == w.end()) fail("llama_logits: weight '" + name + "' is missing");
    if (it->second.shape() != shape)
      fail("llama_logits: weight '" + name + "' has shape " + shape_str(it->second.shape()) + ", expected " + shape_str(shape));
    return it->second;
  };
  std::vector<float> cs(size_t(T * hd / 2)), sn(cs.size());  // RoPE tables of positions 0..T-1, as Llama's
  for (int64_t p = 0; p < T; p++)
    for (int64_t i = 0; i < hd / 2; i++) {
      double a = double(p) * std::pow(c.rope_theta, -2.0 * double(i) / double(hd));
      cs[size_t(p * hd / 2 + i)] = float(std::cos(a));
      sn[size_t(p * hd / 2 + i)] = float(std::sin(a));
    }
  Tensor cos_t = Tensor::from_vector(cs, {T, hd / 2}), sin_t = Tensor::from_vector(sn, {T, hd / 2});
  Tensor mask = Tensor::full({T, T}, -std::numeric_limits<double>::infinity()).triu(1);
  Tensor x = W("token_embd.weight", {c.vocab_size, D}).index_select(0, tokens.reshape({B * T})).reshape({B, T, D});
  for (int64_t i = 0; i < c.n_layers; i++) {
    std::string p = "blk." + std::to_string(i) + ".";
    Tensor h = x.rms_norm({D}, W(p + "attn_norm.weight", {D}), c.norm_eps);
    auto proj = [&](const char* name, int64_t heads) {
      Tensor y = h.matmul(W(p + name + ".weight", {heads * hd, D}).T());
      if (c.qkv_bias()) y = y + W(p + name + ".bias", {heads * hd});
      return y.reshape({B, T, heads, hd});
    };
    Tensor q = rope(proj("attn_q", H), cos_t, sin_t, sint(0), T, c.rope_halves()).permute({0, 2, 1, 3});  // (B, H, T, hd)
    auto kv_heads = [&](const Tensor& t) {  // (B, T, KVH, hd) -> (B, H, T, hd): query head h reads KV head h / rep
      return t.reshape({B, T, KVH, 1, hd}).expand({B, T, KVH, H / KVH, hd}).reshape({B, T, H, hd}).permute({0, 2, 1, 3});
    };
    Tensor k = kv_heads(rope(proj("attn_k", KVH), cos_t, sin_t, sint(0), T, c.rope_halves()));
    Tensor v = kv_heads(proj("attn_v", KVH));
    Tensor s = (q.matmul(k.permute({0, 1, 3, 2})) * (1.0 / std::sqrt(double(hd)))) + mask;
    Tensor o = s.softmax(-1).matmul(v).permute({0, 2, 1, 3}).reshape({B, T, D});
    x = x + o.matmul(W(p + "attn_output.weight", {D, D}).T());
    Tensor n = x.rms_norm({D}, W(p + "ffn_norm.weight", {D}), c.norm_eps);
    int64_t E = c.n_experts, F = c.hidden_dim;
    if (E > 0)
      x = x + swiglu_ffn(n, W(p + "ffn_gate_exps.weight", {E, F, D}), W(p + "ffn_up_exps.weight", {E, F, D}),
                                W(p + "ffn_down_exps.weight", {E, D, F}), W(p + "ffn_gate_inp.weight", {E, D}), c.n_experts_used);
    else
      x = x + swiglu_ffn(n, W(p + "ffn_gate.weight", {F, D}), W(p + "ffn_up.weight", {F, D}), W(p + "ffn_down.weight", {D, F}),
                                std::nullopt, 0);
  }
  auto out = w.count("output.weight") ? W("output.weight", {c.vocab_size, D}) : W("token_embd.weight", {c.vocab_size, D});
  return x.rms_norm({D}, W("output_norm.weight", {D}), c.norm_eps).matmul(out.T());
}

Llama::Cache& Llama::cache(int64_t slot, const char* op) {
  if (slot < 0 || slot >= slots())
    fail(std::string(op) + ": slot " + std::to_string(slot) + " is outside the " + std::to_string(slots()) + " KV-cache slots");
  return caches_[size_t(slot)];
}

Tensor Llama::attention(Layer& l, Tensor& ck, Tensor& cv, Tensor& resid, const sint& start, int64_t T) {
  Tensor x = resid.rms_norm({cfg_.dim}, l.attn_norm, cfg_.norm_eps);
  const LlamaConfig& c = cfg_;
  int64_t B = batch_, H = c.n_heads, KVH = c.n_kv_heads, hd = c.head_dim(), rep = H / KVH;
  auto proj = [&](const Tensor& w, const std::optional<Tensor>& b, int64_t heads) {
    Tensor y = x.matmul(w.T());
    return (b ? (y + *b) : y).reshape({B, T, heads, hd});
  };
  Tensor q = rope(proj(l.wq, l.bq, H), rope_cos_, rope_sin_, start, T, c.rope_halves());
  Tensor k = rope(proj(l.wk, l.bk, KVH), rope_cos_, rope_sin_, start, T, c.rope_halves());
  Tensor v = proj(l.wv, l.bv, KVH);
  // write rows start..start+T-1 of both caches in place (assigns into views of their buffers). The residual stream
  // is realised with them: the rest of the layer reads it from its buffer instead of computing the layers before again
  Tensor kw = detail::cache_rows(ck, k.cast(ck.dtype()), start), vw = detail::cache_rows(cv, v.cast(cv.dtype()), start);
  Tensor::realize_all({&kw, &vw, &resid});
  // attend over positions 0..start+T-1; query head h reads KV head h / rep
  // (grouped: no copy of the KV heads)
  sint L = start + T;
  auto heads = [&](const Tensor& cache) {
    return cache.shrink({{sint(0), sint(B)}, {sint(0), L}, {sint(0), sint(KVH)}, {sint(0), sint(hd)}})
        .permute({0, 2, 1, 3})
        .reshape({sint(B), sint(KVH), sint(1), L, sint(hd)})
        .cast(dtypes::float32);
  };
  Tensor keys = heads(ck), vals = heads(cv);
  Tensor qh = q.permute({0, 2, 1, 3}).reshape({B, KVH, rep, T, hd});
  Tensor scores = qh.matmul(keys.permute({0, 1, 2, 4, 3})) * (1.0 / std::sqrt(double(hd)));
  if (T > 1) {
    int64_t s = start.value();
    scores = scores + Tensor::full({T, s + T}, -std::numeric_limits<double>::infinity()).triu(s + 1);
  }
  Tensor out = scores.softmax(-1).matmul(vals).reshape({B, H, T, hd}).permute({0, 2, 1, 3}).reshape({B, T, H * hd});
  return out.matmul(l.wo.T());
}

Tensor Llama::forward(const Tensor& tokens, const sint& start, bool last_only, int64_t slot) {
  const LlamaConfig& c = cfg_;
  Cache& kv = cache(slot, "forward");
  if (tokens.ndim() != 2 || tokens.shape()[0] != batch_)
    fail("forward: tokens must be (batch=" + std::to_string(batch_) + ", T), got " + shape_str(tokens.sym_shape()));
  int64_t B = batch_, T = tokens.shape()[1], D = c.dim;
  if (T < 1) fail("forward: no tokens");
  if (T > 1 && !start.is_int()) fail("forward: " + std::to_string(T) + " tokens need a concrete start position, got " + start.str());
  if (start.min() < 0 || start.max() + T > c.max_context)
    fail("forward: positions " + start.str() + ".." + start.str() + "+" + std::to_string(T - 1) + " can reach " +
         std::to_string(start.max() + T - 1) + ", past the KV cache (max_context " + std::to_string(c.max_context) + ")");
  Tensor rows = tok_embd_.index_select(0, tokens.reshape({B * T}));
  Tensor x = (tok_embd_type_ == "f32" ? rows : nn::ggml_dequantize(rows, tok_embd_type_)).reshape({B, T, D});
  for (size_t i = 0; i < layers_.size(); i++) {
    Layer& l = layers_[i];
    Tensor h = x + attention(l, kv.k[i], kv.v[i], x, start, T);
    Tensor n = h.rms_norm({D}, l.ffn_norm, c.norm_eps);
    x = h + swiglu_ffn(n, l.w_gate, l.w_up, l.w_down, l.router, c.n_experts_used);
  }
  if (last_only && T > 1) x = x.shrink({{0, B}, {T - 1, T}, {0, D}});
  return x.rms_norm({D}, output_norm_, c.norm_eps).matmul(output_.T());
}

Tensor Llama::prefill(const std::vector<int32_t>& tokens, int64_t start_pos, bool last_only, int64_t slot) {
  (void)cache(slot, "prefill");
  if (tokens.empty() || int64_t(tokens.size()) % batch_ != 0)
    fail("prefill: " + std::to_string(tokens.size()) + " tokens do not make " + std::to_string(batch_) + " equal sequences");
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.vocab_size)
      fail("prefill: token " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(cfg_.vocab_size - 1) + ")");
  Tensor tok = Tensor::from_vector(tokens, {batch_, int64_t(tokens.size()) / batch_});
  return forward(tok, sint(start_pos), last_only, slot).realize();
}

Tensor Llama::decode(const std::vector<int32_t>& tokens, int64_t pos, int64_t slot) {
  Cache& kv = cache(slot, "decode");
  if (int64_t(tokens.size()) != batch_)
    fail("decode: " + std::to_string(tokens.size()) + " tokens for a batch of " + std::to_string(batch_));
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.vocab_size)
      fail("decode: token " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(cfg_.vocab_size - 1) + ")");
  if (pos < 0 || pos >= cfg_.max_context)
    fail("decode: position " + std::to_string(pos) + " is past the KV cache (max_context " + std::to_string(cfg_.max_context) + ")");
  if (!kv.jit)
    kv.jit = std::make_unique<TinyJit>(TinyJit::FnVars([this, slot](const std::vector<Tensor>& in, const std::vector<sint>& vars) {
      return std::vector<Tensor>{forward(in[0], vars[0], false, slot).reshape({batch_, cfg_.vocab_size}).contiguous()};
    }));
  Tensor tok = Tensor::from_vector(tokens, {batch_, 1}).realize();
  return (*kv.jit)({tok}, {start_pos_.bind(pos)})[0];
}

int64_t Llama::weight_bytes() const {
  std::set<const Buffer*> seen;
  int64_t n = 0;
  for (const Tensor& t : stored_) {
    const UOp* u = t.uop().get();
    while (is_movement(u->op) && contiguous_buffer(u) == nullptr) u = u->src(0);  // a view of an interleaved copy
    const UOp* b = contiguous_buffer(u);
    std::shared_ptr<Buffer> buf = b ? buffer_of(b) : nullptr;
    if (!buf) fail("weight_bytes: a weight " + shape_str(t.shape()) + " is not held in a buffer (realise it first)");
    if (seen.insert(buf.get()).second) n += int64_t(buf->nbytes());
  }
  return n;
}

int64_t Llama::cache_bytes() const {
  int64_t n = 0;
  for (const Cache& kv : caches_)
    for (size_t i = 0; i < kv.k.size(); i++)
      for (const Tensor* t : {&kv.k[i], &kv.v[i]}) n += int64_t(buffer_of(contiguous_buffer(t->uop().get()))->nbytes());
  return n;
}

void Llama::reset(int64_t slot) {
  (void)cache(slot, "reset");  // checks the slot; the next sequence writes each row before it reads it
}

}  // namespace tg::models
