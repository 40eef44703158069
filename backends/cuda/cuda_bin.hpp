#pragma once
// The CUDA backend's binary format: a header with the kernel's argument counts, then a cubin (ELF) or PTX text.
#include <cstdint>
#include <string>

namespace tg::cuda {

struct BinHeader {
  char magic[8] = {'T', 'G', 'C', 'U', 'B', 'I', 'N', '1'};
  int32_t n_bufs = 0, n_vars = 0;
};

/** Argument counts from the renderer's first line "// tg kernel args: N buffers, M vars". */
BinHeader parse_args_marker(const std::string& src);

}  // namespace tg::cuda
