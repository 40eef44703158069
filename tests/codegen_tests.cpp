// Codegen: lowering passes, index width, loop placement of accumulators.
#include <doctest/doctest.h>

#include "tg/codegen.hpp"
#include "tg/device.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {
CompiledKernel lower_first(const Tensor& t) {
  UOpRef root = t.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(!s.items.empty());
  static const std::vector<Opt> none;  // the plain loops: these tests are about lowering, not optimising
  LowerOptions lo;
  lo.opts = &none;
  return lower_kernel(s.items.back().ast, "k", get_device("CPU").renderer(), lo);
}
}  // namespace

TEST_CASE("index arithmetic past 2^31 elements is lowered to int64") {
  int64_t big = int64_t(1) << 33;
  Tensor t = Tensor::ones({1}).expand({big}) * 2;  // never run: only lowered
  CompiledKernel k = lower_first(t);
  bool has_range = false;
  for (const UOp* u : k.program)
    if (u->op == Ops::RANGE) {
      has_range = true;
      CHECK(u->dtype == dtypes::int64);
      CHECK(u->vmax() == big - 1);
    }
  CHECK(has_range);
  Tensor small = Tensor::ones({1}).expand({1000}) * 2;
  for (const UOp* u : lower_first(small).program)
    if (u->op == Ops::RANGE) CHECK(u->dtype == dtypes::int32);
}

TEST_CASE("a reduce inside an output loop initialises its accumulator inside that loop") {
  Tensor a = Tensor::ones({4, 8});
  a.realize();
  CompiledKernel k = lower_first(a.sum(1));
  int depth = 0, init_depth = -1;
  bool first_store_seen = false;
  for (const UOp* u : k.program) {
    if (u->op == Ops::RANGE) depth++;
    if (u->op == Ops::END) depth--;
    if (u->op == Ops::STORE && !first_store_seen) {
      first_store_seen = true;
      init_depth = depth;
    }
  }
  CHECK(init_depth == 1);  // inside the output loop, outside the reduce loop
  CHECK(depth == 0);       // every loop closed
}

TEST_CASE("no index dtype reaches the renderer and PARAMs come first") {
  Tensor a = Tensor::ones({3, 5});
  a.realize();
  CompiledKernel k = lower_first(Tensor(a.T() + 1).contiguous());
  for (const UOp* u : k.program) CHECK(u->dtype.scalar != Scalar::Index);
  CHECK(k.program.front()->op == Ops::PARAM);
  CHECK(k.n_params == 2);
}
