#pragma once
// A read-only byte range and what keeps it alive: a file mapped with mmap, or a copy in memory. Shared by the
// file loaders (safetensors, GGUF); DISK buffers hold the owner.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace tg::nn {

struct Bytes {
  const uint8_t* p = nullptr;
  size_t n = 0;
  std::shared_ptr<const void> owner;
};

/** Map a file privately (copy-on-write: a write into the mapping copies the page and never reaches the file; an
 *  empty file gives n = 0); `who` prefixes errors ("[safe_load] PATH: cannot open"). */
Bytes map_file(const std::string& path, const char* who);
/** A private copy of `n` bytes. */
Bytes copy_bytes(const uint8_t* data, size_t n);
/** Write `path` all or nothing: `body` gets a `put(data, n)` that appends to a temporary file beside it, which is
 *  fsynced and renamed over `path`; on any failure `path` is unchanged and a tg::Error names `who` and the file. */
void write_file_atomic(const std::string& path, const char* who,
                       const std::function<void(const std::function<void(const void*, size_t)>&)>& body);

}  // namespace tg::nn
