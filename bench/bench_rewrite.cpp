// IR and rewrite speed: interning 1,000,000 nodes (with duplicates), and simplifying a 100,000-node index
// expression. Prints absolute figures; scripts/bench_tinygrad_rewrite.py measures the same in tinygrad.
#include <chrono>
#include <cstdio>
#include <vector>

#include "tg/symbolic.hpp"

using namespace tg;
using clk = std::chrono::steady_clock;

static double ms_since(clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); }

int main() {
  auto c = [](int64_t v) { return UOp::cnst_int(dtypes::index, v); };
  // 1. Interning: 1,000,000 node constructions, half of them duplicates of live nodes.
  {
    auto x = UOp::variable("x", 0, 1023);
    std::vector<UOpRef> keep;
    keep.reserve(500000);
    auto t = clk::now();
    UOpRef e = x;
    for (int i = 0; i < 500000; i++) {
      e = e->alu(Ops::ADD, c(i & 1023));  // new node
      keep.push_back(e);
    }
    double t_new = ms_since(t);
    t = clk::now();
    UOpRef d = x;
    for (int i = 0; i < 500000; i++) d = d->alu(Ops::ADD, c(i & 1023));  // all duplicates: same objects
    double t_dup = ms_since(t);
    std::printf("intern  : 1,000,000 nodes in %.1f ms (%.2f M nodes/s; new %.1f ms, duplicates %.1f ms), same=%d\n",
                t_new + t_dup, 1000.0 / (t_new + t_dup), t_new, t_dup, int(d == e));
  }
  // 2. Simplify a 100,000-node index expression: a chain of ((e*4+3)//4 + y*2 + y*3) terms.
  {
    auto x = UOp::variable("x", 0, 255), y = UOp::variable("y", 0, 15);
    UOpRef e = x;
    auto t = clk::now();
    size_t nodes = 0;
    while ((nodes = toposort(e.get()).size()) < 100000) {
      for (int k = 0; k < 1000; k++)
        e = e->alu(Ops::MUL, c(4))->alu(Ops::ADD, c(3))->alu(Ops::IDIV, c(4))
                ->alu(Ops::ADD, y->alu(Ops::MUL, c(2)))->alu(Ops::ADD, y->alu(Ops::MUL, c(3)))->alu(Ops::ADD, c(k & 7));
    }
    double t_build = ms_since(t);
    t = clk::now();
    auto s = simplify(e);
    double t_simp = ms_since(t);
    std::printf("simplify: %zu-node expression in %.1f ms (%.0f nodes/ms; built in %.1f ms) -> %zu nodes\n", nodes,
                t_simp, double(nodes) / t_simp, t_build, toposort(s.get()).size());
  }
  return 0;
}
