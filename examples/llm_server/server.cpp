// The OpenAI-compatible server (see server.hpp): request checks, the chat template, the worker that decodes the
// busy slots in turn, and the HTTP handlers (plain JSON and server-sent events).
#include "server.hpp"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "llm_server_page.hpp"  // kIndexHtml: index.html, generated at build time
#include "tg/error.hpp"
#include "tg/models/gpt2.hpp"
#include "tg/models/llama.hpp"
#include "tg/models/sampler.hpp"
#include "tg/models/tokenizer.hpp"

namespace llm_server {

namespace {

using json = nlohmann::json;
using clk = std::chrono::steady_clock;
namespace models = tg::models;

// A request the server refuses with 400: the field it is about ("body" for the whole of it) and why.
struct BadRequest {
  std::string param, message;
};
[[noreturn]] void bad(const std::string& param, const std::string& message) { throw BadRequest{param, message}; }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& message, const std::string& type, const std::string& param = "") {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", nullptr}}}};
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type, const std::string& param = "") {
  res.status = status;
  res.set_content(dump(error_body(message, type, param)), "application/json");
}

// The longest prefix of `bytes` that is whole UTF-8 characters, moved out; an invalid byte becomes U+FFFD, an
// incomplete character at the end stays (unless `flush`).
std::string take_utf8(std::string& bytes, bool flush) {
  static const std::string repl = "\xEF\xBF\xBD";
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    auto c = uint8_t(bytes[i]);
    size_t n = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    size_t have = 1;
    while (have < n && i + have < bytes.size() && (uint8_t(bytes[i + have]) & 0xC0) == 0x80) have++;
    if (n > 0 && have == n) {
      out.append(bytes, i, n);
      i += n;
    } else if (n > 0 && i + have == bytes.size() && !flush) {
      break;  // the rest of this character is still to come
    } else {
      out += repl;
      i += 1;
    }
  }
  bytes.erase(0, i);
  return out;
}

// The generated text: token bytes made into UTF-8, cut at the first stop string; the text shown so far never
// includes the start of a possible stop string (it is held back until it cannot be one).
class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop) : stop_(std::move(stop)) {}
  /** Appends a token's bytes; true when a stop string is complete (the text ends before it). */
  bool push(const std::string& piece, bool flush = false) {
    bytes_ += piece;
    text_ += take_utf8(bytes_, flush);
    size_t cut = std::string::npos;
    for (const std::string& s : stop_) cut = std::min(cut, text_.find(s));
    if (cut == std::string::npos) return false;
    text_.resize(cut);
    stopped_ = true;
    return true;
  }
  /** The text not handed out yet that can be shown (all of it when `final`). */
  std::string take(bool final) {
    size_t upto = text_.size();
    if (!final && !stopped_)
      for (const std::string& s : stop_)
        for (size_t k = std::min(s.size() - 1, text_.size()); k > 0; k--)
          if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
            upto = std::min(upto, text_.size() - k);
            break;
          }
    upto = std::max(upto, shown_);
    std::string d = text_.substr(shown_, upto - shown_);
    shown_ = upto;
    return d;
  }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  std::string bytes_, text_;
  size_t shown_ = 0;
  bool stopped_ = false;
};

// One request, shared by its HTTP handler and the worker.
struct Job {
  Job(std::vector<int32_t> p, models::SamplerConfig s, int64_t max, std::vector<std::string> stop, bool no_eos)
      : prompt(std::move(p)), sampling(s), max_tokens(max), ignore_eos(no_eos), text(std::move(stop)) {}
  const std::vector<int32_t> prompt;
  const models::SamplerConfig sampling;
  const int64_t max_tokens;
  const bool ignore_eos;
  TextStream text;  // the worker's
  std::atomic<bool> cancelled{false};
  // under m: what the worker has made, for the handler
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> ready;  // text not taken by the handler yet: one piece per token (a stream's events)
  int64_t completion_tokens = 0;
  bool done = false;
  std::string finish_reason, error;
};

// The chat template: llama.cpp's way (llama_chat_apply_template) of recognising the common templates by a marker in
// tokenizer.chat_template rather than running Jinja. Without a template, or with an unknown one, the default: each
// message as "Role: content\n", then "Assistant:".
enum class Template { DEFAULT, CHATML, LLAMA3, LLAMA2 };

Template detect_template(const std::string& t) {
  if (t.find("<|im_start|>") != std::string::npos) return Template::CHATML;
  if (t.find("<|start_header_id|>") != std::string::npos) return Template::LLAMA3;
  if (t.find("[INST]") != std::string::npos) return Template::LLAMA2;
  return Template::DEFAULT;
}

const char* template_name(Template t) {
  switch (t) {
    case Template::CHATML: return "chatml";
    case Template::LLAMA3: return "llama3";
    case Template::LLAMA2: return "llama2";
    default: return "default";
  }
}

std::string apply_template(Template t, const std::vector<std::pair<std::string, std::string>>& msgs) {
  std::string out;
  switch (t) {
    case Template::CHATML:
      for (const auto& m : msgs) out += "<|im_start|>" + m.first + "\n" + m.second + "<|im_end|>\n";
      return out + "<|im_start|>assistant\n";
    case Template::LLAMA3:
      for (const auto& m : msgs) out += "<|start_header_id|>" + m.first + "<|end_header_id|>\n\n" + m.second + "<|eot_id|>";
      return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case Template::LLAMA2: {
      std::string sys;
      for (const auto& m : msgs) {
        if (m.first == "system")
          sys += m.second + "\n\n";
        else if (m.first == "user")
          out += "[INST] " + sys + m.second + " [/INST]", sys.clear();
        else
          out += " " + m.second + "</s>";
      }
      return out;
    }
    default:
      for (const auto& m : msgs) {
        std::string role = m.first;
        role[0] = char(std::toupper(uint8_t(role[0])));
        out += role + ": " + m.second + "\n";
      }
      return out + "Assistant:";
  }
}

// The sampling and length fields shared by both endpoints.
struct Params {
  models::SamplerConfig sampling;
  int64_t max_tokens = -1;  // -1: up to the context
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  bool ignore_eos = false;  // llama.cpp's extension: EOS and end-of-turn tokens do not end the answer
};

double number_field(const json& body, const char* key, double lo, double hi, bool lo_open = false) {
  const json& v = body.at(key);
  if (!v.is_number()) bad(key, std::string("'") + key + "' must be a number, got " + v.type_name());
  double d = v.get<double>();
  if (d < lo || d > hi || (lo_open && d == lo))
    bad(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                 std::to_string(d));
  return d;
}

Params parse_params(const json& body) {
  Params p;
  auto has = [&](const char* k) { return body.contains(k) && !body.at(k).is_null(); };
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (has(k)) {
      const json& v = body.at(k);
      if (!v.is_number_integer() || v.get<int64_t>() < 1) bad(k, std::string("'") + k + "' must be an integer >= 1, got " + v.dump());
      p.max_tokens = v.get<int64_t>();
    }
  if (has("temperature")) p.sampling.temperature = number_field(body, "temperature", 0, 2);
  if (has("top_p")) p.sampling.top_p = number_field(body, "top_p", 0, 1, true);
  if (has("seed")) {
    const json& v = body.at("seed");
    if (!v.is_number_integer()) bad("seed", "'seed' must be an integer, got " + std::string(v.type_name()));
    p.sampling.seed = v.is_number_unsigned() ? v.get<uint64_t>() : uint64_t(v.get<int64_t>());
  }
  if (has("n") && (!body.at("n").is_number_integer() || body.at("n").get<int64_t>() != 1)) bad("n", "'n' must be 1 (one choice per request)");
  if (has("stop")) {
    const json& v = body.at("stop");
    if (v.is_string())
      p.stop.push_back(v.get<std::string>());
    else if (v.is_array() && v.size() <= 4)
      for (const json& s : v) {
        if (!s.is_string()) bad("stop", "'stop' entries must be strings, got " + std::string(s.type_name()));
        p.stop.push_back(s.get<std::string>());
      }
    else
      bad("stop", "'stop' must be a string or an array of at most 4 strings");
    for (const std::string& s : p.stop)
      if (s.empty()) bad("stop", "'stop' strings must not be empty");
  }
  if (has("stream")) {
    if (!body.at("stream").is_boolean()) bad("stream", "'stream' must be a boolean, got " + std::string(body.at("stream").type_name()));
    p.stream = body.at("stream").get<bool>();
  }
  if (has("ignore_eos")) {
    if (!body.at("ignore_eos").is_boolean()) bad("ignore_eos", "'ignore_eos' must be a boolean, got " + std::string(body.at("ignore_eos").type_name()));
    p.ignore_eos = body.at("ignore_eos").get<bool>();
  }
  if (has("stream_options")) {
    const json& o = body.at("stream_options");
    if (!o.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (o.contains("include_usage")) {
      if (!o.at("include_usage").is_boolean()) bad("stream_options", "'stream_options.include_usage' must be a boolean");
      p.include_usage = o.at("include_usage").get<bool>();
    }
  }
  return p;
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_content(const json& c, size_t i) {
  std::string where = "messages[" + std::to_string(i) + "].content";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, "'" + where + "' must be a string or an array of text parts, got " + c.type_name());
  std::string out;
  for (const json& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part.at("text").is_string())
      bad(where, "'" + where + "' parts must be {\"type\": \"text\", \"text\": STRING} (only text is supported)");
    out += part.at("text").get<std::string>();
  }
  return out;
}

}  // namespace

std::string valid_utf8(std::string bytes) { return take_utf8(bytes, true); }

struct Server::Impl {
  Options opts;
  std::string id;
  // the model: a LLaMA-family GGUF or a GPT-2 safetensors file (one of them set)
  std::unique_ptr<models::Llama> llama;
  std::unique_ptr<models::GPT2> gpt2;
  int64_t vocab = 0;
  tg::Tensor prefill(const std::vector<int32_t>& t, int64_t slot) {
    return gpt2 ? gpt2->prefill(t, 0, true, slot) : llama->prefill(t, 0, true, slot);
  }
  tg::Tensor decode(int32_t t, int64_t pos, int64_t slot) { return gpt2 ? gpt2->decode({t}, pos, slot) : llama->decode({t}, pos, slot); }
  std::unique_ptr<models::Tokenizer> tok;
  Template tmpl = Template::DEFAULT;
  std::set<int32_t> end_ids;  // EOS and the template's end-of-turn token
  int64_t ctx = 0;
  int64_t created = 0;
  httplib::Server http;
  // the queue and the slots' occupancy, under mu
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> queue;
  int busy = 0;
  bool stopping = false;
  std::map<std::string, int64_t> finished;  // requests by finish reason (stop, length, cancelled, error)
  std::thread worker;
  std::atomic<uint64_t> next_id{1};
  int listen_fd = -1;

  explicit Impl(const Options& o) : opts(o) {
    if (o.parallel < 1) throw tg::Error("[llm_server] --parallel must be >= 1, got " + std::to_string(o.parallel));
    if (o.queue < 0) throw tg::Error("[llm_server] --queue must be >= 0, got " + std::to_string(o.queue));
    if (o.ctx < 0) throw tg::Error("[llm_server] --ctx must be >= 0, got " + std::to_string(o.ctx));
    const std::string ext = std::filesystem::path(o.model).extension().string();
    if (ext == ".safetensors") {
      // GPT-2: Hugging Face's weights, the byte-level BPE from encoder.json and vocab.bpe, no chat template
      if (o.tokenizer.empty())
        throw tg::Error("[llm_server] " + o.model + " is a GPT-2 safetensors file: --tokenizer DIR (encoder.json, vocab.bpe) is needed");
      tok = std::make_unique<models::Tokenizer>(models::Tokenizer::gpt2_files(o.tokenizer));
      gpt2 = models::GPT2::from_safetensors(o.model, o.heads, o.ctx, 1, o.parallel);  // ctx 0: its positions (1024)
      ctx = gpt2->config().max_context;
      vocab = gpt2->config().vocab_size;
      if (int64_t(tok->vocab_size()) > vocab)
        throw tg::Error("[llm_server] the tokenizer in " + o.tokenizer + " has " + std::to_string(tok->vocab_size()) +
                        " tokens, more than " + o.model + "'s vocabulary of " + std::to_string(vocab));
    } else {
      tg::nn::GGUFFile f = tg::nn::gguf_load(o.model, "DISK", false);  // weights kept as stored (see models::Llama)
      models::LlamaConfig cfg = models::LlamaConfig::from_gguf(f, o.model, o.ctx);
      if (o.ctx == 0) cfg.max_context = std::min<int64_t>(cfg.max_context, 2048);
      ctx = cfg.max_context;
      tok = std::make_unique<models::Tokenizer>(models::Tokenizer::from_gguf(f, o.model));
      auto t = f.metadata.find("tokenizer.chat_template");
      if (t != f.metadata.end()) tmpl = detect_template(t->second.as_string());
      llama = models::Llama::from_file(std::move(f), o.model, ctx, 1, o.parallel);
      vocab = llama->config().vocab_size;
    }
    if (tok->eos() >= 0) end_ids.insert(tok->eos());
    for (const char* end : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"})
      if (int32_t e = tok->token_id(end); e >= 0) end_ids.insert(e);
    id = std::filesystem::path(o.model).filename().string();
    for (const std::string suffix : {".gguf", ".safetensors"})
      if (id.size() > suffix.size() && id.compare(id.size() - suffix.size(), suffix.size(), suffix) == 0) id.resize(id.size() - suffix.size());
    created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    routes();
    // handler threads: every slot and queue place can hold one (streams block theirs), plus some for the rest
    int threads = o.parallel + o.queue + 8;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
    http.set_tcp_nodelay(true);  // each event goes out at once
    // the listening socket, so bind() can raise its backlog: httplib's is 5 connections, and a burst of clients
    // beyond it waits for TCP's 1 s SYN retry
    http.set_socket_options([this](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd = sock;
    });
    worker = std::thread([this] { work(); });
  }

  ~Impl() { shutdown(); }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (stopping) return;
      stopping = true;
    }
    cv.notify_all();
    http.stop();
    if (worker.joinable()) worker.join();
  }

  // ---- the worker: one thread owns the model ----
  struct Slot {
    std::shared_ptr<Job> job;
    bool fresh = false;
    int64_t pos = 0, made = 0;
    std::vector<float> logits;
    std::vector<int32_t> history;
    std::unique_ptr<models::Sampler> sampler;
  };

  bool submit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (stopping || busy + int(queue.size()) >= opts.parallel + opts.queue) return false;
      queue.push_back(job);
    }
    cv.notify_all();
    return true;
  }

  // Ends a job: counted in /health's "finished" before its client is woken, so a client that has read the end of its
  // answer and then asks /health sees it counted.
  void finish(Job& j, const std::string& reason, const std::string& error = "") {
    {
      std::lock_guard<std::mutex> lk(mu);
      finished[reason]++;
    }
    close_job(j, reason, error);
  }
  static void close_job(Job& j, const std::string& reason, const std::string& error) {
    j.text.push("", true);
    std::lock_guard<std::mutex> lk(j.m);
    if (std::string rest = j.text.take(true); !rest.empty()) j.ready.push_back(rest);
    j.done = true;
    j.finish_reason = reason;
    j.error = error;
    j.cv.notify_all();
  }

  // One step of a slot: its prefill and first token, or its next token. True when the job is finished.
  bool step(Slot& s, int64_t slot) {
    Job& j = *s.job;
    if (j.cancelled) {
      finish(j, "cancelled");
      return true;
    }
    if (s.fresh) {
      s.fresh = false;
      s.sampler = std::make_unique<models::Sampler>(j.sampling);
      s.logits = prefill(j.prompt, slot).to_vector<float>();
      s.pos = int64_t(j.prompt.size());
      s.history = j.prompt;
      s.made = 0;
    }
    int32_t next = s.sampler->sample(s.logits, s.history);
    s.history.push_back(next);
    if (!j.ignore_eos && end_ids.count(next)) {
      finish(j, "stop");
      return true;
    }
    s.made++;
    bool hit = j.text.push(tok->piece(next));
    {
      std::lock_guard<std::mutex> lk(j.m);
      if (std::string piece = j.text.take(false); !piece.empty()) j.ready.push_back(piece);
      j.completion_tokens = s.made;
    }
    j.cv.notify_all();
    if (hit) {
      finish(j, "stop");
      return true;
    }
    if (s.made >= j.max_tokens || s.pos >= ctx) {
      finish(j, "length");
      return true;
    }
    s.logits = decode(next, s.pos++, slot).to_vector<float>();
    return false;
  }

  void work() {
    std::vector<Slot> slots(size_t(opts.parallel));
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stopping || !queue.empty() || busy > 0; });
        if (stopping) break;
        for (Slot& s : slots)
          if (!s.job && !queue.empty()) {
            s.job = std::move(queue.front());
            queue.pop_front();
            s.fresh = true;
            busy++;
          }
      }
      for (size_t i = 0; i < slots.size(); i++) {
        Slot& s = slots[i];
        if (!s.job) continue;
        bool over = true;
        try {
          over = step(s, int64_t(i));
        } catch (const std::exception& e) {  // a tg::Error (or worse) ends this request, not the server
          finish(*s.job, "error", e.what());
        }
        if (over) {
          s.job.reset();
          std::lock_guard<std::mutex> lk(mu);
          busy--;
        }
      }
    }
    std::lock_guard<std::mutex> lk(mu);
    auto stop = [&](Job& j) {
      finished["error"]++;
      close_job(j, "error", "the server is stopping");
    };
    for (Slot& s : slots)
      if (s.job) stop(*s.job);
    for (auto& j : queue) stop(*j);
    queue.clear();
  }

  // ---- HTTP ----
  void routes() {
    http.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kIndexHtml, "text/html; charset=utf-8"); });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lk(mu);
      res.set_content(dump({{"status", "ok"},
                            {"slots_idle", opts.parallel - busy},
                            {"slots_busy", busy},
                            {"queued", queue.size()},
                            {"finished", finished}}),
                      "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "tg"},
                {"meta", {{"n_ctx", ctx}, {"n_vocab", vocab}, {"chat_template", template_name(tmpl)}}}};
      res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, true); });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, false); });
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.body.empty()) res.set_content(dump(error_body("HTTP " + std::to_string(res.status), "invalid_request_error")), "application/json");
    });
  }

  json choice_text(bool chat, const std::string& text, bool delta) const {
    if (!chat) return {{"text", text}};
    json m = {{"content", text}};
    if (!delta) m["role"] = "assistant";
    return {{delta ? "delta" : "message", m}};
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    try {
      json body;
      try {
        body = json::parse(req.body);
      } catch (const json::parse_error& e) {
        bad("body", std::string("the body is not valid JSON: ") + e.what());
      }
      if (!body.is_object()) bad("body", std::string("the body must be a JSON object, got ") + body.type_name());
      if (body.contains("model") && !body.at("model").is_null()) {
        if (!body.at("model").is_string()) bad("model", "'model' must be a string");
        std::string m = body.at("model").get<std::string>();
        if (m != id) bad("model", "unknown model '" + m + "': this server has '" + id + "'");
      }
      Params p = parse_params(body);
      std::vector<int32_t> prompt;
      if (chat) {
        if (!body.contains("messages")) bad("messages", "'messages' is required");
        const json& ms = body.at("messages");
        if (!ms.is_array() || ms.empty()) bad("messages", "'messages' must be a non-empty array");
        std::vector<std::pair<std::string, std::string>> msgs;
        for (size_t i = 0; i < ms.size(); i++) {
          std::string where = "messages[" + std::to_string(i) + "]";
          const json& m = ms[i];
          if (!m.is_object()) bad(where, "'" + where + "' must be an object");
          if (!m.contains("role") || !m.at("role").is_string()) bad(where + ".role", "'" + where + ".role' must be a string");
          std::string role = m.at("role").get<std::string>();
          if (role != "system" && role != "user" && role != "assistant" && role != "developer")
            bad(where + ".role", "'" + where + ".role' must be system, developer, user or assistant, got '" + role + "'");
          if (!m.contains("content")) bad(where + ".content", "'" + where + ".content' is required");
          msgs.emplace_back(role == "developer" ? "system" : role, message_content(m.at("content"), i));
        }
        prompt = tok->encode_special(apply_template(tmpl, msgs));
      } else {
        if (!body.contains("prompt") || !body.at("prompt").is_string()) bad("prompt", "'prompt' must be a string");
        prompt = tok->encode(body.at("prompt").get<std::string>());
      }
      std::string field = chat ? "messages" : "prompt";
      if (prompt.empty()) bad(field, "the prompt has no tokens");
      if (int64_t(prompt.size()) >= ctx)
        bad(field, "the prompt is " + std::to_string(prompt.size()) + " tokens, the context " + std::to_string(ctx) +
                       ": it must leave room for at least one new token");
      int64_t room = ctx - int64_t(prompt.size());
      int64_t max_tokens = p.max_tokens < 0 ? room : std::min(p.max_tokens, room);
      auto job = std::make_shared<Job>(prompt, p.sampling, max_tokens, p.stop, p.ignore_eos);
      if (!submit(job)) {
        send_error(res, 503, "the server is busy: all " + std::to_string(opts.parallel) + " slots and " + std::to_string(opts.queue) +
                                 " queue places are taken, try again later",
                   "server_busy");
        return;
      }
      std::string rid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
      json head = {{"id", rid}, {"object", chat ? (p.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
                   {"created", created_now()}, {"model", id}};
      int64_t n_prompt = int64_t(prompt.size());
      if (!p.stream) {
        std::unique_lock<std::mutex> lk(job->m);
        job->cv.wait(lk, [&] { return job->done; });
        if (job->finish_reason == "error") {
          send_error(res, 500, "generation failed: " + job->error, "server_error");
          return;
        }
        json out = head;
        std::string all;
        for (const std::string& piece : job->ready) all += piece;
        json c = choice_text(chat, all, false);
        c["index"] = 0, c["finish_reason"] = job->finish_reason, c["logprobs"] = nullptr;
        out["choices"] = json::array({c});
        out["usage"] = {{"prompt_tokens", n_prompt}, {"completion_tokens", job->completion_tokens},
                        {"total_tokens", n_prompt + job->completion_tokens}};
        res.set_content(dump(out), "application/json");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      auto started = std::make_shared<bool>(false);
      bool include_usage = p.include_usage;
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, job, head, chat, started, include_usage, n_prompt](size_t, httplib::DataSink& sink) {
            auto gone = [&] {  // the client closed the connection: free the slot
              job->cancelled = true;
              return false;
            };
            auto send = [&](const json& j) {
              std::string s = "data: " + dump(j) + "\n\n";
              return sink.write(s.data(), s.size());
            };
            auto chunk = [&](const std::string& text, const json& reason) {
              json c = choice_text(chat, text, true);
              c["index"] = 0, c["finish_reason"] = reason, c["logprobs"] = nullptr;
              json o = head;
              o["choices"] = json::array({c});
              return o;
            };
            if (!*started) {  // the first event: the role (chat), so a client sees the stream open at once
              *started = true;
              json first = chunk("", nullptr);
              if (chat) first["choices"][0]["delta"]["role"] = "assistant";
              if (!send(first)) return gone();
            }
            std::vector<std::string> pieces;
            std::string reason, error;
            bool done;
            int64_t made;
            {
              std::unique_lock<std::mutex> lk(job->m);
              job->cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return job->done || !job->ready.empty(); });
              pieces.swap(job->ready);
              done = job->done, reason = job->finish_reason, error = job->error, made = job->completion_tokens;
            }
            for (const std::string& piece : pieces)
              if (!send(chunk(piece, nullptr))) return gone();
            if (!done) {
              if (pieces.empty() && !sink.is_writable()) return gone();
              return true;
            }
            if (reason == "error") {
              send(error_body("generation failed: " + error, "server_error"));
            } else {
              send(chunk("", reason));
              if (include_usage) {
                json u = head;
                u["choices"] = json::array();
                u["usage"] = {{"prompt_tokens", n_prompt}, {"completion_tokens", made}, {"total_tokens", n_prompt + made}};
                send(u);
              }
            }
            static const std::string end = "data: [DONE]\n\n";
            sink.write(end.data(), end.size());
            sink.done();
            return true;
          },
          [job](bool) { job->cancelled = true; });  // a no-op when it is done; otherwise the client went away
    } catch (const BadRequest& b) {
      send_error(res, 400, b.message, "invalid_request_error", b.param);
    } catch (const tg::Error& e) {
      send_error(res, 400, e.what(), "invalid_request_error");
    } catch (const std::exception& e) {
      send_error(res, 500, e.what(), "server_error");
    }
  }

  static int64_t created_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
};

Server::Server(const Options& opts) : impl_(std::make_unique<Impl>(opts)) {}
Server::~Server() = default;

int Server::bind() {
  const Options& o = impl_->opts;
  int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port <= 0) throw tg::Error("[llm_server] cannot listen on " + o.host + ":" + std::to_string(o.port));
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, 256);  // a second listen() sets the backlog
  return port;
}

void Server::listen() { impl_->http.listen_after_bind(); }
void Server::stop() { impl_->shutdown(); }
const std::string& Server::model_id() const { return impl_->id; }

}  // namespace llm_server
