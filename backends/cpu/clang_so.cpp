// The CPU_COMPILER=clang variant: C text -> `clang -O2 -march=native -shared` -> shared object, loaded with dlopen.
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "cpu.hpp"
#include "tg/error.hpp"

extern char** environ;

namespace tg::cpu {

namespace fs = std::filesystem;

namespace {

// Flags beyond the usual: -fwrapv gives signed overflow exec_alu's wrap-around, -ffp-contract=off keeps every
// rounding step of the program, -fno-math-errno lets sqrt and friends inline, -fno-vectorize leaves the upcast
// copies to the SLP vectoriser (see llvm_jit.cpp: the loop vectoriser turns them into gathers).
// -march names cpu_target(): the host, or TG_CPU's CPU.
const std::vector<std::string>& flags() {
  static const std::vector<std::string> f = {"-O2",     "-march=" + (cpu_target().source == "host" ? std::string("native") : cpu_target().cpu),
                                             "-fPIC",   "-shared", "-fwrapv", "-ffp-contract=off", "-fno-math-errno",
                                             "-fno-vectorize", "-x", "c"};
  return f;
}

// A private temporary folder, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tg-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw Error("[clang] cannot create a temporary folder: " + std::string(std::strerror(errno)));
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const char* name) const { return path_ / name; }

 private:
  fs::path path_;
};

void write_file(const fs::path& p, const void* data, size_t n) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  if (!f || !f.write(static_cast<const char*>(data), std::streamsize(n)) || !f.flush())
    throw Error("[clang] cannot write " + p.string());
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The first `clang` on PATH, found once.
const std::string& find_clang() {
  static const std::string path = [] {
    const char* env = std::getenv("PATH");
    std::stringstream ss(env ? env : "/usr/bin:/bin");
    std::string dir;
    while (std::getline(ss, dir, ':')) {
      fs::path p = fs::path(dir.empty() ? "." : dir) / "clang";
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
    return std::string();
  }();
  return path;
}

// Run argv with stdin from /dev/null and stdout+stderr into `log`; the exit status (or 128 + signal).
int run_process(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw Error("[clang] cannot run " + args[0] + ": " + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error("[clang] waiting for " + args[0] + " failed: " + std::strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class ClangCompiler : public Compiler {
 public:
  std::string id() const override {
    std::string s = "clang";
    for (const std::string& f : flags()) s += " " + f;
    return s + " " + host_id();
  }

  std::vector<uint8_t> compile(const std::string& src, const std::string& name) override {
    const std::string& clang = find_clang();
    if (clang.empty()) throw Error("[clang] no 'clang' on PATH: install clang, or use CPU_COMPILER=llvm");
    TempDir dir;
    fs::path c = dir / "kernel.c", so = dir / "kernel.so", log = dir / "clang.log";
    write_file(c, src.data(), src.size());
    std::vector<std::string> args{clang};
    args.insert(args.end(), flags().begin(), flags().end());
    args.insert(args.end(), {c.string(), "-o", so.string(), "-lm"});
    int rc = run_process(args, log);
    if (rc != 0)
      throw Error("[clang] compile of kernel " + name + " failed (exit " + std::to_string(rc) + "):\n" + read_file(log) +
                  "\n--- source ---\n" + src);
    std::string bin = read_file(so);
    if (bin.empty()) throw Error("[clang] compile of kernel " + name + " produced no shared object");
    return std::vector<uint8_t>(bin.begin(), bin.end());
  }
};

class SharedObjectProgram : public Program {
 public:
  SharedObjectProgram(void* handle, KernelFn fn) : handle_(handle), fn_(fn) {}
  ~SharedObjectProgram() override { ::dlclose(handle_); }
  void run(void* const* bufs, const int64_t* vars, const LaunchDims& dims) override { run_kernel(fn_, bufs, vars, dims); }

 private:
  void* handle_;
  KernelFn fn_;
};

}  // namespace

std::unique_ptr<Compiler> make_clang_compiler() { return std::make_unique<ClangCompiler>(); }

std::unique_ptr<Program> load_shared_object(const std::vector<uint8_t>& so, const std::string& name) {
  void* h = nullptr;
  {
    TempDir dir;  // the file can go as soon as it is mapped
    fs::path p = dir / "kernel.so";
    write_file(p, so.data(), so.size());
    h = ::dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) throw Error("[clang] cannot load kernel " + name + ": " + ::dlerror());
  }
  void* fn = ::dlsym(h, name.c_str());
  if (!fn) {
    ::dlclose(h);
    throw Error("[clang] kernel " + name + " is not in its shared object");
  }
  return std::make_unique<SharedObjectProgram>(h, reinterpret_cast<KernelFn>(fn));
}

}  // namespace tg::cpu
