#pragma once
// A LLaMA-family decoder in tg's Tensor API, as llama.cpp runs its "llama" and "qwen2" architectures: token embedding,
// RMSNorm, RoPE with the file's theta ("llama": llama.cpp's "normal" mode, rotated pairs are adjacent, x[2i] and
// x[2i+1]; "qwen2": NEOX mode, x[i] and x[i + head_dim/2]), grouped-query attention (qwen2: biases on q, k, v) with a
// per-layer KV cache, SwiGLU MLP (or a mixture of SwiGLU experts with top-k routing, as Mixtral), output head (tied to the embedding when the file has none). Weights by llama.cpp's
// GGUF tensor names (token_embd.weight, blk.N.attn_q.weight, ..., output_norm.weight, output.weight), shapes as tg
// reads them from GGUF: (out_features, in_features).
// The KV cache holds max_context positions; a decode step's position is the Variable "start_pos", so its kernels are
// compiled once and TinyJit replays them for every token. A step writes its own rows of the cache in place (an assign
// into a view of the buffer) and reads rows 0..its position; the cache is float16 by default (llama.cpp's), allocated
// unwritten, so positions never reached take no resident memory.
// Several sequences can coexist (a server's requests): `slots` KV caches, each with its own decode TinyJit, share the
// weights; prefill, decode and reset name the slot they work on (slot 0 by default). A slot's kernels are the same
// kernels on other buffers, so they compile once for all slots.
// Thread-safety: a Llama is used from one thread (its caches and JIT are state).
#include "tg/config.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tg/jit.hpp"
#include "tg/nn/state.hpp"
#include "tg/tensor.hpp"
#include "tg/variable.hpp"

namespace tg::models {

/** The hyperparameters, from GGUF metadata ("llama.*" keys) or given. */
struct LlamaConfig {
  /// model width, blocks, query heads, key/value heads (GQA: fewer), FFN width and vocabulary size
  ///@{
  int64_t dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, hidden_dim = 0, vocab_size = 0;
  ///@}
  int64_t max_context = 0;  ///< KV cache length (positions 0..max_context-1)
  /// the KV cache's element type: float16 (llama.cpp's default: half the memory, keys and values rounded to f16 as
  /// they are written) or float32 (exact: the libtorch comparison)
  DType cache_dtype = dtypes::float16;
  /// mixture of experts (Mixtral layout, "*.expert_count" > 0): each layer's MLP is n_experts SwiGLU experts of
  /// hidden_dim, stacked (blk.N.ffn_{gate,up,down}_exps.weight), and a router (blk.N.ffn_gate_inp.weight, (n_experts,
  /// dim)); each token runs the n_experts_used experts of the largest router logits, weighted by the softmax over them
  ///@{
  int64_t n_experts = 0, n_experts_used = 0;
  ///@}
  /// RMSNorm's epsilon, and RoPE's base frequency
  ///@{
  double norm_eps = 1e-5, rope_theta = 10000.0;
  ///@}
  std::string arch = "llama";  ///< "llama", or "qwen2": RoPE on the two halves (NEOX), biases on q, k and v
  /// RoPE rotates the two halves of each head (NEOX, qwen2) rather than interleaved pairs
  bool rope_halves() const { return arch == "qwen2"; }
  /// the q, k and v projections have biases (qwen2)
  bool qkv_bias() const { return arch == "qwen2"; }
  /// width of one attention head (dim / n_heads)
  int64_t head_dim() const { return dim / n_heads; }
  /** From a GGUF file's metadata: general.architecture "llama" or "qwen2" (keys under that prefix); max_context 0
   *  takes its context_length. A missing or inconsistent key is a tg::Error naming `file` and the key. */
  static LlamaConfig from_gguf(const nn::GGUFFile& f, const std::string& file, int64_t max_context = 0);
};

/** The logits (batch, T, vocab) of whole sequences `tokens` (batch, T) int32 at positions 0..T-1, causal, without a
 *  KV cache: Llama's graph on float32 weights by llama.cpp's names (as Llama takes them), differentiable (the weights
 *  may require grad: examples/llm_train trains a model with it). A missing or mis-shaped weight is a tg::Error. */
Tensor llama_logits(const LlamaConfig& cfg, const std::map<std::string, Tensor>& weights, const Tensor& tokens);

/// A Llama-family model (Llama, Mistral, Mixtral, Qwen2) with a KV cache, from GGUF weights (float or quantised).
class Llama {
 public:
  /** The model from weights by llama.cpp's names; a missing or mis-shaped
   * weight is a tg::Error naming it. `types` gives the GGML type of weights kept as a GGUF file stores them
   * (nn::gguf_load with dequantise = false: f16/bf16 tensors, uint8 blocks of q8_0, q4_0, q4_K, ...); those stay
   * as they are in memory and are dequantised by tensor ops (nn::ggml_dequantize) inside the kernels that read
   * them (each linear layer is one kernel reading the blocks). A weight not named there is float32. `slots`: the
   * number of KV caches (sequences that coexist). */
  Llama(LlamaConfig cfg, std::map<std::string, Tensor> weights, int64_t batch = 1,
        const std::map<std::string, std::string>& types = {}, int64_t slots = 1);
  /** Load a GGUF file. Its weights stay as the file stores them (mapped through DISK, copied once onto the
   * default device: memory about the file's tensor bytes), dequantised inside the kernels; dequantise = true
   * dequantises them to float32 at load instead (nn::gguf_load), 4 bytes a weight. */
  static std::unique_ptr<Llama> from_gguf(const std::string& path, int64_t max_context = 0, int64_t batch = 1,
                                          bool dequantise = false, int64_t slots = 1, DType cache_dtype = dtypes::float16);
  /** The model from a GGUF file already read (its metadata also gives the tokenizer): `f` read by nn::gguf_load,
   * either way (tensors kept as stored, as `from_gguf` does, or dequantised); `path` is used in errors. */
  static std::unique_ptr<Llama> from_file(nn::GGUFFile f, const std::string& path, int64_t max_context = 0,
                                          int64_t batch = 1, int64_t slots = 1, DType cache_dtype = dtypes::float16);
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  /// the hyperparameters the model was built with
  const LlamaConfig& config() const { return cfg_; }
  /** The number of KV-cache slots. */
  int64_t slots() const { return int64_t(caches_.size()); }
  /** The forward pass of tokens (batch, T) int32 at positions
   * start_pos..start_pos+T-1, writing their keys and values into the cache:
   * logits (batch, T, vocab), lazy. T > 1 needs a concrete start_pos (causal
   * mask); T == 1 takes a symbolic one. `last_only` computes the head for the
   * last position only: (batch, 1, vocab). Works on KV-cache slot `slot`. */
  Tensor forward(const Tensor& tokens, const sint& start_pos, bool last_only = false, int64_t slot = 0);
  /** Prefill: forward at a concrete position, realised. */
  Tensor prefill(const std::vector<int32_t>& tokens, int64_t start_pos = 0, bool last_only = false, int64_t slot = 0);
  /** One decode step for one token per sequence (batch tokens) at `pos`,
   * through slot's TinyJit with start_pos bound to pos: logits (batch, vocab). */
  Tensor decode(const std::vector<int32_t>& tokens, int64_t pos, int64_t slot = 0);
  /** Start a new sequence in a slot. Its KV caches are not cleared: a step at position p reads rows 0..p only, and
   *  every one of them was written by this sequence's steps before (the caches are allocated unwritten, so the
   *  pages of positions never reached are not resident). */
  void reset(int64_t slot = 0);
  /** The TinyJit of a slot's decode (calls, captured kernels); null before its first decode. */
  const TinyJit* decode_jit(int64_t slot = 0) const { return caches_.at(size_t(slot)).jit.get(); }
  /** The bytes of the device buffers that hold the weights (each buffer once: a tied output head is not counted
   * twice); with weights kept as stored, about the GGUF file's tensor bytes. */
  int64_t weight_bytes() const;
  /** The bytes of the KV caches' buffers, every slot and layer (2 x slots x layers x batch x max_context x kv_heads x
   *  head_dim elements of cache_dtype). */
  int64_t cache_bytes() const;

 private:
  struct Layer {
    Tensor attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;  // MoE: w_* stacked (n_experts, ...)
    std::optional<Tensor> router;                                       // MoE: (n_experts, dim)
    std::optional<Tensor> bq, bk, bv;
  };
  struct Cache {  // one sequence's KV cache: per layer (batch, max_context, kv_heads, head_dim), and its decode JIT
    std::vector<Tensor> k, v;
    std::unique_ptr<TinyJit> jit;
  };
  // realises resid with the layer's caches ck, cv
  Tensor attention(Layer& l, Tensor& ck, Tensor& cv, Tensor& resid, const sint& start_pos, int64_t T);
  Cache& cache(int64_t slot, const char* op);
  LlamaConfig cfg_;
  int64_t batch_;
  Tensor tok_embd_, output_norm_, output_, rope_cos_, rope_sin_;
  std::string tok_embd_type_ = "f32";  // tok_embd_ as stored: rows are picked first, then dequantised
  std::vector<Tensor> stored_;        // every weight as given (the buffers weight_bytes counts)
  std::vector<Layer> layers_;
  std::vector<Cache> caches_;
  Variable start_pos_;
};

}  // namespace tg::models
