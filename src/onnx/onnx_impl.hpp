#pragma once
// Internals of the ONNX runner: the parsed model (protobuf, Debian's libonnx_proto), tensor conversion, the
// operator table. Nothing here is public; include/tg/onnx.hpp is the interface.
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "tg/jit.hpp"
#include "tg/onnx.hpp"

namespace tg::onnx {

namespace pb = ::onnx;

/** Where errors point: the file (or case) being read. */
[[noreturn]] void fail(const std::string& where, const std::string& what);

/** TensorProto -> tg dtype; throws naming `where` for types tg cannot hold (strings, complex, fp8 variants). */
DType dtype_of_onnx(int32_t t, const std::string& where);
/** tg dtype -> TensorProto data_type. */
int32_t onnx_of_dtype(DType d);
/** A checked TensorProto -> realised Tensor; base_dir "" forbids external data. */
Value value_of_proto(const pb::TensorProto& t, const std::string& where, const std::string& base_dir);
/** A checked TensorProto -> realised Tensor (strings refused); base_dir "" forbids external data. */
Tensor tensor_of_proto(const pb::TensorProto& t, const std::string& where, const std::string& base_dir);

/** A captured run for one input signature (names, shapes, dtypes): replayed by TinyJit, or marked eager when
 *  the graph cannot be replayed (it reads input data on the host, or returns sequences or strings). */
struct RunJit {
  std::mutex mu;  // one call at a time
  std::unique_ptr<TinyJit> jit;
  bool eager = false;
  bool non_tensor = false;  // set by the captured function: an output is not a tensor
};

struct Model::Impl {
  std::string name, base_dir;
  pb::ModelProto proto;
  std::map<std::string, int64_t> opsets;
  std::map<std::string, Tensor> initializers;
  // The main graph's Constant nodes with a tensor value, read once by load (like the initializers, not per run)
  std::map<const pb::NodeProto*, Value> constants;
  // The main graph with graph-level rules applied by load (fold_batchnorm), when one applied: run unless an input
  // overrides one of the initializers it folded away (folded_from); its new initializers are folded_initializers.
  std::unique_ptr<pb::GraphProto> folded;
  std::map<std::string, Tensor> folded_initializers;
  std::set<std::string> folded_from;
  size_t bn_folded = 0;  // BatchNormalization nodes folded into their Conv
  std::vector<ValueInfo> inputs, outputs;
  std::map<std::string, std::string> kinds;  // declared kind of each graph input/output
  mutable std::mutex jits_mu;
  mutable std::map<std::string, std::shared_ptr<RunJit>> jits;  // by input signature, at most kMaxJits
  static constexpr size_t kMaxJits = 32;
};

/** Folds inference BatchNormalization into the Conv before it where both read initializers (ONNX Runtime's
 *  ConvBNFusion), into m.folded; called by load after the initializers and Constant nodes are read. */
void fold_batchnorm(Model::Impl& m);

/** The main graph a run uses: the folded one unless `overrides` (input names) replace an initializer it folded. */
const pb::GraphProto& main_graph(const Model::Impl& m, const std::map<std::string, Value>& overrides);

/** Run one graph (the main graph or a subgraph of If/Loop/Scan) with `scope` holding outer values. */
std::vector<Value> run_graph(const Model::Impl& m, const pb::GraphProto& g, const std::map<std::string, Value>& scope,
                             const std::vector<Value>& args);

/** The operator context handed to each operator. */
struct Ctx {
  const Model::Impl& model;
  const pb::NodeProto& node;
  int64_t opset;
  std::vector<Value> in;  // Kind::None where the input name is empty (an omitted optional input)
  const std::map<std::string, Value>& scope;

  [[noreturn]] void error(const std::string& what) const;
  size_t n() const { return in.size(); }
  bool has(size_t i) const { return i < in.size() && in[i].kind != Value::Kind::None; }
  const Tensor& t(size_t i) const;
  bool is_strings(size_t i) const { return i < in.size() && in[i].kind == Value::Kind::Strings; }
  /** The host values of an int/float input (realises it). */
  std::vector<int64_t> ints(size_t i) const;
  std::vector<double> floats(size_t i) const;

  const pb::AttributeProto* attr(const std::string& name) const;
  bool has_attr(const std::string& name) const { return attr(name) != nullptr; }
  int64_t i(const std::string& name, int64_t def) const;
  double f(const std::string& name, double def) const;
  std::string s(const std::string& name, const std::string& def) const;
  std::vector<int64_t> ints_attr(const std::string& name, std::vector<int64_t> def = {}) const;
  std::vector<double> floats_attr(const std::string& name) const;
};

using OpFn = std::function<std::vector<Value>(Ctx&)>;
/** The operator table: "Domain::OpType" ("" domain is plain "OpType"). */
const std::unordered_map<std::string, OpFn>& op_table();
/** Adds the operators of ops_extra.cpp (quantisation, Resize, windows, training, host-shaped ops) to the table. */
void register_extra_ops(std::unordered_map<std::string, OpFn>& t);
/** Adds the operators of ops_image.cpp (GridSample, RoiAlign, MaxUnpool, Det, DFT, STFT, MelWeightMatrix). */
void register_image_ops(std::unordered_map<std::string, OpFn>& t);
/** Adds the control-flow, sequence and optional operators of ops_control.cpp. */
void register_control_ops(std::unordered_map<std::string, OpFn>& t);

}  // namespace tg::onnx
