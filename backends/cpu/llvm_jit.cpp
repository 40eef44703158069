// The in-process CPU compiler: LLVM IR text -> O2 for the host CPU -> ELF object in memory, and the loader that
// links objects into one process-wide ORC LLJIT, one JITDylib per program.
#include <math.h>
#include <unistd.h>

#include <llvm/ADT/SmallVector.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/DiagnosticHandler.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Object/SymbolSize.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Host.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "cpu.hpp"
#include "tg/env.hpp"
#include "tg/error.hpp"

// libgcc's float16 conversions: LLVM calls them for `half` on x86 CPUs without F16C.
extern "C" void __extendhfsf2(void);
extern "C" void __truncsfhf2(void);

namespace tg::cpu {

namespace {

struct HostTarget {
  std::string triple, cpu, features;
  const llvm::Target* target = nullptr;
};

// cpu_target() (the host's CPU or TG_CPU's) and its LLVM target.
const HostTarget& host() {
  static const HostTarget h = [] {
    init_llvm();
    const CpuTarget& c = cpu_target();
    HostTarget t{c.triple, c.cpu, c.features, nullptr};
    std::string err;
    t.target = llvm::TargetRegistry::lookupTarget(t.triple, err);
    if (!t.target) throw Error("[llvm] no LLVM target for " + t.triple + ": " + err);
    return t;
  }();
  return h;
}

std::string llvm_message(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return s;
}

class LLVMCompiler : public Compiler {
 public:
  // The id names everything that changes the binary (cached on disk under it): LLVM, pipeline, host.
  LLVMCompiler() : id_("llvm-" LLVM_VERSION_STRING "-O2-slp-noalias-" + host_id()) {}
  std::string id() const override { return id_; }

  std::vector<uint8_t> compile(const std::string& src, const std::string& name) override {
    const HostTarget& h = host();
    auto fail = [&](const std::string& what, const std::string& msg) -> void {
      throw Error("[llvm] " + what + " of kernel " + name + " failed:\n" + msg + "\n--- source ---\n" + src);
    };
    llvm::LLVMContext ctx;
    // Optimisation remarks and warnings (a Lane loop LLVM declined to vectorise) go to stderr only with DEBUG>=4:
    // the kernel is still correct, only slower. Errors still fail the compile.
    struct Quiet : llvm::DiagnosticHandler {
      bool handleDiagnostics(const llvm::DiagnosticInfo& di) override {
        if (di.getSeverity() == llvm::DS_Error) return false;
        if (debug_level() >= 4) {
          llvm::DiagnosticPrinterRawOStream dp(llvm::errs());
          di.print(dp);
          llvm::errs() << "\n";
        }
        return true;
      }
    };
    ctx.setDiagnosticHandler(std::make_unique<Quiet>());
    llvm::SMDiagnostic diag;
    std::unique_ptr<llvm::Module> m = llvm::parseIR(llvm::MemoryBufferRef(src, name), diag, ctx);
    if (!m) {
      std::string msg;
      llvm::raw_string_ostream os(msg);
      diag.print(name.c_str(), os, false);
      fail("parsing", msg);
    }
    std::string verr;
    llvm::raw_string_ostream vos(verr);
    if (llvm::verifyModule(*m, &vos)) fail("verification", verr);

    llvm::TargetOptions opts;  // IEEE semantics: no fast-math, no contraction of separate fmul/fadd
    std::unique_ptr<llvm::TargetMachine> tm(h.target->createTargetMachine(
        h.triple, h.cpu, h.features, opts, llvm::Reloc::PIC_, llvm::CodeModel::Small, llvm::CodeGenOptLevel::Default));
    if (!tm) fail("target setup", "no target machine for " + h.triple);
    m->setTargetTriple(h.triple);
    m->setDataLayout(tm->createDataLayout());
    for (llvm::Function& f : *m)
      if (!f.isDeclaration()) {
        f.addFnAttr("target-cpu", h.cpu);
        f.addFnAttr("target-features", h.features);
      }

    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    // The SLP vectoriser packs the expander's upcast copies into vector instructions. The loop vectoriser stays
    // off: it runs first and vectorises an upcast loop across its iterations, turning each unit-stride copy into a
    // gather with stride amt (the 2^24-float add ran at 10 GB/s with it, 46 GB/s without; matmul N=1024 0.30x
    // OpenBLAS with it, 0.55x without: bench/bandwidth, bench/matmul).
    llvm::PipelineTuningOptions pto;
    pto.LoopVectorization = false;
    pto.SLPVectorization = true;
    llvm::PassBuilder pb(tm.get(), pto);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2).run(*m, mam);

    llvm::SmallVector<char, 0> obj;
    llvm::raw_svector_ostream os(obj);
    llvm::legacy::PassManager pm;
    if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
      fail("code generation", "the target cannot emit object files");
    pm.run(*m);
    return std::vector<uint8_t>(obj.begin(), obj.end());
  }

 private:
  std::string id_;
};

// Host functions compiled kernels may call: libm (transcendentals, and what LLVM's library-call
// simplification turns loops or calls into), memory intrinsics, libgcc's float16 helpers. Registered as
// absolute addresses: searching the whole process would bind into PoCL's LLVM (see PLATFORM.md).
std::vector<std::pair<const char*, void*>> runtime_symbols() {
  using F1 = float (*)(float);
  using D1 = double (*)(double);
  using F2 = float (*)(float, float);
  using D2 = double (*)(double, double);
  auto p = [](auto fn) { return reinterpret_cast<void*>(fn); };
  return {
#define TG_F1(n) {#n "f", p(static_cast<F1>(::n##f))}, {#n, p(static_cast<D1>(::n))}
#define TG_F2(n) {#n "f", p(static_cast<F2>(::n##f))}, {#n, p(static_cast<D2>(::n))}
      TG_F1(sin), TG_F1(cos), TG_F1(tan), TG_F1(exp), TG_F1(exp2), TG_F1(expm1), TG_F1(log), TG_F1(log2),
      TG_F1(log10), TG_F1(log1p), TG_F1(sqrt), TG_F1(trunc), TG_F1(floor), TG_F1(ceil), TG_F1(round),
      TG_F1(rint), TG_F1(nearbyint), TG_F1(fabs), TG_F1(tanh), TG_F2(pow), TG_F2(fmod), TG_F2(fmin),
      TG_F2(fmax), TG_F2(atan2),
#undef TG_F1
#undef TG_F2
      {"fmaf", p(static_cast<float (*)(float, float, float)>(::fmaf))},
      {"fma", p(static_cast<double (*)(double, double, double)>(::fma))},
      {"ldexpf", p(static_cast<float (*)(float, int)>(::ldexpf))},
      {"ldexp", p(static_cast<double (*)(double, int)>(::ldexp))},
      {"sincosf", p(static_cast<void (*)(float, float*, float*)>(::sincosf))},
      {"sincos", p(static_cast<void (*)(double, double*, double*)>(::sincos))},
      {"memset", p(static_cast<void* (*)(void*, int, size_t)>(::memset))},
      {"memcpy", p(static_cast<void* (*)(void*, const void*, size_t)>(::memcpy))},
      {"memmove", p(static_cast<void* (*)(void*, const void*, size_t)>(::memmove))},
      {"__extendhfsf2", p(&__extendhfsf2)},
      {"__truncsfhf2", p(&__truncsfhf2)},
  };
}

// The process-wide JIT. Never destroyed: programs held by static objects may outlive any destruction order.
class Jit {
 public:
  static Jit& get() {
    static Jit* j = new Jit;
    return *j;
  }
  llvm::orc::LLJIT& jit() { return *jit_; }
  llvm::orc::JITDylib& runtime() { return *runtime_; }
  std::string next_dylib_name() { return "tg_program_" + std::to_string(counter_++); }

 private:
  Jit() {
    init_llvm();
    auto j = llvm::orc::LLJITBuilder()
                 .setLinkProcessSymbolsByDefault(false)
                 .setPlatformSetUp(llvm::orc::setUpInactivePlatform)  // no static initialisers in kernels
                 .create();
    if (!j) throw Error("[llvm] cannot create the ORC JIT: " + llvm_message(j.takeError()));
    jit_ = std::move(*j);
    runtime_ = &jit_->getExecutionSession().createBareJITDylib("tg_runtime");
    llvm::orc::SymbolMap syms;
    for (auto& [n, addr] : runtime_symbols())
      syms[jit_->mangleAndIntern(n)] = {llvm::orc::ExecutorAddr::fromPtr(addr),
                                        llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable};
    if (auto e = runtime_->define(llvm::orc::absoluteSymbols(std::move(syms))))
      throw Error("[llvm] cannot define the runtime symbols: " + llvm_message(std::move(e)));
  }
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  llvm::orc::JITDylib* runtime_ = nullptr;
  std::atomic<uint64_t> counter_{0};
};

class OrcProgram : public Program {
 public:
  OrcProgram(llvm::orc::JITDylib* jd, KernelFn fn) : jd_(jd), fn_(fn) {}
  ~OrcProgram() override {
    // Releases the program's code and data memory.
    if (auto e = Jit::get().jit().getExecutionSession().removeJITDylib(*jd_)) llvm::consumeError(std::move(e));
  }
  void run(void* const* bufs, const int64_t* vars, const LaunchDims& dims) override { run_kernel(fn_, bufs, vars, dims); }

 private:
  llvm::orc::JITDylib* jd_;
  KernelFn fn_;
};

}  // namespace

std::unique_ptr<Compiler> make_llvm_compiler() { return std::make_unique<LLVMCompiler>(); }

// PERF_MAP=1: each loaded kernel's address range goes to /tmp/perf-PID.map, so `perf report` names JIT code.
void perf_map(const std::vector<uint8_t>& object, const std::string& name, uint64_t addr) {
  static std::mutex mu;
  uint64_t size = 0;
  auto obj = llvm::object::ObjectFile::createObjectFile(
      llvm::MemoryBufferRef(llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), name));
  if (!obj) {
    llvm::consumeError(obj.takeError());
    return;
  }
  for (const auto& [s, sz] : llvm::object::computeSymbolSizes(**obj)) {
    auto n = s.getName();
    if (n && *n == name) size = sz;
    else if (!n) llvm::consumeError(n.takeError());
  }
  std::lock_guard lk(mu);
  if (FILE* f = std::fopen(("/tmp/perf-" + std::to_string(getpid()) + ".map").c_str(), "a")) {
    std::fprintf(f, "%llx %llx %s\n", (unsigned long long)addr, (unsigned long long)std::max<uint64_t>(size, 1),
                 name.c_str());
    std::fclose(f);
  }
}

std::unique_ptr<Program> load_llvm_object(const std::vector<uint8_t>& object, const std::string& name) {
  Jit& J = Jit::get();
  auto& es = J.jit().getExecutionSession();
  llvm::orc::JITDylib& jd = es.createBareJITDylib(J.next_dylib_name());
  jd.addToLinkOrder(J.runtime());
  auto drop = [&](llvm::Error e, const std::string& what) -> std::unique_ptr<Program> {
    std::string msg = llvm_message(std::move(e));
    if (auto e2 = es.removeJITDylib(jd)) llvm::consumeError(std::move(e2));
    throw Error("[llvm] cannot load kernel " + name + ": " + what + ": " + msg);
  };
  auto buf = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), name);
  if (auto e = J.jit().addObjectFile(jd, std::move(buf))) return drop(std::move(e), "adding the object");
  auto sym = J.jit().lookup(jd, name);
  if (!sym) return drop(sym.takeError(), "linking");
  if (getenv_int("PERF_MAP", 0)) perf_map(object, name, sym->getValue());
  return std::make_unique<OrcProgram>(&jd, sym->toPtr<KernelFn>());
}

const std::string& host_id() {
  static const std::string id = [] {
    const HostTarget& h = host();
    char buf[24];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)XXH3_64bits(h.features.data(), h.features.size()));
    return h.cpu + "-" + buf;
  }();
  return id;
}

}  // namespace tg::cpu
