#pragma once
// GPT-2 (the 124M..1.5B family) in tg's Tensor API, from a safetensors file with Hugging Face's tensor names:
// token and learned position embeddings (wte, wpe), pre-LayerNorm blocks of causal multi-head attention (one fused
// q/k/v projection, c_attn) and a GELU (tanh approximation) MLP, a final LayerNorm, and the output head tied to wte.
// Linear layers are Hugging Face's Conv1D: weight (in, out), y = x W + b. Names may carry the "transformer." prefix
// (GPT2LMHeadModel); an "lm_head.weight" equal in shape to wte is used as the head; the attention's mask buffers
// (h.N.attn.bias, h.N.attn.masked_bias) are ignored.
// The KV cache and decode are Llama's (tg/models/llama.hpp): per layer (batch, max_context, heads, head_dim), its
// rows written in place; a decode step's position is the Variable "start_pos" and TinyJit replays its kernels.
// Several sequences can coexist (a server's requests): `slots` KV caches, each with its own decode TinyJit.
// Thread-safety: a GPT2 is used from one thread (its caches and JIT are state).
#include "tg/config.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tg/jit.hpp"
#include "tg/tensor.hpp"
#include "tg/variable.hpp"

namespace tg::models {

/** GPT-2's hyperparameters: the sizes from the weights' shapes, the head count given (or from config.json). */
struct GPT2Config {
  /// model width, transformer blocks, attention heads, MLP width (4*dim) and vocabulary size
  ///@{
  int64_t dim = 0, n_layers = 0, n_heads = 0, hidden_dim = 0, vocab_size = 0;
  ///@}
  int64_t n_positions = 0;  ///< rows of wpe: the longest sequence the model knows
  int64_t max_context = 0;  ///< KV cache length, at most n_positions
  /// LayerNorm's epsilon
  double norm_eps = 1e-5;
  /// the KV cache's dtype: float16 (llama.cpp's, as Llama's) or float32
  DType cache_dtype = dtypes::float16;
  /// width of one attention head (dim / n_heads)
  int64_t head_dim() const { return dim / n_heads; }
  /** The sizes of the weights `w` (Hugging Face's names, prefix removed); n_heads and norm_eps as given,
   *  max_context 0 takes n_positions. A missing or inconsistent tensor is a tg::Error naming `file` and it. */
  static GPT2Config from_weights(const std::map<std::string, Tensor>& w, const std::string& file, int64_t n_heads,
                                 int64_t max_context = 0, double norm_eps = 1e-5);
};

/// GPT-2 inference with a KV cache: weights from safetensors, logits or sampled tokens per step.
class GPT2 {
 public:
  /** The model from weights by Hugging Face's names (without the "transformer." prefix); a missing or mis-shaped
   *  weight is a tg::Error naming it. Weights of another float dtype (f16, bf16) are kept and cast in the kernels.
   *  `slots` KV caches (sequences that coexist, each decoded by its own TinyJit). */
  GPT2(GPT2Config cfg, std::map<std::string, Tensor> weights, int64_t batch = 1, int64_t slots = 1);
  /** Load a safetensors file. n_heads 0 reads n_head (and layer_norm_epsilon) from a config.json beside the file; with
   *  neither it is a tg::Error. max_context 0: n_positions. The KV cache is of cache_dtype (float16 or float32). */
  static std::unique_ptr<GPT2> from_safetensors(const std::string& path, int64_t n_heads = 0, int64_t max_context = 0,
                                                int64_t batch = 1, int64_t slots = 1, DType cache_dtype = dtypes::float16);
  /** The weights of a safetensors file by Hugging Face's names with the "transformer." prefix removed, as views of
   *  the mapped file (DISK); a tg::Error names the file when it cannot be read. */
  static std::map<std::string, Tensor> load_weights(const std::string& path);
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;

  /// the hyperparameters the model was built with
  const GPT2Config& config() const { return cfg_; }
  /// the number of KV-cache slots
  int64_t slots() const { return int64_t(caches_.size()); }
  /** Logits (batch, T, vocab) of tokens (batch, T) int32 at positions start_pos..start_pos+T-1, lazy; writes their
   *  keys and values into slot's cache. T > 1 needs a concrete start_pos; last_only: the head of the last position. */
  Tensor forward(const Tensor& tokens, const sint& start_pos, bool last_only = false, int64_t slot = 0);
  /** Prefill: forward at a concrete position, realised. */
  Tensor prefill(const std::vector<int32_t>& tokens, int64_t start_pos = 0, bool last_only = false, int64_t slot = 0);
  /** One decode step (one token per sequence) at `pos` through slot's TinyJit: logits (batch, vocab). */
  Tensor decode(const std::vector<int32_t>& tokens, int64_t pos, int64_t slot = 0);
  /** Start new sequences: nothing to clear (a step reads only rows its sequence wrote before), as Llama::reset. */
  void reset();
  /** Bytes of every slot's KV caches at full context (of cache_dtype; pages of rows never written are not resident). */
  int64_t cache_bytes() const;
  /** Slot's decode TinyJit; null before its first decode. */
  const TinyJit* decode_jit(int64_t slot = 0) const { return caches_.at(size_t(slot)).jit.get(); }

 private:
  struct Layer {
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc_proj_w, fc_proj_b;
  };
  void check_tokens(const std::vector<int32_t>& tokens, const char* op) const;
  GPT2Config cfg_;
  int64_t batch_;
  Tensor wte_, wpe_, lnf_w_, lnf_b_, head_;
  std::vector<Layer> layers_;
  struct Cache {  // one slot: per layer (batch, max_context, heads, head_dim), and its decode JIT
    std::vector<Tensor> k, v;
    std::unique_ptr<TinyJit> jit;
  };
  Cache& cache(int64_t slot, const char* op);
  std::vector<Cache> caches_;
  Variable start_pos_;
};

}  // namespace tg::models
