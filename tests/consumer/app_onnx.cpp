// The tg::onnx target: a model file that does not exist is refused with a tg::Error.
#include <tg/onnx.hpp>

#include <iostream>

int main() {
  try {
    tg::onnx::Model::load("/nonexistent/model.onnx");
  } catch (const tg::Error& e) {
    std::cout << "onnx ok\n";
    return 0;
  }
  std::cerr << "loading a missing model did not throw\n";
  return 1;
}
