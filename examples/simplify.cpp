// Builds an index expression, prints its graph, simplifies it with tg's symbolic rules, prints it again.
#include <cstdio>

#include "tg/symbolic.hpp"

int main() {
  using namespace tg;
  auto x = UOp::variable("x", 0, 255);
  auto c = [](int64_t v) { return UOp::cnst_int(dtypes::index, v); };
  // ((x*4 + 3) // 4) + (x*2 + x*3) * 1 + 0
  auto e = x->alu(Ops::MUL, c(4))->alu(Ops::ADD, c(3))->alu(Ops::IDIV, c(4))
               ->alu(Ops::ADD, x->alu(Ops::MUL, c(2))->alu(Ops::ADD, x->alu(Ops::MUL, c(3)))->alu(Ops::MUL, c(1)))
               ->alu(Ops::ADD, c(0));
  std::printf("before: %s\n%s\n", render_expr(e.get()).c_str(), print_graph(e.get()).c_str());
  auto s = simplify(e);
  std::printf("after:  %s\n%s", render_expr(s.get()).c_str(), print_graph(s.get()).c_str());
  return 0;
}
