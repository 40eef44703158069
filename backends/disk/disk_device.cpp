// The DISK device: storage only. Its buffers are views of memory owned elsewhere (a file mapped read-only by
// safe_load); they are copied out to another device on demand (Tensor::to, reading a tensor back). Nothing is
// allocated on DISK, nothing is copied into it, and no kernel runs on it (the engine refuses, naming the kernel).
#include <cstring>
#include <memory>

#include "tg/device.hpp"

namespace tg {

namespace {

[[noreturn]] void no_kernels(const char* what) {
  throw Error(std::string("[DISK] ") + what + ": kernels cannot run on DISK (a mapped file); move the tensor with "
              ".to(\"CPU\") (or another device) first");
}

class DiskAllocator : public Allocator {
 public:
  ~DiskAllocator() override { clear_cache(); }
  void copyin(void*, const void*, size_t bytes) override {
    throw Error("[DISK] cannot write " + std::to_string(bytes) + " bytes: DISK tensors are read-only views of a mapped file");
  }
  void copyout(void* host_dst, const void* src, size_t bytes) override { std::memcpy(host_dst, src, bytes); }

 protected:
  void* alloc_raw(size_t bytes) override {
    throw Error("[DISK] cannot allocate " + std::to_string(bytes) + " bytes: DISK buffers only view mapped files "
                "(nn::safe_load); create the tensor on CPU");
  }
  void free_raw(void*, size_t) override {}
};

class DiskDevice : public Device {
 public:
  explicit DiskDevice(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  Allocator& allocator() override { return allocator_; }
  Renderer& renderer() override { no_kernels("no renderer"); }
  Compiler& compiler() override { no_kernels("no compiler"); }
  std::unique_ptr<Program> load(const std::vector<uint8_t>&, const std::string& name) override {
    no_kernels(("cannot load kernel " + name).c_str());
  }
  bool runs_kernels() const override { return false; }

 private:
  std::string name_;
  DiskAllocator allocator_;
};

// Lowest priority of the built-in devices: never the default unless DEVICE=DISK asks for it.
const bool g_registered = register_device("DISK", [](const std::string& full) { return std::make_unique<DiskDevice>(full); }, 1);

}  // namespace

}  // namespace tg
