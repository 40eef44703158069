// The IR: interning, freeing, keys, toposort, bounds, the spec.
#include <doctest/doctest.h>

#include <cmath>
#include <thread>

#include "tg/env.hpp"
#include "tg/uop.hpp"

using namespace tg;

TEST_CASE("equal nodes are the same object") {
  auto a = UOp::variable("a", 0, 10);
  auto b = UOp::variable("a", 0, 10);
  CHECK(a == b);
  auto c = a->alu(Ops::ADD, UOp::cnst_int(dtypes::index, 1));
  auto d = b->alu(Ops::ADD, UOp::cnst_int(dtypes::index, 1));
  CHECK(c == d);
  CHECK(UOp::cnst(dtypes::float32, 0.0) != UOp::cnst(dtypes::float32, -0.0));
  CHECK(UOp::cnst(dtypes::float32, NAN) == UOp::cnst(dtypes::float32, NAN));
}

TEST_CASE("unused nodes are freed, deep chains iteratively") {
  size_t before = UOp::live_count();
  {
    UOpRef e = UOp::variable("q", 0, 3);
    for (int i = 0; i < 1000000; i++) e = e->alu(Ops::ADD, UOp::cnst_int(dtypes::index, 1));
    CHECK(UOp::live_count() >= before + 1000000);
    CHECK(toposort(e.get()).size() == 1000002);
  }
  CHECK(UOp::live_count() == before);
}

TEST_CASE("interning is safe from several threads") {
  std::vector<std::thread> ts;
  std::vector<UOpRef> res(4);
  for (int t = 0; t < 4; t++)
    ts.emplace_back([t, &res] {
      UOpRef e = UOp::variable("t", 0, 9);
      for (int i = 0; i < 20000; i++) e = e->alu(Ops::ADD, UOp::cnst_int(dtypes::index, i % 7));
      res[size_t(t)] = e;
    });
  for (auto& t : ts) t.join();
  CHECK(res[0] == res[1]);
  CHECK(res[2] == res[3]);
  CHECK(res[0] == res[3]);
}

TEST_CASE("the content key is structural and fixed") {
  auto a = UOp::variable("a", 0, 10);
  auto e = a->alu(Ops::MUL, UOp::cnst_int(dtypes::index, 4));
  CHECK(e->key().size() == 32);
  CHECK(e->key() != a->key());
  // Same value in every process: a change here means every disk cache is invalid.
  CHECK(e->key() == "559cda2f6cd9971297ab3d567865f293");
}

TEST_CASE("bounds of index arithmetic are exact") {
  auto x = UOp::variable("x", 0, 9);
  auto c = [](int64_t v) { return UOp::cnst_int(dtypes::index, v); };
  auto e = x->alu(Ops::MUL, c(4))->alu(Ops::ADD, c(3));
  CHECK(e->vmin() == 3);
  CHECK(e->vmax() == 39);
  auto d = e->alu(Ops::IDIV, c(4));
  CHECK(d->vmin() == 0);
  CHECK(d->vmax() == 9);
  auto m = e->alu(Ops::MOD, c(4));
  CHECK(m->vmin() == 0);
  CHECK(m->vmax() == 3);
  auto lt = x->alu(Ops::CMPLT, c(10));
  CHECK(lt->vmin() == 1);
  auto r = UOp::range(c(16), 0);
  CHECK(r->vmax() == 15);
}

TEST_CASE("exec_alu follows C semantics") {
  Value a{-7, 0}, b{2, 0};
  Value ab[] = {a, b};
  CHECK(exec_alu(Ops::IDIV, dtypes::int32, ab, dtypes::int32).i == -3);
  CHECK(exec_alu(Ops::MOD, dtypes::int32, ab, dtypes::int32).i == -1);
  Value big[] = {Value{2147483647, 0}, Value{1, 0}};
  CHECK(exec_alu(Ops::ADD, dtypes::int32, big, dtypes::int32).i == -2147483648LL);
  Value u[] = {Value{0, 0}, Value{1, 0}};
  CHECK(exec_alu(Ops::SUB, dtypes::uint8, u, dtypes::uint8).i == 255);
  Value z[] = {Value{1, 0}, Value{0, 0}};
  CHECK_THROWS_AS(exec_alu(Ops::IDIV, dtypes::int32, z, dtypes::int32), Error);
}

TEST_CASE("the spec rejects malformed nodes with the node printed") {
  auto a = UOp::variable("a", 0, 10);
  auto f = UOp::cnst(dtypes::float32, 1.5);
  // an ADD of an index and a float, a WHERE with a non-bool condition, a unary op with two sources
  auto bad_add = UOp::make(Ops::ADD, dtypes::index, {a, f});
  CHECK_THROWS_AS(spec_check(bad_add.get()), SpecError);
  try {
    spec_check(bad_add.get());
  } catch (const SpecError& e) {
    std::string m = e.what();
    CHECK(m.find("[spec] ADD") != std::string::npos);
    CHECK(m.find("float32") != std::string::npos);
  }
  CHECK_THROWS_AS(spec_check(UOp::make(Ops::WHERE, dtypes::index, {a, a, a}).get()), SpecError);
  CHECK_THROWS_AS(spec_check(UOp::make(Ops::EXP2, dtypes::float32, {f, f}).get()), SpecError);
  CHECK_THROWS_AS(spec_check(UOp::make(Ops::CMPLT, dtypes::index, {a, a}).get()), SpecError);
  CHECK_NOTHROW(spec_check(a->alu(Ops::ADD, UOp::cnst_int(dtypes::index, 1)).get()));
}

TEST_CASE("bad environment values and bad constants are errors") {
  setenv("TG_TEST_KNOB", "yes", 1);
  env_reset_cache();
  CHECK_THROWS_AS(getenv_int("TG_TEST_KNOB"), EnvError);
  setenv("TG_TEST_KNOB", "3", 1);
  env_reset_cache();
  CHECK(getenv_int("TG_TEST_KNOB") == 3);
  CHECK_THROWS_AS(UOp::cnst(dtypes::int32, NAN), Error);
  CHECK_THROWS_AS(UOp::variable("v", 5, 1), Error);
  CHECK_THROWS_AS(dtypes::from_name("float33"), Error);
}
