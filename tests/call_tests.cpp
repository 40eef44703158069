// CALL nodes in the tensor graph (issue 24): Tensor::custom_kernel (a kernel written in UOps, run as one CALL) and
// Tensor::callify (a computation made one CALL), each compared with the same tensor ops exactly.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {
using test::error_of;
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

UOpRef loop(int64_t n, int64_t id) { return UOp::range(UOp::cnst_int(dtypes::index, n), id, AxisType::Loop); }
UOpRef reduce_range(int64_t n, int64_t id) { return UOp::range(UOp::cnst_int(dtypes::index, n), id, AxisType::Reduce); }
UOpRef sink(std::vector<UOpRef> stores) { return UOp::make(Ops::SINK, dtypes::void_, stores); }

// out[i, j] = a[i, j] * b[i, j] + 1
UOpRef mul_add_one(const std::vector<KernelParam>& p) {
  UOpRef i = loop(p[0].shape[0], 0), j = loop(p[0].shape[1], 1);
  UOpRef v = p[1].load({i, j})->alu(Ops::MUL, p[2].load({i, j}))->alu(Ops::ADD, UOp::cnst(p[0].dtype, 1));
  return sink({p[0].store({i, j}, v)});
}

// out[i] = sum over r of a[i, r]
UOpRef row_sum(const std::vector<KernelParam>& p) {
  UOpRef i = loop(p[0].shape[0], 0), r = reduce_range(p[1].shape[1], 1000);
  UOpRef red = UOp::make(Ops::REDUCE, p[0].dtype, {p[1].load({i, r}), r}, int64_t(Ops::ADD));
  return sink({p[0].store({i}, red)});
}

// exact in float32: multiples of 1/8 below 2^10
Tensor eighths(const Shape& s, float k) {
  size_t n = 1;
  for (int64_t d : s) n *= size_t(d);
  std::vector<float> v(n);
  for (size_t i = 0; i < v.size(); i++) v[i] = float(int(i * 7 + int(k * 8)) % 37 - 18) / 8.f;
  return Tensor::from_vector(v, s);
}
}  // namespace

TEST_CASE("custom_kernel: an elementwise kernel in UOps gives what the tensor ops give, as one kernel") {
  Tensor a = eighths({4, 8}, 1), b = eighths({4, 8}, 2);
  Tensor ref = a * b + 1.f;
  auto outs = Tensor::custom_kernel({Tensor::empty({4, 8}), a, b}, mul_add_one);
  REQUIRE(outs.size() == 3);
  CHECK(outs[1].uop() == a.uop());  // sources it only reads come back as they are
  CHECK(outs[2].uop() == b.uop());
  size_t k0 = kernels_run();
  outs[0].realize();
  CHECK(kernels_run() - k0 == 1);  // the inputs are buffers: the kernel alone
  CHECK(outs[0].shape() == Shape{4, 8});
  CHECK(outs[0].to_vector<float>() == ref.to_vector<float>());
}

TEST_CASE("custom_kernel: a reduction in UOps gives sum(1) exactly; lazy inputs are realised first, consumers read its buffer") {
  Tensor x = eighths({6, 5}, 3);
  Tensor lazy = x * 2.f - 1.f;  // realised into a buffer before the kernel reads it
  auto outs = Tensor::custom_kernel({Tensor::empty({6}), lazy}, row_sum);
  Tensor after = outs[0] * 3.f;  // a consumer: its own kernel, reading the output
  size_t k0 = kernels_run();
  std::vector<float> got = after.to_vector<float>();
  CHECK(kernels_run() - k0 == 3);  // the input, the custom kernel, the consumer: nothing fused across the CALL
  CHECK(got == (lazy.sum(1) * 3.f).to_vector<float>());
  CHECK(outs[0].to_vector<float>() == lazy.sum(1).to_vector<float>());
  // an int32 reduction: the dtype is the sources'
  Tensor xi = Tensor::arange(0, 24, 1, dtypes::int32).reshape({4, 6}).contiguous();
  auto oi = Tensor::custom_kernel({Tensor::empty({4}, dtypes::int32), xi}, row_sum);
  CHECK(oi[0].to_vector<int32_t>() == xi.sum(1).cast(dtypes::int32).to_vector<int32_t>());
}

TEST_CASE("custom_kernel: several outputs in one kernel, a source given twice, the same AST reuses its schedule") {
  Tensor a = eighths({3, 4}, 4), b = eighths({3, 4}, 5);
  auto addmul = [](const std::vector<KernelParam>& p) {
    UOpRef i = loop(3, 0), j = loop(4, 1);
    UOpRef x = p[2].load({i, j}), y = p[3].load({i, j});
    return sink({p[0].store({i, j}, x->alu(Ops::ADD, y)), p[1].store({i, j}, x->alu(Ops::MUL, y))});
  };
  auto outs = Tensor::custom_kernel({Tensor::empty({3, 4}), Tensor::empty({3, 4}), a, b}, addmul);
  size_t k0 = kernels_run();
  Tensor::realize_all({&outs[0], &outs[1]});
  CHECK(kernels_run() - k0 == 1);
  CHECK(outs[0].to_vector<float>() == (a + b).to_vector<float>());
  CHECK(outs[1].to_vector<float>() == (a * b).to_vector<float>());
  // only the second output used: the kernel still writes both (the first into a buffer nobody reads)
  Tensor c = eighths({3, 4}, 6), d = eighths({3, 4}, 7);
  std::vector<float> ba = (b * a).to_vector<float>(), cd = (c * d).to_vector<float>();
  auto again = Tensor::custom_kernel({Tensor::empty({3, 4}), Tensor::empty({3, 4}), b, a}, addmul);
  size_t s0 = schedules_built();
  CHECK(again[1].to_vector<float>() == ba);
  auto third = Tensor::custom_kernel({Tensor::empty({3, 4}), Tensor::empty({3, 4}), c, d}, addmul);
  CHECK(third[1].to_vector<float>() == cd);
  CHECK(schedules_built() - s0 == 1);  // the third has the second's structure: its schedule is cached
  // x written and read as two sources (tinygrad's test_duplicate_call_arg): the output is a new buffer, x unchanged
  Tensor x = Tensor::from_vector(std::vector<float>{0, 1, 2, 3});
  auto add_one = [](const std::vector<KernelParam>& p) {
    UOpRef i = loop(4, 0);
    return sink({p[0].store({i}, p[1].load({i})->alu(Ops::ADD, UOp::cnst(dtypes::float32, 1)))});
  };
  auto y = Tensor::custom_kernel({x, x}, add_one);
  CHECK(y[0].to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3});
}

TEST_CASE("custom_kernel: wrong arity, shape, dtype or op in the AST is a tg::Error naming custom_kernel") {
  Tensor a = eighths({4, 8}, 1), b = eighths({4, 8}, 2), out = Tensor::empty({4, 8});
  // a PARAM beyond the sources
  CHECK(error_of([&] {
          (void)Tensor::custom_kernel({out, a}, [](const std::vector<KernelParam>& p) {
            UOpRef i = loop(4, 0), j = loop(8, 1);
            UOpRef extra = UOp::make(Ops::PARAM, dtypes::float32.ptr_to(), {}, int64_t(2));
            UOpRef v = UOp::make(Ops::LOAD, dtypes::float32, {UOp::make(Ops::INDEX, extra->dtype, {extra, i})});
            return sink({p[0].store({i, j}, v)});
          });
        }) == "[custom_kernel] PARAM 2 but the kernel has 2 sources (PARAM 0..1)");
  // indices that do not match the shape, or reach outside it
  CHECK(error_of([&] { (void)Tensor::custom_kernel({out, a}, [](const std::vector<KernelParam>& p) {
          UOpRef i = loop(32, 0);
          return sink({p[0].store({i}, UOp::cnst(dtypes::float32, 1))});
        }); }) == "[custom_kernel] PARAM 0 has shape (4, 8): give 2 indices, not 1");
  CHECK(error_of([&] { (void)Tensor::custom_kernel({out, a}, [](const std::vector<KernelParam>& p) {
          UOpRef i = loop(5, 0), j = loop(8, 1);
          return sink({p[0].store({i, j}, p[1].load({i, j}))});
        }); }) == "[custom_kernel] PARAM 0 is indexed at 0..39 but source 0 (4, 8) holds 32 elements");
  // a dtype that is not the source's
  CHECK(error_of([&] { (void)Tensor::custom_kernel({out, a}, [](const std::vector<KernelParam>& p) {
          UOpRef i = loop(4, 0), j = loop(8, 1);
          return sink({p[0].store({i, j}, UOp::cnst(dtypes::int32, 1))});
        }); }) == "[custom_kernel] storing int32 into PARAM 0 of float32: cast the value first");
  CHECK(error_of([&] { (void)Tensor::custom_kernel({Tensor::empty({4, 8}, dtypes::int32), a}, [](const std::vector<KernelParam>& p) {
          UOpRef i = loop(4, 0), j = loop(8, 1);
          return sink({UOp::make(Ops::STORE, dtypes::void_, {p[0].index({i, j}), p[1].load({i, j})})});
        }); }) == "[custom_kernel] a STORE of float32 from/into PARAM 0 of int32");
  CHECK(error_of([&] { (void)Tensor::custom_kernel({out, a}, [](const std::vector<KernelParam>& p) {
          UOpRef i = loop(4, 0), j = loop(8, 1);
          UOpRef wrong = UOp::make(Ops::PARAM, dtypes::int32.ptr_to(), {}, int64_t(1));
          UOpRef v = UOp::make(Ops::LOAD, dtypes::int32, {UOp::make(Ops::INDEX, wrong->dtype, {wrong, i})});
          return sink({p[0].store({i, j}, v->cast(dtypes::float32))});
        }); }) == "[custom_kernel] PARAM 1 is int32* but source 1 is float32 (4, 8)");
  // not a kernel: no STORE, or a tensor-graph op inside
  CHECK(error_of([&] { (void)Tensor::custom_kernel({out}, [](const std::vector<KernelParam>&) { return sink({}); }); }) ==
        "[custom_kernel] the kernel stores nothing: it has no output");
  CHECK(contains(error_of([&] { (void)Tensor::custom_kernel({out, a}, [&](const std::vector<KernelParam>& p) {
          UOpRef i = loop(4, 0), j = loop(8, 1);
          return sink({p[0].store({i, j}, (a + 1.f).uop())});
        }); }), "is not a kernel op"));
  CHECK(contains(error_of([&] { (void)Tensor::custom_kernel({}, mul_add_one); }), "[custom_kernel] needs at least one source"));
}

TEST_CASE("custom_kernel: backward uses the given rule, and without one backward() is an error naming it") {
  Tensor a = eighths({4, 8}, 1).requires_grad_(), b = eighths({4, 8}, 2).requires_grad_();
  Tensor::CustomBackward bw = [](const Tensor& g, const Tensor&, const std::vector<Tensor>& in) {
    return std::vector<std::optional<Tensor>>{std::nullopt, g * in[2], g * in[1]};  // d(a*b+1) = b da + a db
  };
  auto outs = Tensor::custom_kernel({Tensor::empty({4, 8}), a, b}, mul_add_one, bw);
  (outs[0] * outs[0]).sum().backward();
  std::vector<float> ga = a.grad().to_vector<float>(), gb = b.grad().to_vector<float>();
  Tensor a2 = a.detach().requires_grad_(), b2 = b.detach().requires_grad_();
  Tensor r = a2 * b2 + 1.f;
  (r * r).sum().backward();
  CHECK(ga == a2.grad().to_vector<float>());
  CHECK(gb == b2.grad().to_vector<float>());
  Tensor c = eighths({4, 8}, 3).requires_grad_();
  auto no_bw = Tensor::custom_kernel({Tensor::empty({4, 8}), c, c}, mul_add_one);
  CHECK(error_of([&] { no_bw[0].sum().backward(); }) ==
        "[backward] a custom kernel's output has no gradient: pass a backward to Tensor::custom_kernel");
}

TEST_CASE("callify: the tensors become one CALL: realising one computes all, consumers do not fuse across it") {
  Tensor x = eighths({8, 8}, 6);
  Tensor a = x * 2.f + 1.f, b = (x * x).sum(1);
  std::vector<float> ra = a.to_vector<float>(), rb = b.to_vector<float>();
  Tensor ca = x * 2.f + 1.f, cb = (x * x).sum(1);
  Tensor& self = ca.callify({&cb});
  CHECK(&self == &ca);
  CHECK(ca.uop()->op == Ops::AFTER);
  Tensor consumer = ca.sum(0) * 3.f;  // without callify ca would fuse into the reduce's kernel
  size_t k0 = kernels_run();
  std::vector<float> got = consumer.to_vector<float>();
  CHECK(kernels_run() - k0 == 3);  // the CALL's two values (elementwise and reduce), then the consumer
  CHECK(contiguous_buffer(cb.uop().get()) != nullptr);  // realised with ca: its sibling in the CALL
  CHECK(got == (a.sum(0) * 3.f).to_vector<float>());
  k0 = kernels_run();
  CHECK(cb.to_vector<float>() == rb);
  CHECK(kernels_run() == k0);  // nothing left to run
  CHECK(ca.to_vector<float>() == ra);
  // the same structure again: the schedule is reused
  Tensor y = eighths({8, 8}, 7);
  Tensor da = y * 2.f + 1.f, db = (y * y).sum(1);
  da.callify({&db});
  Tensor consumer2 = da.sum(0) * 3.f;
  size_t s0 = schedules_built();
  (void)consumer2.to_vector<float>();
  CHECK(schedules_built() == s0);
  CHECK(db.to_vector<float>() == (y * y).sum(1).to_vector<float>());
  // a realised tensor is left alone; gradients pass through a callified value
  Tensor w = eighths({4}, 1).requires_grad_();
  Tensor h = w * w;
  h.callify();
  (h * 2.f).sum().backward();
  CHECK(w.grad().to_vector<float>() == (w.detach() * 4.f).to_vector<float>());
  Tensor done = Tensor::from_vector(std::vector<float>{1, 2});
  const UOp* before = done.uop().get();
  done.callify();
  CHECK(done.uop().get() == before);
}
