// Writes a random-weight LLaMA GGUF with a byte-level vocabulary (SentencePiece-style, or GPT-2 BPE with --vocab gpt2)
// (examples/llm_model_util.hpp), for trying build/examples/llm and for the
// llama.cpp check and bench/llm:
//   build/examples/llm_make_model OUT.gguf [--dim 64] [--layers 2] [--heads 4]
//   [--kv-heads 2] [--ffn 128] [--ctx 256]
//                                 [--type f32|f16|q8_0|q4_0|q4_1|q4_K|q5_K|q6_K] [--seed 1]
// (q4_1 and the K-quants are random blocks: tg has no quantiser for them; K-quant rows need a multiple of 256)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "llm_model_util.hpp"
#include "tg/error.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr,
                 "usage: llm_make_model OUT.gguf [--dim D] [--layers "
                 "L] [--heads H] [--kv-heads K] [--ffn F] [--ctx C] "
                 "[--type f32|f16|q8_0|q4_0|q4_1|q4_K|q5_K|q6_K] [--vocab llama|gpt2] [--arch llama|qwen2] [--seed S]\n");
    return 2;
  }
  tg::models::LlamaConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 128, c.max_context = 256;
  std::string type = "f32", vocab = "llama";
  uint64_t seed = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--dim")
      c.dim = std::stoll(v);
    else if (a == "--layers")
      c.n_layers = std::stoll(v);
    else if (a == "--heads")
      c.n_heads = std::stoll(v);
    else if (a == "--kv-heads")
      c.n_kv_heads = std::stoll(v);
    else if (a == "--ffn")
      c.hidden_dim = std::stoll(v);
    else if (a == "--ctx")
      c.max_context = std::stoll(v);
    else if (a == "--type")
      type = v;
    else if (a == "--vocab")
      vocab = v;
    else if (a == "--arch")
      c.arch = v;
    else if (a == "--seed")
      seed = std::stoull(v);
    else {
      std::fprintf(stderr, "llm_make_model: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    if (vocab != "llama" && vocab != "gpt2") {
      std::fprintf(stderr, "llm_make_model: --vocab is llama or gpt2, got %s\n", vocab.c_str());
      return 2;
    }
    llm_util::write_random_llama(argv[1], c, seed, type, vocab == "gpt2" ? llm_util::gpt2_vocab() : llm_util::byte_vocab());
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "llm_make_model: %s\n", e.what());
    return 1;
  }
  std::printf(
      "%s: dim %lld, %lld layers, %lld heads (%lld KV), ffn %lld, "
      "context %lld, %s\n",
      argv[1], (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads, (long long)c.n_kv_heads, (long long)c.hidden_dim,
      (long long)c.max_context, type.c_str());
  return 0;
}
