// libFuzzer target for the IDX loader: any bytes (plain or gzip) must either load or raise tg::Error (never crash,
// hang or read out of bounds). Run: build-asan/tools/idx_fuzz -max_total_time=60 CORPUS (scripts/fuzz_check idx).
#include <cstddef>
#include <cstdint>

#include "tg/nn/datasets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tg::Tensor t = tg::nn::load_idx_bytes(data, size, "fuzz.idx");
    (void)t.numel();
  } catch (const tg::Error&) {
  }
  return 0;
}
