#pragma once
// A read-only byte range and what keeps it alive: a file mapped with mmap, or a copy in memory. Shared by the
// file loaders (safetensors, GGUF); DISK buffers hold the owner.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tg::nn {

struct Bytes {
  const uint8_t* p = nullptr;
  size_t n = 0;
  std::shared_ptr<const void> owner;
};

/** Map a file read-only (an empty file gives n = 0); `who` prefixes errors ("[safe_load] PATH: cannot open"). */
Bytes map_file(const std::string& path, const char* who);
/** A private copy of `n` bytes. */
Bytes copy_bytes(const uint8_t* data, size_t n);

}  // namespace tg::nn
