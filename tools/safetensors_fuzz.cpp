// libFuzzer target for the safetensors loader: any bytes must either load or raise tg::Error (never crash, hang or
// read out of bounds). Each image is loaded twice: copied onto the default device (every tensor's bytes are read)
// and as DISK views, which are then copied out (a COPY, no kernels). Run: scripts/fuzz_check safetensors.
#include <cstddef>
#include <cstdint>

#include "tg/nn/state.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto sd = tg::nn::safe_load_bytes(data, size, "fuzz.safetensors");
    for (auto& [k, t] : sd) (void)t.numel();
  } catch (const tg::Error&) {
  }
  try {
    auto sd = tg::nn::safe_load_bytes(data, size, "fuzz.safetensors", "DISK");
    for (auto& [k, t] : sd) t.to("CPU").realize();
  } catch (const tg::Error&) {
  }
  return 0;
}
