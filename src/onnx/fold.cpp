// Graph-level rules applied once by load: BatchNormalization (inference) folded into the Conv before it when both
// take their parameters from initializers, as ONNX Runtime's ConvBNFusion does. The folded graph is a copy of the
// main graph; the original stays for runs that override a folded initializer with an input of the same name.
#include <cmath>
#include <cstdio>
#include <set>

#include "onnx_impl.hpp"
#include "tg/env.hpp"

namespace tg::onnx {

namespace {

bool plain_domain(const pb::NodeProto& n) { return n.domain().empty() || n.domain() == "ai.onnx"; }

const pb::AttributeProto* attr_of(const pb::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

// Every value name a graph's nodes read, subgraphs (If/Loop/Scan bodies, which may read outer names) included.
void count_uses(const pb::GraphProto& g, std::map<std::string, int>& uses) {
  for (const auto& n : g.node()) {
    for (const auto& in : n.input())
      if (!in.empty()) uses[in]++;
    for (const auto& a : n.attribute()) {
      if (a.has_g()) count_uses(a.g(), uses);
      for (const auto& sg : a.graphs()) count_uses(sg, uses);
    }
  }
}

}  // namespace

// Conv(X, W[, B]) -> BatchNormalization(scale, bias, mean, var) becomes Conv(X, W', B') with, in float32 and in
// ONNX Runtime's order, s = scale / sqrt(var + eps), W'[m] = W[m] * s[m], B' = (B - mean) * s + bias (without B:
// bias - mean * s). The BN's per-element sqrt and division leave the convolution's kernel, and its four per-channel
// loads; each output is then the convolution plus one bias add. Folded when: the Conv's output is read only by the
// BN (not a graph output, not read by a subgraph), the BN is in inference mode with one output, W, B and the BN's
// parameters are float32 initializers, and the parameters have W's output-channel count. A run whose inputs
// override one of those initializers runs the original graph (main_graph). ONNX_FOLD_BN=0 turns the rule off.
void fold_batchnorm(Model::Impl& m) {
  if (getenv_int("ONNX_FOLD_BN", 1, 0, 1) == 0) return;
  const pb::GraphProto& g = m.proto.graph();
  auto os = m.opsets.find("");
  const int64_t opset = os == m.opsets.end() ? 0 : os->second;
  std::map<std::string, int> uses;
  count_uses(g, uses);
  for (const auto& o : g.output()) uses[o.name()] += 2;  // a graph output is never folded away
  std::map<std::string, const Tensor*> consts;  // the values load read: Constant nodes', then initializers
  for (const auto& [n, v] : m.constants)
    if (v.kind == Value::Kind::Tensor && n->output_size() == 1) consts[n->output(0)] = &v.tensor;
  for (const auto& [k, t] : m.initializers) consts[k] = &t;
  auto param = [&](const std::string& name) -> const Tensor* {
    auto it = consts.find(name);
    return it != consts.end() && it->second->dtype() == dtypes::float32 ? it->second : nullptr;
  };
  std::map<std::string, const pb::NodeProto*> conv_of;  // a Conv's output name -> the Conv
  for (const auto& n : g.node())
    if (plain_domain(n) && n.op_type() == "Conv" && n.output_size() == 1) conv_of[n.output(0)] = &n;
  struct Fold {
    std::string w, b, out;  // the folded initializers' names and the BN's output the Conv now writes
  };
  std::map<const pb::NodeProto*, Fold> folds;     // by Conv
  std::set<const pb::NodeProto*> removed;         // the folded BNs
  for (const auto& bn : g.node()) {
    if (!plain_domain(bn) || bn.op_type() != "BatchNormalization" || bn.input_size() != 5) continue;
    bool extra_out = false;
    for (int i = 1; i < bn.output_size(); i++) extra_out |= !bn.output(i).empty();
    const auto* tm = attr_of(bn, "training_mode");
    const auto* is_test = attr_of(bn, "is_test");
    const auto* spatial = attr_of(bn, "spatial");
    if (extra_out || bn.output_size() < 1 || (tm && tm->i() != 0) || (opset < 9 && is_test && is_test->i() == 0) ||
        (spatial && spatial->i() == 0))
      continue;
    auto ci = conv_of.find(bn.input(0));
    if (ci == conv_of.end() || uses[bn.input(0)] != 1 || folds.count(ci->second)) continue;
    const pb::NodeProto& conv = *ci->second;
    if (conv.input_size() < 2 || conv.input_size() > 3) continue;
    const Tensor* w = param(conv.input(1));
    const bool has_b = conv.input_size() == 3 && !conv.input(2).empty();
    const Tensor* b = has_b ? param(conv.input(2)) : nullptr;
    const Tensor *scale = param(bn.input(1)), *beta = param(bn.input(2)), *mean = param(bn.input(3)),
                 *var = param(bn.input(4));
    if (!w || (has_b && !b) || !scale || !beta || !mean || !var || w->ndim() < 3) continue;
    const int64_t cout = w->shape()[0];
    bool ok = cout > 0;
    for (const Tensor* t : {scale, beta, mean, var, b})
      if (t && (t->ndim() != 1 || t->shape()[0] != cout)) ok = false;
    if (!ok) continue;
    const float eps = float(attr_of(bn, "epsilon") ? attr_of(bn, "epsilon")->f() : 1e-5f);
    std::vector<float> s = scale->to_vector<float>(), v = var->to_vector<float>(), mu = mean->to_vector<float>(),
                       bb = beta->to_vector<float>(), wv = w->to_vector<float>();
    std::vector<float> bias(static_cast<size_t>(cout));
    const std::vector<float> cb = b ? b->to_vector<float>() : std::vector<float>{};
    for (size_t c = 0; c < size_t(cout); c++) {
      s[c] = s[c] / std::sqrt(v[c] + eps);
      bias[c] = b ? (cb[c] - mu[c]) * s[c] + bb[c] : bb[c] - mu[c] * s[c];
    }
    const size_t per = wv.size() / size_t(cout);
    for (size_t i = 0; i < wv.size(); i++) wv[i] *= s[i / per];
    Fold f;
    f.w = "tg.bn_folded/" + bn.output(0) + "/W";
    f.b = "tg.bn_folded/" + bn.output(0) + "/B";
    f.out = bn.output(0);
    m.folded_initializers[f.w] = Tensor::from_vector(wv, w->shape()).realize();
    m.folded_initializers[f.b] = Tensor::from_vector(bias, {cout}).realize();
    for (const auto& name : {conv.input(1), bn.input(1), bn.input(2), bn.input(3), bn.input(4)}) m.folded_from.insert(name);
    if (b) m.folded_from.insert(conv.input(2));
    folds[&conv] = f;
    removed.insert(&bn);
  }
  if (debug_level() >= 1)
    std::fprintf(stderr, "onnx %s: %zu BatchNormalization node(s) folded into their Conv\n", m.name.c_str(), folds.size());
  if (folds.empty()) return;
  // Constant nodes only the folded nodes read go too
  for (const auto& [conv, f] : folds) {
    uses[conv->input(1)]--;
    if (conv->input_size() == 3 && !conv->input(2).empty()) uses[conv->input(2)]--;
  }
  for (const pb::NodeProto* bn : removed)
    for (int i = 1; i < 5; i++) uses[bn->input(i)]--;
  // The copy leaves out what runs of it never read, the weights: the initializers (load read them into
  // m.initializers, which runs of the folded graph take) and the payloads of the Constant nodes load read (runs take
  // those from m.constants). Each is moved out of the main graph while it is copied, then put back; the nodes stay
  // where they are (the maps above hold their addresses).
  pb::GraphProto& mg = *m.proto.mutable_graph();
  pb::GraphProto folded;
  {
    google::protobuf::RepeatedPtrField<pb::NodeProto> nodes;
    google::protobuf::RepeatedPtrField<pb::TensorProto> inits;
    nodes.Swap(mg.mutable_node());
    inits.Swap(mg.mutable_initializer());
    folded = mg;
    nodes.Swap(mg.mutable_node());
    inits.Swap(mg.mutable_initializer());
  }
  std::map<std::string, const pb::NodeProto*> constant_of;  // a Constant node's output -> the original node
  for (int i = 0; i < mg.node_size(); i++) {
    pb::NodeProto& n = *mg.mutable_node(i);
    if (removed.count(&n) || (m.constants.count(&n) && n.output_size() == 1 && uses[n.output(0)] <= 0)) continue;
    pb::NodeProto* c = folded.add_node();
    pb::TensorProto payload;
    pb::AttributeProto* value = nullptr;
    if (m.constants.count(&n))
      for (auto& a : *n.mutable_attribute())
        if (a.name() == "value" && a.has_t()) value = &a;
    if (value) payload.Swap(value->mutable_t());
    *c = n;
    if (value) payload.Swap(value->mutable_t());
    if (auto f = folds.find(&n); f != folds.end()) {
      c->clear_input();
      c->add_input(n.input(0));
      c->add_input(f->second.w);
      c->add_input(f->second.b);
      c->set_output(0, f->second.out);
    }
    if (n.output_size() > 0 && m.constants.count(&n)) constant_of[n.output(0)] = &n;
  }
  m.folded = std::make_unique<pb::GraphProto>(std::move(folded));
  for (const auto& n : m.folded->node())  // the folded copies share the values load read for the Constant nodes
    if (n.output_size() > 0)
      if (auto it = constant_of.find(n.output(0)); it != constant_of.end()) m.constants[&n] = m.constants.at(it->second);
  m.bn_folded = folds.size();
}

}  // namespace tg::onnx
