// onnx_conformance DIR...: runs every ONNX backend-test case folder (model.onnx + test_data_set_*/input_*.pb,
// output_*.pb) found under the given folders, each in a forked child with a time limit, and compares the outputs
// (rtol 1e-3, atol 1e-5 for floats, NaN-aware; exact for ints and bools). One line per case, then
// "N passed, N failed". Options: -t SECONDS (per-case limit, default 30), -j N (cases at once, default 1),
// --min-pass N (exit 1 when fewer pass), -v (show the children's stdout, e.g. DEBUG=2 kernel lines).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tg/onnx.hpp"

namespace fs = std::filesystem;
using tg::Tensor;
using tg::onnx::Value;

namespace {

std::vector<fs::path> sorted_glob(const fs::path& dir, const std::string& prefix, const std::string& suffix) {
  std::vector<std::pair<int, fs::path>> found;
  if (!fs::is_directory(dir)) return {};
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) != 0 || n.size() < prefix.size() + suffix.size() || n.substr(n.size() - suffix.size()) != suffix) continue;
    std::string mid = n.substr(prefix.size(), n.size() - prefix.size() - suffix.size());
    if (mid.empty() || !std::all_of(mid.begin(), mid.end(), ::isdigit)) continue;
    found.push_back({std::stoi(mid), e.path()});
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [i, p] : found) out.push_back(p);
  return out;
}

// First mismatch between a result and the expected tensor, or "" when they agree.
std::string compare(const Tensor& got, const Tensor& want, const std::string& name) {
  if (got.shape() != want.shape())
    return name + ": shape " + tg::shape_str(got.shape()) + ", expected " + tg::shape_str(want.shape());
  if (tg::dtypes::strong(got.dtype()) != want.dtype()) return name + ": dtype " + got.dtype().name() + ", expected " + want.dtype().name();
  if (want.numel() == 0) return "";
  bool is_float = tg::dtypes::is_float(want.dtype());
  if (is_float) {
    auto as_f64 = [](const Tensor& t) { return t.dtype() == tg::dtypes::float64 ? t.to_doubles() : t.cast(tg::dtypes::float32).to_doubles(); };
    std::vector<double> g = as_f64(got), w = as_f64(want);
    for (size_t i = 0; i < w.size(); i++) {
      double a = g[i], e = w[i];
      if (std::isnan(e) && std::isnan(a)) continue;
      if (std::isinf(e) && a == e) continue;
      if (!(std::fabs(a - e) <= 1e-5 + 1e-3 * std::fabs(e)))
        return name + ": element " + std::to_string(i) + " is " + std::to_string(a) + ", expected " + std::to_string(e);
    }
    return "";
  }
  std::vector<int64_t> g = got.cast(tg::dtypes::int64).to_vector<int64_t>(), w = want.cast(tg::dtypes::int64).to_vector<int64_t>();
  for (size_t i = 0; i < w.size(); i++)
    if (g[i] != w[i]) return name + ": element " + std::to_string(i) + " is " + std::to_string(g[i]) + ", expected " + std::to_string(w[i]);
  return "";
}

std::string compare_value(const Value& got, const Value& want, const std::string& name) {
  if (got.kind != want.kind) return name + ": value kind differs (tensor, sequence or none)";
  if (want.kind == Value::Kind::Tensor) return compare(got.tensor, want.tensor, name);
  if (want.kind == Value::Kind::Strings) {
    if (got.strings_shape != want.strings_shape)
      return name + ": shape " + tg::shape_str(got.strings_shape) + ", expected " + tg::shape_str(want.strings_shape);
    for (size_t i = 0; i < want.strings.size(); i++)
      if (got.strings[i] != want.strings[i]) return name + ": string " + std::to_string(i) + " is '" + got.strings[i] + "', expected '" + want.strings[i] + "'";
  }
  if (want.kind == Value::Kind::Sequence) {
    if (got.sequence.size() != want.sequence.size())
      return name + ": sequence of " + std::to_string(got.sequence.size()) + ", expected " + std::to_string(want.sequence.size());
    for (size_t i = 0; i < want.sequence.size(); i++) {
      std::string r = compare(got.sequence[i], want.sequence[i], name + "[" + std::to_string(i) + "]");
      if (!r.empty()) return r;
    }
  }
  return "";
}

// The test data stores bfloat16 tensors as UINT16 (older ONNX): take them as the model declares them.
Value as_declared(Value v, const tg::onnx::ValueInfo& vi) {
  if (v.kind == Value::Kind::Tensor && vi.dtype == tg::dtypes::bfloat16 && v.tensor.dtype() == tg::dtypes::uint16)
    v.tensor = v.tensor.bitcast(tg::dtypes::bfloat16);
  return v;
}

// Runs one case in this process; returns "PASS", "FAIL reason" or "ERROR reason".
std::string run_case(const fs::path& dir) {
  try {
    tg::onnx::Model m = tg::onnx::Model::load((dir / "model.onnx").string());
    auto sets = sorted_glob(dir, "test_data_set_", "");
    if (sets.empty()) return "ERROR no test_data_set_* folders";
    for (const auto& set : sets) {
      std::map<std::string, Value> inputs;
      auto ins = sorted_glob(set, "input_", ".pb");
      if (ins.size() > m.inputs().size()) return "ERROR " + std::to_string(ins.size()) + " input files, the model has " + std::to_string(m.inputs().size()) + " inputs";
      for (size_t i = 0; i < ins.size(); i++) {
        const std::string& name = m.inputs()[i].name;
        inputs[name] = as_declared(tg::onnx::load_value(ins[i].string(), m.kind(name)), m.inputs()[i]);
      }
      auto outs = sorted_glob(set, "output_", ".pb");
      std::map<std::string, Value> got = m.run(inputs);
      if (outs.size() > m.outputs().size()) return "ERROR more output files than model outputs";
      for (size_t i = 0; i < outs.size(); i++) {
        const std::string& name = m.outputs()[i].name;
        Value want = as_declared(tg::onnx::load_value(outs[i].string(), m.kind(name)), m.outputs()[i]);
        std::string r = compare_value(got.at(name), want, set.filename().string() + "/" + name);
        if (!r.empty()) return "FAIL " + r;
      }
    }
    return "PASS";
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    return "ERROR " + msg;
  }
}

struct Running {
  pid_t pid;
  int fd;
  std::string name, out;
  std::chrono::steady_clock::time_point start;
};

}  // namespace

int main(int argc, char** argv) {
  double limit = 30;
  int jobs = 1;
  long min_pass = -1;
  bool verbose = false;
  std::vector<fs::path> roots;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if ((a == "-t" || a == "-j" || a == "--min-pass") && i + 1 < argc) {
      std::string v = argv[++i];
      if (a == "-t") limit = std::stod(v);
      else if (a == "-j") jobs = std::max(1, std::stoi(v));
      else min_pass = std::stol(v);
    } else if (a == "-v") {
      verbose = true;
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << "usage: onnx_conformance [-t SECONDS] [-j N] [--min-pass N] [-v] DIR...\n";
      return 2;
    } else {
      roots.emplace_back(a);
    }
  }
  if (roots.empty()) {
    std::cerr << "usage: onnx_conformance [-t SECONDS] [-j N] [--min-pass N] [-v] DIR...\n";
    return 2;
  }
  std::vector<fs::path> cases;
  for (const auto& r : roots) {
    if (fs::exists(r / "model.onnx")) {
      cases.push_back(r);
      continue;
    }
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(r, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_directory() && fs::exists(it->path() / "model.onnx")) cases.push_back(it->path());
    if (ec) std::cerr << "onnx_conformance: cannot read " << r << ": " << ec.message() << "\n";
  }
  std::sort(cases.begin(), cases.end());
  std::cout.setf(std::ios::unitbuf);

  int passed = 0, failed = 0;
  double max_time = 0;
  std::string max_case;
  std::vector<Running> running;
  size_t next = 0;
  auto finish = [&](Running& r, const std::string& forced) {
    int status = 0;
    waitpid(r.pid, &status, 0);
    close(r.fd);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
    std::string res = forced;
    if (res.empty()) {
      res = r.out;
      while (!res.empty() && (res.back() == '\n' || res.back() == '\r')) res.pop_back();
      if (WIFSIGNALED(status)) res = std::string("ERROR crashed: ") + strsignal(WTERMSIG(status));
      else if (res.empty()) res = "ERROR exited with status " + std::to_string(WEXITSTATUS(status)) + " and no result";
    }
    if (res.rfind("PASS", 0) == 0) passed++;
    else failed++;
    if (secs > max_time) {
      max_time = secs;
      max_case = r.name;
    }
    std::string status_word = res.substr(0, res.find(' '));
    std::string reason = res.size() > status_word.size() ? res.substr(status_word.size() + 1) : "";
    char t[32];
    std::snprintf(t, sizeof t, "%.2fs", secs);
    std::cout << status_word << " " << r.name << " (" << t << ")" << (reason.empty() ? "" : ": " + reason) << "\n";
  };
  while (next < cases.size() || !running.empty()) {
    while (next < cases.size() && int(running.size()) < jobs) {
      int p[2];
      if (pipe(p) != 0) {
        std::perror("pipe");
        return 2;
      }
      fs::path dir = cases[next++];
      pid_t pid = fork();
      if (pid == 0) {
        close(p[0]);
        if (!verbose) {
          FILE* null = std::freopen("/dev/null", "w", stdout);
          (void)null;
        }
        std::string res = run_case(dir) + "\n";
        ssize_t w = write(p[1], res.data(), res.size());
        (void)w;
        _exit(0);
      }
      close(p[1]);
      if (pid < 0) {
        std::perror("fork");
        return 2;
      }
      running.push_back({pid, p[0], dir.filename().string(), "", std::chrono::steady_clock::now()});
    }
    std::vector<pollfd> fds;
    for (auto& r : running) fds.push_back({r.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    for (size_t i = running.size(); i-- > 0;) {
      Running& r = running[i];
      bool done = false;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[4096];
        ssize_t n = read(r.fd, buf, sizeof buf);
        if (n > 0) r.out.append(buf, size_t(n));
        else done = true;
      }
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
      if (done) {
        finish(r, "");
        running.erase(running.begin() + long(i));
      } else if (secs > limit) {
        kill(r.pid, SIGKILL);
        char t[64];
        std::snprintf(t, sizeof t, "ERROR timed out after %.0f s", limit);
        finish(r, t);
        running.erase(running.begin() + long(i));
      }
    }
  }
  char t[32];
  std::snprintf(t, sizeof t, "%.2f", max_time);
  std::cout << "slowest case: " << max_case << " (" << t << " s)\n";
  std::cout << passed << " passed, " << failed << " failed\n";
  if (min_pass >= 0 && passed < min_pass) {
    std::cerr << "onnx_conformance: " << passed << " passed, fewer than the recorded " << min_pass << "\n";
    return 1;
  }
  return 0;
}
