// Trains a small character-level LLaMA on a plain-text corpus with tg's autograd and AdamW, and writes it as a GGUF
// file that build/examples/llm (and llama.cpp) runs (examples/llm_train_util.hpp):
//   build/examples/llm_train OUT.gguf [--corpus /usr/share/common-licenses/GPL-3] [--bytes 2048] [--steps 400]
//                            [--batch 16] [--seq 64] [--dim 64] [--layers 2] [--heads 4] [--ffn 192] [--lr 1e-2] [--seed 1]
//   build/examples/llm --model OUT.gguf --prompt "The GNU General Public License" -n 34
// The default corpus is the GPL version 3 from Debian's base-files; --bytes takes its beginning (0: all of it).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <CLI/CLI.hpp>

#include "llm_train_util.hpp"
#include "tg/error.hpp"

int main(int argc, char** argv) {
  std::string out, corpus = "/usr/share/common-licenses/GPL-3";
  int64_t bytes = 2048;
  llm_util::TrainOptions o;
  tg::models::LlamaConfig& c = o.cfg;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 4, c.hidden_dim = 192, c.max_context = 64;
  CLI::App app{"Train a character-level LLaMA on a text file and write it as GGUF", "llm_train"};
  app.add_option("out", out, "the GGUF file to write")->required();
  app.add_option("--corpus", corpus, "plain-text corpus")->capture_default_str()->check(CLI::ExistingFile);
  app.add_option("--bytes", bytes, "train on the corpus' first bytes (0: all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps, "optimiser steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "windows per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seq", c.max_context, "window length (the model's context)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dim", c.dim, "model width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--layers", c.n_layers, "layers")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--heads", c.n_heads, "attention heads (as many KV heads)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--ffn", c.hidden_dim, "feed-forward width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "peak learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "initialisation and batch seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    c.n_kv_heads = c.n_heads;
    if (c.dim % c.n_heads != 0 || c.head_dim() % 2 != 0)
      throw tg::Error("[llm_train] --heads " + std::to_string(c.n_heads) + " must divide --dim " + std::to_string(c.dim) + " into even head sizes");
    std::ifstream f(corpus, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), {});
    if (bytes > 0 && int64_t(text.size()) > bytes) text.resize(size_t(bytes));
    std::vector<int32_t> data = llm_util::char_tokenizer().encode(text, false);
    std::printf("%s: %zu bytes, %zu tokens; dim %lld, %lld layers, %lld heads, ffn %lld, window %lld; %lld steps of %lld windows\n",
                corpus.c_str(), text.size(), data.size(), (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads,
                (long long)c.hidden_dim, (long long)c.max_context, (long long)o.steps, (long long)o.batch);
    auto t0 = std::chrono::steady_clock::now();
    double avg = 0;
    o.progress = [&](int64_t s, double loss) {
      avg = s == 0 ? loss : 0.9 * avg + 0.1 * loss;
      if ((s + 1) % 25 == 0 || s + 1 == o.steps) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("step %4lld  loss %.4f  (smoothed %.4f)  %.1f s\n", (long long)s + 1, loss, avg, secs);
        std::fflush(stdout);
      }
    };
    llm_util::Trained t = llm_util::train_char_llama(data, o);
    llm_util::save_char_llama(out, t);
    std::printf("wrote %s\n", out.c_str());
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "llm_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
