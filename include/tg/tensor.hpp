#pragma once
// tg::Tensor: a lazy tensor (a handle on a UOp graph) with a PyTorch/tinygrad-style API.
// Operators build expression templates (tg::et); they become UOps when assigned to a Tensor, passed to a
// non-elementwise op, or realised. Nothing computes until realize().
// Thread-safety: a Tensor may be read from several threads; realize() and assign() on tensors that share
// a graph must not run concurrently.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tg/dtype.hpp"
#include "tg/error.hpp"
#include "tg/uop.hpp"

namespace tg {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);

/** The shape of a tensor-graph node from its sources' shapes (movement args, reduce axes, broadcast ALU). */
Shape infer_shape(Ops op, const std::vector<const Shape*>& src_shapes, const Arg& arg, DType dtype);

/** One axis of a slice: [start, stop) with step; negative indices count from the end; step may be negative. */
struct Slice {
  std::optional<int64_t> start, stop;
  int64_t step = 1;
  static Slice all() { return {}; }
  static Slice index(int64_t i) { return Slice{i, i == -1 ? std::nullopt : std::optional<int64_t>(i + 1), 1}; }
};

/** Element type of a C++ type. */
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, bool>) return dtypes::bool_;
  else if constexpr (std::is_same_v<T, int8_t>) return dtypes::int8;
  else if constexpr (std::is_same_v<T, uint8_t>) return dtypes::uint8;
  else if constexpr (std::is_same_v<T, int16_t>) return dtypes::int16;
  else if constexpr (std::is_same_v<T, uint16_t>) return dtypes::uint16;
  else if constexpr (std::is_same_v<T, int32_t>) return dtypes::int32;
  else if constexpr (std::is_same_v<T, uint32_t>) return dtypes::uint32;
  else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, long long>) return dtypes::int64;
  else if constexpr (std::is_same_v<T, uint64_t> || std::is_same_v<T, unsigned long long>) return dtypes::uint64;
  else if constexpr (std::is_same_v<T, float>) return dtypes::float32;
  else if constexpr (std::is_same_v<T, double>) return dtypes::float64;
  else static_assert(sizeof(T) == 0, "[tensor] no dtype for this C++ type");
}

struct TensorImpl;

/** A lazy tensor. Copies share the same node (like torch): realize() on one is seen by all. */
class Tensor {
 public:
  Tensor();
  explicit Tensor(UOpRef uop, Shape shape, std::string device);
  /** A 0-d tensor holding a scalar (weakly typed like a Python scalar unless a dtype is given). */
  Tensor(double v);  // NOLINT
  Tensor(int v);     // NOLINT
  Tensor(bool v);    // NOLINT

  // ---- creation
  static Tensor empty(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor full(const Shape& shape, double value, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor zeros(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor ones(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor arange(double start, double stop, double step = 1, DType dtype = dtypes::int32, const std::string& device = "");
  static Tensor arange(int64_t stop, DType dtype = dtypes::int32) { return arange(0, double(stop), 1, dtype); }
  static Tensor eye(int64_t n, int64_t m = -1, DType dtype = dtypes::float32, const std::string& device = "");
  /** A tensor from host memory: `nbytes` bytes of `dtype` elements (copied). */
  static Tensor from_blob(const void* data, const Shape& shape, DType dtype, const std::string& device = "");
  template <class T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape = {}, const std::string& device = "") {
    Shape s = shape.empty() ? Shape{int64_t(v.size())} : shape;
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<uint8_t> b(v.begin(), v.end());
      return from_blob(b.data(), s, dtypes::bool_, device).check_numel(v.size(), "from_vector");
    } else {
      return from_blob(v.data(), s, dtype_of<T>(), device).check_numel(v.size(), "from_vector");
    }
  }
  /** Seed the counter-based (threefry) generator; the same seed gives the same numbers on every backend. */
  static void manual_seed(uint64_t seed);
  static Tensor rand(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor randn(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = dtypes::int32, const std::string& device = "");

  // ---- properties
  const Shape& shape() const;
  DType dtype() const;
  const std::string& device() const;
  int ndim() const { return int(shape().size()); }
  int64_t numel() const;
  const UOpRef& uop() const;
  int64_t size(int dim) const;

  // ---- realising and reading back
  /** Compute this tensor (and nothing else) now. */
  Tensor& realize();
  template <class T>
  std::vector<T> to_vector() const {
    if (!(dtype_of<T>() == dtypes::strong(dtype())))
      throw Error("[to_vector] tensor is " + dtype().name() + ", asked for " + dtype_of<T>().name());
    std::vector<T> out(static_cast<size_t>(numel()));
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<uint8_t> b(static_cast<size_t>(out.size()));
      copy_to_host(b.data(), b.size());
      for (size_t i = 0; i < b.size(); i++) out[i] = b[i] != 0;
    } else {
      copy_to_host(out.data(), out.size() * sizeof(T));
    }
    return out;
  }
  template <class T>
  T item() const {
    if (numel() != 1) throw Error("[item] needs one element, tensor has shape " + shape_str(shape()));
    return to_vector<T>()[0];
  }
  /** All elements converted to double (any dtype). */
  std::vector<double> to_doubles() const;
  /** The same values on another device. */
  Tensor to(const std::string& device) const;
  /** Write x's values into this tensor's buffer (shapes must match; dtype is converted). */
  Tensor& assign(const Tensor& x);

  // ---- elementwise (see also the operators below)
  Tensor alu(Ops op, const Tensor& b) const;  // broadcasting + promotion
  Tensor cast(DType d) const;
  Tensor bitcast(DType d) const;
  Tensor neg() const;
  Tensor exp2() const;
  Tensor log2() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor sqrt() const;
  Tensor reciprocal() const;
  Tensor trunc() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor abs() const;
  Tensor maximum(const Tensor& b) const;
  Tensor minimum(const Tensor& b) const;
  Tensor where(const Tensor& a, const Tensor& b) const;  // this is the condition
  Tensor div(const Tensor& b) const;                       // true division
  Tensor idiv(const Tensor& b) const;                      // floor division (ints), like torch's //
  Tensor mod(const Tensor& b) const;                       // floor remainder, like torch's %
  Tensor pow(const Tensor& b) const;
  Tensor logical_not() const;

  // ---- movement
  Tensor reshape(Shape s) const;  // one -1 allowed
  Tensor permute(std::vector<int64_t> order) const;
  Tensor expand(Shape s) const;   // -1 keeps a dim
  Tensor pad(const std::vector<std::pair<int64_t, int64_t>>& p, double value = 0) const;
  Tensor shrink(const std::vector<std::pair<int64_t, int64_t>>& s) const;
  Tensor flip(std::vector<int64_t> axes) const;
  Tensor transpose(int64_t a = 1, int64_t b = 0) const;
  Tensor T() const { return transpose(); }
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor squeeze(std::optional<int64_t> dim = std::nullopt) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor slice(const std::vector<Slice>& s) const;

  // ---- reductions (axes empty = all)
  Tensor sum(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor sum(int64_t axis, bool keepdim = false) const { return sum(std::vector<int64_t>{axis}, keepdim); }
  Tensor max(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor max(int64_t axis, bool keepdim = false) const { return max(std::vector<int64_t>{axis}, keepdim); }
  Tensor min(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor min(int64_t axis, bool keepdim = false) const { return min(std::vector<int64_t>{axis}, keepdim); }
  Tensor prod(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor prod(int64_t axis, bool keepdim = false) const { return prod(std::vector<int64_t>{axis}, keepdim); }
  Tensor mean(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor mean(int64_t axis, bool keepdim = false) const { return mean(std::vector<int64_t>{axis}, keepdim); }
  Tensor softmax(int64_t axis = -1) const;

  Tensor contiguous() const;
  Tensor detach() const;
  /** Same data, broadcast to a common shape with b (PyTorch rules). */
  static Shape broadcast_shape(const Shape& a, const Shape& b, const char* op);

  // ---- autograd (symbolic: gradients are UOp graphs built by the rule table in gradient.hpp)
  /** Mark this tensor as a leaf whose gradient backward() computes. */
  Tensor& requires_grad_(bool on = true);
  bool requires_grad() const;
  /** The accumulated gradient (a tensor of this shape); throws if none was computed. */
  Tensor grad() const;
  bool has_grad() const;
  void zero_grad();
  /** Gradients of this scalar (or with `seed` for a non-scalar) into every requires_grad tensor it depends on,
   *  added to what they hold. The gradient graph is lazy: realise it (or an optimiser step) to compute it. */
  void backward();
  void backward(const Tensor& seed);
  /** d(this)/d(wrt) for each target (zeros where this does not depend on it); works on gradients too. */
  std::vector<Tensor> gradient(const std::vector<Tensor>& wrt, const Tensor* seed = nullptr) const;

  /** Realise several tensors together (one schedule). */
  static void realize_all(std::vector<Tensor*> ts);
  std::shared_ptr<TensorImpl> impl() const { return impl_; }

 private:
  friend void replace_realized(const std::vector<std::pair<const UOp*, UOpRef>>&);
  Tensor check_numel(size_t n, const char* op) const;
  void copy_to_host(void* dst, size_t bytes) const;
  Tensor reduce(Ops op, std::vector<int64_t> axes, bool keepdim, const char* name) const;
  Tensor mov(Ops op, Arg arg, Shape out) const;
  int64_t norm_axis(int64_t a, const char* op) const;
  std::shared_ptr<TensorImpl> impl_;
};

/** Shared state behind Tensor handles. */
struct TensorImpl {
  UOpRef uop;
  Shape shape;
  std::string device;
  bool weak = false;           // a Python-like scalar (weakly typed)
  bool requires_grad = false;  // a leaf whose gradient is wanted, or computed from one
  std::shared_ptr<TensorImpl> grad;
};

/** While one of these lives (per thread), new tensors do not require gradients. */
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;
  static bool active();

 private:
  bool prev_;
};

// ================================================================ expression templates

namespace et {

/** What is known about an expression's dtype at compile time. */
enum class Kind { Unknown, Bool, Int, Float };

template <class T>
struct is_expr : std::false_type {};

/** Lowering of an operand: Tensor as is, scalars as weak 0-d tensors. */
inline Tensor lower(const Tensor& t) { return t; }
template <class T>
  requires std::is_arithmetic_v<T>
Tensor lower(T v) {
  if constexpr (std::is_same_v<T, bool>) return Tensor(v);
  else if constexpr (std::is_integral_v<T>) return Tensor(int(v));
  else return Tensor(double(v));
}

template <class T>
constexpr Kind kind_of() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) return Kind::Bool;
  else if constexpr (std::is_integral_v<U>) return Kind::Int;
  else if constexpr (std::is_floating_point_v<U>) return Kind::Float;
  else if constexpr (is_expr<U>::value) return U::kind;
  else return Kind::Unknown;
}

/** Forwarding of Tensor methods on expressions, so `(a*b).sum(1)` reads naturally. */
template <class D>
struct ExprBase {
  Tensor tensor() const { return static_cast<const D&>(*this).eval(); }
  operator Tensor() const { return tensor(); }  // NOLINT: expressions become tensors on assignment
  Shape shape() const { return tensor().shape(); }
  DType dtype() const { return tensor().dtype(); }
  template <class... A>
  Tensor sum(A&&... a) const { return tensor().sum(std::forward<A>(a)...); }
  template <class... A>
  Tensor max(A&&... a) const { return tensor().max(std::forward<A>(a)...); }
  template <class... A>
  Tensor min(A&&... a) const { return tensor().min(std::forward<A>(a)...); }
  template <class... A>
  Tensor mean(A&&... a) const { return tensor().mean(std::forward<A>(a)...); }
  template <class... A>
  Tensor prod(A&&... a) const { return tensor().prod(std::forward<A>(a)...); }
  Tensor reshape(Shape s) const { return tensor().reshape(std::move(s)); }
  Tensor permute(std::vector<int64_t> o) const { return tensor().permute(std::move(o)); }
  Tensor expand(Shape s) const { return tensor().expand(std::move(s)); }
  Tensor cast(DType d) const { return tensor().cast(d); }
  Tensor contiguous() const { return tensor().contiguous(); }
  Tensor realize() const { Tensor t = tensor(); t.realize(); return t; }
  template <class T>
  std::vector<T> to_vector() const { return tensor().template to_vector<T>(); }
  template <class T>
  T item() const { return tensor().template item<T>(); }
};

template <Ops O, class A, class B>
struct Bin : ExprBase<Bin<O, A, B>> {
  A a;
  B b;
  static constexpr Kind ka = kind_of<A>(), kb = kind_of<B>();
  static constexpr Kind kind = is_comparison(O) ? Kind::Bool
                               : O == Ops::FDIV ? Kind::Float
                               : (ka == Kind::Float || kb == Kind::Float) ? Kind::Float
                               : (ka == Kind::Int && kb == Kind::Int) ? Kind::Int
                               : (ka == Kind::Bool && kb == Kind::Bool) ? Kind::Bool
                               : Kind::Unknown;
  static_assert(!((O == Ops::AND || O == Ops::OR || O == Ops::XOR || O == Ops::SHL || O == Ops::SHR) &&
                  (ka == Kind::Float || kb == Kind::Float)),
                "[tensor] bitwise ops need int or bool operands, and this operand is statically float");
  static_assert(!((O == Ops::SHL || O == Ops::SHR) && (ka == Kind::Bool || kb == Kind::Bool)),
                "[tensor] shifts need int operands");
  Bin(A a_, B b_) : a(std::move(a_)), b(std::move(b_)) {}
  Tensor eval() const {
    Tensor l = lower(a), r = lower(b);
    if constexpr (O == Ops::FDIV) return l.div(r);
    else if constexpr (O == Ops::MOD) return l.mod(r);
    else if constexpr (O == Ops::SUB) return l.alu(Ops::ADD, r.neg());
    else return l.alu(O, r);
  }
};

/** `a > b` and `a >= b` are built from CMPLT with swapped operands / negation, as in tinygrad. */
template <bool Swap, bool Not, class A, class B>
struct Cmp : ExprBase<Cmp<Swap, Not, A, B>> {
  A a;
  B b;
  static constexpr Kind kind = Kind::Bool;
  Cmp(A a_, B b_) : a(std::move(a_)), b(std::move(b_)) {}
  Tensor eval() const {
    Tensor l = lower(a), r = lower(b);
    Tensor c = Swap ? r.alu(Ops::CMPLT, l) : l.alu(Ops::CMPLT, r);
    return Not ? c.logical_not() : c;
  }
};

template <Ops O, class A>
struct Un : ExprBase<Un<O, A>> {
  A a;
  static constexpr Kind kind = O == Ops::NEG ? kind_of<A>() : (O == Ops::XOR ? kind_of<A>() : Kind::Float);
  static_assert(!(O == Ops::XOR && kind_of<A>() == Kind::Float), "[tensor] ~ needs an int or bool operand");
  explicit Un(A a_) : a(std::move(a_)) {}
  Tensor eval() const {
    Tensor t = lower(a);
    if constexpr (O == Ops::NEG) return t.neg();
    else if constexpr (O == Ops::XOR) return t.dtype() == dtypes::bool_ ? t.logical_not() : t.alu(Ops::XOR, Tensor(-1));
    else return t;
  }
};

template <Ops O, class A, class B>
struct is_expr<Bin<O, A, B>> : std::true_type {};
template <bool S, bool N, class A, class B>
struct is_expr<Cmp<S, N, A, B>> : std::true_type {};
template <Ops O, class A>
struct is_expr<Un<O, A>> : std::true_type {};

template <class T>
inline constexpr bool is_tensorish = std::is_same_v<std::remove_cvref_t<T>, Tensor> || is_expr<std::remove_cvref_t<T>>::value;
template <class T>
inline constexpr bool is_operand = is_tensorish<T> || std::is_arithmetic_v<std::remove_cvref_t<T>>;

/** How an operand is stored in an expression node: tensors and expressions by value (cheap handles). */
template <class T>
using stored = std::remove_cvref_t<T>;

template <class A>
decltype(auto) lower(const A& e)
  requires is_expr<A>::value
{
  return e.eval();
}

}  // namespace et

#define TG_ET_BINOP(sym, OPNAME)                                                                      \
  template <class A, class B>                                                                         \
    requires(et::is_operand<A> && et::is_operand<B> && (et::is_tensorish<A> || et::is_tensorish<B>)) \
  auto operator sym(A&& a, B&& b) {                                                                   \
    return et::Bin<Ops::OPNAME, et::stored<A>, et::stored<B>>(std::forward<A>(a), std::forward<B>(b)); \
  }
TG_ET_BINOP(+, ADD)
TG_ET_BINOP(-, SUB)
TG_ET_BINOP(*, MUL)
TG_ET_BINOP(/, FDIV)
TG_ET_BINOP(%, MOD)
TG_ET_BINOP(&, AND)
TG_ET_BINOP(|, OR)
TG_ET_BINOP(^, XOR)
TG_ET_BINOP(<<, SHL)
TG_ET_BINOP(>>, SHR)
TG_ET_BINOP(<, CMPLT)
TG_ET_BINOP(==, CMPEQ)
TG_ET_BINOP(!=, CMPNE)
#undef TG_ET_BINOP

template <class A, class B>
  requires(et::is_operand<A> && et::is_operand<B> && (et::is_tensorish<A> || et::is_tensorish<B>))
auto operator>(A&& a, B&& b) {
  return et::Cmp<true, false, et::stored<A>, et::stored<B>>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
  requires(et::is_operand<A> && et::is_operand<B> && (et::is_tensorish<A> || et::is_tensorish<B>))
auto operator>=(A&& a, B&& b) {
  return et::Cmp<false, true, et::stored<A>, et::stored<B>>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
  requires(et::is_operand<A> && et::is_operand<B> && (et::is_tensorish<A> || et::is_tensorish<B>))
auto operator<=(A&& a, B&& b) {
  return et::Cmp<true, true, et::stored<A>, et::stored<B>>(std::forward<A>(a), std::forward<B>(b));
}
template <class A>
  requires et::is_tensorish<A>
auto operator-(A&& a) {
  return et::Un<Ops::NEG, et::stored<A>>(std::forward<A>(a));
}
template <class A>
  requires et::is_tensorish<A>
auto operator~(A&& a) {
  return et::Un<Ops::XOR, et::stored<A>>(std::forward<A>(a));
}

/** Realise several tensors in one schedule. */
template <class... Ts>
void realize(Ts&... ts) {
  Tensor::realize_all({&ts...});
}

}  // namespace tg
