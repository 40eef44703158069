// An OpenAI-compatible server with a chat page for a LLaMA-family GGUF model (see server.hpp):
//   build/examples/llm_server --model FILE.gguf [--host 127.0.0.1] [--port 8080] [--parallel N] [--queue Q] [--ctx C]
// Prints "llm_server: listening on http://HOST:PORT" once it accepts connections (--port 0: a free port).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "server.hpp"
#include "tg/error.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "llm_server: %s\nusage: llm_server --model FILE.gguf [--host H (127.0.0.1)] [--port P (8080; 0: any free port)] "
               "[--parallel N (1: KV-cache slots)] [--queue Q (16: requests waiting beyond the slots)] [--ctx C (the file's "
               "context length, at most 2048)]\n",
               why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  llm_server::Options o;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--model" || a == "-m")
        o.model = val();
      else if (a == "--host")
        o.host = val();
      else if (a == "--port")
        o.port = std::stoi(val());
      else if (a == "--parallel" || a == "-np")
        o.parallel = std::stoi(val());
      else if (a == "--queue")
        o.queue = std::stoi(val());
      else if (a == "--ctx")
        o.ctx = std::stoll(val());
      else
        usage("unknown argument " + a);
    } catch (const std::logic_error&) {
      usage("bad value for " + a);
    }
  }
  if (o.model.empty()) usage("--model is required");
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
