// The ONNX runner: models built in memory with the protobuf API, run through tg; hostile input refused with
// tg::Error naming the file and the problem.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <string>
#include <tuple>

#include "../../src/onnx/onnx_impl.hpp"
#include "../scoped_env.hpp"
#include "tg/device.hpp"
#include "tg/schedule.hpp"

using tg::DType, tg::Error, tg::Shape, tg::Tensor;
namespace dtypes = tg::dtypes;
namespace pb = ::onnx;
namespace tgx = tg::onnx;

namespace {

pb::ValueInfoProto tensor_info(const std::string& name, int elem, std::vector<int64_t> shape) {
  pb::ValueInfoProto v;
  v.set_name(name);
  auto* tt = v.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  for (int64_t d : shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
  return v;
}

// A one-node model: inputs and output given by name, float tensors.
pb::ModelProto one_node(const std::string& op, std::vector<std::pair<std::string, std::vector<int64_t>>> inputs, const std::string& out,
                        int64_t opset = 13) {
  pb::ModelProto m;
  m.set_ir_version(8);
  auto* os = m.add_opset_import();
  os->set_domain("");
  os->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* n = g->add_node();
  n->set_op_type(op);
  for (auto& [name, shape] : inputs) {
    n->add_input(name);
    *g->add_input() = tensor_info(name, pb::TensorProto::FLOAT, shape);
  }
  n->add_output(out);
  *g->add_output() = tensor_info(out, pb::TensorProto::FLOAT, {});
  return m;
}

// Declare graph input `name` of m as elem (one_node declares every input float).
void set_elem(pb::ModelProto& m, const std::string& name, int elem) {
  for (auto& in : *m.mutable_graph()->mutable_input())
    if (in.name() == name) in.mutable_type()->mutable_tensor_type()->set_elem_type(elem);
}

tgx::Model parse(const pb::ModelProto& m, const std::string& name = "mem.onnx", const std::string& dir = "") {
  std::string s = m.SerializeAsString();
  return tgx::Model::parse(s.data(), s.size(), name, dir);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a model built in memory runs Add with numpy broadcasting") {
  tgx::Model m = parse(one_node("Add", {{"a", {2, 3}}, {"b", {3}}}, "c"));
  CHECK(m.inputs().size() == 2);
  CHECK(m.opset() == 13);
  auto out = m.run({{"a", tgx::Value::of(Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}))},
                    {"b", tgx::Value::of(Tensor::from_vector<float>({10, 20, 30}))}});
  CHECK(out.at("c").tensor.to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
}

TEST_CASE("Slice with a negative step and clamped bounds follows ONNX, not Python, for end -INT_MAX") {
  pb::ModelProto mp = one_node("Slice", {{"x", {5}}, {"starts", {1}}, {"ends", {1}}, {"steps", {1}}}, "y");
  mp.mutable_graph()->mutable_node(0)->clear_input();
  for (const char* n : {"x", "starts", "ends", "", "steps"}) mp.mutable_graph()->mutable_node(0)->add_input(n);
  for (const char* n : {"starts", "ends", "steps"}) set_elem(mp, n, pb::TensorProto::INT64);
  tgx::Model m = parse(mp);
  auto i64 = [](int64_t v) { return tgx::Value::of(Tensor::from_vector<int64_t>({v})); };
  auto out = m.run({{"x", tgx::Value::of(Tensor::from_vector<float>({0, 1, 2, 3, 4}))},
                    {"starts", i64(-1)},
                    {"ends", i64(INT64_MIN + 1)},
                    {"steps", i64(-2)}});
  CHECK(out.at("y").tensor.to_vector<float>() == std::vector<float>{4, 2, 0});
}

TEST_CASE("ReduceSum with an empty axes input reduces everything (an empty tensor read on the host)") {
  pb::ModelProto mp = one_node("ReduceSum", {{"x", {2, 2}}, {"axes", {0}}}, "y");
  set_elem(mp, "axes", pb::TensorProto::INT64);
  tgx::Model m = parse(mp);
  auto out = m.run({{"x", tgx::Value::of(Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}))},
                    {"axes", tgx::Value::of(Tensor::from_vector<int64_t>(std::vector<int64_t>{}, {0}))}});
  CHECK(out.at("y").tensor.shape() == Shape{1, 1});
  CHECK(out.at("y").tensor.to_vector<float>() == std::vector<float>{10});
  CHECK(Tensor::zeros({0}, dtypes::int64).to_vector<int64_t>().empty());
}

TEST_CASE("an unsupported operator is an error naming the operator and the opset") {
  tgx::Model m = parse(one_node("NoSuchOp", {{"a", {1}}}, "c", 17));
  std::string e = error_of([&] { m.run({{"a", tgx::Value::of(Tensor::from_vector<float>({1}))}}); });
  CHECK(e.find("NoSuchOp") != std::string::npos);
  CHECK(e.find("opset 17") != std::string::npos);
  CHECK(e.find("mem.onnx") != std::string::npos);
}

TEST_CASE("a missing input is an error naming it") {
  tgx::Model m = parse(one_node("Relu", {{"a", {1}}}, "c"));
  CHECK(error_of([&] { m.run({}); }).find("'a'") != std::string::npos);
}

TEST_CASE("truncated, garbage and deeply nested protobuf is refused with the file's name") {
  std::string s = one_node("Add", {{"a", {2}}, {"b", {2}}}, "c").SerializeAsString();
  for (size_t cut : {s.size() / 2, s.size() - 1, size_t(3)}) {
    std::string e = error_of([&] { tgx::Model::parse(s.data(), cut, "cut.onnx"); });
    CHECK(e.find("cut.onnx") != std::string::npos);
  }
  std::string bad_varint = "\x3a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";  // graph field, an 11-byte length varint
  CHECK_THROWS_AS(tgx::Model::parse(bad_varint.data(), bad_varint.size(), "v.onnx"), Error);
  std::string past_end = "\x3a\x7f\x0a";  // graph of 127 bytes, 1 present
  CHECK_THROWS_AS(tgx::Model::parse(past_end.data(), past_end.size(), "p.onnx"), Error);
  // graphs nested in If-style attributes 200 deep: beyond the recursion limit
  pb::GraphProto inner;
  for (int i = 0; i < 200; i++) {
    pb::GraphProto outer;
    auto* a = outer.add_node()->add_attribute();
    a->set_name("then_branch");
    *a->mutable_g() = inner;
    inner = outer;
  }
  pb::ModelProto deep;
  *deep.mutable_graph() = inner;
  std::string d = deep.SerializeAsString();
  std::string e = error_of([&] { tgx::Model::parse(d.data(), d.size(), "deep.onnx"); });
  CHECK(e.find("deep.onnx") != std::string::npos);
  CHECK(e.find("nesting") != std::string::npos);
}

TEST_CASE("tensor data of the wrong size is refused") {
  pb::TensorProto t;
  t.set_name("w");
  t.set_data_type(pb::TensorProto::FLOAT);
  t.add_dims(4);
  t.set_raw_data(std::string(12, '\0'));  // 3 floats for 4 elements
  std::string s = t.SerializeAsString();
  std::string e = error_of([&] { tgx::parse_tensor(s.data(), s.size(), "w.pb"); });
  CHECK(e.find("w.pb") != std::string::npos);
  CHECK(e.find("needs 16") != std::string::npos);
  t.clear_raw_data();
  t.add_float_data(1);
  s = t.SerializeAsString();
  CHECK_THROWS_AS(tgx::parse_tensor(s.data(), s.size(), "w.pb"), Error);
  t.set_dims(0, -2);
  s = t.SerializeAsString();
  CHECK(error_of([&] { tgx::parse_tensor(s.data(), s.size(), "w.pb"); }).find("negative") != std::string::npos);
  t.set_dims(0, int64_t(1) << 40);
  t.add_dims(int64_t(1) << 40);
  s = t.SerializeAsString();
  CHECK_THROWS_AS(tgx::parse_tensor(s.data(), s.size(), "w.pb"), Error);
}

TEST_CASE("initializers from external data load; paths leaving the model's folder are refused") {
  auto dir = std::filesystem::temp_directory_path() / ("tg_onnx_ext_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  float vals[3] = {1.5f, 2.5f, 3.5f};
  {
    std::ofstream f(dir / "w.bin", std::ios::binary);
    f.write("pad!", 4);
    f.write(reinterpret_cast<const char*>(vals), sizeof vals);
  }
  pb::ModelProto m = one_node("Add", {{"a", {3}}, {"w", {3}}}, "c");
  auto* init = m.mutable_graph()->add_initializer();
  init->set_name("w");
  init->set_data_type(pb::TensorProto::FLOAT);
  init->add_dims(3);
  init->set_data_location(pb::TensorProto::EXTERNAL);
  auto kv = [&](const char* k, const std::string& v) {
    auto* e = init->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  kv("location", "w.bin");
  kv("offset", "4");
  tgx::Model model = parse(m, "ext.onnx", dir.string());
  CHECK(model.inputs().size() == 1);  // w is an initializer
  auto out = model.run({{"a", tgx::Value::of(Tensor::from_vector<float>({1, 1, 1}))}});
  CHECK(out.at("c").tensor.to_vector<float>() == std::vector<float>{2.5f, 3.5f, 4.5f});
  init->mutable_external_data(1)->set_value("8");  // 4 + 12 > 16 bytes: past the end
  CHECK(error_of([&] { parse(m, "ext.onnx", dir.string()); }).find("past the end") != std::string::npos);
  init->mutable_external_data(0)->set_value("../w.bin");
  CHECK(error_of([&] { parse(m, "ext.onnx", dir.string()); }).find("leaves the model's folder") != std::string::npos);
  init->mutable_external_data(0)->set_value("/etc/passwd");
  CHECK_THROWS_AS(parse(m, "ext.onnx", dir.string()), Error);
  CHECK_THROWS_AS(parse(m, "ext.onnx", ""), Error);  // in-memory models may not read files
  std::filesystem::remove_all(dir);
}

TEST_CASE("shape-computing subgraphs (Shape, Gather, Concat, Reshape) are read on the host") {
  pb::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  *g->add_input() = tensor_info("x", pb::TensorProto::FLOAT, {2, 3, 4});
  auto node = [&](const char* op, std::vector<std::string> in, const char* out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    for (auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  };
  auto* c = g->add_initializer();
  c->set_name("minus1");
  c->set_data_type(pb::TensorProto::INT64);
  c->add_dims(1);
  c->add_int64_data(-1);
  node("Shape", {"x"}, "s");
  auto* sl = node("Shape", {"x"}, "s0");
  auto* a = sl->add_attribute();
  a->set_name("end");
  a->set_type(pb::AttributeProto::INT);
  a->set_i(1);
  node("Concat", {"s0", "minus1"}, "shape2")->add_attribute()->CopyFrom([] {
    pb::AttributeProto at;
    at.set_name("axis");
    at.set_type(pb::AttributeProto::INT);
    at.set_i(0);
    return at;
  }());
  node("Reshape", {"x", "shape2"}, "y");
  *g->add_output() = tensor_info("y", pb::TensorProto::FLOAT, {});
  tgx::Model model = parse(m);
  auto out = model.run({{"x", tgx::Value::of(Tensor::arange(24, dtypes::float32).reshape({2, 3, 4}))}});
  CHECK(out.at("y").tensor.shape() == Shape{2, 12});
}

TEST_CASE("inputs are checked against the graph's declared element types and fixed dimensions, naming the input") {
  pb::ModelProto mp = one_node("Add", {{"a", {2, 3}}, {"b", {3}}}, "c");
  // b's first dimension symbolic: any size is accepted there
  mp.mutable_graph()->mutable_input(1)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param("n");
  tgx::Model m = parse(mp);
  auto f32 = [](Shape s) { return tgx::Value::of(Tensor::zeros(s, dtypes::float32)); };
  auto run = [&](tgx::Value a, tgx::Value b) { return error_of([&] { m.run({{"a", a}, {"b", b}}); }); };
  CHECK(run(f32({2, 3}), f32({3})).empty());
  CHECK(run(f32({2, 3}), f32({1})).empty());  // symbolic dimension
  // a float64 tensor for a float32 input: refused (as ONNX Runtime does), not run in float64
  std::string e = run(tgx::Value::of(Tensor::zeros({2, 3}, dtypes::float64)), f32({3}));
  CHECK(e.find("mem.onnx") != std::string::npos);
  CHECK(e.find("input 'a'") != std::string::npos);
  CHECK(e.find("float64") != std::string::npos);
  CHECK(e.find("float32") != std::string::npos);
  // a wrong fixed dimension and a wrong rank: named before any node runs
  e = run(f32({2, 4}), f32({3}));
  CHECK(e.find("input 'a' has shape (2, 4)") != std::string::npos);
  CHECK(e.find("(2, 3)") != std::string::npos);
  e = run(f32({2, 3}), f32({1, 3}));
  CHECK(e.find("input 'b' has shape (1, 3)") != std::string::npos);
  CHECK(e.find("(?,)") != std::string::npos);
  // a sequence for a tensor input
  e = run(f32({2, 3}), tgx::Value::seq({Tensor::zeros({3}, dtypes::float32)}));
  CHECK(e.find("input 'b' must be a tensor of float32") != std::string::npos);
}

TEST_CASE("Resize nearest by an integer factor repeats elements (a broadcast, no gather)") {
  pb::ModelProto mp = one_node("Resize", {{"x", {1, 2, 2, 3}}, {"roi", {0}}, {"scales", {4}}}, "y");
  tgx::Model m = parse(mp);
  std::vector<float> xs{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  auto out = m.run({{"x", tgx::Value::of(Tensor::from_vector(xs, {1, 2, 2, 3}))},
                    {"roi", tgx::Value::of(Tensor::from_vector<float>(std::vector<float>{}, {0}))},
                    {"scales", tgx::Value::of(Tensor::from_vector<float>({1, 1, 2, 3}))}});
  const Tensor& y = out.at("y").tensor;
  REQUIRE(y.shape() == Shape{1, 2, 4, 9});
  // no REDUCE in the graph: the repeat is movement ops on x
  for (const tg::UOp* u : tg::toposort(y.uop().get())) CHECK(u->op != tg::Ops::REDUCE_AXIS);
  std::vector<float> got = y.to_vector<float>();
  for (int c = 0; c < 2; c++)
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 9; j++) CHECK(got[size_t((c * 4 + i) * 9 + j)] == xs[size_t((c * 2 + i / 2) * 3 + j / 3)]);
}

TEST_CASE("a main-graph initializer is read once at load and may be overridden by an input of the same name") {
  pb::ModelProto mp = one_node("Add", {{"a", {3}}, {"w", {3}}}, "c");
  auto* w = mp.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(pb::TensorProto::FLOAT);
  w->add_dims(3);
  for (float v : {10.f, 20.f, 30.f}) w->add_float_data(v);
  tgx::Model m = parse(mp);
  CHECK(m.inputs().size() == 1);  // w has a default: not required
  auto a = tgx::Value::of(Tensor::from_vector<float>({1, 2, 3}));
  for (int run = 0; run < 2; run++)
    CHECK(m.run({{"a", a}}).at("c").tensor.to_vector<float>() == std::vector<float>{11, 22, 33});
  auto out = m.run({{"a", a}, {"w", tgx::Value::of(Tensor::from_vector<float>({100, 200, 300}))}});
  CHECK(out.at("c").tensor.to_vector<float>() == std::vector<float>{101, 202, 303});
}

TEST_CASE("repeated runs of one input signature replay the captured kernels; each result keeps its own values") {
  tgx::Model m = parse(one_node("Mul", {{"a", {-1, 3}}, {"b", {-1, 3}}}, "c"));
  std::vector<Tensor> results;
  for (int i = 0; i < 6; i++) {
    Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}), b = Tensor::full({2, 3}, float(i + 1)).realize();
    size_t before = tg::schedules_built();
    auto out = m.run({{"a", tgx::Value::of(a)}, {"b", tgx::Value::of(b)}});
    if (i >= 3) CHECK(tg::schedules_built() == before);  // runs 4 to 6 schedule nothing: replays
    results.push_back(out.at("c").tensor);
  }
  for (int i = 0; i < 6; i++) {  // earlier results are not overwritten by later runs
    CAPTURE(i);
    std::vector<float> want;
    for (float x : {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}) want.push_back(x * float(i + 1));
    CHECK(results[size_t(i)].to_vector<float>() == want);
  }
  // another shape: its own capture, the right values
  for (int i = 0; i < 5; i++) {
    auto out = m.run({{"a", tgx::Value::of(Tensor::from_vector<float>({1, 2, 3}, {1, 3}))},
                      {"b", tgx::Value::of(Tensor::from_vector<float>({3, 4, float(i)}, {1, 3}))}});
    CHECK(out.at("c").tensor.to_vector<float>() == std::vector<float>{3, 8, 3.f * float(i)});
  }
}

TEST_CASE("replays do not recompute what depends only on weights: Constant nodes are read once, their layout copies run once") {
  // y = Conv(Conv(x, W1), W2), both weights Constant nodes of one shape: on the CPU each is copied into the
  // channels-last layout by a kernel of its own, whose buffer the memory planner hands from W1's copy to W2's. The
  // replays launch neither copy, and their values are the eager run's on every call, exactly.
  pb::ModelProto mp;
  mp.set_ir_version(8);
  auto* os = mp.add_opset_import();
  os->set_domain("");
  os->set_version(13);
  auto* g = mp.mutable_graph();
  g->set_name("g");
  *g->add_input() = tensor_info("x", pb::TensorProto::FLOAT, {1, 16, 6, 6});
  *g->add_output() = tensor_info("y", pb::TensorProto::FLOAT, {});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.2f, 0.2f);
  for (const char* w : {"w1", "w2"}) {
    auto* c = g->add_node();
    c->set_op_type("Constant");
    c->add_output(w);
    auto* a = c->add_attribute();
    a->set_name("value");
    a->set_type(pb::AttributeProto::TENSOR);
    auto* t = a->mutable_t();
    t->set_data_type(pb::TensorProto::FLOAT);
    for (int64_t d : {16, 16, 3, 3}) t->add_dims(d);
    for (int i = 0; i < 16 * 16 * 9; i++) t->add_float_data(u(rng));
  }
  for (auto [in, w, out] : {std::tuple{"x", "w1", "h"}, std::tuple{"h", "w2", "y"}}) {
    auto* n = g->add_node();
    n->set_op_type("Conv");
    n->add_input(in), n->add_input(w), n->add_output(out);
    auto* p = n->add_attribute();
    p->set_name("pads");
    p->set_type(pb::AttributeProto::INTS);
    for (int k = 0; k < 4; k++) p->add_ints(1);
  }
  tgx::Model m = parse(mp);
  auto input = [&](int i) {
    std::vector<float> v(16 * 36);
    for (size_t k = 0; k < v.size(); k++) v[k] = float((int(k) * 7 + i * 13) % 23) / 23.0f - 0.5f;
    return Tensor::from_vector(v, {1, 16, 6, 6});
  };
  std::vector<size_t> launched;
  for (int i = 0; i < 6; i++) {
    CAPTURE(i);
    Tensor x = input(i).realize();
    size_t k0 = tg::kernels_run();
    std::vector<float> got = m.run({{"x", tgx::Value::of(x)}}).at("y").tensor.to_vector<float>();
    launched.push_back(tg::kernels_run() - k0);
    std::vector<float> want;
    {
      ScopedEnv eager("ONNX_JIT", "0");
      want = m.run({{"x", tgx::Value::of(x)}}).at("y").tensor.to_vector<float>();
    }
    CHECK(got == want);
  }
  if (tg::get_device(tg::default_device()).renderer().grid_limits().threads == 0) {
    CHECK(launched[3] + 2 == launched[0]);  // the two weight copies are not replayed
    CHECK(launched[5] == launched[3]);
  }
}

TEST_CASE("a graph whose shape comes from its input's values runs eagerly, right on every call") {
  // y = Reshape(x, s) with s an input: the target shape is read on the host from data that changes per call
  pb::ModelProto p = one_node("Reshape", {{"x", {6}}, {"s", {2}}}, "y");
  set_elem(p, "s", pb::TensorProto::INT64);
  tgx::Model m = parse(p);
  for (int i = 0; i < 6; i++) {
    CAPTURE(i);
    Shape want = i % 2 ? Shape{2, 3} : Shape{3, 2};
    auto out = m.run({{"x", tgx::Value::of(Tensor::arange(6, dtypes::float32))},
                      {"s", tgx::Value::of(Tensor::from_vector<int64_t>({want[0], want[1]}))}});
    CHECK(out.at("y").tensor.shape() == want);
    CHECK(out.at("y").tensor.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  }
}

namespace {

// y = BatchNormalization(Conv(x, w[, b])): w and b initializers; the BN's scale a Constant node, its bias, mean and
// var initializers (both kinds of weights load reads).
pb::ModelProto conv_bn(const std::vector<float>& w, const std::vector<float>* b, const std::vector<float> bn[4]) {
  pb::ModelProto mp;
  mp.set_ir_version(8);
  auto* os = mp.add_opset_import();
  os->set_domain("");
  os->set_version(13);
  auto* g = mp.mutable_graph();
  g->set_name("g");
  *g->add_input() = tensor_info("x", pb::TensorProto::FLOAT, {1, 3, 5, 7});
  *g->add_output() = tensor_info("y", pb::TensorProto::FLOAT, {});
  auto init = [&](const std::string& name, const std::vector<float>& v, std::vector<int64_t> dims) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(pb::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    for (float x : v) t->add_float_data(x);
  };
  init("w", w, {4, 3, 3, 3});
  if (b) init("b", *b, {4});
  auto* c = g->add_node();
  c->set_op_type("Constant");
  c->add_output("scale");
  auto* a = c->add_attribute();
  a->set_name("value");
  a->set_type(pb::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(pb::TensorProto::FLOAT);
  a->mutable_t()->add_dims(4);
  for (float x : bn[0]) a->mutable_t()->add_float_data(x);
  init("bias", bn[1], {4});
  init("mean", bn[2], {4});
  init("var", bn[3], {4});
  auto* conv = g->add_node();
  conv->set_op_type("Conv");
  conv->add_input("x"), conv->add_input("w");
  if (b) conv->add_input("b");
  conv->add_output("h");
  auto* p = conv->add_attribute();
  p->set_name("pads");
  p->set_type(pb::AttributeProto::INTS);
  for (int k = 0; k < 4; k++) p->add_ints(1);
  auto* n = g->add_node();
  n->set_op_type("BatchNormalization");
  for (const char* in : {"h", "scale", "bias", "mean", "var"}) n->add_input(in);
  n->add_output("y");
  auto* e = n->add_attribute();
  e->set_name("epsilon");
  e->set_type(pb::AttributeProto::FLOAT);
  e->set_f(1e-3f);
  return mp;
}

}  // namespace

TEST_CASE("a BatchNormalization after a Conv is folded into the Conv's weights by load, as ONNX Runtime folds it") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto vec = [&](size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = lo + (hi - lo) * (u(rng) + 1.f) / 2.f;
    return v;
  };
  std::vector<float> w = vec(4 * 27, -1, 1), b = vec(4, -1, 1);
  std::vector<float> bn[4] = {vec(4, 0.5f, 2), vec(4, -1, 1), vec(4, -1, 1), vec(4, 0.1f, 3)};
  std::vector<float> xv = vec(3 * 35, -1, 1);
  auto x = tgx::Value::of(Tensor::from_vector(xv, {1, 3, 5, 7}));
  for (bool with_b : {true, false}) {
    CAPTURE(with_b);
    // ONNX Runtime's ConvBNFusion, in float: s = scale / sqrt(var + eps), W' = W * s, B' = (B - mean) * s + bias
    std::vector<float> w2 = w, b2(4);
    for (size_t c = 0; c < 4; c++) {
      float s = bn[0][c] / std::sqrt(bn[3][c] + 1e-3f);
      for (size_t k = 0; k < 27; k++) w2[c * 27 + k] *= s;
      b2[c] = with_b ? (b[c] - bn[2][c]) * s + bn[1][c] : bn[1][c] - bn[2][c] * s;
    }
    pb::ModelProto ref = one_node("Conv", {{"x", {1, 3, 5, 7}}, {"w", {4, 3, 3, 3}}, {"b", {4}}}, "y");
    auto* p = ref.mutable_graph()->mutable_node(0)->add_attribute();
    p->set_name("pads");
    p->set_type(pb::AttributeProto::INTS);
    for (int k = 0; k < 4; k++) p->add_ints(1);
    std::vector<float> want =
        parse(ref).run({{"x", x}, {"w", tgx::Value::of(Tensor::from_vector(w2, {4, 3, 3, 3}))}, {"b", tgx::Value::of(Tensor::from_vector(b2))}})
            .at("y").tensor.to_vector<float>();
    // the folded model runs exactly that convolution: no sqrt or division left in any kernel
    tgx::Model m = parse(conv_bn(w, with_b ? &b : nullptr, bn));
    std::vector<std::string> ops;
    tg::set_kernel_compile_hook([&](const tg::UOpRef& ast, const std::string&) {
      for (const tg::UOp* n : tg::toposort(ast.get())) ops.push_back(tg::op_name(n->op));
    });
    std::vector<float> got;
    for (int run = 0; run < 4; run++) {  // eager, the capture, replays
      CAPTURE(run);
      got = m.run({{"x", x}}).at("y").tensor.to_vector<float>();
      CHECK(got == want);
    }
    tg::set_kernel_compile_hook(nullptr);
    CHECK(std::count(ops.begin(), ops.end(), "SQRT") == 0);
    CHECK(std::count(ops.begin(), ops.end(), "RECIPROCAL") == 0);
    // unfolded (ONNX_FOLD_BN=0) the BN's formula: the same values to float rounding
    std::vector<float> unfolded;
    {
      ScopedEnv off("ONNX_FOLD_BN", "0");
      unfolded = parse(conv_bn(w, with_b ? &b : nullptr, bn)).run({{"x", x}}).at("y").tensor.to_vector<float>();
    }
    REQUIRE(unfolded.size() == want.size());
    for (size_t i = 0; i < want.size(); i++) CHECK(std::fabs(unfolded[i] - want[i]) <= 1e-5f * (1.f + std::fabs(want[i])));
    // an input overriding a folded initializer runs the original graph: the override is used, not the fold
    auto mean2 = tgx::Value::of(Tensor::from_vector<float>({0.5f, -0.5f, 0.25f, 0.f}));
    std::vector<float> over = m.run({{"x", x}, {"mean", mean2}}).at("y").tensor.to_vector<float>(), over_ref;
    {
      ScopedEnv off("ONNX_FOLD_BN", "0");
      over_ref = parse(conv_bn(w, with_b ? &b : nullptr, bn)).run({{"x", x}, {"mean", mean2}}).at("y").tensor.to_vector<float>();
    }
    CHECK(over == over_ref);
    CHECK(over != got);
  }
}
