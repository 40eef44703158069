// VIZ: the rewrite recorder and the page that shows it; PROFILE: the Chrome-trace event recorder.
// The page (page.html) and the layout library (npm dagre's dagre.min.js) are compiled in (viz_assets.hpp).
#include "tg/viz.hpp"

#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "tg/env.hpp"
#include "tg/error.hpp"
#include "viz_dagre.hpp"
#include "viz_page.hpp"

namespace tg::viz {

namespace detail {
std::atomic<int> g_viz{-1}, g_profile{-1};
}  // namespace detail

namespace {
using json = nlohmann::json;

constexpr size_t kMaxSteps = 2000;  // rules kept per rewrite (the count of the rest is kept)

struct Rewrite {
  std::string stage;
  UOpRef before, after;
  std::vector<RewriteStep> steps;
  size_t dropped = 0;
};
struct Ctx {
  std::string kind, name, source;
  int64_t parent;
  int thread;
  std::vector<Rewrite> rewrites;
};

// Never destroyed: records may arrive from threads still running while the process exits.
struct Store {
  std::mutex mu;
  std::deque<Ctx> ctxs;
  std::unordered_map<int, int64_t> loose;  // per thread: the context of rewrites outside any Context
  std::mutex server_mu;
  httplib::Server* server = nullptr;
  std::thread server_thread;
  int port = 0;
};
Store& store() {
  static Store* s = new Store;
  return *s;
}

std::atomic<int> g_next_thread{0};
int thread_index() {
  thread_local int t = g_next_thread++;
  return t;
}
thread_local std::vector<int64_t> t_stack;
thread_local size_t t_records = 0;

void serve_at_exit();
}  // namespace
}  // namespace tg::viz
namespace tg::profile {
namespace {
void write_at_exit();
}  // namespace
}  // namespace tg::profile
namespace tg::viz {
namespace {

// This thread's context, made on first use when no Context is open. Called under the lock.
int64_t current_ctx(Store& s) {
  if (!t_stack.empty()) return t_stack.back();
  int t = thread_index();
  auto it = s.loose.find(t);
  if (it != s.loose.end()) return it->second;
  s.ctxs.push_back(Ctx{"other", "outside any kernel (thread " + std::to_string(t) + ")", "", -1, t, {}});
  return s.loose[t] = int64_t(s.ctxs.size()) - 1;
}

// The source line a rule is declared on (its pattern and the trailing comment with its math), when the file is here.
std::string rule_code(const std::string& loc) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::vector<std::string>> files;
  size_t colon = loc.rfind(':');
  if (colon == std::string::npos) return "";
  std::string path = loc.substr(0, colon);
  size_t line = size_t(std::atoll(loc.c_str() + colon + 1));
  std::lock_guard lk(mu);
  auto it = files.find(path);
  if (it == files.end()) {
    std::vector<std::string> lines;
    for (std::string p : {path, std::string(TG_BUILD_ROOT) + "/" + path, std::string(TG_SOURCE_ROOT) + "/" + path}) {
      std::ifstream f(p);
      if (!f) continue;
      for (std::string l; std::getline(f, l);) lines.push_back(l);
      break;
    }
    it = files.emplace(path, std::move(lines)).first;
  }
  if (line == 0 || line > it->second.size()) return "";
  std::string l = it->second[line - 1];
  size_t b = l.find_first_not_of(" \t");
  return b == std::string::npos ? "" : l.substr(b);
}

// A graph as nodes in topological order. `changed` marks what the step made: the rule's `result` and its new nodes
// (not the users above it, rebuilt only because a source changed); with no result, every node not in `prev`.
json graph_json(const UOp* root, const std::unordered_set<const UOp*>* prev, const UOp* result) {
  std::vector<const UOp*> topo = toposort(root);
  std::unordered_set<const UOp*> made;
  if (result)
    for (const UOp* u : toposort(result))
      if (u == result || !prev->count(u)) made.insert(u);
  std::unordered_map<const UOp*, size_t> id;
  json nodes = json::array();
  for (const UOp* u : topo) {
    id[u] = nodes.size();
    json src = json::array();
    for (size_t i = 0; i < u->nsrc(); i++) src.push_back(id.at(u->src(i)));
    std::string arg = arg_str(u->arg);
    if (arg.size() > 200) arg = arg.substr(0, 200) + "…";
    nodes.push_back({{"id", nodes.size()}, {"op", op_name(u->op)}, {"dtype", u->dtype.name()}, {"arg", arg}, {"src", src},
                     {"changed", result ? made.count(u) > 0 : prev && !prev->count(u)}});
  }
  return json{{"nodes", nodes}};
}

std::unordered_set<const UOp*> node_set(const UOp* root) {
  std::vector<const UOp*> t = toposort(root);
  return {t.begin(), t.end()};
}

}  // namespace

int detail::read_viz() {
  int v = int(getenv_int("VIZ", 0, 0, 2));
  int expect = -1;
  if (g_viz.compare_exchange_strong(expect, v) && v == 1) {
    std::atexit(serve_at_exit);
    if (int64_t port = getenv_int("VIZ_PORT", 0, 0, 65535); port > 0) serve(int(port));
  }
  return g_viz.load();
}

void set_level(int v) {
  if (v < 0 || v > 2) throw Error("[viz] level " + std::to_string(v) + " is not 0, 1 or 2");
  detail::g_viz.store(v);
}

Context::Context(const char* kind, const std::string& name) {
  if (!enabled()) return;
  Store& s = store();
  std::lock_guard lk(s.mu);
  parent_ = t_stack.empty() ? -1 : t_stack.back();
  s.ctxs.push_back(Ctx{kind, name, "", parent_, thread_index(), {}});
  id_ = int64_t(s.ctxs.size()) - 1;
  t_stack.push_back(id_);
}

Context::~Context() {
  if (id_ >= 0 && !t_stack.empty() && t_stack.back() == id_) t_stack.pop_back();
}

void record_rewrite(const char* stage, const UOpRef& before, std::vector<RewriteStep> steps, const UOpRef& after) {
  if (steps.empty() && before == after) return;  // nothing happened: not worth a line
  t_records++;
  Rewrite r{stage, before, after, std::move(steps), 0};
  if (r.steps.size() > kMaxSteps) r.dropped = r.steps.size() - kMaxSteps, r.steps.resize(kMaxSteps);
  Store& s = store();
  std::lock_guard lk(s.mu);
  s.ctxs[size_t(current_ctx(s))].rewrites.push_back(std::move(r));
}

size_t thread_records() { return t_records; }

void attach_source(const std::string& src) {
  if (!enabled()) return;
  Store& s = store();
  std::lock_guard lk(s.mu);
  s.ctxs[size_t(current_ctx(s))].source = src;
}

std::string to_json() {
  Store& s = store();
  std::lock_guard lk(s.mu);
  json cs = json::array();
  for (const Ctx& c : s.ctxs) {
    json rws = json::array();
    for (const Rewrite& r : c.rewrites) {
      json rules = json::array();
      for (const RewriteStep& st : r.steps) rules.push_back(st.rule);
      rws.push_back({{"stage", r.stage}, {"steps", r.steps.size()}, {"dropped", r.dropped}, {"rules", rules}});
    }
    cs.push_back({{"kind", c.kind}, {"name", c.name}, {"parent", c.parent}, {"thread", c.thread}, {"source", c.source},
                  {"rewrites", rws}});
  }
  return json{{"contexts", cs}}.dump();
}

std::string rewrite_json(size_t context, size_t rewrite) {
  Rewrite r;
  {
    Store& s = store();
    std::lock_guard lk(s.mu);
    if (context >= s.ctxs.size() || rewrite >= s.ctxs[context].rewrites.size())
      throw Error("[viz] no rewrite " + std::to_string(context) + "/" + std::to_string(rewrite) + ": " +
                  std::to_string(s.ctxs.size()) + " contexts recorded");
    r = s.ctxs[context].rewrites[rewrite];
  }
  // The graph after each step: the step's node replaced in the graph of the step before (a node the rewrite built
  // from already-rewritten sources appears once those substitutions are made, as nodes are interned).
  json graphs = json::array(), rules = json::array();
  UOpRef cur = r.before;
  std::unordered_set<const UOp*> prev = node_set(cur.get());
  graphs.push_back(graph_json(cur.get(), nullptr, nullptr));
  for (const RewriteStep& st : r.steps) {
    const UOp* from = st.before.get();
    UOpRef to = st.after;
    if (prev.count(from)) cur = substitute(cur, [&](const UOp* u) { return u == from ? to : UOpRef(); });
    graphs.push_back(graph_json(cur.get(), &prev, to.get()));
    prev = node_set(cur.get());
    rules.push_back({{"loc", st.rule}, {"code", rule_code(st.rule)}});
  }
  if (cur != r.after) {  // the rewrite's own result, when replaying the steps did not reach it
    graphs.push_back(graph_json(r.after.get(), &prev, nullptr));
    rules.push_back({{"loc", "result"}, {"code", "the graph graph_rewrite returned"}});
  }
  return json{{"stage", r.stage}, {"graphs", graphs}, {"rules", rules}, {"dropped", r.dropped}}.dump();
}

void clear() {
  Store& s = store();
  std::lock_guard lk(s.mu);
  s.ctxs.clear();
  s.loose.clear();
}

int serve(int port) {
  Store& s = store();
  std::lock_guard lk(s.server_mu);
  if (s.server) return s.port;
  auto* srv = new httplib::Server;
  srv->Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kVizPage, "text/html; charset=utf-8"); });
  srv->Get("/dagre.min.js", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kDagreJs, "text/javascript; charset=utf-8");
  });
  srv->Get("/api/contexts", [](const httplib::Request&, httplib::Response& res) { res.set_content(to_json(), "application/json"); });
  srv->Get("/api/rewrite", [](const httplib::Request& req, httplib::Response& res) {
    try {
      size_t c = size_t(std::stoull(req.get_param_value("ctx"))), r = size_t(std::stoull(req.get_param_value("rw")));
      res.set_content(rewrite_json(c, r), "application/json");
    } catch (const std::exception& e) {
      res.status = 400;
      res.set_content(json{{"error", e.what()}}.dump(), "application/json");
    }
  });
  srv->Get("/api/profile", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(profile::to_json(), "application/json");
  });
  int bound = port > 0 ? (srv->bind_to_port("127.0.0.1", port) ? port : -1) : srv->bind_to_any_port("127.0.0.1");
  if (bound <= 0) {
    delete srv;
    throw Error("[viz] cannot serve on 127.0.0.1:" + std::to_string(port) + ": the port is taken; set VIZ_PORT to a free one");
  }
  s.server = srv;
  s.port = bound;
  s.server_thread = std::thread([srv] { srv->listen_after_bind(); });
  std::fprintf(stderr, "VIZ: http://127.0.0.1:%d\n", bound);
  return bound;
}

void stop_serving() {
  Store& s = store();
  std::lock_guard lk(s.server_mu);
  if (!s.server) return;
  s.server->stop();
  s.server_thread.join();
  delete s.server;
  s.server = nullptr;
}

namespace {
// VIZ=1 at exit: serve (on VIZ_PORT, default 8000) until interrupted.
void serve_at_exit() {
  if (viz::level() != 1) return;
  profile::write_at_exit();  // before serving, which does not return
  try {
    int port = serve(int(getenv_int("VIZ_PORT", 8000, 0, 65535)));
    std::fprintf(stderr, "VIZ: serving http://127.0.0.1:%d until interrupted (Ctrl-C)\n", port);
    std::fflush(stderr);
    while (true) pause();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}
}  // namespace

}  // namespace tg::viz

namespace tg::profile {

namespace {
struct Event {
  const char* cat;
  std::string name, device;
  int thread;
  double ts, dur, flops, bytes;
};
struct Events {
  std::mutex mu;
  std::vector<Event> ev;
  Clock::time_point t0 = Clock::now();
};
Events& events() {
  static Events* e = new Events;
  return *e;
}

void write_at_exit() {
  static std::atomic<bool> written{false};
  if (!enabled() || written.exchange(true)) return;
  std::string path = getenv_str("PROFILE_FILE", "tg_profile.json");
  try {
    write(path);
    std::fprintf(stderr, "PROFILE: %zu events written to %s\n", events().ev.size(), path.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}
}  // namespace

}  // namespace tg::profile

namespace tg::viz::detail {
int read_profile() {
  int v = int(getenv_int("PROFILE", 0, 0, 1));
  int expect = -1;
  if (g_profile.compare_exchange_strong(expect, v) && v == 1) {
    profile::events();  // the time origin
    std::atexit(profile::write_at_exit);
  }
  return g_profile.load();
}
}  // namespace tg::viz::detail

namespace tg::profile {

void set_enabled(bool on) {
  events();
  viz::detail::g_profile.store(on ? 1 : 0);
}

void event(const char* cat, const std::string& name, const std::string& device, Clock::time_point t0, Clock::time_point t1,
           double flops, double bytes) {
  Events& e = events();
  int t = viz::thread_index();
  std::lock_guard lk(e.mu);
  e.ev.push_back(Event{cat, name, device, t, std::chrono::duration<double, std::micro>(t0 - e.t0).count(),
                       std::chrono::duration<double, std::micro>(t1 - t0).count(), flops, bytes});
}

std::string to_json() {
  using json = nlohmann::json;
  Events& e = events();
  std::lock_guard lk(e.mu);
  json ev = json::array();
  std::unordered_set<int> threads;
  for (const Event& x : e.ev) {
    json args = json::object();
    if (!x.device.empty()) args["device"] = x.device;
    if (x.flops > 0 && x.dur > 0) args["GFLOPS"] = x.flops / x.dur / 1e3;
    if (x.bytes > 0 && x.dur > 0) args["GB/s"] = x.bytes / x.dur / 1e3;
    if (x.bytes > 0) args["bytes"] = x.bytes;
    ev.push_back({{"name", x.name}, {"cat", x.cat}, {"ph", "X"}, {"ts", x.ts}, {"dur", x.dur}, {"pid", 0}, {"tid", x.thread},
                  {"args", args}});
    threads.insert(x.thread);
  }
  for (int t : threads)
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", t},
                  {"args", {{"name", t == 0 ? std::string("main") : "thread " + std::to_string(t)}}}});
  return json{{"traceEvents", ev}, {"displayTimeUnit", "ms"}}.dump();
}

void write(const std::string& path) {
  std::string s = to_json();
  std::ofstream f(path, std::ios::binary);
  if (!f || !f.write(s.data(), std::streamsize(s.size())))
    throw Error("[profile] cannot write " + path + ": check PROFILE_FILE names a writable file");
}

void clear() {
  Events& e = events();
  std::lock_guard lk(e.mu);
  e.ev.clear();
  e.t0 = Clock::now();
}

}  // namespace tg::profile
