// The symbolic simplifier: exact simplifications, constant folding per dtype, the rule tester over the same tables
// the rewriter uses, and a seeded random-expression checker.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "../src/uop/symbolic_rules.hpp"
#include "tg/rule_check.hpp"
#include "tg/symbolic.hpp"

using namespace tg;

namespace {
UOpRef var(const char* n, int64_t lo, int64_t hi, DType d = dtypes::index) { return UOp::variable(n, lo, hi, d); }
UOpRef ci(int64_t v, DType d = dtypes::index) { return UOp::cnst_int(d, v); }
UOpRef cf(double v, DType d = dtypes::float32) { return UOp::cnst(d, v); }
std::string str(const UOpRef& u) { return render_expr(u.get()); }
int64_t folded_int(const UOpRef& u) {
  REQUIRE(u->op == Ops::CONST);
  return u->const_int();
}
}  // namespace

// ------------------------------------------------------------------ exact simplifications

TEST_CASE("(x*4+3)//4 is x and (x*4+3)%4 is 3 for x in [0,255]") {
  auto x = var("x", 0, 255);
  auto n = x->alu(Ops::MUL, ci(4))->alu(Ops::ADD, ci(3));
  CHECK(simplify(n->alu(Ops::IDIV, ci(4))) == x);
  CHECK(simplify(n->alu(Ops::MOD, ci(4))) == ci(3));
}

TEST_CASE("truncating div/mod of a negative range folds with the right sign") {
  auto x = var("x", -10, -1);
  auto n = x->alu(Ops::MUL, ci(4))->alu(Ops::ADD, ci(3));  // 4x+3 in [-37,-1]
  CHECK(simplify(n->alu(Ops::IDIV, ci(4))) == x->alu(Ops::ADD, ci(1)));
  CHECK(simplify(n->alu(Ops::MOD, ci(4))) == ci(-1));
  auto m = var("m", -5, 5);  // mixed signs: (4m+3)//4 is not m
  CHECK(simplify(m->alu(Ops::MUL, ci(4))->alu(Ops::ADD, ci(3))->alu(Ops::IDIV, ci(4))) != m);
}

TEST_CASE("like terms combine: x+x*3 -> x*4, x*2+x*5 -> x*7, x-x -> 0, (a+b)-b -> a") {
  auto x = var("x", 0, 100), a = var("a", 0, 9), b = var("b", -9, 9);
  CHECK(simplify(x->alu(Ops::ADD, x->alu(Ops::MUL, ci(3)))) == x->alu(Ops::MUL, ci(4)));
  CHECK(simplify(x->alu(Ops::MUL, ci(2))->alu(Ops::ADD, x->alu(Ops::MUL, ci(5)))) == x->alu(Ops::MUL, ci(7)));
  CHECK(simplify(x->alu(Ops::SUB, x)) == ci(0));
  CHECK(simplify(a->alu(Ops::ADD, b)->alu(Ops::SUB, b)) == a);
}

TEST_CASE("commutative chains have one canonical form") {
  auto a = var("a", 0, 9), b = var("b", 0, 9), c = var("c", 0, 9);
  CHECK(simplify(a->alu(Ops::ADD, b)) == simplify(b->alu(Ops::ADD, a)));
  CHECK(simplify(a->alu(Ops::MUL, b)) == simplify(b->alu(Ops::MUL, a)));
  auto abc = simplify(a->alu(Ops::ADD, b)->alu(Ops::ADD, c));
  CHECK(simplify(c->alu(Ops::ADD, a)->alu(Ops::ADD, b)) == abc);
  CHECK(simplify(b->alu(Ops::ADD, c->alu(Ops::ADD, a))) == abc);
  CHECK(str(abc) == "((a+b)+c)");
  CHECK(str(simplify(ci(3)->alu(Ops::ADD, b)->alu(Ops::ADD, a))) == "((a+b)+3)");
}

TEST_CASE("sums of up to 64 terms in any order become one node; longer ones stay fast") {
  std::vector<UOpRef> v;
  for (int i = 0; i < 40; i++) v.push_back(var(("v" + std::to_string(100 + i)).c_str(), 0, 10));
  UOpRef fwd = v[0], rev = v[39], mixed = v[17];
  for (int i = 1; i < 40; i++) fwd = fwd->alu(Ops::ADD, v[size_t(i)]);
  for (int i = 38; i >= 0; i--) rev = rev->alu(Ops::ADD, v[size_t(i)]);
  for (int i = 1; i < 40; i++) mixed = mixed->alu(Ops::ADD, v[size_t((17 + i * 7) % 40)]);
  auto s = simplify(fwd);
  CHECK(s == fwd);  // already canonical
  CHECK(simplify(rev) == s);
  CHECK(simplify(mixed) == s);
  UOpRef big = var("w9999", 0, 10);  // 5,000 terms in reverse name order
  for (int i = 4998; i >= 0; i--) big = big->alu(Ops::ADD, var(("w" + std::to_string(1000 + i)).c_str(), 0, 10));
  auto t0 = std::chrono::steady_clock::now();
  simplify(big);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
}

TEST_CASE("constants move right and combine: (x+3)+5 -> x+8, (x*2)*3 -> x*6") {
  auto x = var("x", 0, 100), y = var("y", 0, 100);
  CHECK(simplify(x->alu(Ops::ADD, ci(3))->alu(Ops::ADD, ci(5))) == x->alu(Ops::ADD, ci(8)));
  CHECK(simplify(x->alu(Ops::MUL, ci(2))->alu(Ops::MUL, ci(3))) == x->alu(Ops::MUL, ci(6)));
  CHECK(simplify(x->alu(Ops::ADD, ci(3))->alu(Ops::ADD, y)) == x->alu(Ops::ADD, y)->alu(Ops::ADD, ci(3)));
  CHECK(simplify(ci(3)->alu(Ops::ADD, x)) == x->alu(Ops::ADD, ci(3)));
}

TEST_CASE("identities: x*1, x+0, x*0, x//1, x%1, x&x, x|x, where(c,a,a), --x") {
  auto x = var("x", -50, 50), c = var("c", 0, 1)->alu(Ops::CMPLT, ci(1));
  CHECK(simplify(x->alu(Ops::MUL, ci(1))) == x);
  CHECK(simplify(x->alu(Ops::ADD, ci(0))) == x);
  CHECK(simplify(x->alu(Ops::MUL, ci(0))) == ci(0));
  CHECK(simplify(x->alu(Ops::IDIV, ci(1))) == x);
  CHECK(simplify(x->alu(Ops::MOD, ci(1))) == ci(0));
  CHECK(simplify(x->alu(Ops::AND, x)) == x);
  CHECK(simplify(x->alu(Ops::OR, x)) == x);
  CHECK(simplify(c->alu(Ops::WHERE, x, x)) == x);
  CHECK(simplify(UOp::cnst_int(dtypes::bool_, 1)->alu(Ops::WHERE, x, ci(7))) == x);
  CHECK(simplify(x->alu(Ops::NEG)->alu(Ops::NEG)) == x);
}

TEST_CASE("comparisons fold from bounds and move constants") {
  auto x = var("x", 0, 10), y = var("y", 20, 30);
  CHECK(simplify(x->alu(Ops::CMPLT, y)) == UOp::cnst_int(dtypes::bool_, 1));
  CHECK(simplify(y->alu(Ops::CMPLT, x)) == UOp::cnst_int(dtypes::bool_, 0));
  CHECK(simplify(x->alu(Ops::CMPLT, x)) == UOp::cnst_int(dtypes::bool_, 0));
  CHECK(simplify(x->alu(Ops::CMPNE, x)) == UOp::cnst_int(dtypes::bool_, 0));
  auto z = var("z", -100, 100);
  CHECK(simplify(z->alu(Ops::ADD, ci(3))->alu(Ops::CMPLT, ci(10))) == z->alu(Ops::CMPLT, ci(7)));
  CHECK(simplify(z->alu(Ops::MUL, ci(4))->alu(Ops::CMPLT, ci(10))) == z->alu(Ops::CMPLT, ci(3)));   // 4z<10 <=> z<3
  CHECK(simplify(z->alu(Ops::MUL, ci(4))->alu(Ops::CMPLT, ci(-10))) == z->alu(Ops::CMPLT, ci(-2))); // 4z<-10 <=> z<-2
  CHECK(simplify(z->alu(Ops::IDIV, ci(4))->alu(Ops::CMPLT, ci(3))) == z->alu(Ops::CMPLT, ci(12)));
  auto w = var("w", 0, 3);
  auto sum = z->alu(Ops::MUL, ci(4))->alu(Ops::ADD, w);
  CHECK(simplify(sum->alu(Ops::CMPLT, ci(8))) == z->alu(Ops::CMPLT, ci(2)));  // 4z+w<8, 0<=w<4 <=> z<2
}

TEST_CASE("div/mod from bounds, nesting and variable divisors") {
  auto x = var("x", 0, 9), n = var("n", 0, 1000), d = var("d", 1, 16);
  CHECK(simplify(x->alu(Ops::IDIV, ci(10))) == ci(0));
  CHECK(simplify(x->alu(Ops::MOD, ci(10))) == x);
  CHECK(simplify(n->alu(Ops::IDIV, ci(4))->alu(Ops::IDIV, ci(8))) == n->alu(Ops::IDIV, ci(32)));
  CHECK(simplify(n->alu(Ops::MOD, ci(24))->alu(Ops::MOD, ci(8))) == n->alu(Ops::MOD, ci(8)));
  CHECK(simplify(n->alu(Ops::MUL, d)->alu(Ops::IDIV, d)) == n);
  CHECK(simplify(n->alu(Ops::MUL, d)->alu(Ops::MOD, d)) == ci(0));
  auto rec = n->alu(Ops::MOD, ci(6))->alu(Ops::ADD, n->alu(Ops::IDIV, ci(6))->alu(Ops::MUL, ci(6)));
  CHECK(simplify(rec) == n);  // x%c + (x//c)*c -> x
  auto r = UOp::range(ci(1), 0);
  CHECK(simplify(r->alu(Ops::ADD, x)) == x);  // RANGE(1) is 0
  auto r8 = UOp::range(ci(8), 1);
  CHECK(simplify(r8->alu(Ops::MOD, ci(8))) == r8);
  CHECK(simplify(r8->alu(Ops::IDIV, ci(8))) == ci(0));
  CHECK(simplify(x->alu(Ops::IDIV, ci(0))) == x->alu(Ops::IDIV, ci(0)));  // never folded
}

TEST_CASE("a sum split at a factor of the divisor: (56h + w)//112 is h//2 for w < 56, and its % keeps every value") {
  auto h = var("h", 0, 55), w = var("w", 0, 55);
  auto n = h->alu(Ops::MUL, ci(56))->alu(Ops::ADD, w);
  UOpRef q = simplify(n->alu(Ops::IDIV, ci(112))), m = simplify(n->alu(Ops::MOD, ci(112)));
  CHECK(q == h->alu(Ops::IDIV, ci(2)));
  for (int64_t hv = 0; hv < 56; hv++)
    for (int64_t wv = 0; wv < 56; wv += 5) {
      auto at = [&](const UOpRef& e) {
        return folded_int(simplify(substitute(e, [&](const UOp* u) { return u == h.get() ? ci(hv) : u == w.get() ? ci(wv) : UOpRef{}; })));
      };
      CHECK(at(q) == (56 * hv + wv) / 112);
      CHECK(at(m) == (56 * hv + wv) % 112);
    }
  auto w2 = var("w2", 0, 56);  // the rest may reach the factor: no split
  CHECK(simplify(h->alu(Ops::MUL, ci(56))->alu(Ops::ADD, w2)->alu(Ops::IDIV, ci(112))) != h->alu(Ops::IDIV, ci(2)));
}

TEST_CASE("symbolic_simple folds and applies identities but keeps the order of terms") {
  auto a = var("a", 0, 9), b = var("b", 0, 9);
  auto e = b->alu(Ops::ADD, a)->alu(Ops::MUL, ci(2)->alu(Ops::SUB, ci(1)));
  CHECK(graph_rewrite(e, symbolic_simple()) == b->alu(Ops::ADD, a));
  CHECK(symbolic_simple().size() < symbolic().size());
}

TEST_CASE("index arithmetic: recombined div/mod, shifts, residues, nots and max") {
  auto i = var("i", 0, 4095), x = var("x", 0, 10), y = var("y", -5, 5);
  auto split = i->alu(Ops::MOD, ci(4))->alu(Ops::MUL, ci(8))->alu(Ops::ADD, i->alu(Ops::IDIV, ci(4))->alu(Ops::MUL, ci(32)));
  CHECK(simplify(split) == i->alu(Ops::MUL, ci(8)));  // (i%4)*8 + (i//4)*32 -> i*8
  CHECK(simplify(i->alu(Ops::SHL, ci(3))) == i->alu(Ops::MUL, ci(8)));
  CHECK(simplify(i->alu(Ops::SHR, ci(2))) == i->alu(Ops::IDIV, ci(4)));
  CHECK(simplify(x->alu(Ops::ADD, ci(7))->alu(Ops::MOD, ci(4))) == x->alu(Ops::ADD, ci(3))->alu(Ops::MOD, ci(4)));
  CHECK(simplify(x->alu(Ops::MUL, ci(5))->alu(Ops::MOD, ci(4))) == x->alu(Ops::MOD, ci(4)));
  CHECK(simplify(x->alu(Ops::ADD, ci(8))->alu(Ops::IDIV, ci(4))) == x->alu(Ops::IDIV, ci(4))->alu(Ops::ADD, ci(2)));
  auto t = UOp::cnst_int(dtypes::bool_, 1);
  CHECK(simplify(y->alu(Ops::CMPLT, ci(3))->alu(Ops::CMPNE, t)) == ci(2)->alu(Ops::CMPLT, y));  // !(y<3) -> 2<y
  CHECK(simplify(x->alu(Ops::CMPLT, y)->alu(Ops::WHERE, y, x)) == x->alu(Ops::MAX, y));       // where(x<y,y,x) -> max
  CHECK(simplify(x->alu(Ops::MAX, ci(20))) == ci(20));                                          // max from bounds
  auto u = var("u", 0, 200, dtypes::uint8);
  CHECK(simplify(u->alu(Ops::ADD, UOp::cnst_int(dtypes::uint8, 255))->alu(Ops::ADD, UOp::cnst_int(dtypes::uint8, 1))) == u);
}

// ------------------------------------------------------------------ constant folding

TEST_CASE("constant folding wraps as C does, per dtype") {
  auto fold = [](Ops op, DType d, int64_t a, int64_t b) {
    return folded_int(simplify(UOp::cnst_int(d, a)->alu(op, UOp::cnst_int(d, b))));
  };
  CHECK(fold(Ops::ADD, dtypes::int8, 100, 100) == -56);
  CHECK(fold(Ops::SUB, dtypes::uint8, 0, 1) == 255);
  CHECK(fold(Ops::MUL, dtypes::int16, 300, 300) == int16_t(90000));
  CHECK(fold(Ops::IDIV, dtypes::int32, std::numeric_limits<int32_t>::min(), -1) == std::numeric_limits<int32_t>::min());
  CHECK(fold(Ops::MOD, dtypes::int32, std::numeric_limits<int32_t>::min(), -1) == 0);
  CHECK(fold(Ops::ADD, dtypes::int32, std::numeric_limits<int32_t>::max(), 1) == std::numeric_limits<int32_t>::min());
  CHECK(fold(Ops::IDIV, dtypes::index, -7, 2) == -3);
  CHECK(fold(Ops::MOD, dtypes::index, -7, 2) == -1);
  CHECK(fold(Ops::IDIV, dtypes::index, 7, -2) == -3);
  CHECK(fold(Ops::MOD, dtypes::index, 7, -2) == 1);
  CHECK(fold(Ops::IDIV, dtypes::uint32, 7, 2) == 3);
  CHECK(fold(Ops::CMPLT, dtypes::uint8, 255, 1) == 0);
  CHECK(fold(Ops::SHL, dtypes::uint8, 1, 9) == 0);
  CHECK(fold(Ops::MAX, dtypes::int8, -3, -100) == -3);
  CHECK(fold(Ops::XOR, dtypes::index, 12, 10) == 6);
  CHECK(folded_int(simplify(UOp::cnst_int(dtypes::uint64, -1)->alu(Ops::IDIV, UOp::cnst_int(dtypes::uint64, 2)))) ==
        int64_t(uint64_t(-1) / 2));
  // integer division by zero is left alone
  auto z = simplify(ci(5)->alu(Ops::IDIV, ci(0)));
  CHECK(z->op == Ops::IDIV);
  CHECK(simplify(ci(5)->alu(Ops::MOD, ci(0)))->op == Ops::MOD);
}

TEST_CASE("casts and bitcasts of constants fold") {
  CHECK(folded_int(simplify(UOp::cnst_int(dtypes::int32, 300)->cast(dtypes::uint8))) == 44);
  CHECK(folded_int(simplify(UOp::cnst_int(dtypes::int32, -1)->cast(dtypes::uint16))) == 65535);
  CHECK(simplify(cf(2.75)->cast(dtypes::int32)) == UOp::cnst_int(dtypes::int32, 2));
  CHECK(simplify(cf(-2.75)->cast(dtypes::int32)) == UOp::cnst_int(dtypes::int32, -2));
  CHECK(simplify(UOp::cnst_int(dtypes::int32, 7)->cast(dtypes::float32)) == cf(7));
  auto bc = UOp::make(Ops::BITCAST, dtypes::int32, {cf(1.0)});
  CHECK(folded_int(simplify(bc)) == 0x3f800000);
  auto x = var("x", 0, 100, dtypes::int32);
  CHECK(simplify(x->cast(dtypes::int64)->cast(dtypes::int32)) == x);            // lossless round trip
  CHECK(simplify(x->cast(dtypes::int8)->cast(dtypes::int32)) == x);             // [0,100] fits int8
  auto big = var("b", 0, 1000, dtypes::int32);
  CHECK(simplify(big->cast(dtypes::int8)->cast(dtypes::int32)) == big->cast(dtypes::int8)->cast(dtypes::int32));
}

TEST_CASE("IEEE floats fold exactly and NaN is never folded away") {
  auto inf = simplify(cf(1.0)->alu(Ops::FDIV, cf(0.0)));
  REQUIRE(inf->op == Ops::CONST);
  CHECK(std::isinf(inf->const_float()));
  CHECK(inf->const_float() > 0);
  auto nan = cf(NAN);
  auto n0 = simplify(nan->alu(Ops::MUL, cf(0.0)));
  REQUIRE(n0->op == Ops::CONST);
  CHECK(std::isnan(n0->const_float()));
  auto f = UOp::make(Ops::DEFINE_VAR, dtypes::float32, {}, VarArg{"f", 0, 0});  // an opaque float
  CHECK(simplify(f->alu(Ops::MUL, cf(0.0))) == f->alu(Ops::MUL, cf(0.0)));     // NaN*0 is NaN
  CHECK(simplify(f->alu(Ops::SUB, f)) == f->alu(Ops::SUB, f));                 // inf-inf is NaN
  CHECK(simplify(f->alu(Ops::FDIV, f)) == f->alu(Ops::FDIV, f));               // 0/0 is NaN
  CHECK(simplify(f->alu(Ops::CMPNE, f)) == f->alu(Ops::CMPNE, f));             // NaN != NaN
  CHECK(simplify(f->alu(Ops::ADD, cf(0.0))) == f->alu(Ops::ADD, cf(0.0)));     // -0.0 + 0.0 is 0.0
  CHECK(simplify(f->alu(Ops::ADD, cf(-0.0))) == f);
  CHECK(simplify(f->alu(Ops::MUL, cf(1.0))) == f);
  CHECK(simplify(f->alu(Ops::FDIV, cf(4.0))) == f->alu(Ops::MUL, cf(0.25)));
  CHECK(simplify(f->alu(Ops::FDIV, cf(3.0))) == f->alu(Ops::FDIV, cf(3.0)));
  CHECK(simplify(f->alu(Ops::ADD, cf(1.0))->alu(Ops::ADD, cf(2.0))) ==
        f->alu(Ops::ADD, cf(1.0))->alu(Ops::ADD, cf(2.0)));  // not reassociated
  auto nanlt = simplify(nan->alu(Ops::CMPLT, cf(1.0)));
  CHECK(nanlt == UOp::cnst_int(dtypes::bool_, 0));
  auto h = simplify(UOp::cnst(dtypes::float16, 65504.0)->alu(Ops::ADD, UOp::cnst(dtypes::float16, 65504.0)));
  REQUIRE(h->op == Ops::CONST);
  CHECK(std::isinf(h->const_float()));
}

TEST_CASE("a 100,000-node index expression simplifies without overflowing the stack") {
  auto a = var("a", 0, 255), b = var("b", -8, 8), c = var("c", 0, 3);
  UOpRef vs[3] = {a, b, c};
  UOpRef e = ci(0);
  for (int i = 0; i < 50000; i++) e = e->alu(Ops::ADD, vs[i % 3])->alu(Ops::MUL, ci(1));
  auto s = simplify(e);
  auto want = simplify(a->alu(Ops::MUL, ci(16667))->alu(Ops::ADD, b->alu(Ops::MUL, ci(16667)))
                           ->alu(Ops::ADD, c->alu(Ops::MUL, ci(16666))));
  CHECK(s == want);
  UOpRef d = a;  // ((d*4+3)//4) nested 25,000 deep: 100,000 nodes
  for (int i = 0; i < 25000; i++) d = d->alu(Ops::MUL, ci(4))->alu(Ops::ADD, ci(3))->alu(Ops::IDIV, ci(4));
  CHECK(simplify(d) == a);
}

// ------------------------------------------------------------------ the rule tester

TEST_CASE("every integer rule, instantiated at random, keeps its value (same tables as the rewriter)") {
  using namespace tg::sym;
  rule_check::CheckOptions o;
  std::vector<rule_check::TableResult> rs;
  uint64_t seed = 1234;
  rs.push_back(rule_check::check_table("sym_fold", sym_fold, seed++, o));
  rs.push_back(rule_check::check_table("sym_identity", sym_identity, seed++, o));
  rs.push_back(rule_check::check_table("sym_bool", sym_bool, seed++, o));
  rs.push_back(rule_check::check_table("sym_cast", sym_cast, seed++, o));
  rs.push_back(rule_check::check_table("sym_bounds", sym_bounds, seed++, o));
  rs.push_back(rule_check::check_table("sym_add", sym_add, seed++, o));
  rs.push_back(rule_check::check_table("sym_mul", sym_mul, seed++, o));
  rs.push_back(rule_check::check_table("sym_bits", sym_bits, seed++, o));
  rs.push_back(rule_check::check_table("sym_divmod", sym_divmod, seed++, o));
  rs.push_back(rule_check::check_table("sym_cmp", sym_cmp, seed++, o));
  rs.push_back(rule_check::check_table("sym_where", sym_where, seed++, o));
  rs.push_back(rule_check::check_table("sym_order", sym_order, seed++, o));
  size_t total = 0, exercised = 0, mismatches = 0;
  std::string report;
  for (auto& r : rs) {
    total += r.rules.size();
    exercised += r.exercised();
    mismatches += r.mismatches();
    report += r.report();
  }
  MESSAGE(report << "total: " << exercised << "/" << total << " integer rules exercised");
  CHECK(mismatches == 0);
  CHECK(exercised * 10 >= total * 9);
}

TEST_CASE("float rules are IEEE-exact bit for bit, and no integer rule fires on floats wrongly") {
  using namespace tg::sym;
  rule_check::CheckOptions o;
  o.floats = true;
  auto fl = rule_check::check_table("sym_float", sym_float, 99, o);
  std::vector<rule_check::TableResult> rs;
  uint64_t seed = 4321;
  rs.push_back(rule_check::check_table("sym_fold", sym_fold, seed++, o));
  rs.push_back(rule_check::check_table("sym_identity", sym_identity, seed++, o));
  rs.push_back(rule_check::check_table("sym_cast", sym_cast, seed++, o));
  rs.push_back(rule_check::check_table("sym_add", sym_add, seed++, o));
  rs.push_back(rule_check::check_table("sym_mul", sym_mul, seed++, o));
  rs.push_back(rule_check::check_table("sym_cmp", sym_cmp, seed++, o));
  rs.push_back(rule_check::check_table("sym_where", sym_where, seed++, o));
  rs.push_back(rule_check::check_table("sym_order", sym_order, seed++, o));
  std::string report = fl.report();
  size_t mismatches = fl.mismatches();
  for (auto& r : rs) mismatches += r.mismatches(), report += r.report();
  MESSAGE(report);
  CHECK(fl.exercised() == fl.rules.size());
  CHECK(fl.verified() == fl.rules.size());
  CHECK(mismatches == 0);
}

// ------------------------------------------------------------------ random expressions

TEST_CASE("100,000 random samples of simplified integer expressions match their originals") {
  rule_check::ExprFuzzer fz(20240601);
  auto t0 = std::chrono::steady_clock::now();
  size_t bad = 0;
  while (fz.samples() < 100000) {
    if (auto c = fz.step()) {
      if (bad++ < 3) MESSAGE("counterexample:\n" << fz.minimize(*c).str());
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(fz.samples() << " samples of " << fz.exprs() << " expressions in " << s << " s, " << bad << " mismatches");
  CHECK(bad == 0);
}
