// The engine: lower and compile each kernel of a schedule (cached, in parallel when several are new), then
// run them in order. DEBUG=2 prints one line per kernel launched.
#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <list>
#include <optional>
#include <set>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "tg/codegen.hpp"
#include "tg/env.hpp"
#include "tg/jit.hpp"
#include "tg/schedule.hpp"
#include "tg/search.hpp"
#include "tg/viz.hpp"

namespace tg {

namespace {

std::atomic<size_t> g_kernels_run{0};
std::atomic<size_t> g_index_check_reads{0};  // IndexChecks::flush calls that read records
std::atomic<size_t> g_kernels_lowered{0};

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

// ---- persistent program cache: what lowering made of a kernel (name, source, launch shape) kept on disk, so a
// later process compiles nothing and lowers nothing for a kernel it has seen (the binary is in the disk cache too).

// This build of tg: a hash of the file holding this code (libtg.so), so a rebuilt library never reads entries
// an older lowering wrote.
const std::string& build_id() {
  static const std::string id = [] {
    Dl_info info{};
    std::string path = dladdr(reinterpret_cast<void*>(&build_id), &info) && info.dli_fname ? info.dli_fname : "";
    std::ifstream f(path, std::ios::binary);
    if (path.empty() || !f) return std::string();
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    std::vector<char> chunk(1 << 20);
    while (f.read(chunk.data(), std::streamsize(chunk.size())) || f.gcount() > 0)
      XXH3_64bits_update(&st, chunk.data(), size_t(f.gcount()));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits_digest(&st));
    return std::string(hex);
  }();
  return id;
}

// Everything lowering reads besides the AST: the device and its compiler, the opt config, the knobs, this build.
// Empty where the cache must not be used (no build id; a compile hook or process replay must see every lowering).
std::string program_key_material(const ScheduleItem& it, Device& dev, const LowerOptions& lo) {
  if (build_id().empty() || compile_hook() || !getenv_str("TG_PROCESS_REPLAY").empty() || getenv_int("CACHELEVEL", 1) <= 0 ||
      viz::enabled())  // VIZ: every kernel is lowered here, so its rewrites are recorded
    return "";
  const OptConfig& c = lo.config;
  std::string m = "tgprog1|" + it.ast->key() + "|" + dev.name() + "|" + dev.compiler().id() + "|" + build_id() + "|" +
                  std::to_string(c.threads) + "," + std::to_string(c.vector_width) + "," + std::to_string(c.local_threads) +
                  "," + std::to_string(c.tensor_cores) + "," + std::to_string(c.vector_registers) + "," +
                  std::to_string(c.l2_bytes) + "," + std::to_string(c.fma_chains) + "," + std::to_string(c.llc_bytes) + "," + std::to_string(c.int8_dot) + "," + std::to_string(c.row_prefetch) + "," + std::to_string(lo.index64);
  for (const char* k : {"NOOPT", "BEAM", "BEAM_BUDGET", "TRANSCENDENTAL", "ROW_REUSE", "FACTOR_REDUCE", "NARROW_GATES", "VECTORIZE", "PREFETCH", "NONTEMPORAL", "CUDA_PTX", "TG_CPU", "THREADS"})
    m += std::string("|") + k + "=" + getenv_str(k);
  return m;
}

std::string program_file_key(const std::string& material) {
  XXH128_hash_t h = XXH3_128bits(material.data(), material.size());
  char key[40];
  std::snprintf(key, sizeof key, "prog-%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
  return key;
}

void save_program(const std::string& material, const CompiledKernel& k) {
  nlohmann::json opts = nlohmann::json::array();
  for (const Opt& o : k.opts) opts.push_back({int(o.op), o.axis, o.amt});
  const LaunchDims& d = k.dims;
  nlohmann::json j = {{"key", material},   {"name", k.name},         {"src", k.src},          {"n_params", k.n_params},
                      {"vars", k.var_names}, {"flops", k.flops},     {"mem", k.mem_bytes},    {"opts", opts},
                      {"threads", k.threads}, {"core_var", k.core_var},
                      {"global", {d.global[0], d.global[1], d.global[2]}}, {"local", {d.local[0], d.local[1], d.local[2]}},
                      {"dims_core_var", d.core_var}, {"n_vars", d.n_vars}, {"exact_local", d.exact_local}};
  std::string s = j.dump();
  disk_cache_put(program_file_key(material), std::vector<uint8_t>(s.begin(), s.end()));
}

// The cached lowering, or nullopt (absent, torn, written for other key material: a hash collision).
std::optional<CompiledKernel> load_program(const std::string& material) {
  std::vector<uint8_t> bytes;
  if (!disk_cache_get(program_file_key(material), bytes)) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(bytes.begin(), bytes.end());
    if (j.at("key").get<std::string>() != material) return std::nullopt;
    CompiledKernel k;
    k.name = j.at("name").get<std::string>();
    k.src = j.at("src").get<std::string>();
    k.n_params = j.at("n_params").get<int>();
    k.var_names = j.at("vars").get<std::vector<std::string>>();
    k.flops = j.at("flops").get<double>();
    k.mem_bytes = j.at("mem").get<double>();
    for (auto& o : j.at("opts")) k.opts.push_back(Opt{OptOp(o.at(0).get<int>()), o.at(1).get<int>(), o.at(2).get<int64_t>()});
    k.threads = j.at("threads").get<int>();
    k.core_var = j.at("core_var").get<int>();
    for (int i = 0; i < 3; i++) {
      k.dims.global[i] = j.at("global").at(size_t(i)).get<int64_t>();
      k.dims.local[i] = j.at("local").at(size_t(i)).get<int64_t>();
    }
    k.dims.core_var = j.at("dims_core_var").get<int>();
    k.dims.n_vars = j.at("n_vars").get<int>();
    k.dims.exact_local = j.at("exact_local").get<bool>();
    return k;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

// Once the device has built its program, a cached kernel keeps what a launch reads (name, variables, dims, the
// estimates DEBUG=2 prints): its lowered nodes and rendered source go. A model's ~440 kernels held 2.3 MB of source
// text, and, lowered in this process, 8 MB more of nodes (bench/llm's 1B model: resident memory over the file's).
void keep_launch_facts(CompiledKernel& k) {
  k.sink = nullptr;
  std::vector<const UOp*>().swap(k.program);
  std::string().swap(k.src);
}

std::shared_ptr<Runner> compile_item(const ScheduleItem& it) {
  Device& dev = get_device(it.device);
  auto r = std::make_shared<Runner>();
  r->device = it.device;
  LowerOptions lo;
  lo.config = opt_config(dev);
  lo.index64 = dev.index64();
  std::string material = program_key_material(it, dev, lo);
  if (!material.empty())
    if (auto k = load_program(material)) {
      r->kernel = std::move(*k);
      try {
        profile::Span span("compile", r->kernel.name + " (disk cache)", it.device);
        r->program = dev.get_program(r->kernel.src, r->kernel.name);
        keep_launch_facts(r->kernel);
        return r;
      } catch (const Error&) {  // a source this compiler refuses now: lower afresh
      }
    }
  BeamResult beam;  // BEAM=N: the searched opts (cached across runs) replace the heuristic's
  if (BeamOptions bo = beam_options_from_env(); bo.width > 0 && getenv_int("NOOPT", 0) == 0) {
    bo.cache = BeamCache::global();
    std::vector<Buffer*> bufs;
    for (auto& b : it.bufs) bufs.push_back(b.get());
    beam = beam_search(it.ast, bufs, it.device, bo);
    lo.opts = &beam.opts;
  }
  r->kernel = lower_kernel(it.ast, kernel_name(it.ast.get()), dev.renderer(), lo);
  g_kernels_lowered++;
  record_for_replay(it, dev, r->kernel);
  if (auto& hook = compile_hook()) hook(it.ast, r->kernel.name);
  {
    profile::Span span("compile", r->kernel.name, it.device);
    r->program = dev.get_program(r->kernel.src, r->kernel.name);
  }
  if (!material.empty()) save_program(material, r->kernel);
  keep_launch_facts(r->kernel);
  return r;
}

// One launch: the kernel's variables (core_id set per parallel call, the others from `vals` by name) and its calls.
void launch(Runner& r, void* const* bufs, size_t n_bufs, const VarVals& vals) {
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
  dims.n_vars = int(nv), dims.n_bufs = int(n_bufs);
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
size_t index_check_reads() { return g_index_check_reads.load(); }
size_t kernels_lowered() { return g_kernels_lowered.load(); }

void set_kernel_compile_hook(std::function<void(const UOpRef& ast, const std::string& name)> hook) {
  compile_hook() = std::move(hook);
}

namespace {
// Runs a checked kernel's diagnostic (IndexDiag) on the buffers it ran on: the out-of-range indices as checked, in
// the order of the check's loops.
std::vector<int64_t> run_index_diag(const IndexDiag& d, const std::vector<Buffer*>& bufs, const std::string& device,
                                    const VarVals& vals) {
  auto out = std::make_shared<Buffer>(device, dtypes::int64, size_t(d.size));
  ScheduleItem it;
  it.ast = d.ast;
  it.device = device;
  it.bufs.push_back(out);
  for (int k : d.params) it.bufs.emplace_back(std::shared_ptr<Buffer>{}, bufs[size_t(k)]);  // not owned
  std::shared_ptr<Runner> r = kernel_cache().get(d.ast.get(), device);
  if (!r) kernel_cache().put(d.ast, device, r = compile_item(it));
  std::vector<void*> ptrs;
  for (auto& b : it.bufs) ptrs.push_back(b->ptr());
  launch(*r, ptrs.data(), ptrs.size(), vals);
  std::vector<int64_t> all(size_t(d.size)), bad;
  out->copyout(all.data(), all.size() * sizeof(int64_t));
  for (int64_t v : all)
    if (v != INT64_MIN) bad.push_back(v);
  return bad;
}
}  // namespace

void IndexChecks::arm(const std::vector<Buffer*>& bufs) {
  static const int64_t no_hit[IndexCheck::kSlots] = {};
  bufs.back()->copyin(no_hit, sizeof(no_hit));
}

void IndexChecks::launched(std::vector<Buffer*> bufs, size_t n_out, std::string device,
                           const std::vector<IndexDiag>* diags) {
  pending_.push_back({std::move(bufs), n_out, std::move(device), diags});
}

void IndexChecks::before(const std::vector<Buffer*>& bufs, size_t n_out, bool writes_existing, const VarVals& vals) {
  if (pending_.empty()) return;
  bool now = writes_existing;  // a bad index stops the run before it changes state that existed before it
  for (size_t k = 0; k < n_out && !now; k++)  // a diagnostic kernel reads what its checked kernel read
    for (const Pending& p : pending_)
      for (size_t j = p.n_out; j + 1 < p.bufs.size(); j++) now |= p.bufs[j] == bufs[k];
  if (now) flush(vals);
}

void IndexChecks::flush(const VarVals& vals) {
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  if (!pending.empty()) g_index_check_reads++;
  for (const Pending& p : pending) {
    int64_t rec[IndexCheck::kSlots];
    p.bufs.back()->copyout(rec, sizeof(rec));
    if (rec[0] <= 0) continue;
    std::vector<int64_t> bad;  // every out-of-range index of the op that hit (its diagnostic kernels)
    if (p.diags)
      for (const IndexDiag& d : *p.diags)
        if (d.code + 1 == rec[0]) {
          std::vector<int64_t> b = run_index_diag(d, p.bufs, p.device, vals);
          bad.insert(bad.end(), b.begin(), b.end());
        }
    throw Error(IndexCheck::message(rec, bad));
  }
}

namespace {
// Each device the schedule used ends a round of its allocator (cached blocks left unused for long are given back).
void end_rounds(const std::vector<ScheduleItem>& items) {
  std::set<std::string> devices;
  for (const auto& it : items)
    for (const auto& b : it.bufs) devices.insert(b->device());
  for (const std::string& d : devices) get_device(d).allocator().end_round();
}
}  // namespace

void jit_begin_capture(std::vector<JitItem>* sink) { g_capture = sink; }
void jit_end_capture() { g_capture = nullptr; }

void jit_run(const JitItem& item, const std::vector<Buffer*>& bufs, const VarVals& vals, IndexChecks* checks) {
  IndexChecks own;  // without a caller's: checked right after this launch
  IndexChecks& ch = checks ? *checks : own;
  ch.before(bufs, item.outputs, item.writes_existing, vals);
  if (!item.runner) {  // a copy
    bufs[0]->copy_from(*bufs[1]);
    return;
  }
  auto& r = *static_cast<Runner*>(item.runner.get());
  std::vector<void*> ptrs;
  for (Buffer* b : bufs) ptrs.push_back(b->ptr());
  if (item.index_check) {
    if (!checks) IndexChecks::arm(bufs);
    ch.launched(bufs, item.outputs, r.device, &item.index_diags);
  }
  if (profile::enabled()) [[unlikely]] {
    auto t0 = profile::Clock::now();
    launch(r, ptrs.data(), ptrs.size(), vals);
    get_device(r.device).synchronize();
    profile::event("kernel", r.kernel.name, r.device, t0, profile::Clock::now(), r.kernel.flops, r.kernel.mem_bytes);
  } else {
    launch(r, ptrs.data(), ptrs.size(), vals);
  }
  g_kernels_run++;
  if (!checks) own.flush(vals);
}

int64_t IndexCheck::code(const std::string& op) {
  for (size_t i = 0; i < std::size(ops); i++)
    if (op == ops[i].name) return int64_t(i);
  throw Error("[schedule] internal: no index check for op " + op);
}

std::string IndexCheck::message(const int64_t* record, const std::vector<int64_t>& bad) {
  if (record[0] <= 0) return "";
  int64_t code = record[0] - 1, n = record[2];
  const char* op = op_of(code) ? op_of(code)->name : "index";
  bool wraps = op_of(code) && op_of(code)->wraps;
  std::string range = "(valid: 0 <= index < " + std::to_string(n) + (wraps ? ", or -size <= index < 0" : "") +
                      "; checked in the kernel)";
  if (bad.size() <= 1)
    return std::string("[") + op + "] index " + std::to_string(as_passed(code, record[1], n)) +
           " is out of range for an axis of size " + std::to_string(n) + " " + range;
  std::string first;
  for (size_t i = 0; i < bad.size() && i < 5; i++) first += (i ? ", " : "") + std::to_string(as_passed(code, bad[i], n));
  return std::string("[") + op + "] " + std::to_string(bad.size()) + " indices are out of range for an axis of size " +
         std::to_string(n) + " " + range + "; the first " + std::to_string(std::min<size_t>(bad.size(), 5)) + ": " + first;
}

namespace {
// What compiling left free in the C heap goes back to the system. LLVM's passes allocate and free tens of MB a large
// kernel, the pool's workers in arenas of their own; glibc returns a free arena's pages only from its top, so the
// middle of them stayed resident (the ~1B q4_0 model of bench/llm: 36 MB after a 512-token prefill, 1.14x the file
// instead of 1.08x). malloc_trim gives back every whole free page (0.2 ms), but the next compile faults in again what
// it reuses of them: trimming after every compile made a small kernel's 4.6-4.8 ms 5.5-5.8. So it trims after a
// batch compiled by the pool (several kernels, tens of ms or more), and after a single kernel only once the process's
// anonymous resident memory (/proc/self/statm: resident less file-backed) has grown by 8 MiB since the last trim.
// (The anonymous part after the q4_0 run read 27-31 MB trimming after every compile, 44-54 MB trimming on that growth
// alone, 31-50 MB with both rules: it moves from run to run.)
void give_back_heap(bool batch) {
#ifdef __GLIBC__
  constexpr long kSlack = 8l << 20;
  static std::mutex mu;
  static long after_trim = 0;
  auto anon = [] {
    long size = 0, resident = 0, shared = 0;
    std::ifstream("/proc/self/statm") >> size >> resident >> shared;
    return (resident - shared) * sysconf(_SC_PAGESIZE);
  };
  std::lock_guard lk(mu);
  long now = anon();
  if (!batch && now < after_trim + kSlack) {
    after_trim = std::min(after_trim, now);
    return;
  }
  malloc_trim(0);
  after_trim = anon();
#else
  (void)batch;
#endif
}
}  // namespace

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
  std::vector<std::pair<size_t, size_t>> same;  // (item, an earlier missing item with its AST and device)
  for (size_t i = 0; i < s.items.size(); i++) {
    if (s.items[i].kind != ScheduleItem::Kind::Kernel) continue;
    runners[i] = kernel_cache().get(s.items[i].ast.get(), s.items[i].device);
    if (runners[i]) continue;
    auto first = std::find_if(missing.begin(), missing.end(), [&](size_t j) {  // one AST, two buffers: lower it once
      return s.items[j].ast == s.items[i].ast && s.items[j].device == s.items[i].device;
    });
    if (first != missing.end()) same.emplace_back(i, *first);
    else missing.push_back(i);
  }
  if (missing.size() > 1 && dbg < 5) {  // DEBUG=5 prints every lowering stage: one kernel at a time, not interleaved
    // One worker per CPU this process may run on, each taking the next kernel: not a thread per kernel (a model's
    // first run compiles 150, and as many LLVM instances at once contend for the allocator and the caches). An
    // error is rethrown for the first failing kernel in schedule order, as a serial compile would.
    std::vector<std::exception_ptr> err(missing.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t k; (k = next++) < missing.size();) try {
          runners[missing[k]] = compile_item(s.items[missing[k]]);
        } catch (...) {
          err[k] = std::current_exception();
        }
    };
    cpu_set_t set;
    size_t ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? size_t(std::max(1, CPU_COUNT(&set))) : 1;
    std::vector<std::thread> pool;
    for (size_t w = 1; w < std::min(ncpu, missing.size()); w++) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
  } else {
    for (size_t i : missing) runners[i] = compile_item(s.items[i]);
  }
  for (size_t i : missing) kernel_cache().put(s.items[i].ast, s.items[i].device, runners[i]);
  for (auto [i, j] : same) runners[i] = runners[j];
  if (!missing.empty()) give_back_heap(missing.size() > 1);
  // 2. Run in order. The index checks' records are zeroed first and read together after the run (one host sync),
  // or earlier where a kernel would change existing state or what a checked kernel read (IndexChecks).
  IndexChecks checks;
  std::vector<std::vector<Buffer*>> raw(s.items.size());
  for (size_t i = 0; i < s.items.size(); i++) {
    for (auto& b : s.items[i].bufs) raw[i].push_back(b.get());
    if (s.items[i].index_check) IndexChecks::arm(raw[i]);
  }
  for (size_t i = 0; i < s.items.size(); i++) {
    ScheduleItem& it = s.items[i];
    if (g_capture)
      g_capture->push_back(JitItem{runners[i], it.bufs, it.ast.get(), it.n_out, it.index_check,
                                   it.writes_existing, it.index_diags});
    checks.before(raw[i], it.n_out, it.writes_existing, s.var_vals);
    if (it.kind == ScheduleItem::Kind::Copy) {
      auto c0 = profile::Clock::now();
      it.bufs[0]->copy_from(*it.bufs[1]);
      const size_t nbytes = it.bufs[1]->nbytes();
      if (profile::enabled())
        profile::event("copy", it.bufs[1]->device() + " -> " + it.bufs[0]->device(), it.device, c0, profile::Clock::now(), 0,
                       double(nbytes));
      if (dbg >= 2)
        std::fprintf(stderr, "*** %-6s copy %8zu bytes %s -> %s\n", it.device.c_str(), nbytes,
                     it.bufs[1]->device().c_str(), it.bufs[0]->device().c_str());
      continue;
    }
    Runner& r = *runners[i];
    std::vector<void*> ptrs;
    for (auto& b : it.bufs) ptrs.push_back(b->ptr());
    auto t0 = std::chrono::steady_clock::now();
    launch(r, ptrs.data(), ptrs.size(), s.var_vals);
    if (it.index_check) checks.launched(raw[i], it.n_out, it.device, &it.index_diags);
    bool prof = profile::enabled();
    if (dbg >= 2 || prof) get_device(it.device).synchronize();
    auto t1 = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    if (prof) profile::event("kernel", r.kernel.name, it.device, t0, t1, r.kernel.flops, r.kernel.mem_bytes);
    size_t n = ++g_kernels_run;
    if (dbg >= 2) {
      std::string vs;  // the bound values this launch used
      for (auto& name : r.kernel.var_names)
        for (auto& [k, x] : s.var_vals)
          if (k == name) vs += " " + k + "=" + std::to_string(x);
      if (r.kernel.core_var >= 0) vs += " threads=" + std::to_string(r.kernel.threads);  // a THREAD split's parts
      std::fprintf(stderr, "*** %-6s %4zu %-24s arg %2zu mem %8.4f GB tm %10.2fus %9.2f GFLOPS %8.2f GB/s%s\n",
                   it.device.c_str(), n, r.kernel.name.c_str(), it.bufs.size(), r.kernel.mem_bytes / 1e9, us,
                   r.kernel.flops / us / 1e3, r.kernel.mem_bytes / us / 1e3, vs.c_str());
    }
  }
  checks.flush(s.var_vals);
  end_rounds(s.items);
}

}  // namespace tg
