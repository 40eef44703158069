// libFuzzer target for the GGUF loader: any bytes must either load (metadata read, tensors dequantised; and kept as
// stored, viewed on DISK) or raise tg::Error (never crash, hang or read out of bounds). Run: scripts/fuzz_check gguf.
#include <cstddef>
#include <cstdint>

#include "tg/nn/state.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tg::nn::GGUFFile g = tg::nn::gguf_load_bytes(data, size, "fuzz.gguf");
    for (auto& [k, v] : g.metadata) (void)v.type;
    tg::nn::GGUFFile kept = tg::nn::gguf_load_bytes(data, size, "fuzz.gguf", "DISK", false);
    (void)kept;
  } catch (const tg::Error&) {
  }
  return 0;
}
