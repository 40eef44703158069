#pragma once
// VIZ and PROFILE: what the compiler did, for a person to look at.
//  - VIZ=1 records every graph_rewrite (its stage name, each applied rule with the file:line that declares it, the
//    graph before and after) under the context it ran in (a schedule, a kernel's lowering), plus each kernel's
//    rendered source. At exit the program serves a page on 127.0.0.1:VIZ_PORT (default 8000) that draws them;
//    with VIZ_PORT set it serves from the first record on (live), and keeps serving at exit until interrupted.
//    VIZ=2 records without serving (tests read viz::to_json()).
//  - PROFILE=1 records spans (scheduling, lowering, compiling) and every kernel launch and copy (device, duration,
//    GFLOPS, GB/s) per thread, and writes them at exit as Chrome-trace JSON to PROFILE_FILE (default
//    tg_profile.json); the VIZ page shows them as a timeline.
// Off, each costs one load and branch on a cached flag where it hooks in.
// Thread-safety: safe; records from any thread are appended under one lock, contexts are per thread.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tg/pattern.hpp"

namespace tg::viz {

namespace detail {
extern std::atomic<int> g_viz, g_profile;  // -1: not read yet
int read_viz();
int read_profile();
}  // namespace detail

/** The VIZ level (0 off, 1 record and serve, 2 record only); read from the environment once. */
inline int level() {
  int v = detail::g_viz.load(std::memory_order_relaxed);
  return v >= 0 ? v : detail::read_viz();
}
/** Whether rewrites are recorded. */
inline bool enabled() { return level() > 0; }
/** Turn recording on or off from code (tests): 0, 1 or 2 as VIZ. */
void set_level(int v);

/** A named context on this thread ("schedule", "kernel r_4_4"): rewrites recorded while it lives belong to it.
 *  Nested contexts are separate entries. Free when VIZ is off. */
class Context {
 public:
  /// opens the context on this thread (kind: "schedule", "kernel", ...; name shown in the viewer)
  Context(const char* kind, const std::string& name);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

 private:
  int64_t id_ = -1, parent_ = -1;
};

/** Record one graph_rewrite: the graph `before`, the rules applied in order, the graph `after`. */
void record_rewrite(const char* stage, const UOpRef& before, std::vector<RewriteStep> steps, const UOpRef& after);
/** How many rewrites this thread has recorded (a caller tells whether a step recorded any). */
size_t thread_records();
/** Attach text (a kernel's rendered source) to this thread's current context. */
void attach_source(const std::string& src);

/** Everything recorded so far as JSON: {"contexts": [{"kind", "name", "thread", "source", "rewrites": [{"stage",
 *  "steps": n, "rules": ["file:line", ...]}]}]}. */
std::string to_json();
/** One rewrite with its graphs: {"stage", "graphs": [graph after 0..n steps], "rules": [{"loc", "code"}]}; each
 *  graph {"nodes": [{"id", "op", "dtype", "arg", "src": [ids], "changed"}]}. Throws tg::Error for a bad index. */
std::string rewrite_json(size_t context, size_t rewrite);
/** Forget every record (tests). */
void clear();
/** Serve the page on 127.0.0.1:`port` (0: any free port) in a background thread; returns the port. */
int serve(int port);
/** Stop the background server (tests). */
void stop_serving();

}  // namespace tg::viz

namespace tg::profile {

/** Whether PROFILE is on; read from the environment once. */
inline bool enabled() {
  int v = viz::detail::g_profile.load(std::memory_order_relaxed);
  return (v >= 0 ? v : viz::detail::read_profile()) > 0;
}
/** Turn profiling on or off from code (tests). */
void set_enabled(bool on);

/// The clock of profile events.
using Clock = std::chrono::steady_clock;
/** One complete event on this thread: category ("schedule", "lower", "compile", "kernel", "copy"), name, device,
 *  start and end; flops and bytes give the event's GFLOPS and GB/s. */
void event(const char* cat, const std::string& name, const std::string& device, Clock::time_point t0, Clock::time_point t1,
           double flops = 0, double bytes = 0);

/** A span from construction to destruction, recorded when PROFILE is on. */
class Span {
 public:
  /// starts a span of category `cat` named `name` on `device` (the event is recorded at destruction)
  Span(const char* cat, std::string name, std::string device = "")
      : on_(enabled()), cat_(cat) {
    if (on_) name_ = std::move(name), device_ = std::move(device), t0_ = Clock::now();
  }
  ~Span() {
    if (on_) event(cat_, name_, device_, t0_, Clock::now());
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  const char* cat_;
  std::string name_, device_;
  Clock::time_point t0_;
};

/** The events so far as Chrome-trace JSON ({"traceEvents": [...]}; times in microseconds). */
std::string to_json();
/** Write to_json() to `path`; throws tg::Error naming the file when it cannot. */
void write(const std::string& path);
/** Forget every event (tests). */
void clear();

}  // namespace tg::profile
