#pragma once
// Symbolic shapes. A Variable is a named integer with bounds (a DEFINE_VAR); bound to a value it gives a `sint`, an
// integer expression that sizes or offsets a tensor dim: `cache.shrink({{0, 1}, {0, pos + 1}, {0, 64}})`. Kernels
// take the variable as a parameter, so realising the same graph with other values compiles nothing new; a tensor
// with a symbolic dim is stored at its largest size (the variable's maximum) and only its first elements are valid.
// Thread-safety: Variables and sints are immutable values.
#include "tg/config.hpp"

#include <concepts>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tg/uop.hpp"

namespace tg {

/** An int or a symbolic integer expression (index dtype) over bound or unbound Variables. */
class sint {
 public:
  sint() : sint(int64_t(0)) {}
  /// an int as a constant sint (implicit: ints are sints)
  template <std::integral T>
  sint(T v) : u_(UOp::cnst_int(dtypes::index, int64_t(v))) {}  // NOLINT: ints are sints
  /** An index expression (simplified). */
  explicit sint(const UOpRef& expr);

  /// whether it is a plain int (no variables)
  bool is_int() const { return u_->is_const(); }
  /** The value: the int, or the expression evaluated with its bound variables (a tg::Error when one is unbound). */
  int64_t value() const;
  /** Bounds over every value of the variables. */
  int64_t min() const { return u_->vmin(); }
  /// the largest value over every value of the variables
  int64_t max() const { return u_->vmax(); }
  /// the index expression (a CONST for an int)
  const UOpRef& uop() const { return u_; }
  /** "start_pos+1", or the int. */
  std::string str() const;

  /// the simplified sum (ints fold to an int)
  friend sint operator+(const sint& a, const sint& b);
  /// the simplified difference (ints fold to an int)
  friend sint operator-(const sint& a, const sint& b);
  /// the simplified product (ints fold to an int)
  friend sint operator*(const sint& a, const sint& b);
  /** Same expression (after simplification). */
  friend bool operator==(const sint& a, const sint& b) { return a.u_ == b.u_; }

 private:
  UOpRef u_;
};
/// A shape whose dims may be symbolic.
using SymShape = std::vector<sint>;
/// "(1, start_pos+1)": a symbolic shape as errors show it
std::string shape_str(const SymShape& s);

/** A bounded integer for symbolic shapes: `Variable pos("start_pos", 0, 1023); t.shrink({{0, pos.bind(5) + 1}})`. */
class Variable {
 public:
  /// a variable named `name` taking values in [min, max]; an empty name or a negative min is a tg::Error
  Variable(std::string name, int64_t min, int64_t max);
  /** This variable bound to `v` (a tg::Error outside [min, max]). */
  sint bind(int64_t v) const;
  /** The unbound variable (a graph that uses it needs a bound value before it is realised). */
  operator sint() const { return sint(u_); }  // NOLINT
  /// the name, as kernels' int parameters and shape strings show it
  const std::string& name() const;
  /// the smallest value it may take
  int64_t min() const { return u_->vmin(); }
  /// the largest value it may take
  int64_t max() const { return u_->vmax(); }
  /// the unbound DEFINE_VAR node
  const UOpRef& uop() const { return u_; }

 private:
  UOpRef u_;
};

/** Values of variables by name (a schedule's, a JIT call's). */
using VarVals = std::vector<std::pair<std::string, int64_t>>;

/** The variables bound in a graph, by name, in order of first appearance; a tg::Error when one is bound to two
 *  different values, naming `op`. */
VarVals bound_vars(std::span<const UOpRef> roots, const char* op);
/** `u` with every BIND replaced by its variable (DEFINE_VAR), and the values collected into `vals`. */
UOpRef unbind(const UOpRef& u, std::vector<std::pair<std::string, int64_t>>* vals = nullptr);
/** `u` with the variables named in `vals` bound to those values (BIND nodes replaced or added). */
UOpRef rebind(const UOpRef& u, const std::vector<std::pair<std::string, int64_t>>& vals);

}  // namespace tg
