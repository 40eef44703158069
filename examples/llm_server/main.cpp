// An OpenAI-compatible server with a chat page for a LLaMA-family GGUF model or GPT-2 (see server.hpp):
//   build/examples/llm_server --model FILE.gguf [--host 127.0.0.1] [--port 8080] [--parallel N] [--queue Q] [--ctx C]
//   build/examples/llm_server --model model.safetensors --tokenizer DIR [--heads N] ...
// Prints "llm_server: listening on http://HOST:PORT" once it accepts connections (--port 0: a free port).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "server.hpp"
#include "tg/error.hpp"


int main(int argc, char** argv) {
  llm_server::Options o;
  // flags by CLI11 (Debian's libcli11-dev), as the other LLM programs
  CLI::App app{"An OpenAI-compatible server with a chat page for a LLaMA-family GGUF model or GPT-2", "llm_server"};
  app.add_option("-m,--model", o.model, "GGUF file, or GPT-2 .safetensors")->required()->check(CLI::ExistingFile);
  app.add_option("--tokenizer", o.tokenizer, "GPT-2: the folder of encoder.json and vocab.bpe")->check(CLI::ExistingDirectory);
  app.add_option("--heads", o.heads, "GPT-2: attention heads (0: n_head of config.json beside the model)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port (0: any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--parallel", o.parallel, "KV-cache slots")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--queue", o.queue, "requests waiting beyond the slots")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--ctx", o.ctx, "context length (0: the file's, at most 2048)")->capture_default_str()->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGPIPE, SIG_IGN);
  // SIGINT and SIGTERM are taken by one thread (sigwait), which stops the server: every other thread blocks them
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  try {
    llm_server::Server server(o);
    int port = server.bind();
    std::thread([&server, stop_signals] {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      server.stop();
    }).detach();
    std::printf("llm_server: model %s, %d slots; listening on http://%s:%d\n", server.model_id().c_str(), o.parallel, o.host.c_str(), port);
    std::fflush(stdout);
    server.listen();
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "llm_server: %s\n", e.what());
    return 1;
  }
  return 0;
}
