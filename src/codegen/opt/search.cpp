// BEAM search (see include/tg/search.hpp): rounds of "apply every action to the N best, compile in parallel, time
// on scratch buffers, keep the N best", seeded with the empty list or the heuristic's opts and their prefixes.
#include "tg/search.hpp"

#include <oneapi/tbb/parallel_for.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "tg/codegen.hpp"
#include "tg/env.hpp"
#include "tg/symbolic.hpp"

namespace tg {

namespace {

using clk = std::chrono::steady_clock;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxExpanded = 8192;  // most nodes after expansion (an LLVM compile of 3,500 takes ~2 s here)
constexpr double kMinProgress = 0.01;  // a round must beat the best by 1%
constexpr double kEarlyStop = 3;       // a first run this many times slower than the best is not repeated
constexpr size_t kTileSeeds = 4;        // the heuristic's best register tiles that seed the search

std::atomic<size_t> g_compiled{0};
std::mutex g_search_mu;  // one search at a time: timings must not overlap

double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// The axis's size, 0 when symbolic.
int64_t axis_size(const UOp* r) { return r->src(0)->op == Ops::CONST ? r->src(0)->const_int() : 0; }

struct Candidate {
  std::vector<Opt> opts;
  UOpRef applied;  // the simplified kernel with the opts applied (interned: equal kernels are one node)
  CompiledKernel ck;
  std::shared_ptr<Program> prog;
  std::string error;
  double us = kInf;
  double compile_ms = 0;
};

// Values for a candidate's run: each variable of a symbolic shape at the middle of its bounds (as tinygrad's search),
// core_id set per call.
std::vector<int64_t> search_vars(const CompiledKernel& ck) {
  std::vector<int64_t> vars(std::max<size_t>(1, ck.var_names.size()), 0);
  size_t i = 0;
  for (const UOp* u : ck.program)
    if (u->op == Ops::DEFINE_VAR) {
      const VarArg& v = std::get<VarArg>(u->arg);
      if (i < vars.size() && int(i) != ck.core_var) vars[i] = v.min + (v.max - v.min) / 2;
      i++;
    }
  return vars;
}

LaunchDims dims_of(const CompiledKernel& ck) {
  LaunchDims d = ck.dims;
  d.n_vars = int(ck.var_names.size());
  if (ck.core_var >= 0) d.core_var = ck.core_var, d.global[0] = ck.threads;
  return d;
}

// CPU candidates run once in a forked child before they are timed here: one that crashes (a bad kernel reading or
// writing out of bounds) kills the child, not the search, and its wild writes land in the child's copy-on-write
// pages. The child runs the thread split's parts one after another (a forked child has no thread pool). Returns
// why the candidate is refused, or nothing.
std::optional<std::string> crash_probe(Program& p, const CompiledKernel& ck, void* const* bufs, double timeout_s) {
  std::vector<int64_t> vars = search_vars(ck);
  LaunchDims one = dims_of(ck);
  one.core_var = -1, one.global[0] = 1;
  int parts = ck.core_var >= 0 ? ck.threads : 1;
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return std::nullopt;  // no fork: timed in this process, as without the probe
  if (pid == 0) {
    // die of the signal itself: handlers inherited from the parent (a test framework's, a sanitizer's) would
    // report a crash of the whole program from here
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP}) signal(sig, SIG_DFL);
    for (int i = 0; i < parts; i++) {
      if (ck.core_var >= 0) vars[size_t(ck.core_var)] = i;
      p.run(bufs, vars.data(), one);
    }
    _exit(0);
  }
  int st = 0;
  auto t0 = clk::now();
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (seconds_since(t0) > timeout_s) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      return "ran longer than " + std::to_string(int(timeout_s)) + " s";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (WIFSIGNALED(st)) return "crashed (signal " + std::to_string(WTERMSIG(st)) + ", " + strsignal(WTERMSIG(st)) + ")";
  if (WIFEXITED(st) && WEXITSTATUS(st) != 0) return "exited with status " + std::to_string(WEXITSTATUS(st));
  return std::nullopt;
}

// Best of several runs; a first run slower than `cutoff` is not repeated. At least two runs (one past the
// deadline), more while cheap.
double time_us(Program& p, const CompiledKernel& ck, void* const* bufs, Device& dev, double cutoff,
               clk::time_point deadline) {
  std::vector<int64_t> vars = search_vars(ck);
  LaunchDims d = dims_of(ck);
  double best = kInf, total = 0;
  for (int r = 0; r < 20; r++) {
    auto t = clk::now();
    p.run(bufs, vars.data(), d);
    dev.synchronize();
    double us = std::chrono::duration<double, std::micro>(clk::now() - t).count();
    best = std::min(best, us);
    total += us;
    if (r == 0 && (us > cutoff || clk::now() > deadline)) break;
    if (r >= 1 && total > 50e3) break;
  }
  return best;
}

// Apply opts to the simplified kernel; null when one does not apply. (No size limits: seeds and cached lists are
// what the engine would run anyway; the limits bound what the search adds.)
UOpRef apply_all(const UOpRef& base, const std::vector<Opt>& opts) {
  UOpRef k = base;
  try {
    for (const Opt& o : opts) k = apply_opt(k, o);
  } catch (const OptError&) {
    return nullptr;
  }
  return k;
}

}  // namespace

int64_t expanded_size(const UOpRef& applied) {
  // Each node is copied once per combination of the UPCAST/UNROLL ranges it depends on.
  std::unordered_map<const UOp*, std::vector<const UOp*>> up;
  int64_t total = 0;
  for (const UOp* u : toposort(applied.get())) {
    std::vector<const UOp*> d;
    for (const UOpRef& s : u->src())
      for (const UOp* r : up[s.get()])
        if (std::find(d.begin(), d.end(), r) == d.end()) d.push_back(r);
    if (u->op == Ops::RANGE && (range_type(u) == AxisType::Upcast || range_type(u) == AxisType::Unroll)) d.push_back(u);
    int64_t copies = 1;
    for (const UOp* r : d) copies *= std::max<int64_t>(1, axis_size(r));
    total += copies;
    up[u] = std::move(d);
  }
  return total;
}

size_t beam_candidates_compiled() { return g_compiled.load(); }

std::optional<std::vector<int64_t>> beam_amounts(OptOp op, const OptConfig& cfg) {
  switch (op) {
    case OptOp::UPCAST:
    case OptOp::UNROLL: return std::vector<int64_t>{0, 2, 3, 4, 5, 7, 8, 16};
    case OptOp::THREAD:
      if (cfg.threads <= 1) return std::vector<int64_t>{};
      return std::vector<int64_t>{cfg.threads, 2 * int64_t(cfg.threads)};
    case OptOp::LOCAL:  // work-group opts only where the device has work groups (as tinygrad's action amounts)
      if (cfg.local_threads <= 0) return std::vector<int64_t>{};
      return std::vector<int64_t>{2, 3, 4, 8, 13, 16, 29};
    case OptOp::GROUP:
    case OptOp::GROUPTOP:
      if (cfg.local_threads <= 0) return std::vector<int64_t>{};
      return std::vector<int64_t>{0, 4, 8, 16};
    case OptOp::TC:    // chosen by the GPU heuristic (its arg is a tile layout, not a split)
    case OptOp::SWAP:  // its arg names a second axis, not an amount
    case OptOp::PADTO:  // chosen by the heuristic before an UPCAST that does not divide the axis (BEAM's seeds)
    case OptOp::PREFETCH:  // chosen by the heuristic for streaming reduce loops (BEAM's seeds keep it)
      return std::vector<int64_t>{};
    case OptOp::NONTEMPORAL:  // on or off: axis 0, amt 1 (CPU only)
      if (cfg.local_threads > 0) return std::vector<int64_t>{};
      return std::vector<int64_t>{1};
  }
  return std::nullopt;
}

// A CPU's copies live in its vector registers: a tile of more floats than all but one of them hold spills (AVX2's
// 16 ymm: 128 floats, 16 accumulators with no register left for the operands; at N=1024 a 4x32 tile ran 1.1-1.3x,
// an 8x32 one 1.7-8x the time of the 2x32 one, and timing such candidates took most of a search's 15 s). AVX-512's
// 32 zmm hold 512 floats: the limit stays tinygrad's 256. GPUs: 256.
int64_t beam_upcast_limit(const OptConfig& cfg) {
  if (cfg.local_threads > 0 || cfg.vector_registers < 2 || cfg.vector_width < 1) return kMaxUpcast;
  return std::min<int64_t>(kMaxUpcast, int64_t(cfg.vector_registers - 1) * cfg.vector_width);
}

int64_t upcast_size(const UOpRef& applied) {
  int64_t n = 1;
  for (const UOp* u : toposort(applied.get()))
    if (u->op == Ops::RANGE && (range_type(u) == AxisType::Upcast || range_type(u) == AxisType::Unroll))
      n *= std::max<int64_t>(1, axis_size(u));
  return n;
}

std::vector<std::pair<std::vector<Opt>, UOpRef>> beam_actions(const UOpRef& applied, const std::vector<Opt>& opts,
                                                              const OptConfig& cfg) {
  std::vector<std::pair<std::vector<Opt>, UOpRef>> out;
  std::vector<const UOp*> axes = kernel_axes(applied);
  const int64_t limit = beam_upcast_limit(cfg);
  for (int v = 0; v < 256; v++) {
    auto amts = beam_amounts(OptOp(v), cfg);
    if (!amts) continue;
    if (OptOp(v) == OptOp::NONTEMPORAL &&  // on once
        std::any_of(opts.begin(), opts.end(), [](const Opt& o) { return o.op == OptOp::NONTEMPORAL; }))
      continue;
    for (size_t ax = 0; ax < axes.size(); ax++) {
      std::vector<int64_t> tried;
      for (int64_t a : *amts) {
        int64_t amt = a == 0 ? axis_size(axes[ax]) : a;  // 0: the whole axis
        if (std::find(tried.begin(), tried.end(), amt) != tried.end()) continue;
        tried.push_back(amt);
        Opt o{OptOp(v), int(ax), amt};
        UOpRef k;
        try {
          k = apply_opt(applied, o);
        } catch (const OptError&) {
          continue;
        }
        if (upcast_size(k) > limit || expanded_size(k) > kMaxExpanded) continue;
        std::vector<Opt> next = opts;
        next.push_back(o);
        out.emplace_back(std::move(next), k);
      }
    }
  }
  return out;
}

BeamOptions beam_options_from_env() {
  BeamOptions o;
  int64_t w = getenv_int("BEAM", 0);
  if (w < 0 || w > 64) throw EnvError("[beam] BEAM=" + std::to_string(w) + " is out of range; expected 0..64 (0: no search)");
  o.width = int(w);
  o.budget_s = getenv_double("BEAM_BUDGET", 60);
  if (!(o.budget_s > 0) || !std::isfinite(o.budget_s))
    throw EnvError("[beam] BEAM_BUDGET=" + getenv_str("BEAM_BUDGET") + " is not a positive number of seconds; expected e.g. BEAM_BUDGET=60");
  return o;
}

BeamResult beam_search(const UOpRef& ast, std::span<Buffer* const> bufs, const std::string& device, const BeamOptions& o) {
  if (o.width < 1) throw Error("[beam_search] the beam width must be at least 1, got " + std::to_string(o.width));
  auto t0 = clk::now();
  auto deadline = t0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(std::min(o.budget_s, 1e6)));
  int dbg = debug_level();
  Device& dev = get_device(device);
  BeamKey key{ast->key(), dev.name(), dev.compiler().id(), o.width};
  const bool host = dev.name().rfind("CPU", 0) == 0;  // kernels run in this process: probe them in a child first
  UOpRef base = split_ranges(graph_rewrite(ast, symbolic(), nullptr, false, "simplify for beam"));
  LowerOptions lo;
  lo.config = opt_config(dev);
  lo.index64 = dev.index64();
  auto lookup = [&](bool report) -> std::optional<BeamResult> {
    if (!o.cache) return std::nullopt;
    auto e = o.cache->get(key);
    if (!e) return std::nullopt;
    if (!apply_all(base, e->opts)) {  // a stale or foreign row: search again (and overwrite it)
      if (report && dbg >= 1) std::fprintf(stderr, "beam: cached opts [%s] do not apply; searching again\n", opts_to_text(e->opts).c_str());
      return std::nullopt;
    }
    BeamResult r;
    r.opts = e->opts, r.us = e->us, r.cached = true;
    r.search_s = seconds_since(t0);
    return r;
  };
  if (auto r = lookup(true)) return *r;
  std::lock_guard lk(g_search_mu);
  if (auto r = lookup(false)) return *r;  // another thread searched this kernel while we waited

  // Scratch copies of the buffers (the same Buffer twice stays one scratch buffer): the search never writes the
  // user's data. Unallocated buffers (outputs, or inputs an earlier kernel will fill) start as zeros.
  std::vector<std::unique_ptr<Buffer>> scratch;
  std::unordered_map<Buffer*, void*> scratch_of;
  std::vector<void*> ptrs;
  for (Buffer* b : bufs) {
    auto it = scratch_of.find(b);
    if (it == scratch_of.end()) {
      auto s = std::make_unique<Buffer>(device, b->dtype(), b->size());
      std::vector<uint8_t> host(b->nbytes(), 0);
      if (b->allocated() && !host.empty()) b->copyout(host.data(), host.size());
      if (!host.empty()) s->copyin(host.data(), host.size());
      it = scratch_of.emplace(b, s->ptr()).first;
      scratch.push_back(std::move(s));
    }
    ptrs.push_back(it->second);
  }

  BeamResult res;
  std::unordered_set<const UOp*> seen;
  std::vector<UOpRef> keep;  // seen kernels stay alive, so their addresses are not reused
  auto add = [&](std::vector<Candidate>& cs, std::vector<Opt> opts, UOpRef k) {
    if (!k || seen.count(k.get())) return;
    seen.insert(k.get());
    keep.push_back(k);
    cs.push_back(Candidate{std::move(opts), std::move(k), {}, nullptr, {}, kInf});
  };
  // Seeds: what the engine would apply without BEAM (the heuristic on CPUs), and the same without its THREAD split
  // (so the search may split differently; at most `threads` times slower), else nothing. Not the heuristic's
  // prefixes: without its register tile a big kernel runs 10-100x slower, and one run of that can take minutes.
  std::vector<Candidate> cands;
  std::vector<Opt> dflt = dev.renderer().grid_limits().threads > 0 ? std::vector<Opt>{}
                                                                    : hand_coded_optimizations(base, lo.config);
  std::vector<Opt> serial;
  for (const Opt& op : dflt)
    if (op.op != OptOp::THREAD) serial.push_back(op);
  // and the default with its non-temporal stores turned the other way (the search measures whether they pay)
  std::vector<Opt> toggled;
  for (const Opt& op : dflt)
    if (op.op != OptOp::NONTEMPORAL) toggled.push_back(op);
  if (toggled.size() == dflt.size() && dev.renderer().grid_limits().threads == 0) toggled.push_back({OptOp::NONTEMPORAL, 0, 1});
  for (const std::vector<Opt>* seed : {&dflt, &serial, &toggled}) add(cands, *seed, apply_all(base, *seed));
  // The heuristic's next-best register tiles too (its load model ranks them): the search can leave its first
  // choice, which already uses the whole copy budget (so no action could change the tile).
  if (dev.renderer().grid_limits().threads == 0)
    for (const std::vector<Opt>& alt : hand_coded_alternatives(base, lo.config, kTileSeeds)) add(cands, alt, apply_all(base, alt));

  static std::atomic<uint64_t> name_counter{0};
  Candidate best;
  std::vector<Candidate> beam;
  for (int round = 0; !cands.empty(); round++) {
    if (seconds_since(t0) > o.budget_s) {
      res.out_of_budget = true;
      break;
    }
    // Compile in parallel (each LLVM compile has its own context and target machine; the ORC JIT takes objects
    // from several threads, as run_schedule already relies on).
    std::atomic<int> compiled{0};
    tbb::parallel_for(size_t(0), cands.size(), [&](size_t i) {
      Candidate& c = cands[i];
      if (seconds_since(t0) > o.budget_s) return;
      auto tc = clk::now();
      try {
        if (o.before_compile) o.before_compile(c.opts);
        LowerOptions l = lo;
        l.opts = &c.opts;
        c.ck = lower_kernel(ast, "beam_" + std::to_string(name_counter++), dev.renderer(), l);
        if (o.edit_source) o.edit_source(c.opts, c.ck.src);
        std::vector<uint8_t> bin = dev.compiler().compile(c.ck.src, c.ck.name);
        c.prog = dev.load(bin, c.ck.name);
        g_compiled++;
        compiled++;
        c.compile_ms = seconds_since(tc) * 1e3;
      } catch (const std::exception& e) {
        c.error = e.what();
      }
    });
    res.compiled += compiled.load();
    // Time one after another, the device otherwise idle.
    for (Candidate& c : cands) {
      if (!c.error.empty()) {
        res.failed++;
        if (dbg >= 1)
          std::fprintf(stderr, "beam: skipped candidate [%s]: %s\n", opts_to_text(c.opts).c_str(), first_line(c.error).c_str());
        continue;
      }
      if (!c.prog) continue;  // not compiled: out of budget
      if (seconds_since(t0) > o.budget_s) {
        res.out_of_budget = true;
        break;
      }
      if (host) {
        if (auto why = crash_probe(*c.prog, c.ck, ptrs.data(), std::max(5.0, o.budget_s - seconds_since(t0)))) {
          res.failed++;
          std::fprintf(stderr, "beam: skipped candidate [%s]: it %s\n", opts_to_text(c.opts).c_str(), why->c_str());
          continue;
        }
      }
      try {
        c.us = time_us(*c.prog, c.ck, ptrs.data(), dev, best.us * kEarlyStop, deadline);
      } catch (const std::exception& e) {
        res.failed++;
        if (dbg >= 1)
          std::fprintf(stderr, "beam: candidate [%s] failed to run: %s\n", opts_to_text(c.opts).c_str(), first_line(e.what()).c_str());
        continue;
      }
      if (dbg >= 3)
        std::fprintf(stderr, "beam:   %10.1f us  compile %7.1f ms  size %6lld  [%s]\n", c.us, c.compile_ms,
                     (long long)expanded_size(c.applied), opts_to_text(c.opts).c_str());
      if (c.us < best.us) best.opts = c.opts, best.us = c.us;
    }
    std::vector<Candidate*> timed;
    for (Candidate& c : cands)
      if (std::isfinite(c.us)) timed.push_back(&c);
    std::sort(timed.begin(), timed.end(), [](const Candidate* a, const Candidate* b) { return a->us < b->us; });
    res.rounds = round + 1;
    if (dbg >= 2)
      std::fprintf(stderr, "beam: round %d: %zu candidates, %zu timed, best %.1f us [%s], %.1f s\n", round, cands.size(),
                   timed.size(), timed.empty() ? 0.0 : timed[0]->us, timed.empty() ? "" : opts_to_text(timed[0]->opts).c_str(),
                   seconds_since(t0));
    double prev = beam.empty() ? kInf : beam[0].us;
    if (timed.empty() || (!beam.empty() && timed[0]->us >= prev * (1 - kMinProgress))) break;
    beam.clear();
    for (size_t i = 0; i < timed.size() && i < size_t(o.width); i++)
      beam.push_back(Candidate{timed[i]->opts, timed[i]->applied, {}, nullptr, {}, timed[i]->us});
    if (res.out_of_budget) break;
    cands.clear();  // frees this round's programs
    for (const Candidate& b : beam)
      for (auto& [opts, k] : beam_actions(b.applied, b.opts, lo.config)) add(cands, std::move(opts), std::move(k));
  }
  res.search_s = seconds_since(t0);
  if (!std::isfinite(best.us)) {  // nothing ran: what the engine would do without BEAM, not cached
    res.opts = dflt;
    if (dbg >= 1) std::fprintf(stderr, "beam: no candidate ran (%d failed); using the default opts\n", res.failed);
    return res;
  }
  res.opts = best.opts;
  res.us = best.us;
  if (o.cache) o.cache->put(key, BeamCache::Entry{res.opts, res.us});
  if (dbg >= 1)
    std::fprintf(stderr, "beam: %s: %.1f us with [%s] after %d rounds, %d candidates (%d failed), %.1f s%s\n",
                 key.ast.substr(0, 8).c_str(), res.us, opts_to_text(res.opts).c_str(), res.rounds, res.compiled,
                 res.failed, res.search_s, res.out_of_budget ? " (budget spent)" : "");
  return res;
}

}  // namespace tg
