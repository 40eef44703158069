// libFuzzer target for the ONNX loader: any bytes, read as a model and as a TensorProto, must either load or raise
// tg::Error (never crash, hang or read out of bounds). Run: build-asan/tools/onnx_fuzz -max_total_time=60 CORPUS
#include <cstddef>
#include <cstdint>

#include "tg/onnx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tg::onnx::Model m = tg::onnx::Model::parse(data, size, "fuzz.onnx");
    (void)m.inputs();
  } catch (const tg::Error&) {
  }
  try {
    tg::Tensor t = tg::onnx::parse_tensor(data, size, "fuzz.pb");
    (void)t.numel();
  } catch (const tg::Error&) {
  }
  return 0;
}
