// ONNX loading: protobuf parsing with bounded recursion and size, checked conversion of TensorProtos (typed fields,
// raw data, external data files), graph inputs/outputs and opsets.
#include <google/protobuf/io/coded_stream.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "onnx_impl.hpp"
// after onnx_impl.hpp, which defines what the generated header expects
#include <onnx/onnx-data_pb.h>

namespace tg::onnx {

namespace {

constexpr int kRecursionLimit = 64;                       // nested messages (subgraphs in attributes, ...)
constexpr int64_t kMaxFileBytes = int64_t(2) << 30;       // protobuf cannot hold a larger message anyway
constexpr int64_t kMaxElements = int64_t(1) << 34;        // a tensor larger than this is refused outright

std::string read_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot read " + what + ": " + ec.message());
  if (int64_t(size) > kMaxFileBytes) fail(path, what + " is " + std::to_string(size) + " bytes, more than the 2 GiB protobuf allows");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open " + what);
  std::string s(size_t(size), '\0');
  if (size > 0 && !f.read(s.data(), std::streamsize(size))) fail(path, "short read of " + what);
  return s;
}

template <class Msg>
void parse_message(Msg& msg, const void* data, size_t size, const std::string& where, const char* what) {
  if (int64_t(size) > kMaxFileBytes) fail(where, std::string(what) + " larger than 2 GiB");
  google::protobuf::io::CodedInputStream in(static_cast<const uint8_t*>(data), int(size));
  in.SetRecursionLimit(kRecursionLimit);
  if (!msg.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    fail(where, std::string("not a valid ") + what + " (truncated, a bad varint or length, or nesting deeper than " +
                    std::to_string(kRecursionLimit) + ")");
}

int64_t checked_numel(const pb::TensorProto& t, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0) fail(where, "tensor '" + t.name() + "' has a negative dimension " + std::to_string(d));
    if (d > 0 && n > kMaxElements / d) fail(where, "tensor '" + t.name() + "' has more than 2^34 elements");
    n *= d;
  }
  return n;
}

// Paths of external data must stay inside the model's folder.
std::string external_path(const std::string& base_dir, const std::string& loc, const std::string& where) {
  if (base_dir.empty()) fail(where, "external data '" + loc + "' but no folder to read it from");
  std::filesystem::path p(loc);
  if (loc.empty() || p.is_absolute()) fail(where, "external data location '" + loc + "' must be a relative path");
  for (const auto& part : p)
    if (part == "..") fail(where, "external data location '" + loc + "' leaves the model's folder");
  return (std::filesystem::path(base_dir) / p).string();
}

std::string read_external(const pb::TensorProto& t, const std::string& where, const std::string& base_dir, int64_t want) {
  std::string loc;
  int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    auto num = [&](const std::string& v) {
      try {
        size_t pos = 0;
        long long x = std::stoll(v, &pos);
        if (pos != v.size() || x < 0) throw std::invalid_argument("");
        return int64_t(x);
      } catch (const std::exception&) {
        fail(where, "tensor '" + t.name() + "': external data " + kv.key() + " '" + v + "' is not a non-negative integer");
      }
    };
    if (kv.key() == "location") loc = kv.value();
    else if (kv.key() == "offset") offset = num(kv.value());
    else if (kv.key() == "length") length = num(kv.value());
  }
  std::string path = external_path(base_dir, loc, where);
  std::error_code ec;
  auto fsize = int64_t(std::filesystem::file_size(path, ec));
  if (ec) fail(where, "tensor '" + t.name() + "': cannot read external data file " + path + ": " + ec.message());
  if (length < 0) length = want;
  if (length != want)
    fail(where, "tensor '" + t.name() + "': external length " + std::to_string(length) + " bytes, the shape needs " + std::to_string(want));
  if (offset > fsize || length > fsize - offset)
    fail(where, "tensor '" + t.name() + "': external data [" + std::to_string(offset) + ", +" + std::to_string(length) +
                    ") is past the end of " + path + " (" + std::to_string(fsize) + " bytes)");
  std::ifstream f(path, std::ios::binary);
  std::string s(size_t(length), '\0');
  f.seekg(offset);
  if (!f || (length > 0 && !f.read(s.data(), std::streamsize(length)))) fail(where, "short read of external data " + path);
  return s;
}

template <class Field>
void check_count(const Field& f, int64_t n, const pb::TensorProto& t, const std::string& where, const char* field) {
  if (int64_t(f.size()) != n)
    fail(where, "tensor '" + t.name() + "' has " + std::to_string(f.size()) + " values in " + field + ", its shape needs " + std::to_string(n));
}

std::vector<int64_t> dims_of(const pb::TensorProto& t) { return {t.dims().begin(), t.dims().end()}; }

}  // namespace

void fail(const std::string& where, const std::string& what) { throw Error("[onnx] " + where + ": " + what); }

DType dtype_of_onnx(int32_t t, const std::string& where) {
  switch (t) {
    case pb::TensorProto::FLOAT: return dtypes::float32;
    case pb::TensorProto::UINT8: return dtypes::uint8;
    case pb::TensorProto::INT8: return dtypes::int8;
    case pb::TensorProto::UINT16: return dtypes::uint16;
    case pb::TensorProto::INT16: return dtypes::int16;
    case pb::TensorProto::INT32: return dtypes::int32;
    case pb::TensorProto::INT64: return dtypes::int64;
    case pb::TensorProto::BOOL: return dtypes::bool_;
    case pb::TensorProto::FLOAT16: return dtypes::float16;
    case pb::TensorProto::DOUBLE: return dtypes::float64;
    case pb::TensorProto::UINT32: return dtypes::uint32;
    case pb::TensorProto::UINT64: return dtypes::uint64;
    case pb::TensorProto::BFLOAT16: return dtypes::bfloat16;
    case 17:  // FLOAT8E4M3FN (newer schemas)
    return dtypes::fp8e4m3;
    case 19:  // FLOAT8E5M2
    return dtypes::fp8e5m2;
    default: {
      std::string name = pb::TensorProto::DataType_IsValid(t) ? pb::TensorProto::DataType_Name(pb::TensorProto::DataType(t))
                                                              : std::to_string(t);
      fail(where, "element type " + name + " is not supported");
    }
  }
}

int32_t onnx_of_dtype(DType d) {
  switch (dtypes::strong(d).scalar) {
    case Scalar::Float32: return pb::TensorProto::FLOAT;
    case Scalar::UInt8: return pb::TensorProto::UINT8;
    case Scalar::Int8: return pb::TensorProto::INT8;
    case Scalar::UInt16: return pb::TensorProto::UINT16;
    case Scalar::Int16: return pb::TensorProto::INT16;
    case Scalar::Int32: return pb::TensorProto::INT32;
    case Scalar::Int64: return pb::TensorProto::INT64;
    case Scalar::Bool: return pb::TensorProto::BOOL;
    case Scalar::Float16: return pb::TensorProto::FLOAT16;
    case Scalar::Float64: return pb::TensorProto::DOUBLE;
    case Scalar::UInt32: return pb::TensorProto::UINT32;
    case Scalar::UInt64: return pb::TensorProto::UINT64;
    case Scalar::BFloat16: return pb::TensorProto::BFLOAT16;
    case Scalar::Fp8E4M3: return 17;
    case Scalar::Fp8E5M2: return 19;
    default: return pb::TensorProto::UNDEFINED;
  }
}

Tensor tensor_of_proto(const pb::TensorProto& t, const std::string& where, const std::string& base_dir) {
  if (t.has_segment()) fail(where, "tensor '" + t.name() + "' is segmented, which is not supported");
  DType d = dtype_of_onnx(t.data_type(), where + ": tensor '" + t.name() + "'");
  int64_t n = checked_numel(t, where);
  auto item = int64_t(d.itemsize());
  Shape shape = dims_of(t);
  // Every path checks the data present against the shape before allocating (a hostile shape claims terabytes).
  std::vector<uint8_t> bytes;
  auto put = [&](const auto& field, const char* name, auto convert) {
    check_count(field, n, t, where, name);
    bytes.resize(size_t(n * item));
    for (int64_t i = 0; i < n; i++) {
      auto v = convert(field[int(i)]);
      std::memcpy(&bytes[size_t(i * item)], &v, sizeof(v));
    }
  };
  if (t.data_location() == pb::TensorProto::EXTERNAL) {
    std::string s = read_external(t, where, base_dir, n * item);
    bytes.assign(s.begin(), s.end());
  } else if (t.has_raw_data()) {
    if (int64_t(t.raw_data().size()) != n * item)
      fail(where, "tensor '" + t.name() + "' has " + std::to_string(t.raw_data().size()) + " raw bytes, shape " +
                      shape_str(shape) + " of " + d.name() + " needs " + std::to_string(n * item));
    if (d != dtypes::bool_) return Tensor::from_blob(t.raw_data().data(), shape, d);  // one copy, into the buffer
    bytes.assign(t.raw_data().begin(), t.raw_data().end());
    for (auto& b : bytes) b = b != 0;
  } else {
    switch (d.scalar) {
      case Scalar::Float32: put(t.float_data(), "float_data", [](float v) { return v; }); break;
      case Scalar::Float64: put(t.double_data(), "double_data", [](double v) { return v; }); break;
      case Scalar::Int64: put(t.int64_data(), "int64_data", [](int64_t v) { return v; }); break;
      case Scalar::UInt32: put(t.uint64_data(), "uint64_data", [](uint64_t v) { return uint32_t(v); }); break;
      case Scalar::UInt64: put(t.uint64_data(), "uint64_data", [](uint64_t v) { return v; }); break;
      case Scalar::Int32: put(t.int32_data(), "int32_data", [](int32_t v) { return v; }); break;
      case Scalar::Int16: put(t.int32_data(), "int32_data", [](int32_t v) { return int16_t(v); }); break;
      case Scalar::UInt16: case Scalar::Float16: case Scalar::BFloat16:
        put(t.int32_data(), "int32_data", [](int32_t v) { return uint16_t(v); });
        break;
      case Scalar::Int8: put(t.int32_data(), "int32_data", [](int32_t v) { return int8_t(v); }); break;
      case Scalar::Bool: put(t.int32_data(), "int32_data", [](int32_t v) { return uint8_t(v != 0); }); break;
      default: put(t.int32_data(), "int32_data", [](int32_t v) { return uint8_t(v); }); break;
    }
  }
  return Tensor::from_blob(bytes.data(), shape, d);
}

Value value_of_proto(const pb::TensorProto& t, const std::string& where, const std::string& base_dir) {
  if (t.data_type() != pb::TensorProto::STRING) return Value::of(tensor_of_proto(t, where, base_dir));
  int64_t n = checked_numel(t, where);
  check_count(t.string_data(), n, t, where, "string_data");
  return Value::of_strings({t.string_data().begin(), t.string_data().end()}, dims_of(t));
}

Tensor parse_tensor(const void* data, size_t size, const std::string& name) {
  pb::TensorProto t;
  parse_message(t, data, size, name, "TensorProto");
  return tensor_of_proto(t, name, "");
}

Tensor load_tensor(const std::string& path) {
  std::string s = read_file(path, "tensor file");
  pb::TensorProto t;
  parse_message(t, s.data(), s.size(), path, "TensorProto");
  return tensor_of_proto(t, path, std::filesystem::path(path).parent_path().string());
}

Value load_value(const std::string& path, const std::string& kind) {
  std::string s = read_file(path, "value file");
  if (kind == "tensor") {
    pb::TensorProto t;
    parse_message(t, s.data(), s.size(), path, "TensorProto");
    return value_of_proto(t, path, std::filesystem::path(path).parent_path().string());
  }
  auto seq_of = [&](const pb::SequenceProto& sp) {
    if (sp.elem_type() != pb::SequenceProto::TENSOR) fail(path, "only sequences of tensors are supported");
    std::vector<Tensor> ts;
    for (const auto& t : sp.tensor_values()) ts.push_back(tensor_of_proto(t, path, ""));
    return Value::seq(std::move(ts));
  };
  if (kind == "sequence") {
    pb::SequenceProto sp;
    parse_message(sp, s.data(), s.size(), path, "SequenceProto");
    return seq_of(sp);
  }
  if (kind == "optional") {
    pb::OptionalProto op;
    parse_message(op, s.data(), s.size(), path, "OptionalProto");
    if (op.has_tensor_value()) return Value::of(tensor_of_proto(op.tensor_value(), path, ""));
    if (op.has_sequence_value()) return seq_of(op.sequence_value());
    return Value{};
  }
  fail(path, "values of kind '" + kind + "' are not supported");
}

namespace {

std::string kind_of_type(const pb::TypeProto& t) {
  if (t.has_tensor_type()) return "tensor";
  if (t.has_sequence_type()) return "sequence";
  if (t.has_optional_type()) return "optional";
  return "other";
}

ValueInfo info_of(const pb::ValueInfoProto& v, const std::string& where) {
  ValueInfo vi;
  vi.name = v.name();
  const pb::TypeProto& t = v.type();
  if (t.has_tensor_type()) {
    const auto& tt = t.tensor_type();
    if (tt.elem_type() != pb::TensorProto::STRING && tt.elem_type() != pb::TensorProto::UNDEFINED) {
      try {
        vi.dtype = dtype_of_onnx(tt.elem_type(), where);
      } catch (const Error&) {
      }
    }
    if (tt.has_shape()) {
      vi.has_shape = true;
      for (const auto& d : tt.shape().dim()) vi.shape.push_back(d.has_dim_value() && d.dim_value() >= 0 ? d.dim_value() : -1);
    }
  }
  return vi;
}

}  // namespace

Model Model::parse(const void* data, size_t size, const std::string& name, const std::string& base_dir) {
  auto impl = std::make_shared<Impl>();
  impl->name = name;
  impl->base_dir = base_dir;
  parse_message(impl->proto, data, size, name, "ONNX model");
  const pb::ModelProto& m = impl->proto;
  if (!m.has_graph()) fail(name, "the model has no graph");
  for (const auto& o : m.opset_import()) {
    std::string dom = o.domain() == "ai.onnx" ? "" : o.domain();
    if (o.version() < 1) fail(name, "opset version " + std::to_string(o.version()) + " for domain '" + o.domain() + "'");
    impl->opsets[dom] = o.version();
  }
  if (m.opset_import_size() == 0) impl->opsets[""] = 1;  // IR version 2 models had no opset_import
  const pb::GraphProto& g = m.graph();
  if (g.sparse_initializer_size() > 0) fail(name, "sparse initializers are not supported");
  for (const auto& t : g.initializer()) {
    if (t.name().empty()) fail(name, "an initializer has no name");
    impl->initializers[t.name()] = tensor_of_proto(t, name, base_dir);
  }
  for (const auto& n : g.node())
    if (n.op_type() == "Constant" && (n.domain().empty() || n.domain() == "ai.onnx"))
      for (const auto& a : n.attribute())
        if (a.name() == "value" && a.has_t()) impl->constants[&n] = value_of_proto(a.t(), name, base_dir);
  fold_batchnorm(*impl);
  for (const auto& v : g.input()) {
    impl->kinds[v.name()] = kind_of_type(v.type());
    if (!impl->initializers.count(v.name())) impl->inputs.push_back(info_of(v, name));
  }
  for (const auto& v : g.output()) {
    impl->kinds[v.name()] = kind_of_type(v.type());
    impl->outputs.push_back(info_of(v, name));
  }
  for (const auto& n : g.node())
    if (n.op_type().empty()) fail(name, "node '" + n.name() + "' has no op_type");
  Model out;
  out.impl_ = std::move(impl);
  return out;
}

Model Model::load(const std::string& path) {
  std::string s = read_file(path, "ONNX model");
  std::string dir = std::filesystem::path(path).parent_path().string();
  return parse(s.data(), s.size(), path, dir.empty() ? "." : dir);
}

const std::vector<ValueInfo>& Model::inputs() const { return impl_->inputs; }
const std::vector<ValueInfo>& Model::outputs() const { return impl_->outputs; }
int64_t Model::opset(const std::string& domain) const {
  auto it = impl_->opsets.find(domain == "ai.onnx" ? "" : domain);
  return it == impl_->opsets.end() ? 0 : it->second;
}
size_t Model::num_nodes() const { return size_t(impl_->proto.graph().node_size()); }

std::string Model::kind(const std::string& name) const {
  auto it = impl_->kinds.find(name);
  return it == impl_->kinds.end() ? "tensor" : it->second;
}

}  // namespace tg::onnx
