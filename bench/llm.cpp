// bench/llm: a LLaMA-shaped model with random weights, written as GGUF by tg (examples/llm_model_util.hpp), run by
// tg and by llama.cpp (npm node-llama-cpp, bench/llm_llama_cpp.mjs) in the same run, on the same file, the same
// prompt tokens and the same number of threads: prompt processing (one prefill of LLM_PROMPT tokens) and decode (ms
// a token, tg's TinyJit replays after its 3 capture steps; llama.cpp one token per call). Prints the ratios, the GB/s
// each decode step reads (both: the file's tensors but the embedding; tg keeps the weights as the file stores them
// and dequantises inside its kernels, LLM_DEQUANTISE=1: float32 at load), tg's resident memory for the model against
// the file's size (at load, and after the run: the KV caches are float16 like llama.cpp's and take pages only as
// positions are written), and the bytes of tg's KV-cache write (each token's K and V rows, written in place). A
// decode step reads every weight once, so it is bound by memory bandwidth: the program measures the machine's triad
// first (bench/triad.hpp, on the same threads) and prints, for each library, its decode step's weight bytes over
// that bandwidth (the fastest a token could be) against its time a token.
// Environment: LLM_DIM (512), LLM_LAYERS (8), LLM_HEADS (8), LLM_KV_HEADS (4), LLM_FFN (1536), LLM_CTX (512),
// LLM_PROMPT (64), LLM_DECODE (32), LLM_TYPES (f32,q8_0,q4_0), LLM_REPS (3), THREADS (both libraries; default: every CPU),
// LLM_MEMDIAG=1 (after the run: the allocator's cached bytes, and the resident set once they and glibc's free heap
// are given back),
// TG_NODE_MODULES (data/node/node_modules). On a busy machine llama.cpp's spinning thread barriers suffer more than
// tg's pool: compare at THREADS=1 there (bench/run runs both).
#include <malloc.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "../examples/llm_model_util.hpp"
#include "bench_util.hpp"
#include "triad.hpp"
#include "tg/device.hpp"
#include "tg/env.hpp"

using namespace tg;

namespace {
// A field of /proc/self/status in bytes: this process's resident set (VmRSS), its anonymous and file-backed parts
// (RssAnon, RssFile).
double status_bytes(const std::string& field = "VmRSS:") {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field, 0) == 0) return 1024.0 * std::stod(line.substr(field.size()));
  return 0;
}
double rss_bytes() { return status_bytes(); }
// Resident bytes of this process's mappings of `file` (the Rss of its entries in /proc/self/smaps).
double mapped_bytes(const std::string& file) {
  std::ifstream f("/proc/self/smaps");
  double n = 0;
  bool in = false;
  for (std::string line; std::getline(f, line);) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < 16) in = line.find(file) != std::string::npos;
    else if (in && line.rfind("Rss:", 0) == 0) n += 1024.0 * std::stod(line.substr(4));
  }
  return n;
}
// Anonymous memory in transparent huge pages (AnonHugePages of /proc/self/smaps_rollup), bytes.
double huge_bytes() {
  std::ifstream f("/proc/self/smaps_rollup");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("AnonHugePages:", 0) == 0) return 1024.0 * std::stod(line.substr(14));
  return 0;
}
int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
}  // namespace

int main() {
  bench::LoadReport load;
  models::LlamaConfig c;
  c.dim = getenv_int("LLM_DIM", 512), c.n_layers = getenv_int("LLM_LAYERS", 8), c.n_heads = getenv_int("LLM_HEADS", 8);
  c.n_kv_heads = getenv_int("LLM_KV_HEADS", 4), c.hidden_dim = getenv_int("LLM_FFN", 1536), c.max_context = getenv_int("LLM_CTX", 512);
  int64_t n_prompt = getenv_int("LLM_PROMPT", 64), n_decode = getenv_int("LLM_DECODE", 32), reps = getenv_int("LLM_REPS", 3);
  std::string types = getenv_str("LLM_TYPES", "f32,q8_0,q4_0"), modules = getenv_str("TG_NODE_MODULES", TG_SOURCE_ROOT "/data/node/node_modules");
  // the same thread count for both: THREADS (tg's CPU backend reads it too), else every CPU
  unsigned threads = unsigned(getenv_int("THREADS", int64_t(std::thread::hardware_concurrency())));
  if (!std::filesystem::exists(modules + "/node-llama-cpp/package.json")) {
    std::fprintf(stderr, "llm: node-llama-cpp is not installed in %s (scripts/datasets installs it)\n", modules.c_str());
    return 1;
  }
  double triad_gbs = 0;
  {  // freed before any model is loaded: its 192 MiB are not part of the resident sets below
    bench::Triad tri;
    const double ms = tri.best_ms(10);
    tri.check();
    triad_gbs = tri.gbs(ms);
    std::printf("machine: triad (%s) %.1f GB/s: a decode step is bound by its weight bytes over it\n", tri.describe().c_str(), triad_gbs);
  }
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < n_prompt; i++) prompt.push_back(int32_t(3 + (i * 7919 + 13) % 339));  // any tokens but BOS/EOS/unk
  std::printf("model: dim %lld, %lld layers, %lld heads (%lld KV), ffn %lld, context %lld; prompt %lld tokens, decode %lld; %u threads\n",
              (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads, (long long)c.n_kv_heads, (long long)c.hidden_dim,
              (long long)c.max_context, (long long)n_prompt, (long long)n_decode, threads);
  std::stringstream ts(types);
  for (std::string type; std::getline(ts, type, ',');) {
    std::string path = (std::filesystem::temp_directory_path() / ("tg_bench_llm_" + std::to_string(getpid()) + "_" + type + ".gguf")).string();
    llm_util::write_random_llama(path, c, 1, type);
    double file_bytes = double(std::filesystem::file_size(path));
    // tg
    bool dequantise = getenv_int("LLM_DEQUANTISE", 0) != 0;
    // the previous type's model is freed into the allocator's cache and glibc's heap, which a new model would reuse
    // without growing the resident set: given back first
    get_device(default_device()).allocator().clear_cache();
    malloc_trim(0);
    double rss0 = rss_bytes(), anon0 = status_bytes("RssAnon:"), file0 = status_bytes("RssFile:");
    auto llm = models::Llama::from_gguf(path, c.max_context, 1, dequantise);
    double rss_load = rss_bytes() - rss0, weight_bytes = double(llm->weight_bytes());
    double read_bytes = 0, stored_bytes = 0;  // what a decode step reads of the weights (the embedding: one row)
    {
      nn::GGUFFile f = nn::gguf_load(path, "DISK", false);
      for (const auto& [name, t] : f.tensors)
        if (name != "token_embd.weight") {
          stored_bytes += double(t.numel() * t.dtype().itemsize());
          read_bytes += dequantise ? 4.0 * double(shape_numel(f.shapes.at(name))) : double(t.numel() * t.dtype().itemsize());
        }
    }
    auto run_prefill = [&] {
      llm->reset();
      return llm->prefill(prompt, 0, true).to_vector<float>();
    };
    double tg_prefill = bench::median_ms(run_prefill, int(reps));
    std::vector<int32_t> tg_tokens;
    std::vector<double> per_tok;
    for (int64_t r = 0; r <= reps; r++) {
      std::vector<float> logits = run_prefill();
      tg_tokens.clear();
      bench::clk::time_point t0;
      for (int64_t i = 0; i <= n_decode + 3; i++) {
        int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        tg_tokens.push_back(next);
        if (i == 3) t0 = bench::clk::now();
        if (i == n_decode + 3) break;
        logits = llm->decode({next}, n_prompt + i).to_vector<float>();
      }
      if (r > 0) per_tok.push_back(bench::ms_since(t0) / double(n_decode));
    }
    double rss_run = rss_bytes() - rss0;  // after the prompt and decode steps: the KV-cache rows written, kernels, buffers
    if (getenv_int("LLM_MEMDIAG", 0)) {
      double cached = double(get_device(default_device()).allocator().cached_bytes());
      get_device(default_device()).allocator().clear_cache();
      double rss_c = rss_bytes() - rss0;
      malloc_trim(0);
      if (getenv_int("LLM_MEMDIAG", 0) > 1) {
        std::ifstream sm("/proc/self/smaps");
        bool in = false;
        for (std::string line; std::getline(sm, line);) {
          if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < 16) in = line.find(path) != std::string::npos;
          if (in) std::fprintf(stderr, "%s\n", line.c_str());
        }
      }
      std::fprintf(stderr, "memdiag %s: after run %.1f MB (anonymous %.1f MB, %.1f MB of it in huge pages, file-backed %.1f MB, of the GGUF file %.1f MB), allocator cache %.1f MB, "
                   "after clear_cache %.1f MB, after malloc_trim %.1f MB\n",
                   type.c_str(), rss_run / 1e6, (status_bytes("RssAnon:") - anon0) / 1e6, huge_bytes() / 1e6, (status_bytes("RssFile:") - file0) / 1e6, mapped_bytes(path) / 1e6, cached / 1e6,
                   rss_c / 1e6, (rss_bytes() - rss0) / 1e6);
    }
    std::sort(per_tok.begin(), per_tok.end());
    double tg_decode = per_tok[per_tok.size() / 2];
    // llama.cpp
    std::string ids;
    for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    std::string out = path + ".json";
    std::string cmd = "node " TG_SOURCE_ROOT "/bench/llm_llama_cpp.mjs '" + modules + "' '" + path + "' " + std::to_string(c.max_context) +
                      " " + std::to_string(threads) + " " + ids + " " + std::to_string(n_decode + 3) + " " + std::to_string(reps) + " >'" + out + "'";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "llm: llama.cpp run failed: %s\n", cmd.c_str());
      return 1;
    }
    std::ifstream jf(out);
    nlohmann::json j = nlohmann::json::parse(jf);
    std::filesystem::remove(out), std::filesystem::remove(path);
    double peer_prefill = j["prefill_ms"].get<double>(), peer_decode = j["decode_ms_per_token"].get<double>();
    std::vector<int32_t> peer_tokens = j["tokens"].get<std::vector<int32_t>>();
    size_t same = 0;
    while (same < std::min(peer_tokens.size(), tg_tokens.size()) && peer_tokens[same] == tg_tokens[same]) same++;
    double tg_bytes = read_bytes, peer_bytes = stored_bytes, cache_bytes = 2.0 * llm->config().cache_dtype.itemsize() * double(c.n_kv_heads * c.head_dim() * c.n_layers);
    std::printf("%s: prefill tg %.1f ms (%.0f tokens/s), llama.cpp %.1f ms (%.0f tokens/s): %.2fx; decode tg %.2f ms (%.0f tokens/s, "
                "%.1f GB/s of %s weights + %.1f KiB of KV-cache rows a token), llama.cpp %.2f ms (%.0f tokens/s, %.1f GB/s): %.2fx; "
                "at the triad's bandwidth a token takes %.2f ms (tg %.2f of that limit, llama.cpp %.2f); "
                "greedy tokens agree for %zu of %zu; tg memory: weights %.1f MB, KV caches %.1f MB (%s), resident growth at load %.1f MB, "
                "file %.1f MB (%.2fx), after the run %.1f MB (%.2fx)\n",
                type.c_str(), tg_prefill, 1e3 * double(n_prompt) / tg_prefill, peer_prefill, 1e3 * double(n_prompt) / peer_prefill,
                peer_prefill / tg_prefill, tg_decode, 1e3 / tg_decode, tg_bytes / tg_decode / 1e6, dequantise ? "float32" : "stored",
                cache_bytes / 1024, peer_decode, 1e3 / peer_decode, peer_bytes / peer_decode / 1e6, peer_decode / tg_decode,
                peer_bytes / triad_gbs / 1e6, tg_bytes / triad_gbs / 1e6 / tg_decode, peer_bytes / triad_gbs / 1e6 / peer_decode, same,
                tg_tokens.size(), weight_bytes / 1e6, double(llm->cache_bytes()) / 1e6, llm->config().cache_dtype.name().c_str(), rss_load / 1e6,
                file_bytes / 1e6, rss_load / file_bytes, rss_run / 1e6, rss_run / file_bytes);
    std::string extra = ", \"threads\": " + std::to_string(threads) + ", \"triad_gbs\": " + std::to_string(triad_gbs);
    bench::json("llm_prefill_" + std::to_string(n_prompt) + "_" + type, bench::variant(), tg_prefill, "llama.cpp", peer_prefill, extra);
    bench::json("llm_decode_" + type, bench::variant(), tg_decode, "llama.cpp", peer_decode, extra);
  }
  return 0;
}
