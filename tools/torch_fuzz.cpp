// libFuzzer target for torch_load: any bytes must either load (zip or legacy torch.save files, every tensor gathered
// from its storage) or raise tg::Error (never crash, hang or read out of bounds). Run: scripts/fuzz_check torch.
#include <cstddef>
#include <cstdint>

#include "tg/nn/state.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto tensors = tg::nn::torch_load_bytes(data, size, "fuzz.pt");
    (void)tensors;
  } catch (const tg::Error&) {
  }
  return 0;
}
