// The second process of the device suite's program-cache test: realises one reduce kernel on the default device
// and prints how many kernels this process lowered (not found in the on-disk program cache) and the result.
#include <cstdio>

#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

int main() {
  using namespace tg;
  try {
    Tensor x = Tensor::arange(0, 37, 1, dtypes::float32);
    float v = Tensor((x * 2.5f + 1.0f).sum()).item<float>();
    std::printf("lowered=%zu value=%.3f\n", kernels_lowered(), double(v));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
