// The CPU kernels are compiled for, and the machine model the optimiser reads: the host's CPU as LLVM names it, or
// the one TG_CPU names (so an AVX-512 machine builds, tests and times the AVX2 code paths); vector width and register
// count from LLVM's target transform info for that CPU; the vector FMA's latency and throughput from LLVM's scheduling
// model for it; cache sizes from sysfs, else from cpuid (read here), else from glibc; the share of the L3 that
// this process counts on.
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <llvm/ADT/StringMap.h>
#include <llvm/Analysis/TargetTransformInfo.h>
#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/MCInstrInfo.h>
#include <llvm/MC/MCSchedule.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Host.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "cpu.hpp"
#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/error.hpp"

namespace tg::cpu {

void init_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

namespace {

// "+a,+b,-c" for the host's ISA features as LLVM reads them from cpuid (sorted: the string is part of cache keys).
std::string feature_string(const std::map<std::string, bool>& host) {
  std::vector<std::string> feats;
  for (const auto& [name, on] : host) feats.push_back((on ? "+" : "-") + name);
  std::sort(feats.begin(), feats.end());
  std::string s;
  for (const std::string& f : feats) s += (s.empty() ? "" : ",") + f;
  return s;
}

// Features whose instructions LLVM may put in a kernel's code: vector and scalar arithmetic extensions.
bool user_instructions(llvm::StringRef f) {
  for (const char* p : {"sse", "ssse3", "avx", "fma", "f16c", "bmi", "lzcnt", "popcnt", "amx", "gfni", "vaes", "vpclmulqdq",
                        "aes", "pclmul", "sha", "movbe", "adx", "xop", "cx16", "sahf", "neon", "sve", "fp-armv8", "fullfp16",
                        "dotprod", "i8mm", "bf16"})
    if (f.starts_with(p)) return true;
  return false;
}

// TG_CPU=NAME: LLVM's default ISA for NAME, which this CPU must be able to run (every feature NAME enables that the
// host's cpuid reports is present on the host). Features are spelled out, with NAME's absent ones off, so that the
// kernels use exactly NAME's instruction set.
std::string override_features(const llvm::Target& t, const std::string& triple, const std::string& cpu,
                              const std::map<std::string, bool>& host, const std::string& host_cpu) {
  // (asked of a generic subtarget first: LLVM prints a warning when given an unknown name)
  std::unique_ptr<llvm::MCSubtargetInfo> generic(t.createMCSubtargetInfo(triple, "", ""));
  std::unique_ptr<llvm::MCSubtargetInfo> sti;
  if (generic && generic->isCPUStringValid(cpu)) sti.reset(t.createMCSubtargetInfo(triple, cpu, ""));
  if (!sti) {
    std::string names;
    if (generic)
      for (const auto& p : generic->getAllProcessorDescriptions()) names += (names.empty() ? "" : " ") + std::string(p.Key);
    throw EnvError("[CPU] TG_CPU=" + cpu + " is not a CPU LLVM knows for " + triple +
                   "; expected one of: " + (names.empty() ? "(none)" : names));
  }
  std::vector<std::string> lacking, feats;
  for (const auto& kv : sti->getAllProcessorFeatures()) {
    auto h = host.find(std::string(kv.Key));
    if (h == host.end()) continue;  // a tuning flag, not an instruction-set feature
    bool on = sti->getFeatureBits().test(kv.Value);
    // Only instructions kernels can contain must be on the host; system ones (invpcid, rtm, xsaves: often hidden by
    // VMs) are turned off instead.
    if (on && !h->second) {
      if (!user_instructions(kv.Key)) on = false;
      else lacking.push_back(kv.Key);
    }
    feats.push_back((on ? "+" : "-") + std::string(kv.Key));
  }
  if (!lacking.empty()) {
    std::string l;
    for (size_t i = 0; i < lacking.size() && i < 8; i++) l += (l.empty() ? "" : ", ") + lacking[i];
    if (lacking.size() > 8) l += " and " + std::to_string(lacking.size() - 8) + " more";
    throw EnvError("[CPU] TG_CPU=" + cpu + " needs " + l + ", which this CPU (" + host_cpu +
                   ") lacks; expected a CPU whose instruction set this one has (x86-64-v2, x86-64-v3 and x86-64-v4 name "
                   "the SSE4.2, AVX2 and AVX-512 levels)");
  }
  std::sort(feats.begin(), feats.end());
  std::string s;
  for (const std::string& f : feats) s += (s.empty() ? "" : ",") + f;
  return s;
}

// A cache size in bytes from sysfs ("32K", "1024K", "32M"); 0 when absent.
int64_t sysfs_size(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v.empty()) return 0;
  char unit = v.back();
  int64_t mult = unit == 'K' ? 1024 : unit == 'M' ? 1 << 20 : unit == 'G' ? int64_t(1) << 30 : 1;
  if (mult != 1) v.pop_back();
  try {
    return std::stoll(v) * mult;
  } catch (...) {
    return 0;
  }
}

// How many CPUs a sysfs CPU list names ("0-15", "0,2,4-7"); 0 when absent.
int cpu_list_count(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v)) return 0;
  int n = 0;
  for (size_t b = 0; b < v.size();) {
    size_t e = std::min(v.find(',', b), v.size());
    std::string r = v.substr(b, e - b);
    size_t dash = r.find('-');
    try {
      n += dash == std::string::npos ? 1 : std::stoi(r.substr(dash + 1)) - std::stoi(r.substr(0, dash)) + 1;
    } catch (...) {
      return 0;
    }
    b = e + 1;
  }
  return n;
}

// The logical CPUs this process may run on.
int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, int(std::thread::hardware_concurrency()));
}

void read_caches(MachineModel& m) {
  for (int i = 0; i < 8; i++) {
    std::string d = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lf(d + "level"), tf(d + "type");
    int level = 0;
    std::string type;
    if (!(lf >> level) || !(tf >> type)) continue;
    int64_t size = sysfs_size(d + "size");
    if (type == "Instruction" || size <= 0) continue;
    (level == 1 ? m.l1d_bytes : level == 2 ? m.l2_bytes : m.l3_bytes) = size;
    if (level == 3) m.l3_sharing = cpu_list_count(d + "shared_cpu_list");
    m.cache_source = "sysfs";
  }
#if defined(__x86_64__) || defined(__i386__)
  // No sysfs cache folders (some VMs): cpuid, read here for the L3's sharing count (glibc's reading of it gives the
  // size alone, on a VM the whole host socket's: 508 MiB on a 2-CPU Zen 5 VM).
  if (m.cache_source.empty()) {
    CpuidCaches c = caches_from_cpuid([](uint32_t leaf, uint32_t sub) {
      std::array<uint32_t, 4> r{};
      if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) r = {};
      return r;
    });
    if (c.l1d_bytes > 0 || c.l2_bytes > 0) {
      m.l1d_bytes = c.l1d_bytes, m.l2_bytes = c.l2_bytes, m.l3_bytes = c.l3_bytes, m.l3_sharing = c.l3_sharing;
      m.cache_source = "cpuid";
    }
  }
#endif
  if (m.cache_source.empty()) {
    // Neither: glibc's reading (its own cpuid reading on x86; on other CPUs, what it knows)
    long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l1 > 0 || l2 > 0) {
      m.l1d_bytes = std::max(0L, l1), m.l2_bytes = std::max(0L, l2), m.l3_bytes = std::max(0L, l3);
      m.cache_source = "glibc";
    }
  }
  m.cpus = affinity_cpus();
  m.l3_share_bytes = cache_share(m.l3_bytes, m.l3_sharing, m.cpus, m.l2_bytes * m.cpus);
}

std::string isa_words(const std::string& features) {
  std::set<std::string> on;
  for (size_t b = 0; b < features.size();) {
    size_t e = std::min(features.find(',', b), features.size());
    if (features[b] == '+') on.insert(features.substr(b + 1, e - b - 1));
    b = e + 1;
  }
  auto has = [&](const char* f) { return on.count(f) > 0; };
  if (has("avx512f")) return "AVX-512";
  if (has("avx2")) return has("fma") ? "AVX2+FMA" : "AVX2";
  if (has("avx")) return "AVX";
  if (has("sse4.2")) return "SSE4.2";
  if (has("neon") || has("sve")) return has("sve") ? "SVE" : "NEON";
  return "scalar";
}

// The latency and issue rate of a vector FMA of `bits` from LLVM's scheduling model of the CPU (the tables LLVM's
// instruction scheduler and llvm-mca use; e.g. znver3/znver4/znver5 ymm: 4 cycles, 0.5 reciprocal throughput;
// haswell 5 and 0.5; the AVX-512 parts' zmm form on znver4/5 and sapphirerapids 4 and 1.0). Left at the defaults
// when the CPU has no FMA or no per-instruction model (LLVM's generic AArch64 CPUs).
void read_fma(MachineModel& m, const llvm::Target& t, const CpuTarget& c) {
  const bool x86 = c.triple.starts_with("x86_64") || c.triple.starts_with("i686") || c.triple.starts_with("i386");
  const char* name = nullptr;
  if (x86 && ("," + c.features + ",").find(",+fma,") != std::string::npos)
    name = m.vector_bits >= 512 ? "VFMADD231PSZr" : m.vector_bits >= 256 ? "VFMADD231PSYr" : "VFMADD231PSr";
  else if (c.triple.starts_with("aarch64") || c.triple.starts_with("arm64"))
    name = "FMLAv4f32";
  if (!name) return;
  std::unique_ptr<llvm::MCSubtargetInfo> sti(t.createMCSubtargetInfo(c.triple, c.cpu, c.features));
  std::unique_ptr<llvm::MCInstrInfo> mii(t.createMCInstrInfo());
  if (!sti || !mii || !sti->getSchedModel().hasInstrSchedModel()) return;
  const llvm::MCSchedModel& sm = sti->getSchedModel();
  for (unsigned op = 0; op < mii->getNumOpcodes(); op++) {
    if (mii->getName(op) != name) continue;
    const llvm::MCSchedClassDesc* d = sm.getSchedClassDesc(mii->get(op).getSchedClass());
    if (!d || !d->isValid() || d->isVariant()) return;
    int lat = llvm::MCSchedModel::computeInstrLatency(*sti, *d);
    double rthru = llvm::MCSchedModel::getReciprocalThroughput(*sti, *d);
    if (lat < 1 || lat > 64 || !(rthru > 0) || rthru > 16) return;
    m.fma_latency = lat, m.fma_per_cycle = 1.0 / rthru, m.fma_source = "LLVM sched model";
    return;
  }
}

// --- Whether a row kernel's loops of a few ops an element should prefetch the next row ---------------------------
// A row kernel (layernorm: the mean's loop from memory, the variance's and the output's over the row in L1, its
// output stored past the caches) reads memory in one of its three loops only; the next row's reads can be started by
// software prefetches in the variance's loop. Whether that pays depends on the core's miss buffers and hardware
// prefetchers, not on its ISA: on a Zen 5 VM a 4096 x 4096 layernorm took 2.24-2.32 -> 1.90-2.03 ms with them
// (TG_CPU=haswell 2.80-2.90 -> 1.94-2.08), on a Zen 4 VM 2.70 -> 3.27-3.30 (the prefetches, one a 128 bytes in a
// loop of a few vector ops, filled the miss buffers in a burst). So it is measured: the same loops written here
// with the machine model's vector width, rows of 16 KiB over twice its last-level cache, on its cores, alternated
// with and without the prefetches; they are taken where they save 10% or more (the median pair, below). The margin
// is the gap measured between the probe and tg's kernel in tg's runtime: under TG_CPU=haswell on the Zen 4 VM the
// probe read 0.945-0.953 with / without while bench/bandwidth's layernorm read 0.87-0.94 of the triad with the
// prefetches, 1.04-1.07 without; Zen 5's gains were 0.70-0.85.
// The loop from memory is unrolled 8 vectors deep, as the heuristic's layernorm kernel is: the decision depends on
// that loop's shape. Rolled (two vectors an iteration), the probe without prefetches was 10-25% slower than tg's
// kernel without them on the Zen 4 VM, and the prefetches then paid in the probe (taken in 3 of 5 fresh measurements)
// while they cost tg's kernel 15-20% (its compiled IR linked beside the probe, the same buffers, alternated: 2.75-2.93
// ms without, 3.27-3.53 with); unrolled, the probe measures what tg's kernel does (2.85-3.12 / 3.07-3.31).
template <int W, bool pf>
struct RowProbe;
#define TG_ROW_PROBE(W, TARGET, VEC, SET1, ZERO, LOAD, ADD, SUB, MUL, FMA, STREAM, REDUCE)                            \
  template <bool pf>                                                                                                  \
  struct RowProbe<W, pf> {                                                                                            \
    __attribute__((target(TARGET))) static void rows(const float* x, float* y, int64_t r0, int64_t r1, int64_t d) {   \
      for (int64_t r = r0; r < r1; r++) {                                                                             \
        const float* a = x + r * d;                                                                                   \
        VEC s0 = ZERO(), s1 = ZERO();                                                                                 \
        for (int64_t i = 0; i < d; i += 8 * W) { /* unrolled as tg's kernel is: see above */                        \
          s0 = ADD(s0, LOAD(a + i)), s1 = ADD(s1, LOAD(a + i + W));                                                   \
          s0 = ADD(s0, LOAD(a + i + 2 * W)), s1 = ADD(s1, LOAD(a + i + 3 * W));                                       \
          s0 = ADD(s0, LOAD(a + i + 4 * W)), s1 = ADD(s1, LOAD(a + i + 5 * W));                                       \
          s0 = ADD(s0, LOAD(a + i + 6 * W)), s1 = ADD(s1, LOAD(a + i + 7 * W));                                       \
        }                                                                                                             \
        float mean = REDUCE(ADD(s0, s1)) / float(d);                                                                  \
        VEC m = SET1(mean);                                                                                           \
        s0 = ZERO(), s1 = ZERO();                                                                                     \
        for (int64_t i = 0; i < d; i += 2 * W) {                                                                      \
          if constexpr (pf)                                                                                           \
            if (i % 32 == 0) __builtin_prefetch(a + d + i);                                                           \
          VEC d0 = SUB(LOAD(a + i), m), d1 = SUB(LOAD(a + i + W), m);                                                 \
          s0 = FMA(d0, d0, s0), s1 = FMA(d1, d1, s1);                                                                 \
        }                                                                                                             \
        VEC inv = SET1(1.0f / __builtin_sqrtf(REDUCE(ADD(s0, s1)) / float(d) + 1e-5f));                               \
        for (int64_t i = 0; i < d; i += W) STREAM(y + r * d + i, MUL(SUB(LOAD(a + i), m), inv));                     \
      }                                                                                                               \
      _mm_sfence();                                                                                                   \
    }                                                                                                                 \
  };
// (through memory: GCC 12 warns that _mm512_reduce_add_ps's undefined halves "may be used uninitialized")
__attribute__((target("avx512f"))) inline float reduce16(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0;
  for (float f : t) s += f;
  return s;
}
__attribute__((target("avx2"))) inline float reduce8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}
inline float reduce4(__m128 h) {
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}
TG_ROW_PROBE(16, "avx512f", __m512, _mm512_set1_ps, _mm512_setzero_ps, _mm512_load_ps, _mm512_add_ps, _mm512_sub_ps,
             _mm512_mul_ps, _mm512_fmadd_ps, _mm512_stream_ps, reduce16)
TG_ROW_PROBE(8, "avx2,fma", __m256, _mm256_set1_ps, _mm256_setzero_ps, _mm256_load_ps, _mm256_add_ps, _mm256_sub_ps,
             _mm256_mul_ps, _mm256_fmadd_ps, _mm256_stream_ps, reduce8)
inline __m128 fma4(__m128 a, __m128 b, __m128 c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
TG_ROW_PROBE(4, "sse2", __m128, _mm_set1_ps, _mm_setzero_ps, _mm_load_ps, _mm_add_ps, _mm_sub_ps, _mm_mul_ps, fma4,
             _mm_stream_ps, reduce4)
#undef TG_ROW_PROBE

// The probe over rows [0, n) on `threads` threads, `rounds` passes without the prefetches and as many with, each
// pass without followed by one with: the median of the pairs' ratios (time with / time without), and each side's
// best pass in ms. The VM's memory speed moves by 20-40% from one 50 ms window to the next; a pair's two passes share
// their window, so its ratio does not move with it (best of 6 against best of 6 once read 4.42 ms without, 2.95 with).
struct RowProbeTimes {
  double ratio, without, with;
};
template <int W>
RowProbeTimes time_row_probe(const float* x, float* y, int64_t n, int64_t d, int threads, int rounds) {
  auto pass = [&](auto fn) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 1; t < threads; t++) ts.emplace_back(fn, x, y, n * t / threads, n * (t + 1) / threads, d);
    fn(x, y, 0, n / threads, d);
    for (auto& t : ts) t.join();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  RowProbeTimes out{0, 1e30, 1e30};
  std::vector<double> ratios;
  pass(RowProbe<W, false>::rows);  // a first pass: the output's pages, the threads' stacks
  for (int r = 0; r < rounds; r++) {
    const double without = pass(RowProbe<W, false>::rows), with = pass(RowProbe<W, true>::rows);
    ratios.push_back(with / without), out.without = std::min(out.without, without), out.with = std::min(out.with, with);
  }
  std::nth_element(ratios.begin(), ratios.begin() + rounds / 2, ratios.end());
  out.ratio = ratios[size_t(rounds / 2)];
  return out;
}

// The probe of m's row prefetch (see above), in vectors of w floats: whether the median pair saves 10% or more.
bool row_prefetch_measured(const MachineModel& m, int w) {
  const int64_t d = 4096, llc = m.l3_share_bytes > 0 ? m.l3_share_bytes : m.l2_bytes * std::max(1, m.cores);
  const int64_t bytes = std::clamp<int64_t>(2 * llc, int64_t(32) << 20, int64_t(128) << 20);
  const int64_t n = bytes / (4 * d);
  // in huge pages where the system gives them: first touching 128 MiB of small pages took 300-400 ms on the VM
  auto t0 = std::chrono::steady_clock::now();
  const size_t mapped = size_t(2 * bytes) + (size_t(2) << 20);
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;  // no memory for the probe: no prefetch
  madvise(p, mapped, MADV_HUGEPAGE);
  auto* x = static_cast<float*>(p);
  auto* y = x + n * d + 1040;  // 4160 bytes further than adjacent: x[i] and y[i] not in the same cache sets
  std::fill(x, x + n * d, 1.0f);
  std::memset(y, 0, size_t(bytes));
  // the model's cores, at most the CPUs there are (THREADS may ask for more)
  const int threads = std::clamp(m.cores, 1, int(std::max(1u, std::thread::hardware_concurrency()))), rounds = 11;
  const RowProbeTimes t = w == 16 ? time_row_probe<16>(x, y, n, d, threads, rounds)
                          : w == 8 ? time_row_probe<8>(x, y, n, d, threads, rounds)
                                   : time_row_probe<4>(x, y, n, d, threads, rounds);
  munmap(p, mapped);
  const bool taken = t.ratio <= 0.90;
  if (debug_level() >= 1)
    std::fprintf(stderr, "tg: row prefetch (%d-float vectors, %d threads, %lld MiB): best %.3f ms without, %.3f ms with, median pair %.3f: %s (measured in %.0f ms)\n",
                 w, threads, (long long)(bytes >> 20), t.without, t.with, t.ratio, taken ? "taken" : "not taken",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return taken;
}

// Measures (or reads back) m.row_prefetch; see above. Only where the host runs the model's vector code (x86).
void read_row_prefetch(MachineModel& m) {
  if (int64_t env = getenv_int("ROW_PREFETCH", -1, -1, 1); env >= 0) {
    m.row_prefetch = env == 1, m.row_prefetch_source = "ROW_PREFETCH";
    return;
  }
  const int w = m.vector_bits >= 512 && __builtin_cpu_supports("avx512f") ? 16
                : m.vector_bits >= 256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 8 : 4;
  m.row_prefetch = measured_once("row_prefetch_v2_", to_string(m), [&] { return row_prefetch_measured(m, w); });
  m.row_prefetch_source = "measured";
}

// --- The vector FMA's issue rate, measured ------------------------------------------------------------------------
// LLVM 19's scheduling models give one 512-bit FMA a cycle for znver4, znver5 and sapphirerapids alike; Zen 4 issues
// one (its 256-bit pipes pair up), Zen 5 two (bench/peak: 234 GFLOPS with AVX-512 and with AVX2 on a Zen 4 VM, 429
// against 224 on a Zen 5 one). Measured in cycles without a cycle counter: a chain of dependent FMAs runs at one per
// latency (LLVM's figure: 4 cycles on these), which clocks the core; kFmaChains independent chains then run at the
// issue rate. Rate = (the chain's time per FMA) / (latency x the chains' time per FMA, all their FMAs counted).
constexpr int kFmaChains = 12;  // >= latency x rate for every x86 core (5 x 2), and 12 + 2 operands fit in 16 registers
#define TG_FMA_PROBE(W, TARGET, VEC, SET1, FMA, FIRST)                                                                \
  __attribute__((target(TARGET))) float fma_chain##W(int64_t n) {                                                     \
    VEC a = SET1(0.5f), b = SET1(0.999999f), c = SET1(1e-6f);                                                         \
    for (int64_t i = 0; i < n; i++) a = FMA(a, b, c);                                                                 \
    return FIRST(a);                                                                                                  \
  }                                                                                                                   \
  /* the chains in twelve named registers: an array of them stays in memory under ASan (0.25/cycle measured) */      \
  __attribute__((target(TARGET))) float fma_chains##W(int64_t n) {                                                    \
    VEC b = SET1(0.999999f), c = SET1(1e-6f), a0 = SET1(0.50f), a1 = SET1(0.51f), a2 = SET1(0.52f),                   \
        a3 = SET1(0.53f), a4 = SET1(0.54f), a5 = SET1(0.55f), a6 = SET1(0.56f), a7 = SET1(0.57f), a8 = SET1(0.58f),     \
        a9 = SET1(0.59f), a10 = SET1(0.60f), a11 = SET1(0.61f);                                                       \
    for (int64_t i = 0; i < n; i++) {                                                                                 \
      a0 = FMA(a0, b, c), a1 = FMA(a1, b, c), a2 = FMA(a2, b, c), a3 = FMA(a3, b, c), a4 = FMA(a4, b, c);             \
      a5 = FMA(a5, b, c), a6 = FMA(a6, b, c), a7 = FMA(a7, b, c), a8 = FMA(a8, b, c), a9 = FMA(a9, b, c);             \
      a10 = FMA(a10, b, c), a11 = FMA(a11, b, c);                                                                     \
    }                                                                                                                 \
    return FIRST(a0) + FIRST(a1) + FIRST(a2) + FIRST(a3) + FIRST(a4) + FIRST(a5) + FIRST(a6) + FIRST(a7) +            \
           FIRST(a8) + FIRST(a9) + FIRST(a10) + FIRST(a11);                                                           \
  }
TG_FMA_PROBE(16, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_cvtss_f32)
TG_FMA_PROBE(8, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_cvtss_f32)
#undef TG_FMA_PROBE

}  // namespace

double fma_rate_measured(int w, int latency) {
  auto time = [](auto fn, int64_t n) {
    auto t0 = std::chrono::steady_clock::now();
    volatile float sink = fn(n);
    (void)sink;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const int64_t n_chain = int64_t(1) << 20, n_chains = int64_t(1) << 18;
  double chain = 1e30, chains = 1e30;
  for (int r = 0; r < 7; r++) {
    chain = std::min(chain, time(w == 16 ? fma_chain16 : fma_chain8, n_chain));
    chains = std::min(chains, time(w == 16 ? fma_chains16 : fma_chains8, n_chains));
  }
  const double cycles_per_s = double(n_chain) * latency / chain, fmas_per_s = double(n_chains * kFmaChains) / chains;
  return fmas_per_s / cycles_per_s;
}

namespace {

// Sets m.fma_measured_per_cycle: LLVM's rate or twice it, measured once per model line (kept in the disk cache), or
// FMA_RATE=1|2 x LLVM's. Only for an x86 model with FMA whose vectors the host runs. Under TG_CPU the latency is the
// named CPU's, not always the host's (haswell's 5 on a Zen 4 measured its 256-bit FMAs at 1.6/cycle, not 2): inside
// the factor of 2 the answer is taken at.
void read_fma_measured(MachineModel& m) {
  if (m.fma_source != "LLVM sched model" || m.vector_bits < 256) return;
  if (int64_t env = getenv_int("FMA_RATE", 0, 0, 2); env > 0) {
    m.fma_measured_per_cycle = double(env) * m.fma_per_cycle, m.fma_measured_source = "FMA_RATE";
    return;
  }
  const int w = m.vector_bits >= 512 ? 16 : 8;
  if (w == 16 ? !__builtin_cpu_supports("avx512f") : !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
    return;
  const bool twice = measured_once("fma_rate_v1_", to_string(m), [&] {
    const double rate = fma_rate_measured(w, m.fma_latency);
    if (debug_level() >= 1)
      std::fprintf(stderr, "tg: %d-float FMA issue rate measured %.2f/cycle (latency %d from LLVM), LLVM's %g\n", w,
                   rate, m.fma_latency, m.fma_per_cycle);
    return rate >= 1.5 * m.fma_per_cycle;
  });
  m.fma_measured_per_cycle = (twice ? 2 : 1) * m.fma_per_cycle, m.fma_measured_source = "measured";
}

}  // namespace

CpuidCaches caches_from_cpuid(const CpuidFn& cpuid) {
  CpuidCaches c;
  const std::array<uint32_t, 4> v = cpuid(0, 0);
  const uint32_t max_std = v[0], max_ext = cpuid(0x80000000, 0)[0];
  // vendor: EBX, EDX, ECX
  auto is = [&](uint32_t b, uint32_t d, uint32_t cx) { return v[1] == b && v[3] == d && v[2] == cx; };
  const bool amd = is(0x68747541, 0x69746e65, 0x444d4163) || is(0x6f677948, 0x6e65476e, 0x656e6975);  // AMD, Hygon
  // The deterministic cache leaf (AMD 0x8000001D, Intel 4: the same layout): one subleaf per cache, EAX type (bits
  // 4:0; 0 ends the list, 2 instructions), level (7:5), logical CPUs sharing it - 1 (25:14); EBX ways - 1 (31:22),
  // partitions - 1 (21:12), line bytes - 1 (11:0); ECX sets - 1. (Intel's sharing count is a bound rounded up to a
  // power of two: a smaller share than the true one.)
  const uint32_t leaf = amd ? (max_ext >= 0x8000001D ? 0x8000001D : 0) : (max_std >= 4 ? 4 : 0);
  for (uint32_t sub = 0; leaf != 0 && sub < 16; sub++) {
    const std::array<uint32_t, 4> r = cpuid(leaf, sub);
    const uint32_t type = r[0] & 0x1f, level = (r[0] >> 5) & 7;
    if (type == 0) break;
    if (type == 2 || level < 1 || level > 3) continue;
    const int64_t ways = (r[1] >> 22) + 1, partitions = ((r[1] >> 12) & 0x3ff) + 1, line = (r[1] & 0xfff) + 1;
    const int64_t bytes = ways * partitions * line * (int64_t(r[2]) + 1);
    (level == 1 ? c.l1d_bytes : level == 2 ? c.l2_bytes : c.l3_bytes) = bytes;
    if (level == 3) c.l3_sharing = int((r[0] >> 14) & 0xfff) + 1;
    char name[16];
    std::snprintf(name, sizeof name, leaf == 4 ? "%u" : "0x%x", leaf);
    c.leaf = name;
  }
  if (!c.leaf.empty() || !amd || max_ext < 0x80000006) return c;
  // A hypervisor that zeroes the deterministic leaf (seen: a 2-CPU Zen 5 VM): AMD's legacy leaves, L1d KiB in
  // 0x80000005 ECX 31:24, L2 KiB in 0x80000006 ECX 31:16, L3 in units of 512 KiB in its EDX 31:18. They describe
  // the host's package, so the L3 is taken as shared by the package's logical CPUs (leaf 1 EBX 23:16, valid when
  // EDX bit 28 is set): per CPU, the host's own L3 per thread (Zen 5 EPYC: 508 MiB / 254).
  if (max_ext >= 0x80000005) c.l1d_bytes = int64_t(cpuid(0x80000005, 0)[2] >> 24) << 10;
  const std::array<uint32_t, 4> l = cpuid(0x80000006, 0);
  c.l2_bytes = int64_t(l[2] >> 16) << 10;
  c.l3_bytes = int64_t(l[3] >> 18) << 19;
  const std::array<uint32_t, 4> l1 = cpuid(1, 0);
  if (c.l3_bytes > 0 && (l1[3] >> 28 & 1)) c.l3_sharing = int((l1[1] >> 16) & 0xff);
  if (c.l1d_bytes > 0 || c.l2_bytes > 0) c.leaf = "0x80000006";
  return c;
}

// A process on `ours` logical CPUs of a cache shared by `sharing` counts on its proportion of it: the neighbours (other
// processes, other VMs on the host) fill the rest as fast as it does, and a kernel writing more than its proportion
// finds its first lines evicted when the next kernel reads them. More CPUs than one cache's sharers span several
// caches: the same proportion (ours / sharing instances). At least `floor`, the private caches (L2s) of its CPUs,
// which hold what it wrote whatever the neighbours do (AMD's L3 is a victim cache, exclusive of the L2s).
int64_t cache_share(int64_t size, int sharing, int ours, int64_t floor) {
  if (size <= 0) return 0;
  if (sharing <= 0) return size;
  return std::max(floor, size * std::max(1, ours) / sharing);
}

CpuTarget resolve_cpu_target(const std::string& tg_cpu, const std::map<std::string, bool>* host_features) {
  init_llvm();
  CpuTarget c;
  c.triple = llvm::sys::getProcessTriple();
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(c.triple, err);
  if (!target) throw Error("[llvm] no LLVM target for " + c.triple + ": " + err);
  std::map<std::string, bool> host;
  if (host_features) {
    host = *host_features;
  } else {
    for (const auto& kv : llvm::sys::getHostCPUFeatures()) host[kv.first().str()] = kv.second;
  }
  std::string host_cpu = llvm::sys::getHostCPUName().str();
  // TG_CPU=NAME[,+feature,-feature...]: LLVM's spelling of features after the CPU name (e.g. +prefer-256-bit)
  std::string name = tg_cpu.substr(0, tg_cpu.find(','));
  std::vector<std::string> extra;
  for (size_t b = name.size(); b < tg_cpu.size();) {
    size_t e = std::min(tg_cpu.find(',', b + 1), tg_cpu.size());
    std::string f = tg_cpu.substr(b + 1, e - b - 1);
    bool ok = f.size() > 1 && (f[0] == '+' || f[0] == '-') &&
              std::all_of(f.begin() + 1, f.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.' || ch == '_'; });
    if (!ok) throw EnvError("[CPU] TG_CPU=" + tg_cpu + ": '" + f + "' is not a feature; expected NAME[,+feature,-feature...], e.g. TG_CPU=haswell or TG_CPU=native,+prefer-256-bit");
    auto h = host.find(f.substr(1));
    if (f[0] == '+' && h != host.end() && !h->second && user_instructions(f.substr(1)))
      throw EnvError("[CPU] TG_CPU=" + tg_cpu + " turns on " + f.substr(1) + ", which this CPU (" + host_cpu + ") lacks");
    extra.push_back(f);
    b = e;
  }
  if (name.empty() || name == "native" || name == "host") {
    c.cpu = host_cpu;
    c.features = feature_string(host);
    c.source = extra.empty() ? "host" : "host+TG_CPU";
  } else {
    c.cpu = name;
    c.features = override_features(*target, c.triple, name, host, host_cpu);
    c.source = "TG_CPU";
  }
  // Vector registers are used at their full width: LLVM's tuning of some AVX-512 CPUs (Intel's server parts)
  // prefers 256-bit vectors, and a register tile sized for 32 zmm registers then becomes 64 ymm ones and spills.
  // (TG_CPU=...,+prefer-256-bit keeps LLVM's preference; the machine model then says 256 bits.)
  bool own = std::any_of(extra.begin(), extra.end(), [](const std::string& f) { return f.substr(1) == "prefer-256-bit"; });
  if (isa_words(c.features) == "AVX-512" && !own) c.features += ",-prefer-256-bit";
  for (const std::string& f : extra) c.features += "," + f;
  return c;
}

const CpuTarget& cpu_target() {
  static const CpuTarget t = resolve_cpu_target(getenv_str("TG_CPU"));
  return t;
}

MachineModel machine_model_of(const CpuTarget& c, int cores) {
  MachineModel m;
  m.cpu = c.cpu, m.source = c.source, m.isa = isa_words(c.features), m.cores = cores;
  const std::string feats = "," + c.features + ",";
  for (const char* f : {"avx512vnni", "avxvnni"}) m.int8_dot |= feats.find(std::string(",+") + f + ",") != std::string::npos;
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(c.triple, err);
  std::unique_ptr<llvm::TargetMachine> tm(target ? target->createTargetMachine(c.triple, c.cpu, c.features, llvm::TargetOptions(),
                                                                              llvm::Reloc::PIC_)
                                                 : nullptr);
  if (tm) {
    // LLVM's cost model for a function compiled as kernels are: the vector width it uses and the register count.
    llvm::LLVMContext ctx;
    llvm::Module mod("machine_model", ctx);
    auto* f = llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), false),
                                     llvm::Function::ExternalLinkage, "probe", mod);
    f->addFnAttr("target-cpu", c.cpu);
    f->addFnAttr("target-features", c.features);
    llvm::ReturnInst::Create(ctx, llvm::BasicBlock::Create(ctx, "entry", f));
    llvm::TargetTransformInfo tti = tm->getTargetTransformInfo(*f);
    m.vector_bits = int(tti.getRegisterBitWidth(llvm::TargetTransformInfo::RGK_FixedWidthVector).getFixedValue());
    m.vector_registers = int(tti.getNumberOfRegisters(tti.getRegisterClassForType(true)));
  }
  if (m.vector_bits < 128) m.vector_bits = 128;  // no SIMD: the tile model still wants a width of 4 floats
  if (m.vector_registers < 8) m.vector_registers = 16;
  if (target) read_fma(m, *target, c);
  read_caches(m);
  read_row_prefetch(m);
  read_fma_measured(m);
  return m;
}

}  // namespace tg::cpu
