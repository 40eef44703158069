// Writes a random-weight LLaMA GGUF with a byte-level vocabulary (SentencePiece-style, or GPT-2 BPE with --vocab gpt2)
// (examples/llm_model_util.hpp), for trying build/examples/llm and for the
// llama.cpp check and bench/llm:
//   build/examples/llm_make_model OUT.gguf [--dim 64] [--layers 2] [--heads 4]
//   [--kv-heads 2] [--ffn 128] [--ctx 256]
//                                 [--type f32|f16|q8_0|q4_0|q4_1|q4_K|q5_K|q6_K] [--seed 1]
// --arch gpt2 writes a random GPT-2 instead: OUT.safetensors by Hugging Face's names and config.json beside it
// (--dim, --layers, --heads, --ffn, --ctx as its positions, --vocab-size: 50257 fits GPT-2's own tokenizer files).
// (q4_1 and the K-quants are random blocks: tg has no quantiser for them; K-quant rows need a multiple of 256)
#include <cstdio>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "llm_model_util.hpp"
#include "tg/error.hpp"

int main(int argc, char** argv) {
  tg::models::LlamaConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 128, c.max_context = 256;
  std::string out, type = "f32", vocab = "llama";
  uint64_t seed = 1;
  int64_t vocab_size = 50257;
  // flags by CLI11 (Debian's libcli11-dev), as the other LLM programs
  CLI::App app{"Write a random-weight LLaMA GGUF", "llm_make_model"};
  app.add_option("out", out, "the GGUF file to write")->required();
  app.add_option("--dim", c.dim, "model width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--layers", c.n_layers, "layers")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--heads", c.n_heads, "attention heads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", c.n_kv_heads, "key/value heads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--ffn", c.hidden_dim, "feed-forward width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--ctx", c.max_context, "context length")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--type", type, "weight type")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "q4_0", "q4_1", "q4_K", "q5_K", "q6_K"}));
  app.add_option("--vocab", vocab, "vocabulary kind")->capture_default_str()->check(CLI::IsMember({"llama", "gpt2"}));
  app.add_option("--arch", c.arch, "architecture")->capture_default_str()->check(CLI::IsMember({"llama", "qwen2", "gpt2"}));
  app.add_option("--vocab-size", vocab_size, "gpt2: vocabulary size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "weights' seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (c.arch == "gpt2") {
      tg::models::GPT2Config g;
      g.dim = c.dim, g.n_layers = c.n_layers, g.n_heads = c.n_heads, g.hidden_dim = c.hidden_dim, g.vocab_size = vocab_size;
      g.n_positions = g.max_context = c.max_context;
      if (g.dim % g.n_heads != 0) throw tg::Error("[llm_make_model] --heads " + std::to_string(g.n_heads) + " do not divide --dim");
      llm_util::write_random_gpt2(out, g, seed);
      std::printf("%s (+ config.json): GPT-2, dim %lld, %lld layers, %lld heads, ffn %lld, %lld positions, vocab %lld\n", out.c_str(),
                  (long long)g.dim, (long long)g.n_layers, (long long)g.n_heads, (long long)g.hidden_dim, (long long)g.n_positions,
                  (long long)g.vocab_size);
      return 0;
    }
    llm_util::write_random_llama(out, c, seed, type, vocab == "gpt2" ? llm_util::gpt2_vocab() : llm_util::byte_vocab());
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "llm_make_model: %s\n", e.what());
    return 1;
  }
  std::printf(
      "%s: dim %lld, %lld layers, %lld heads (%lld KV), ffn %lld, "
      "context %lld, %s\n",
      out.c_str(), (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads, (long long)c.n_kv_heads, (long long)c.hidden_dim,
      (long long)c.max_context, type.c_str());
  return 0;
}
