// onnx_run MODEL.onnx [INPUT.pb ...]: runs an ONNX model on inputs read from TensorProto files (in the order of
// the graph's inputs) or, for inputs not given, made at random from the declared shape (unknown dims become 1).
// Prints each output's shape, dtype and first values. DEBUG=2 prints one line per kernel launched. RUNS=N runs the
// model N times on the same inputs (the fourth run on replays what TinyJit captured) and prints each run's time.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>

#include "tg/env.hpp"
#include "tg/onnx.hpp"

using tg::Tensor;
using tg::onnx::Value;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: onnx_run MODEL.onnx [INPUT.pb ...]\n";
    return 2;
  }
  try {
    tg::onnx::Model m = tg::onnx::Model::load(argv[1]);
    std::cout << argv[1] << ": " << m.num_nodes() << " nodes, opset " << m.opset() << "\n";
    std::map<std::string, Value> inputs;
    for (size_t i = 0; i < m.inputs().size(); i++) {
      const auto& vi = m.inputs()[i];
      if (int(i) + 2 < argc) {
        inputs[vi.name] = tg::onnx::load_value(argv[i + 2], m.kind(vi.name));
        continue;
      }
      if (!vi.dtype) throw tg::Error("[onnx_run] input '" + vi.name + "' has no tensor type; give it as a .pb file");
      tg::Shape s;
      for (int64_t d : vi.shape) s.push_back(d < 0 ? 1 : d);
      tg::DType d = *vi.dtype;
      Tensor t = tg::dtypes::is_float(d) ? Tensor::randn(s).cast(d)
                 : tg::dtypes::is_bool(d) ? (Tensor::rand(s) < 0.5)
                                          : Tensor::randint(0, 10, s).cast(d);
      inputs[vi.name] = Value::of(t);
    }
    for (const auto& vi : m.inputs()) {
      const Value& v = inputs[vi.name];
      std::cout << "input  " << vi.name << ": " << (v.kind == Value::Kind::Tensor ? tg::shape_str(v.tensor.shape()) + " " + v.tensor.dtype().name() : "(sequence)") << "\n";
    }
    const int64_t runs = tg::getenv_int("RUNS", 1, 1, 1000000);
    std::map<std::string, Value> outs;
    for (int64_t r = 0; r < runs; r++) {
      auto t0 = std::chrono::steady_clock::now();
      outs = m.run(inputs);
      for (auto& [name, v] : outs)
        if (v.kind == Value::Kind::Tensor) v.tensor.realize();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (runs > 1) std::printf("run %lld: %.2f ms\n", (long long)r + 1, ms), std::fflush(stdout);
    }
    for (const auto& vi : m.outputs()) {
      const Value& v = outs.at(vi.name);
      if (v.kind != Value::Kind::Tensor) {
        std::cout << "output " << vi.name << ": " << (v.kind == Value::Kind::Sequence ? "sequence of " + std::to_string(v.sequence.size()) : "none") << "\n";
        continue;
      }
      std::vector<double> vals = v.tensor.to_doubles();
      std::cout << "output " << vi.name << ": " << tg::shape_str(v.tensor.shape()) << " " << v.tensor.dtype().name() << " [";
      for (size_t i = 0; i < vals.size() && i < 8; i++) std::cout << (i ? ", " : "") << vals[i];
      std::cout << (vals.size() > 8 ? ", ...]" : "]") << "\n";
    }
  } catch (const tg::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
