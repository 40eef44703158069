#pragma once
// tg::Tensor: a lazy tensor (a handle on a UOp graph) with a PyTorch/tinygrad-style API.
// Operators build expression templates (tg::et); they become UOps when assigned to a Tensor, passed to a
// non-elementwise op, or realised. Nothing computes until realize().
// Thread-safety: Tensors may be built, realised and read from several threads. realize(), assign() and host
// reads take one process-wide lock (a realise also substitutes its results into every live tensor), so they run
// one at a time while graph building runs in parallel; the kernels of one realise use every core. A tensor
// handle (and its copies) that one thread realises or assigns must not be read by another at the same moment.
#include "tg/config.hpp"

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tg/dtype.hpp"
#include "tg/error.hpp"
#include "tg/uop.hpp"
#include "tg/variable.hpp"

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

/** An int or a per-dimension list, like torch's `int | tuple[int, ...]`: one value applies to every spatial dim;
 *  an empty list means "the op's default" (e.g. a pool's stride defaults to its kernel size). */
struct IntArg {
  std::vector<int64_t> v;
  IntArg() = default;
  IntArg(int x) : v{x} {}      // NOLINT
  IntArg(int64_t x) : v{x} {}  // NOLINT
  IntArg(std::initializer_list<int64_t> l) : v(l) {}
  IntArg(std::vector<int64_t> l) : v(std::move(l)) {}  // NOLINT
};

/** Padding of a convolution or pool: an int, one int per spatial dim (both sides), 2 per spatial dim
 *  ((begin, end) for each dim in order), or "same" / "valid" (convolutions only). */
struct ConvPadding {
  std::vector<int64_t> v;
  std::string mode;  // "same", "valid", or empty when v holds the amounts
  ConvPadding(int x) : v{x} {}      // NOLINT
  ConvPadding(int64_t x) : v{x} {}  // NOLINT
  ConvPadding(std::initializer_list<int64_t> l) : v(l) {}
  ConvPadding(std::vector<int64_t> l) : v(std::move(l)) {}  // NOLINT
  ConvPadding(const char* m) : mode(m) {}                    // NOLINT
  ConvPadding(std::string m) : mode(std::move(m)) {}         // NOLINT
};

/** Index tags: `NewAxis` inserts a size-1 dim (numpy's None), `Ellipsis` stands for all remaining dims. */
struct NewAxisT {};
inline constexpr NewAxisT NewAxis{};
struct EllipsisT {};
inline constexpr EllipsisT Ellipsis{};
struct TensorIndex;  // defined after Tensor: an int, a Slice, an integer Tensor, NewAxis or Ellipsis

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

/** Values and their indices (int64) along a reduced dim: `auto [v, i] = t.max_with_indices(1);`. */
struct ValuesIndices;

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
  /** Symbolic shapes: `Tensor::full({1, pos + 1}, 0.f)` (braced lists of ints take these too, as ints). */
  static Tensor full(const SymShape& shape, double value, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor full(std::initializer_list<sint> shape, double value, DType dtype = dtypes::float32, const std::string& device = "") {
    return full(SymShape(shape), value, dtype, device);
  }
  static Tensor zeros(std::initializer_list<sint> s, DType d = dtypes::float32, const std::string& dev = "") { return full(s, 0, d, dev); }
  static Tensor ones(std::initializer_list<sint> s, DType d = dtypes::float32, const std::string& dev = "") { return full(s, 1, d, dev); }
  /** A 0-d tensor holding the value of `v` (a kernel parameter when `v` is symbolic: one kernel for every value). */
  static Tensor from_sint(const sint& v, DType dtype = dtypes::int32, const std::string& device = "");
  /** start, start + step, ... below stop. dtype unset: float32 if an argument is not a whole number, else int32. */
  static Tensor arange(double start, double stop, double step = 1, DType dtype = dtypes::void_, const std::string& device = "");
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
  /** From a braced list, the dtype deduced from the elements: `Tensor::from_vector({1.f, 2.f})` is float32. */
  template <class T>
  static Tensor from_vector(std::initializer_list<T> v, const Shape& shape = {}, const std::string& device = "") {
    return from_vector(std::vector<T>(v), shape, device);
  }
  /** Seed the counter-based (threefry) generator; the same seed gives the same numbers on every backend. */
  static void manual_seed(uint64_t seed);
  static Tensor rand(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor randn(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  static Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = dtypes::int32, const std::string& device = "");

  // ---- properties
  /** The shape; a tg::Error on a tensor with a symbolic dim (see sym_shape). */
  const Shape& shape() const;
  /** Symbolic shapes (tg/variable.hpp): whether a dim depends on a Variable, the dims as sints, and the largest
   *  value of each (how the tensor's buffer is laid out). For a tensor without variables, all three agree with shape(). */
  bool is_symbolic() const { return uop()->sym() != nullptr; }
  SymShape sym_shape() const;
  const Shape& max_shape() const;
  DType dtype() const;
  const std::string& device() const;
  int ndim() const { return int(max_shape().size()); }
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
    std::vector<T> out(read_count());  // a symbolic tensor reads its dims at their bound values
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
  /** Write x's values into this tensor's buffer (shapes must match; dtype is converted). Lazy tensors defined
   *  before keep the old values (they are realised before the write); views of the buffer see the new ones. */
  Tensor& assign(const Tensor& x);
  /** In place, like torch's `t += x`: x broadcasts to this shape, the result keeps this dtype (a float result into
   *  an int or bool tensor is an error). Every handle sharing this tensor sees the new value: a realised buffer is
   *  updated with assign(), a lazy tensor's graph is replaced. Refused on a tensor that requires grad (outside
   *  NoGrad), as torch refuses it on a leaf. */
  Tensor& operator+=(const Tensor& x);
  Tensor& operator-=(const Tensor& x);
  Tensor& operator*=(const Tensor& x);
  Tensor& operator/=(const Tensor& x);

  // ---- elementwise (see also the operators below)
  /** Broadcasting + promotion. Integer IDIV/MOD truncate, as C, and are defined for every divisor: x / 0 = 0,
   *  x % 0 = 0, INT_MIN / -1 = INT_MIN (no kernel divides by 0 or by -1; see README "Semantics"). */
  Tensor alu(Ops op, const Tensor& b) const;
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
  Tensor idiv(const Tensor& b) const;                      // floor division (ints), like torch's //; x // 0 = 0
  Tensor mod(const Tensor& b) const;                       // floor remainder, like torch's %; int x % 0 = 0
  Tensor pow(const Tensor& b) const;
  Tensor logical_not() const;

  // ---- movement
  Tensor reshape(Shape s) const;  // one -1 allowed
  /** Symbolic dims (no -1): each symbolic dim stays a dim of its own, at the same place in the layout. */
  Tensor reshape(const SymShape& s) const;
  Tensor reshape(std::initializer_list<sint> s) const { return reshape(SymShape(s)); }
  Tensor permute(std::vector<int64_t> order) const;
  Tensor expand(Shape s) const;   // -1 keeps a dim
  Tensor expand(const SymShape& s) const;
  Tensor expand(std::initializer_list<sint> s) const { return expand(SymShape(s)); }
  Tensor pad(const std::vector<std::pair<int64_t, int64_t>>& p, double value = 0) const;
  /** Symbolic amounts: `x.pad({{p, 0}})` puts x after the first p positions (cat along a symbolic dim). */
  Tensor pad(const std::vector<std::pair<sint, sint>>& p, double value = 0) const;
  Tensor pad(std::initializer_list<std::pair<sint, sint>> p, double value = 0) const {
    return pad(std::vector<std::pair<sint, sint>>(p), value);
  }
  Tensor shrink(const std::vector<std::pair<int64_t, int64_t>>& s) const;
  /** Symbolic bounds: `cache.shrink({{0, 1}, {0, pos + 1}})`, `freqs.shrink({{pos, pos + 1}, {0, 64}})`. */
  Tensor shrink(const std::vector<std::pair<sint, sint>>& s) const;
  Tensor shrink(std::initializer_list<std::pair<sint, sint>> s) const { return shrink(std::vector<std::pair<sint, sint>>(s)); }
  Tensor flip(std::vector<int64_t> axes) const;
  Tensor transpose(int64_t a = 1, int64_t b = 0) const;
  Tensor T() const { return transpose(); }
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor squeeze(std::optional<int64_t> dim = std::nullopt) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor slice(const std::vector<Slice>& s) const;
  /** `t[i]` selects along dim 0 and drops it (negative counts from the end); `t[Slice{1, 3}]` slices dim 0;
   *  `t[{0, Slice::all(), NewAxis}]` indexes several dims, as index(). */
  Tensor operator[](const TensorIndex& i) const;
  Tensor operator[](std::initializer_list<TensorIndex> idx) const;

  // ---- reductions (axes empty = all)
  Tensor sum(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor sum(int64_t axis, bool keepdim = false) const { return sum(std::vector<int64_t>{axis}, keepdim); }
  Tensor max(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor max(int64_t axis, bool keepdim = false) const { return max(std::vector<int64_t>{axis}, keepdim); }
  Tensor min(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor min(int64_t axis, bool keepdim = false) const { return min(std::vector<int64_t>{axis}, keepdim); }
  /** The maximum along dim and the index (int64) of its first occurrence, as torch.max(dim). */
  ValuesIndices max_with_indices(int64_t dim, bool keepdim = false) const;
  /** The minimum along dim and the index (int64) of its first occurrence, as torch.min(dim). */
  ValuesIndices min_with_indices(int64_t dim, bool keepdim = false) const;
  Tensor prod(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor prod(int64_t axis, bool keepdim = false) const { return prod(std::vector<int64_t>{axis}, keepdim); }
  Tensor mean(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor mean(int64_t axis, bool keepdim = false) const { return mean(std::vector<int64_t>{axis}, keepdim); }
  Tensor softmax(int64_t axis = -1) const;

  Tensor contiguous() const;
  Tensor detach() const;
  /** Same data, broadcast to a common shape with b (PyTorch rules). */
  static Shape broadcast_shape(const Shape& a, const Shape& b, const char* op);

  // ================================================================ the full API (src/tensor/ops_*.cpp)
  // Every op validates its inputs first and throws tg::Error("[op] ...") naming what was given and expected.
  // All ops are compositions of the primitives above (alu, cast, where, movement, reductions): no new kernels.

  // ---- creation (ops_math.cpp)
  /** `steps` evenly spaced values from start to stop inclusive (computed like torch.linspace). */
  static Tensor linspace(double start, double stop, int64_t steps, DType dtype = dtypes::float32, const std::string& device = "");
  /** Uniform in [low, high). */
  static Tensor uniform(const Shape& shape, double low = 0, double high = 1, DType dtype = dtypes::float32, const std::string& device = "");
  /** Normal with the given mean and standard deviation. */
  static Tensor normal(const Shape& shape, double mean = 0, double std = 1, DType dtype = dtypes::float32, const std::string& device = "");
  /** uniform(-1, 1) scaled by numel^-0.5 (tinygrad). */
  static Tensor scaled_uniform(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  /** Glorot/Xavier uniform: bound sqrt(6 / (shape[0] + prod(shape[1:]))). */
  static Tensor glorot_uniform(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  /** Kaiming/He uniform with leaky-relu slope a: bound sqrt(6 / (1 + a^2) / prod(shape[1:])). */
  static Tensor kaiming_uniform(const Shape& shape, double a = 0.01, DType dtype = dtypes::float32, const std::string& device = "");
  /** Kaiming/He normal: std sqrt(2 / (1 + a^2) / prod(shape[1:])). */
  static Tensor kaiming_normal(const Shape& shape, double a = 0.01, DType dtype = dtypes::float32, const std::string& device = "");
  /** Same shape and device, filled with a value (dtype defaults to this tensor's). */
  Tensor full_like(double value, std::optional<DType> dtype = std::nullopt) const;
  Tensor zeros_like(std::optional<DType> dtype = std::nullopt) const;
  Tensor ones_like(std::optional<DType> dtype = std::nullopt) const;
  Tensor rand_like(std::optional<DType> dtype = std::nullopt) const;
  Tensor randn_like(std::optional<DType> dtype = std::nullopt) const;
  /** Lower / upper triangle of the last two dims (elements above / below `diagonal` set to 0). */
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;

  // ---- math (ops_math.cpp); results of int inputs are float like torch. Inverse trig functions and erf use
  // float32-accurate approximations (absolute error below 2e-7), also in float64.
  Tensor tan() const;
  /** Abramowitz-Stegun 4.4.46 polynomial; NaN outside [-1, 1]. */
  Tensor asin() const;
  Tensor acos() const;
  Tensor atan() const;
  Tensor sinh() const;
  Tensor cosh() const;
  Tensor tanh() const;
  Tensor asinh() const;
  Tensor acosh() const;
  Tensor atanh() const;
  /** Taylor series below |x| = 0.5, a Chebyshev fit of erfc above (derivatives accurate to ~3e-7). */
  Tensor erf() const;
  Tensor log10() const;
  Tensor log1p() const;
  Tensor expm1() const;
  Tensor rsqrt() const;
  Tensor square() const;
  /** x ** e for a float scalar exponent: int inputs give float (small integral exponents are exact products). */
  Tensor pow(double e) const;
  /** x ** e for an int scalar exponent: int inputs stay int (torch's rule for an int scalar). */
  Tensor pow(int e) const;
  /** -1, 0 or 1 in the input's dtype. */
  Tensor sign() const;
  Tensor floor() const;
  Tensor ceil() const;
  /** Round half to even, like torch.round. */
  Tensor round() const;
  /** min(max(x, min), max); an int tensor with integral bounds stays int. The gradient passes where min <= x <= max. */
  Tensor clamp(double min, double max) const;
  /** clamp with broadcast tensor bounds. */
  Tensor clamp(const Tensor& min, const Tensor& max) const;
  Tensor clamp_min(double min) const;
  Tensor clamp_max(double max) const;
  Tensor clip(double min, double max) const { return clamp(min, max); }
  /** this + weight * (end - this). */
  Tensor lerp(const Tensor& end, const Tensor& weight) const;
  /** Elementwise tests (bool); always false (isfinite: true) for int and bool tensors. */
  Tensor isnan() const;
  Tensor isinf() const;
  Tensor isfinite() const;

  // ---- activations (ops_math.cpp), with torch's definitions and default constants
  Tensor relu6() const;
  Tensor leaky_relu(double negative_slope = 0.01) const;
  Tensor elu(double alpha = 1.0) const;
  Tensor celu(double alpha = 1.0) const;
  Tensor selu() const;
  /** approximate: "none" (exact, via erf) or "tanh". */
  Tensor gelu(const std::string& approximate = "none") const;
  /** x * sigmoid(1.702 x). */
  Tensor quick_gelu() const;
  Tensor silu() const;
  Tensor swish() const { return silu(); }
  Tensor mish() const;
  /** log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch). */
  Tensor softplus(double beta = 1.0, double threshold = 20.0) const;
  Tensor softsign() const;
  Tensor hardsigmoid() const;
  Tensor hardswish() const;
  Tensor hardtanh(double min_val = -1.0, double max_val = 1.0) const;
  Tensor logsigmoid() const;

  // ---- comparisons, logical and bitwise ops (ops_math.cpp), broadcasting; comparisons and logical ops give bool
  Tensor eq(const Tensor& b) const;
  Tensor ne(const Tensor& b) const;
  Tensor lt(const Tensor& b) const;
  Tensor le(const Tensor& b) const;
  Tensor gt(const Tensor& b) const;
  Tensor ge(const Tensor& b) const;
  Tensor logical_and(const Tensor& b) const;
  Tensor logical_or(const Tensor& b) const;
  Tensor logical_xor(const Tensor& b) const;
  Tensor bitwise_and(const Tensor& b) const;
  Tensor bitwise_or(const Tensor& b) const;
  Tensor bitwise_xor(const Tensor& b) const;
  Tensor bitwise_not() const;
  /** Shifts of int tensors (rshift is arithmetic for signed types). */
  Tensor lshift(const Tensor& b) const;
  Tensor rshift(const Tensor& b) const;

  // ---- movement and indexing (ops_movement.cpp)
  /** Tile the tensor `repeats[i]` times along each dim (torch.Tensor.repeat; extra leading repeats add dims). */
  Tensor repeat(const std::vector<int64_t>& repeats) const;
  /** Each element repeated `repeats` times along dim (flattened first when dim is not given). */
  Tensor repeat_interleave(int64_t repeats, std::optional<int64_t> dim = std::nullopt) const;
  /** Pieces of `size` along dim (the last may be smaller). */
  std::vector<Tensor> split(int64_t size, int64_t dim = 0) const;
  /** Pieces with the given sizes along dim (they must sum to the dim's size). */
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t dim = 0) const;
  /** `chunks` pieces of ceil(n / chunks) along dim (fewer when they run out, like torch). */
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  /** Elements shifted by shifts[i] along dims[i], wrapping around; no dims: the flattened tensor. */
  Tensor roll(const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims = {}) const;
  Tensor roll(int64_t shift, int64_t dim) const { return roll(std::vector<int64_t>{shift}, std::vector<int64_t>{dim}); }
  /** Split one dim into several (one -1 allowed). */
  Tensor unflatten(int64_t dim, const std::vector<int64_t>& sizes) const;
  /** The diagonal of dims (dim1, dim2) with an offset, as a new last dim. */
  Tensor diagonal(int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1) const;
  /** out[i][j] = this[i][index[i][j]] along dim (torch.gather); out-of-range indices read 0. */
  Tensor gather(int64_t dim, const Tensor& index) const;
  /** Rows (along dim) picked by a 1-D or 0-d integer index. */
  Tensor index_select(int64_t dim, const Tensor& index) const;
  /** A copy with src[i][j] written at this[i][index[i][j]] along dim (indices must not repeat). */
  Tensor scatter(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor scatter(int64_t dim, const Tensor& index, double value) const;
  /** Scatter with a reduction: "sum", "prod", "mean", "amax" or "amin"; include_self adds this tensor's values. */
  Tensor scatter_reduce(int64_t dim, const Tensor& index, const Tensor& src, const std::string& reduce, bool include_self = true) const;
  /** value where mask (broadcast) is true, this elsewhere; keeps this dtype. */
  Tensor masked_fill(const Tensor& mask, const Tensor& value) const;
  /** The elements where mask (broadcast with this) is true, flattened in order (torch.masked_select). The output
   *  size depends on the data: this realises the mask's count (one sync); the gather costs numel x count. */
  Tensor masked_select(const Tensor& mask) const;
  /** numpy/torch indexing: ints, Slices, integer tensors (broadcast together, advanced indexing), NewAxis, Ellipsis. */
  Tensor index(const std::vector<TensorIndex>& idx) const;
  /** A copy with `value` (broadcast) written into the slice (the functional form of `t[slices] = value`). */
  Tensor set_slice(const std::vector<Slice>& s, const Tensor& value) const;
  /** A copy with `value` written at the positions an index selects (ints, slices and integer tensors). */
  Tensor index_put(const std::vector<TensorIndex>& idx, const Tensor& value) const;
  /** pad with a mode: "constant" (value), "reflect", "replicate" or "circular"; pairs per dim, negative shrinks. */
  Tensor pad(const std::vector<std::pair<int64_t, int64_t>>& p, const std::string& mode, double value = 0) const;
  /** int tensor -> (…, num_classes) one-hot int64 (torch.nn.functional.one_hot). */
  Tensor one_hot(int64_t num_classes) const;

  // ---- reductions and scans (ops_reduce.cpp)
  /** Variance with Bessel's `correction` (1 = unbiased, like torch). */
  Tensor var(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  Tensor std(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  std::pair<Tensor, Tensor> var_mean(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  std::pair<Tensor, Tensor> std_mean(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  /** Index (int64) of the first maximum along axis; no axis: of the flattened tensor. */
  Tensor argmax(std::optional<int64_t> axis = std::nullopt, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> axis = std::nullopt, bool keepdim = false) const;
  Tensor any(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor all(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor cumsum(int64_t axis = 0) const;
  Tensor cumprod(int64_t axis = 0) const;
  /** Running maximum and the index (int64) where it was found (the last one among equal values, like torch). */
  std::pair<Tensor, Tensor> cummax(int64_t axis = 0) const;
  std::pair<Tensor, Tensor> cummin(int64_t axis = 0) const;
  Tensor logsumexp(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor logcumsumexp(int64_t axis = 0) const;
  Tensor log_softmax(int64_t axis = -1) const;
  Tensor softmin(int64_t axis = -1) const;
  /** Sorted values and their original indices (int64), stable (equal values keep their order). Built by counting
   *  comparisons: O(n^2) work along dim, meant for modest sizes. */
  std::pair<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false) const;
  Tensor argsort(int64_t dim = -1, bool descending = false) const;
  /** The k largest (or smallest) values along dim, sorted, and their indices. */
  std::pair<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true) const;

  // ---- linear algebra (ops_linalg.cpp)
  /** torch.matmul: 1-D/1-D dot, matrix-vector, and batched matmul with broadcasting of the batch dims. */
  Tensor matmul(const Tensor& b) const;
  Tensor dot(const Tensor& b) const { return matmul(b); }
  /** x @ weight.T + bias with weight (out_features, in_features), like torch.nn.functional.linear. */
  Tensor linear(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt) const;

  // ---- nn functional (ops_nn.cpp); layouts are torch's (N, C, *spatial)
  /** N-d convolution (the number of spatial dims comes from the weight); padding_mode: "zeros", "reflect",
   *  "replicate" or "circular". */
  Tensor conv(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, ConvPadding padding = 0,
              IntArg dilation = 1, int64_t groups = 1, const std::string& padding_mode = "zeros") const;
  Tensor conv1d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, ConvPadding padding = 0,
                IntArg dilation = 1, int64_t groups = 1, const std::string& padding_mode = "zeros") const;
  Tensor conv2d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, ConvPadding padding = 0,
                IntArg dilation = 1, int64_t groups = 1, const std::string& padding_mode = "zeros") const;
  Tensor conv3d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, ConvPadding padding = 0,
                IntArg dilation = 1, int64_t groups = 1, const std::string& padding_mode = "zeros") const;
  /** Transposed convolution; weight (C_in, C_out / groups, *k) like torch. */
  Tensor conv_transpose(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, IntArg padding = 0,
                        IntArg output_padding = 0, int64_t groups = 1, IntArg dilation = 1) const;
  Tensor conv_transpose1d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, IntArg padding = 0,
                          IntArg output_padding = 0, int64_t groups = 1, IntArg dilation = 1) const;
  Tensor conv_transpose2d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, IntArg padding = 0,
                          IntArg output_padding = 0, int64_t groups = 1, IntArg dilation = 1) const;
  /** Max pool over the last kernel.size() dims; stride defaults to the kernel; padding pads with -inf. */
  Tensor max_pool(IntArg kernel, IntArg stride = {}, IntArg padding = 0, IntArg dilation = 1, bool ceil_mode = false) const;
  Tensor max_pool1d(IntArg kernel, IntArg stride = {}, IntArg padding = 0, IntArg dilation = 1, bool ceil_mode = false) const;
  Tensor max_pool2d(IntArg kernel, IntArg stride = {}, IntArg padding = 0, IntArg dilation = 1, bool ceil_mode = false) const;
  /** Average pool over the last kernel.size() dims (torch semantics for count_include_pad and ceil_mode). */
  Tensor avg_pool(IntArg kernel, IntArg stride = {}, IntArg padding = 0, bool ceil_mode = false, bool count_include_pad = true) const;
  Tensor avg_pool1d(IntArg kernel, IntArg stride = {}, IntArg padding = 0, bool ceil_mode = false, bool count_include_pad = true) const;
  Tensor avg_pool2d(IntArg kernel, IntArg stride = {}, IntArg padding = 0, bool ceil_mode = false, bool count_include_pad = true) const;
  /** Adaptive pools over the last output_size.size() dims (torch's window rule, any sizes). */
  Tensor adaptive_avg_pool(const std::vector<int64_t>& output_size) const;
  Tensor adaptive_max_pool(const std::vector<int64_t>& output_size) const;
  Tensor adaptive_avg_pool1d(int64_t output_size) const { return adaptive_avg_pool({output_size}); }
  Tensor adaptive_avg_pool2d(IntArg output_size) const;
  Tensor adaptive_max_pool1d(int64_t output_size) const { return adaptive_max_pool({output_size}); }
  Tensor adaptive_max_pool2d(IntArg output_size) const;
  /** torch.nn.functional.batch_norm over dim 1. training: batch statistics (and the running stats, when given, are
   *  updated in place with `momentum` via assign); otherwise the running stats. */
  Tensor batch_norm(const std::optional<Tensor>& running_mean, const std::optional<Tensor>& running_var,
                    const std::optional<Tensor>& weight = std::nullopt, const std::optional<Tensor>& bias = std::nullopt,
                    bool training = false, double momentum = 0.1, double eps = 1e-5) const;
  /** Normalise over the last normalized_shape.size() dims, which must equal normalized_shape. */
  Tensor layer_norm(const std::vector<int64_t>& normalized_shape, const std::optional<Tensor>& weight = std::nullopt,
                    const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5) const;
  Tensor group_norm(int64_t num_groups, const std::optional<Tensor>& weight = std::nullopt,
                    const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5) const;
  /** x / sqrt(mean(x^2) + eps) * weight over the last normalized_shape.size() dims; eps defaults to float eps. */
  Tensor rms_norm(const std::vector<int64_t>& normalized_shape, const std::optional<Tensor>& weight = std::nullopt,
                  std::optional<double> eps = std::nullopt) const;
  /** Zero elements with probability p (from rand) and scale the rest by 1/(1-p); identity unless training. */
  Tensor dropout(double p = 0.5, bool training = true) const;
  /** softmax(q k^T * scale + mask) v; a bool mask keeps where true, a float mask is added. */
  Tensor scaled_dot_product_attention(const Tensor& key, const Tensor& value, const std::optional<Tensor>& attn_mask = std::nullopt,
                                      double dropout_p = 0.0, bool is_causal = false, std::optional<double> scale = std::nullopt) const;
  /** Resize the last size.size() dims: mode "nearest", "linear" (also "bilinear", "trilinear"), align_corners for linear. */
  Tensor interpolate(const std::vector<int64_t>& size, const std::string& mode = "nearest", bool align_corners = false) const;

  // ---- losses (ops_loss.cpp); reduction: "mean", "sum" or "none"; this is the prediction
  /** Logits (N, C, *) or (C,) against class indices (int, (N, *)) or class probabilities (float, same shape). */
  Tensor cross_entropy(const Tensor& target, const std::string& reduction = "mean", double label_smoothing = 0.0,
                       int64_t ignore_index = -100, const std::optional<Tensor>& weight = std::nullopt) const;
  /** Log-probabilities (N, C, *) or (C,) against class indices. */
  Tensor nll_loss(const Tensor& target, const std::optional<Tensor>& weight = std::nullopt, int64_t ignore_index = -100,
                  const std::string& reduction = "mean") const;
  /** tinygrad's: logits (…, C) against class indices (…), ignore_index -1 by default. */
  Tensor sparse_categorical_crossentropy(const Tensor& target, int64_t ignore_index = -1, double label_smoothing = 0.0,
                                         const std::string& reduction = "mean") const;
  /** Probabilities against targets in [0, 1] (logs clamped at -100 like torch). */
  Tensor binary_crossentropy(const Tensor& target, const std::string& reduction = "mean") const;
  Tensor binary_crossentropy_with_logits(const Tensor& target, const std::string& reduction = "mean",
                                         const std::optional<Tensor>& pos_weight = std::nullopt) const;
  Tensor mse_loss(const Tensor& target, const std::string& reduction = "mean") const;
  Tensor l1_loss(const Tensor& target, const std::string& reduction = "mean") const;
  Tensor smooth_l1_loss(const Tensor& target, const std::string& reduction = "mean", double beta = 1.0) const;

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
  /** A custom gradient, like a torch.autograd.Function's backward: the result has this tensor's value, and its
   *  gradient with respect to `inputs` is backward(grad, value, inputs) (one entry per input, nullopt for none)
   *  instead of the differentiated graph that computes the value (which gradients do not enter). The forward
   *  graph is unchanged for the scheduler. `key` names the rule: calls with the same key must pass functions that
   *  compute the same thing (the first one registered is used). Under NoGrad it returns this tensor. */
  using CustomBackward = std::function<std::vector<std::optional<Tensor>>(const Tensor& grad, const Tensor& value,
                                                                          const std::vector<Tensor>& inputs)>;
  Tensor custom_gradient(const std::vector<Tensor>& inputs, const std::string& key, CustomBackward backward) const;

  /** Realise several tensors together (one schedule). */
  static void realize_all(std::vector<Tensor*> ts);
  std::shared_ptr<TensorImpl> impl() const { return impl_; }

 private:
  friend void replace_realized(const std::vector<std::pair<const UOp*, UOpRef>>&);
  Tensor check_numel(size_t n, const char* op) const;
  void copy_to_host(void* dst, size_t bytes) const;
  size_t read_count() const;
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

/** Graph nodes walked so far to substitute realised buffers into live tensors' graphs (a statistic for tests: a
 *  host read in the middle of a graph walks only what was built after the nodes it realised). */
size_t becomes_visits();

struct ValuesIndices {
  Tensor values, indices;
};

/** Printing, like torch: `tensor([[1., 2.],\n        [3., 4.]], shape=(2, 2), dtype=float32, device=CPU)`. Realises
 *  the tensor. Floats print with 4 decimals ("1." when every value is integral, scientific when the magnitudes
 *  need it), all with one width; more than 1000 elements print the first and last 3 of each dim around "...". */
std::string to_string(const Tensor& t);
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/** One entry of Tensor::index: an int, a Slice, an integer Tensor (advanced indexing), NewAxis or Ellipsis. */
struct TensorIndex {
  enum class Kind { Int, Slice, Tensor, NewAxis, Ellipsis } kind;
  int64_t i = 0;
  tg::Slice s;
  tg::Tensor t;
  TensorIndex(int v) : kind(Kind::Int), i(v) {}      // NOLINT
  TensorIndex(int64_t v) : kind(Kind::Int), i(v) {}  // NOLINT
  TensorIndex(tg::Slice v) : kind(Kind::Slice), s(v) {}             // NOLINT
  TensorIndex(tg::Tensor v) : kind(Kind::Tensor), t(std::move(v)) {}  // NOLINT
  TensorIndex(NewAxisT) : kind(Kind::NewAxis) {}                    // NOLINT
  TensorIndex(EllipsisT) : kind(Kind::Ellipsis) {}                  // NOLINT
};

/** Concatenate along dim (shapes equal elsewhere; dtypes promote). */
Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0);
/** Stack along a new dim. */
Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0);
/** cond ? a : b with broadcasting. */
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/** Einstein summation: "ij,jk->ik", batch dims, "..." and repeated indices (diagonals) like torch.einsum. */
Tensor einsum(const std::string& formula, const std::vector<Tensor>& operands);
/** Rows of weight (num, dim) picked by integer indices of any shape: (*indices.shape, dim). */
Tensor embedding(const Tensor& indices, const Tensor& weight);
/** Coordinate grids ("ij" or "xy" indexing) from 1-D tensors. */
std::vector<Tensor> meshgrid(const std::vector<Tensor>& ts, const std::string& indexing = "ij");

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
  // common Tensor methods, callable on an expression: (a * b).relu()
#define TG_ET_FORWARD(name)                      \
  template <class... A>                          \
  Tensor name(A&&... a) const {                  \
    return tensor().name(std::forward<A>(a)...); \
  }
  TG_ET_FORWARD(relu) TG_ET_FORWARD(sigmoid) TG_ET_FORWARD(tanh) TG_ET_FORWARD(gelu) TG_ET_FORWARD(silu)
  TG_ET_FORWARD(exp) TG_ET_FORWARD(log) TG_ET_FORWARD(sqrt) TG_ET_FORWARD(rsqrt) TG_ET_FORWARD(abs)
  TG_ET_FORWARD(square) TG_ET_FORWARD(pow) TG_ET_FORWARD(clamp) TG_ET_FORWARD(where)
  TG_ET_FORWARD(softmax) TG_ET_FORWARD(log_softmax) TG_ET_FORWARD(logsumexp) TG_ET_FORWARD(var)
  TG_ET_FORWARD(std) TG_ET_FORWARD(argmax) TG_ET_FORWARD(argmin) TG_ET_FORWARD(any) TG_ET_FORWARD(all)
  TG_ET_FORWARD(cumsum) TG_ET_FORWARD(matmul) TG_ET_FORWARD(linear) TG_ET_FORWARD(flatten)
  TG_ET_FORWARD(unsqueeze) TG_ET_FORWARD(squeeze) TG_ET_FORWARD(transpose) TG_ET_FORWARD(eq) TG_ET_FORWARD(ne)
#undef TG_ET_FORWARD
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
