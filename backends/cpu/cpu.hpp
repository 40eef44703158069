#pragma once
// The CPU backend: kernels rendered as LLVM IR and compiled in process (ORC JIT), or rendered as C and
// compiled by clang into a shared object (CPU_COMPILER=clang). Registered as "CPU".
// Thread-safety: compilers and loaders may be used from several threads; a Program runs on the calling thread.
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tg/device.hpp"

namespace tg::cpu {

/** Which compiler a CPU device uses. */
enum class CompilerKind { LLVM, Clang };

/** Kernel entry point (the CPU ABI of include/tg/codegen.hpp). */
using KernelFn = void (*)(void* const* bufs, const int64_t* vars);

/** Run a kernel: once, or dims.global[0] times in parallel on the thread pool with vars[dims.core_var] = i. */
void run_kernel(KernelFn fn, void* const* bufs, const int64_t* vars, const LaunchDims& dims);

/** A CPU device with the given compiler; the registered "CPU" picks it from CPU_COMPILER=llvm|clang. */
std::unique_ptr<Device> make_device(const std::string& name, CompilerKind kind);

/** LLVM IR text -> ELF object for the host CPU (O2, host features). */
std::unique_ptr<Compiler> make_llvm_compiler();
/** Link an object into the process-wide ORC JIT (one JITDylib per program, released with it). */
std::unique_ptr<Program> load_llvm_object(const std::vector<uint8_t>& object, const std::string& name);

/** C text -> shared object with `clang -O2 -march=native` (clang found on PATH once). */
std::unique_ptr<Compiler> make_clang_compiler();
/** dlopen a shared object (written to a temporary file that is deleted once loaded). */
std::unique_ptr<Program> load_shared_object(const std::vector<uint8_t>& so, const std::string& name);

/** LLVM's native target, asm printer and parser, initialised once (thread-safe). */
void init_llvm();

/** The CPU kernels are compiled for: the host's (source "host") or the one TG_CPU names (source "TG_CPU"; an LLVM
 *  CPU name whose instruction set this CPU has, else a tg::EnvError). Features: LLVM's "+avx2,-avx512f,..." list. */
struct CpuTarget {
  std::string triple, cpu, features, source;
};
const CpuTarget& cpu_target();
/** What cpu_target() does for a TG_CPU value ("" or "native": the host), with the host's features as LLVM reads
 *  them from cpuid, or the given ones (tests). */
CpuTarget resolve_cpu_target(const std::string& tg_cpu, const std::map<std::string, bool>* host_features = nullptr);

/** The machine model of a target: LLVM's vector width and register count, cache sizes (sysfs, else cpuid). */
MachineModel machine_model_of(const CpuTarget& t, int cores);

/** The issue rate of vector FMAs of w floats (16: AVX-512, 8: AVX2) on the calling core, per cycle: a chain of
 *  dependent FMAs, one per `latency` cycles, clocks the core; 12 independent chains then issue at the rate (best of 7
 *  alternated passes of about 1 ms each). x86 hosts that run that width only. */
double fma_rate_measured(int w, int latency);

/** Data cache sizes as the x86 cpuid instruction reports them, with how many logical CPUs share one L3 (the
 *  deterministic cache leaf: AMD 0x8000001D, Intel 4; where a hypervisor zeroes it, AMD's legacy leaves
 *  0x80000005/6 and the package's logical CPU count of leaf 1). All zero when cpuid says nothing. */
struct CpuidCaches {
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  int l3_sharing = 0;  ///< logical CPUs sharing one L3 (0: unknown)
  std::string leaf;    ///< the leaf read: "0x8000001d", "4", "0x80000006", or "" (nothing)
};
/** cpuid(leaf, subleaf) -> {eax, ebx, ecx, edx}; tests pass recorded words. */
using CpuidFn = std::function<std::array<uint32_t, 4>(uint32_t leaf, uint32_t subleaf)>;
CpuidCaches caches_from_cpuid(const CpuidFn& cpuid);
/** The part of a shared cache of `size` bytes (one instance, shared by `sharing` logical CPUs) that a process on
 *  `ours` logical CPUs can count on: size x ours / sharing, at least `floor` (the private caches below it);
 *  sharing unknown (0): the whole size. */
int64_t cache_share(int64_t size, int sharing, int ours, int64_t floor);

/** "<cpu name>-<hash of its features>": part of every CPU compiler id (binaries are target-specific). */
const std::string& host_id();

}  // namespace tg::cpu
