// Patterns, rule tables and graph_rewrite.
#include <doctest/doctest.h>

#include "tg/pattern.hpp"

using namespace tg;
using namespace tg::pat;

namespace {
UOpRef var(const char* n, int64_t lo = 0, int64_t hi = 100) { return UOp::variable(n, lo, hi); }
UOpRef ci(int64_t v) { return UOp::cnst_int(dtypes::index, v); }

constexpr auto pm_test = table(
    rule(x + 0_c, x),                                                    // x+0 -> x
    rule(x * 1_c, x),                                                    // x*1 -> x
    rule(x * 0_c, 0_c),                                                  // x*0 -> 0
    rule(x + x, x * 2_c),                                                // x+x -> x*2
    rule((x * c0) + (x * c1), [](auto& m) {                              // x*c0+x*c1 -> x*(c0+c1)
      return m[x]->alu(Ops::MUL, m[x]->const_like_int(m[c0]->const_int() + m[c1]->const_int()));
    }),
    rule(where(x, y, y), y),                                             // where(x,y,y) -> y
    rule(lt(x, y), 1_c, [](auto& m) { return m[x]->vmax() < m[y]->vmin(); }));  // x<y -> true from bounds
}  // namespace

TEST_CASE("a rule table rewrites to a fixed point") {
  PatternMatcher pm(pm_test);
  auto a = var("a");
  auto e = (a->alu(Ops::ADD, ci(0)))->alu(Ops::MUL, ci(1));
  CHECK(graph_rewrite(e, pm) == a);
  auto f = a->alu(Ops::MUL, ci(3))->alu(Ops::ADD, a->alu(Ops::MUL, ci(4)));
  CHECK(graph_rewrite(f, pm) == a->alu(Ops::MUL, ci(7)));
}

TEST_CASE("commutative ops match both source orders") {
  PatternMatcher pm(pm_test);
  auto a = var("a");
  CHECK(graph_rewrite(ci(0)->alu(Ops::ADD, a), pm) == a);
  CHECK(graph_rewrite(ci(1)->alu(Ops::MUL, a), pm) == a);
  auto f = ci(3)->alu(Ops::MUL, a)->alu(Ops::ADD, a->alu(Ops::MUL, ci(4)));
  CHECK(graph_rewrite(f, pm) == a->alu(Ops::MUL, ci(7)));
}

TEST_CASE("a capture used twice must match the same node") {
  PatternMatcher pm(pm_test);
  auto a = var("a"), b = var("b");
  CHECK(graph_rewrite(a->alu(Ops::ADD, a), pm) == a->alu(Ops::MUL, ci(2)));
  CHECK(graph_rewrite(a->alu(Ops::ADD, b), pm) == a->alu(Ops::ADD, b));
}

TEST_CASE("predicates gate a rule") {
  PatternMatcher pm(pm_test);
  auto a = var("a", 0, 5), b = var("b", 10, 20);
  auto t = graph_rewrite(a->alu(Ops::CMPLT, b), pm);
  CHECK(t->op == Ops::CONST);
  CHECK(t->dtype == dtypes::bool_);
  CHECK(t->const_int() == 1);
  CHECK(graph_rewrite(b->alu(Ops::CMPLT, a), pm) == b->alu(Ops::CMPLT, a));
}

TEST_CASE("a trace records every applied rule") {
  PatternMatcher pm(pm_test);
  auto a = var("a");
  std::vector<RewriteStep> trace;
  RewriteOptions o;
  o.trace = &trace;
  o.name = "test";
  auto e = (a->alu(Ops::ADD, ci(0)))->alu(Ops::MUL, ci(1));
  CHECK(graph_rewrite(e, pm, o) == a);
  REQUIRE(trace.size() == 2);
  CHECK(trace[0].rule.find("pattern_tests.cpp") != std::string::npos);
  CHECK(trace[0].before == a->alu(Ops::ADD, ci(0)));
  CHECK(trace[0].after == a);
}

TEST_CASE("graph_rewrite on a 1,000,000-node chain does not overflow the stack") {
  PatternMatcher pm(pm_test);
  UOpRef e = var("a");
  for (int i = 0; i < 1000000; i++) e = e->alu(Ops::ADD, ci(0));
  CHECK(graph_rewrite(e, pm) == var("a"));
}
