#pragma once
// ONNX: load a model (.onnx) and run it by mapping each ONNX operator onto tg Tensor ops (no per-operator kernels).
// Thread-safety: a Model's graph is immutable after load; run() may be called from several threads (its replayed
// runs take one lock per input signature, and realize is serialised, see tensor.hpp). load/load_tensor are safe
// to call concurrently.
#include "tg/config.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tg/tensor.hpp"

namespace tg::onnx {

/** A value flowing through an ONNX graph: a tensor, a sequence of tensors, an absent optional, or a tensor of
 *  strings (held on the host, row-major; tg tensors have no string dtype). */
struct Value {
  /// which member holds the value
  enum class Kind { Tensor, Sequence, None, Strings };
  /// which member holds the value (None: an absent optional)
  Kind kind = Kind::None;
  /// the value when kind is Tensor
  Tensor tensor;
  /// the value when kind is Sequence
  std::vector<Tensor> sequence;
  /// the value when kind is Strings: the elements, row-major
  std::vector<std::string> strings;
  /// the shape of `strings`
  Shape strings_shape;
  /// a tensor value
  static Value of(Tensor t) { Value v; v.kind = Kind::Tensor; v.tensor = std::move(t); return v; }
  /// a sequence value
  static Value seq(std::vector<Tensor> s) { Value v; v.kind = Kind::Sequence; v.sequence = std::move(s); return v; }
  /// a string tensor of that shape (s row-major)
  static Value of_strings(std::vector<std::string> s, Shape shape) {
    Value v; v.kind = Kind::Strings; v.strings = std::move(s); v.strings_shape = std::move(shape); return v;
  }
};

/** A graph input or output as declared in the model: name, element type, shape (-1 where symbolic or unknown). */
struct ValueInfo {
  /// the name in the graph (the key of run()'s inputs and outputs)
  std::string name;
  std::optional<DType> dtype;  ///< none for strings, sequences, maps
  /// the declared shape, -1 for a symbolic or unknown dim
  std::vector<int64_t> shape;
  /// whether the model declares a shape at all (else the rank is unknown)
  bool has_shape = false;
};

/** A loaded ONNX model. */
class Model {
 public:
  /** Read and check an .onnx file; external initializer data is read relative to its folder. Throws tg::Error
   *  naming the file and what is wrong (bad protobuf, bad tensor sizes, missing external files, ...). */
  static Model load(const std::string& path);
  /** Parse a model held in memory; `name` is used in errors, `base_dir` for external data ("" forbids it). */
  static Model parse(const void* data, size_t size, const std::string& name, const std::string& base_dir = "");

  /** Graph inputs that are not initializers (what run() needs). */
  const std::vector<ValueInfo>& inputs() const;
  /// the graph outputs, as the model declares them
  const std::vector<ValueInfo>& outputs() const;
  /** The opset version imported for a domain ("" is the default ONNX domain); 0 when not imported. */
  int64_t opset(const std::string& domain = "") const;
  /** The declared kind of a graph input or output: "tensor", "sequence", "optional" or "other". */
  std::string kind(const std::string& name) const;
  /** Number of nodes in the main graph. */
  size_t num_nodes() const;

  /** Run the graph on named inputs; returns the graph outputs by name (lazy tensors: realise or read them).
   *  Unsupported operators raise tg::Error naming the operator and the opset. */
  std::map<std::string, Value> run(const std::map<std::string, Value>& inputs) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

/** Read a serialized TensorProto (.pb) file into a realised tensor; throws tg::Error naming the file. */
Tensor load_tensor(const std::string& path);
/** Parse a serialized TensorProto held in memory; `name` is used in errors. */
Tensor parse_tensor(const void* data, size_t size, const std::string& name);
/** Read a test-data .pb file that may be a TensorProto, a SequenceProto or an OptionalProto (`kind` from the
 *  graph's declared type: "tensor", "sequence" or "optional"). */
Value load_value(const std::string& path, const std::string& kind = "tensor");

}  // namespace tg::onnx
