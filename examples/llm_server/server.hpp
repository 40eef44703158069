#pragma once
// An OpenAI-compatible HTTP server for a LLaMA-family GGUF model or a GPT-2 safetensors file (with --tokenizer DIR
// of encoder.json and vocab.bpe; no chat template: messages are joined as plain text) (examples/llm_server/main.cpp is the binary; the
// server tests start one in-process). HTTP through cpp-httplib, JSON through nlohmann-json.
//   GET  /                     the chat page (examples/llm_server/index.html, embedded at build time)
//   GET  /health               {"status":"ok","slots_idle":N,"slots_busy":N,"queued":N,"finished":{REASON: N}}
//   GET  /v1/models            the one model, named after its file
//   POST /v1/chat/completions  messages through the model's chat template; stream: server-sent events, data: [DONE]
//   POST /v1/completions       a prompt as is
// Concurrency: --parallel N KV-cache slots of one model (weights shared). One worker thread owns the model:
// each round it prefills newly admitted requests and runs one decode step for every busy slot, so the answers of
// N clients advance together, token by token. Requests beyond the N slots wait in a queue of `queue` places; one more
// gets 503. A client that closes its connection mid-stream frees its slot at the next step. Bad requests get 400 with
// {"error": {"message", "type": "invalid_request_error", "param": FIELD}}; a tg::Error in a request never ends the
// server.
// Thread-safety: a Server is started and stopped from one thread; its handlers run on httplib's pool.
#include <memory>
#include <string>

namespace llm_server {

struct Options {
  std::string model;              // a GGUF file, or a GPT-2 .safetensors file
  std::string tokenizer;          // GPT-2: the folder of encoder.json and vocab.bpe
  int64_t heads = 0;              // GPT-2: attention heads (0: n_head of config.json beside the model)
  std::string host = "127.0.0.1";
  int port = 8080;                // 0: any free port
  int parallel = 1;               // KV-cache slots (sequences decoded together)
  int queue = 16;                 // requests waiting for a slot; beyond: 503
  int64_t ctx = 0;                // context length; 0: the file's, at most 2048
};

/** What the server makes of generated token bytes: UTF-8 as is, each invalid byte as U+FFFD. */
std::string valid_utf8(std::string bytes);

class Server {
 public:
  /** Loads the model and its tokenizer; a bad file or option is a tg::Error. */
  explicit Server(const Options& opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  /** Binds the listening socket: the port (a free one when Options::port is 0); a tg::Error when it cannot. */
  int bind();
  /** Serves until stop(); call after bind(). */
  void listen();
  /** Stops listening and the worker (from any thread). */
  void stop();
  /** The model's id in /v1/models and responses: the file's name without ".gguf". */
  const std::string& model_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llm_server
