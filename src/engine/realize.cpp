// The engine: lower and compile each kernel of a schedule (cached, in parallel when several are new), then
// run them in order. DEBUG=2 prints one line per kernel launched.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <list>
#include <mutex>
#include <unordered_map>

#include "tg/codegen.hpp"
#include "tg/env.hpp"
#include "tg/jit.hpp"
#include "tg/schedule.hpp"
#include "tg/search.hpp"

namespace tg {

namespace {

std::atomic<size_t> g_kernels_run{0};

struct Runner {
  CompiledKernel kernel;
  std::shared_ptr<Program> program;
  std::string device;
};

// Lowered + compiled kernels by (AST node, device). The AST is interned, so the node identifies the kernel;
// the cache keeps it alive. Bounded: least recently used entries go first.
struct KernelCache {
  std::mutex mu;
  std::list<std::pair<std::pair<UOpRef, std::string>, std::shared_ptr<Runner>>> lru;
  std::unordered_map<std::string, std::unordered_map<const UOp*, decltype(lru)::iterator>> index;
  static constexpr size_t kMax = 2048;

  std::shared_ptr<Runner> get(const UOp* ast, const std::string& dev) {
    std::lock_guard lk(mu);
    auto& m = index[dev];
    auto it = m.find(ast);
    if (it == m.end()) return nullptr;
    lru.splice(lru.begin(), lru, it->second);
    return it->second->second;
  }
  void put(const UOpRef& ast, const std::string& dev, std::shared_ptr<Runner> r) {
    std::lock_guard lk(mu);
    lru.emplace_front(std::make_pair(ast, dev), std::move(r));
    index[dev][ast.get()] = lru.begin();
    while (lru.size() > kMax) {
      auto& back = lru.back();
      index[back.first.second].erase(back.first.first.get());
      lru.pop_back();
    }
  }
};
KernelCache& kernel_cache() {
  static KernelCache* c = new KernelCache();
  return *c;
}

std::string kernel_name(const UOp* ast) {
  bool red = false;
  std::vector<int64_t> dims;
  for (const UOp* u : toposort(ast)) {
    if (u->op == Ops::REDUCE) red = true;
    if (u->op == Ops::RANGE && std::get<std::vector<int64_t>>(u->arg)[1] != int64_t(AxisType::Reduce) &&
        u->src(0)->op == Ops::CONST)
      dims.push_back(u->src(0)->const_int());
  }
  std::string n = red ? "r" : "E";
  for (int64_t d : dims) n += "_" + std::to_string(d);
  if (dims.empty()) n += "_1";
  return n;
}

std::function<void(const UOpRef&, const std::string&)>& compile_hook() {
  static auto* h = new std::function<void(const UOpRef&, const std::string&)>();
  return *h;
}

// TG_PROCESS_REPLAY=DIR: every kernel compiled is recorded as one JSON line in DIR/<pid>.jsonl (its AST's content
// key, device, compiler, name, opts and rendered source), for scripts/process_replay to compare two captures.
void record_for_replay(const ScheduleItem& it, Device& dev, const CompiledKernel& k) {
  std::string dir = getenv_str("TG_PROCESS_REPLAY");  // read per kernel compiled: a cost next to lowering it
  if (dir.empty()) return;
  static std::mutex mu;
  std::string opts;
  for (const Opt& o : k.opts) opts += (opts.empty() ? "" : ", ") + to_string(o);
  nlohmann::json j = {{"key", it.ast->key()}, {"device", dev.name()},  {"compiler", dev.compiler().id()},
                      {"name", k.name},       {"opts", opts},          {"src", k.src}};
  std::lock_guard lk(mu);
  std::ofstream f(dir + "/" + std::to_string(::getpid()) + ".jsonl", std::ios::app);
  if (!(f << j.dump() << "\n"))
    throw EnvError("[process_replay] TG_PROCESS_REPLAY=" + dir + ": cannot write a record there; expected a writable folder");
}

std::shared_ptr<Runner> compile_item(const ScheduleItem& it) {
  Device& dev = get_device(it.device);
  auto r = std::make_shared<Runner>();
  r->device = it.device;
  LowerOptions lo;
  lo.config = opt_config(dev);
  lo.index64 = dev.index64();
  BeamResult beam;  // BEAM=N: the searched opts (cached across runs) replace the heuristic's
  if (BeamOptions bo = beam_options_from_env(); bo.width > 0 && getenv_int("NOOPT", 0) == 0) {
    bo.cache = BeamCache::global();
    std::vector<Buffer*> bufs;
    for (auto& b : it.bufs) bufs.push_back(b.get());
    beam = beam_search(it.ast, bufs, it.device, bo);
    lo.opts = &beam.opts;
  }
  r->kernel = lower_kernel(it.ast, kernel_name(it.ast.get()), dev.renderer(), lo);
  record_for_replay(it, dev, r->kernel);
  if (auto& hook = compile_hook()) hook(it.ast, r->kernel.name);
  r->program = dev.get_program(r->kernel.src, r->kernel.name);
  return r;
}

// One launch: the kernel's variables (core_id set per parallel call, the others from `vals` by name) and its calls.
void launch(Runner& r, void* const* bufs, const VarVals& vals) {
  LaunchDims dims = r.kernel.dims;
  int64_t vars[8] = {0};
  std::vector<int64_t> big;
  int64_t* v = vars;
  size_t nv = r.kernel.var_names.size();
  if (nv > 8) big.assign(nv, 0), v = big.data();
  for (size_t i = 0; i < nv; i++) {
    if (int(i) == r.kernel.core_var) continue;
    bool found = false;
    for (auto& [k, x] : vals)
      if (k == r.kernel.var_names[i]) v[i] = x, found = true;
    if (!found)
      throw Error("[realize] kernel " + r.kernel.name + " needs variable " + r.kernel.var_names[i] + ", which has no value");
  }
  dims.n_vars = int(nv);
  if (r.kernel.core_var >= 0) dims.core_var = r.kernel.core_var, dims.global[0] = r.kernel.threads;
  r.program->run(bufs, v, dims);
}

thread_local std::vector<JitItem>* g_capture = nullptr;

// The ops a kernel computes, for messages: "CAST, ADD".
std::string kernel_ops(const UOp* ast) {
  std::string s;
  for (const UOp* u : toposort(ast))
    if ((is_alu(u->op) || u->op == Ops::CAST || u->op == Ops::BITCAST || u->op == Ops::REDUCE) &&
        s.find(op_name(u->op)) == std::string::npos)
      s += (s.empty() ? "" : ", ") + std::string(op_name(u->op));
  return s.empty() ? "a copy into a contiguous buffer" : s;
}

// Storage-only devices (DISK) run no kernels, feed none and receive no copies: refused before anything runs.
void check_devices(const ScheduleItem& it) {
  for (size_t k = 0; k < it.bufs.size(); k++) {
    Device& d = it.bufs[k]->dev();
    if (d.runs_kernels()) continue;
    if (it.kind == ScheduleItem::Kind::Copy) {
      if (k == 0) throw Error("[to] cannot copy into " + d.name() + ": its tensors are read-only views of a mapped file");
      continue;
    }
    throw Error("[" + d.name() + "] kernel " + kernel_name(it.ast.get()) + " (" + kernel_ops(it.ast.get()) + ") " +
                (it.device == d.name() ? "would run on " : "reads a tensor on ") + d.name() +
                " (a file mapped by safe_load); kernels cannot run on " + d.name() + ": move the tensor with .to(\"CPU\") first");
  }
}

}  // namespace

size_t kernels_run() { return g_kernels_run.load(); }

void set_kernel_compile_hook(std::function<void(const UOpRef& ast, const std::string& name)> hook) {
  compile_hook() = std::move(hook);
}

void jit_begin_capture(std::vector<JitItem>* sink) { g_capture = sink; }
void jit_end_capture() { g_capture = nullptr; }

void jit_run(const JitItem& item, const std::vector<Buffer*>& bufs, const VarVals& vals) {
  if (!item.runner) {  // a copy
    std::vector<uint8_t> host(bufs[1]->nbytes());
    bufs[1]->copyout(host.data(), host.size());
    bufs[0]->copyin(host.data(), host.size());
    return;
  }
  auto& r = *static_cast<Runner*>(item.runner.get());
  std::vector<void*> ptrs;
  for (Buffer* b : bufs) ptrs.push_back(b->ptr());
  launch(r, ptrs.data(), vals);
  g_kernels_run++;
}

void run_schedule(Schedule& s) {
  int dbg = debug_level();
  for (auto& it : s.items) {
    check_devices(it);
    for (auto& b : it.bufs)  // a buffer more than its device can hold: an error before any kernel runs
      if (!b->allocated()) checked_nbytes("realize", {int64_t(b->size())}, b->dtype(), b->device());
  }
  // 1. Compile everything first: a kernel that fails to compile leaves every live tensor untouched.
  std::vector<std::shared_ptr<Runner>> runners(s.items.size());
  std::vector<size_t> missing;
  for (size_t i = 0; i < s.items.size(); i++) {
    if (s.items[i].kind != ScheduleItem::Kind::Kernel) continue;
    runners[i] = kernel_cache().get(s.items[i].ast.get(), s.items[i].device);
    if (!runners[i]) missing.push_back(i);
  }
  if (missing.size() > 1) {
    std::vector<std::future<std::shared_ptr<Runner>>> fut;
    for (size_t i : missing) fut.push_back(std::async(std::launch::async, compile_item, std::cref(s.items[i])));
    for (size_t k = 0; k < missing.size(); k++) runners[missing[k]] = fut[k].get();
  } else if (missing.size() == 1) {
    runners[missing[0]] = compile_item(s.items[missing[0]]);
  }
  for (size_t i : missing) kernel_cache().put(s.items[i].ast, s.items[i].device, runners[i]);
  // 2. Run in order.
  for (size_t i = 0; i < s.items.size(); i++) {
    ScheduleItem& it = s.items[i];
    if (g_capture) g_capture->push_back(JitItem{runners[i], it.bufs, it.ast.get()});
    if (it.kind == ScheduleItem::Kind::Copy) {
      std::vector<uint8_t> host(it.bufs[1]->nbytes());
      it.bufs[1]->copyout(host.data(), host.size());
      it.bufs[0]->copyin(host.data(), host.size());
      if (dbg >= 2)
        std::fprintf(stderr, "*** %-6s copy %8zu bytes %s -> %s\n", it.device.c_str(), host.size(),
                     it.bufs[1]->device().c_str(), it.bufs[0]->device().c_str());
      continue;
    }
    Runner& r = *runners[i];
    std::vector<void*> ptrs;
    for (auto& b : it.bufs) ptrs.push_back(b->ptr());
    auto t0 = std::chrono::steady_clock::now();
    launch(r, ptrs.data(), s.var_vals);
    if (dbg >= 2) get_device(it.device).synchronize();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    size_t n = ++g_kernels_run;
    if (dbg >= 2) {
      std::string vs;  // the bound values this launch used
      for (auto& name : r.kernel.var_names)
        for (auto& [k, x] : s.var_vals)
          if (k == name) vs += " " + k + "=" + std::to_string(x);
      std::fprintf(stderr, "*** %-6s %4zu %-24s arg %2zu mem %8.4f GB tm %10.2fus %9.2f GFLOPS %8.2f GB/s%s\n",
                   it.device.c_str(), n, r.kernel.name.c_str(), it.bufs.size(), r.kernel.mem_bytes / 1e9, us,
                   r.kernel.flops / us / 1e3, r.kernel.mem_bytes / us / 1e3, vs.c_str());
    }
  }
}

}  // namespace tg
