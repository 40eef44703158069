#pragma once
// tg::Tensor: a lazy tensor (a handle on a UOp graph) with a PyTorch/tinygrad-style API.
// Operators build UOps at once and return Tensors (TensorOf<float|int|bool> when the operands' static kinds decide the
// result's: see "operators and static dtype kinds" below). Nothing computes until realize(). A default-constructed
// Tensor is undefined (defined() is false) until one is assigned to it. Errors raised inside the entry points that
// take a CallLoc name the caller's source position (tg/error.hpp).
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
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "tg/dtype.hpp"
#include "tg/error.hpp"
#include "tg/uop.hpp"
#include "tg/variable.hpp"

namespace tg {

/// A concrete shape: the size of each dim, outermost first.
using Shape = std::vector<int64_t>;
/// "(2, 3)": a shape as errors and printing show it
std::string shape_str(const Shape& s);

/** The shape of a tensor-graph node from its sources' shapes (movement args, reduce axes, broadcast ALU). */
Shape infer_shape(Ops op, const std::vector<const Shape*>& src_shapes, const Arg& arg, DType dtype);

/** One axis of a slice: [start, stop) with step; negative indices count from the end; step may be negative. */
struct Slice {
  /// the bounds of [start, stop), as Python's slices: unset means the end the step starts or stops at
  ///@{
  std::optional<int64_t> start, stop;
  ///@}
  /// the stride between taken indices (not 0; negative walks backwards)
  int64_t step = 1;
  /// the whole axis, as Python's `:`
  static Slice all() { return {}; }
  /// the single index i as a length-1 slice (the dim is kept)
  static Slice index(int64_t i) { return Slice{i, i == -1 ? std::nullopt : std::optional<int64_t>(i + 1), 1}; }
};

/** An int or a per-dimension list, like torch's `int | tuple[int, ...]`: one value applies to every spatial dim;
 *  an empty list means "the op's default" (e.g. a pool's stride defaults to its kernel size). */
struct IntArg {
  /// the values: one for every dim, one per dim, or empty for the op's default
  std::vector<int64_t> v;
  IntArg() = default;
  /// one value for every dim
  IntArg(int x) : v{x} {}      // NOLINT
  /// one value for every dim
  IntArg(int64_t x) : v{x} {}  // NOLINT
  /// one value per dim: `{2, 3}`
  IntArg(std::initializer_list<int64_t> l) : v(l) {}
  /// one value per dim
  IntArg(std::vector<int64_t> l) : v(std::move(l)) {}  // NOLINT
};

/** Padding of a convolution or pool: an int, one int per spatial dim (both sides), 2 per spatial dim
 *  ((begin, end) for each dim in order), or "same" / "valid" (convolutions only). */
struct ConvPadding {
  /// the amounts: one for all dims, one per dim, or (begin, end) per dim; empty with a mode
  std::vector<int64_t> v;
  std::string mode;  ///< "same", "valid", or empty when v holds the amounts
  /// the same amount on both sides of every spatial dim
  ConvPadding(int x) : v{x} {}      // NOLINT
  /// the same amount on both sides of every spatial dim
  ConvPadding(int64_t x) : v{x} {}  // NOLINT
  /// amounts per dim: `{1, 2}` or `{1, 1, 2, 2}`
  ConvPadding(std::initializer_list<int64_t> l) : v(l) {}
  /// amounts per dim, or (begin, end) per dim
  ConvPadding(std::vector<int64_t> l) : v(std::move(l)) {}  // NOLINT
  /// "same" (output size = input size / stride) or "valid" (no padding)
  ConvPadding(const char* m) : mode(m) {}                    // NOLINT
  /// "same" (output size = input size / stride) or "valid" (no padding)
  ConvPadding(std::string m) : mode(std::move(m)) {}         // NOLINT
};

/** Index tags: `NewAxis` inserts a size-1 dim (numpy's None), `Ellipsis` stands for all remaining dims. */
struct NewAxisT {};
/// inserts a size-1 dim in an index (numpy's None)
inline constexpr NewAxisT NewAxis{};
struct EllipsisT {};
/// stands for all the dims the other index entries leave
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

/** Options of Tensor::backward: retain_graph allows another backward() of the same tensor (torch's flag). */
struct BackwardOptions {
  bool retain_graph = false;  ///< keep the graph: another backward() of the same tensor is allowed
};

/** Values and their indices (int64) along a reduced dim: `auto [v, i] = t.max_with_indices(1);`. */
struct ValuesIndices;
/** One parameter of a custom kernel as its builder sees it (Tensor::custom_kernel): PARAM `slot` of the kernel,
 *  over the row-major elements of source `slot` (its shape and dtype). */
struct KernelParam {
  /// the PARAM node (a pointer to the dtype)
  UOpRef param;
  /// the source's shape and dtype
  ///@{
  std::vector<int64_t> shape;
  DType dtype;
  ///@}
  /// INDEX(PARAM, row-major offset of idx): one index per dim (a tg::Error naming custom_kernel otherwise)
  UOpRef index(const std::vector<UOpRef>& idx) const;
  /// LOAD of the element at idx
  UOpRef load(const std::vector<UOpRef>& idx) const;
  /// STORE of v (of the parameter's dtype) into the element at idx
  UOpRef store(const std::vector<UOpRef>& idx, const UOpRef& v) const;
};

/** A tensor's values as nested lists (Tensor::tolist): a leaf holds one value (double for floats, int64 for
 *  integers, uint64 for uint64, bool), a list its items; a (2, 3) tensor is a list of 2 lists of 3 leaves. */
struct NestedList;

/** A tensor's values on the host (Tensor::numpy, tinygrad's numpy()): dtype, shape, C-contiguous strides in bytes
 *  and the row-major bytes. */
struct HostArray {
  DType dtype = dtypes::float32;  ///< the element type
  std::vector<int64_t> shape;     ///< the dims
  std::vector<int64_t> strides;   ///< bytes between neighbours along each dim (row-major)
  std::vector<uint8_t> bytes;     ///< the elements, row-major
  /// the elements as T (T's size must be the dtype's; else a tg::Error)
  template <class T>
  const T* data() const {
    if (sizeof(T) != size_t(dtype.itemsize())) throw Error("[HostArray] element size " + std::to_string(sizeof(T)) + " asked, the dtype " + dtype.name() + " has " + std::to_string(dtype.itemsize()));
    return reinterpret_cast<const T*>(bytes.data());
  }
};

struct Schedule;

/** A lazy tensor. Copies share the same node (like torch): realize() on one is seen by all. */
class Tensor {
 public:
  /** An undefined tensor: it holds no value; any use raises a tg::Error saying so, until a tensor is assigned to it. */
  Tensor() = default;
  /** Whether this handle holds a tensor (false for a default-constructed one). */
  bool defined() const { return impl_ != nullptr; }
  /// a tensor over an existing tensor-graph node with that shape, on `device` (under NoGrad: detached)
  explicit Tensor(UOpRef uop, Shape shape, std::string device);
  /** A 0-d tensor holding a scalar (weakly typed like a Python scalar unless a dtype is given). */
  Tensor(double v);  // NOLINT
  /// a 0-d int tensor, weakly typed like a Python int
  Tensor(int v);     // NOLINT
  /// a 0-d bool tensor
  Tensor(bool v);    // NOLINT

  // ---- creation
  /// a tensor of that shape whose values are unspecified until written (allocates on realise)
  static Tensor empty(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  /// a tensor of `shape` with every element `value` (a constant expanded to the shape; a negative dim is a tg::Error)
  static Tensor full(const Shape& shape, double value, DType dtype = dtypes::float32, const std::string& device = "");
  /// full(shape, 0)
  static Tensor zeros(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  /// full(shape, 1)
  static Tensor ones(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  /** Symbolic shapes: `Tensor::full({1, pos + 1}, 0.f)` (braced lists of ints take these too, as ints). */
  static Tensor full(const SymShape& shape, double value, DType dtype = dtypes::float32, const std::string& device = "");
  /// full() with a braced shape of ints or sints
  static Tensor full(std::initializer_list<sint> shape, double value, DType dtype = dtypes::float32, const std::string& device = "") {
    return full(SymShape(shape), value, dtype, device);
  }
  /// zeros() with a braced shape of ints or sints
  static Tensor zeros(std::initializer_list<sint> s, DType d = dtypes::float32, const std::string& dev = "") { return full(s, 0, d, dev); }
  /// ones() with a braced shape of ints or sints
  static Tensor ones(std::initializer_list<sint> s, DType d = dtypes::float32, const std::string& dev = "") { return full(s, 1, d, dev); }
  /** A 0-d tensor holding the value of `v` (a kernel parameter when `v` is symbolic: one kernel for every value). */
  static Tensor from_sint(const sint& v, DType dtype = dtypes::int32, const std::string& device = "");
  /** start, start + step, ... below stop. dtype unset: float32 if an argument is not a whole number, else int32. */
  static Tensor arange(double start, double stop, double step = 1, DType dtype = dtypes::void_, const std::string& device = "");
  /// 0, 1, ..., stop-1
  static Tensor arange(int64_t stop, DType dtype = dtypes::int32) { return arange(0, double(stop), 1, dtype); }
  /// the (n, m) identity matrix (m -1: square)
  static Tensor eye(int64_t n, int64_t m = -1, DType dtype = dtypes::float32, const std::string& device = "");
  /** A tensor from host memory: `nbytes` bytes of `dtype` elements (copied). */
  static Tensor from_blob(const void* data, const Shape& shape, DType dtype, const std::string& device = "");
  /// a tensor of v's values (copied) in the dtype of T, shaped `shape` (default 1-d); a size mismatch is a tg::Error
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
  /// uniform in [0, 1), from the seeded generator
  static Tensor rand(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  /// standard normal, from the seeded generator
  static Tensor randn(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  /// uniform integers in [low, high)
  static Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = dtypes::int32, const std::string& device = "");

  // ---- properties
  /** The shape; a tg::Error on a tensor with a symbolic dim (see sym_shape). */
  const Shape& shape() const;
  /** Symbolic shapes (tg/variable.hpp): whether a dim depends on a Variable, the dims as sints, and the largest
   *  value of each (how the tensor's buffer is laid out). For a tensor without variables, all three agree with shape(). */
  bool is_symbolic() const { return uop()->sym() != nullptr; }
  /// the dims as sints (symbolic where they depend on a Variable)
  SymShape sym_shape() const;
  /// the largest value of each dim (the buffer's layout)
  const Shape& max_shape() const;
  /// the element dtype
  DType dtype() const;
  /// the device name ("CPU", "CL", "CUDA:1", ...)
  const std::string& device() const;
  /// number of dims
  int ndim() const { return int(max_shape().size()); }
  /// number of elements (the product of the shape)
  int64_t numel() const;
  /// the tensor-graph node that computes it
  const UOpRef& uop() const;
  /// the size of one dim (negative counts from the end)
  int64_t size(int dim) const;

  // ---- realising and reading back
  /** Compute this tensor (and nothing else) now. */
  Tensor& realize(CallLoc loc = CallLoc::current());
  /// realises and copies the elements to the host in row-major order; T must be the tensor's dtype (else a tg::Error)
  template <class T>
  std::vector<T> to_vector(CallLoc loc = CallLoc::current()) const {
    CallSite site(loc);
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
  /// the single element of a one-element tensor (else a tg::Error), as to_vector
  template <class T>
  T item(CallLoc loc = CallLoc::current()) const {
    CallSite site(loc);
    if (numel() != 1) throw Error("[item] needs one element, tensor has shape " + shape_str(shape()));
    return to_vector<T>(loc)[0];
  }
  /** All elements converted to double (any dtype). */
  std::vector<double> to_doubles() const;
  /** The same values on another device. A multi-device name ("CPU,CPU:1") replicates the tensor on each; a
   *  multi-device tensor moved to one device is gathered there. */
  Tensor to(const std::string& device, CallLoc loc = CallLoc::current()) const;

  // ---- several devices (src/tensor/multi.cpp, include/tg/multi.hpp)
  /** Split across `devices` along `axis` (each gets an equal slice; the size must divide), or a copy on each when
   *  axis is absent. The result's device() is the devices joined with ','; ops on it run on every device and a
   *  reduction across the split axis combines the devices' partial results (an allreduce). */
  Tensor shard(const std::vector<std::string>& devices, std::optional<int> axis = std::nullopt,
               CallLoc loc = CallLoc::current()) const;
  /** shard() in place: this handle (and its copies) holds the sharded tensor. */
  Tensor& shard_(const std::vector<std::string>& devices, std::optional<int> axis = std::nullopt,
                 CallLoc loc = CallLoc::current());
  /** Sharded as `other` is (its devices and axis); on other's device when other is on one device. */
  Tensor shard_like(const Tensor& other, CallLoc loc = CallLoc::current()) const;
  /** Whether this tensor lives on several devices. */
  bool is_multi() const;
  /** The devices this tensor lives on (one for an ordinary tensor). */
  std::vector<std::string> devices() const;
  /** The axis a multi-device tensor is split along; absent when replicated or on one device. */
  std::optional<int> shard_axis() const;
  /** Write x's values into this tensor's buffer (shapes must match; dtype is converted). Lazy tensors defined
   *  before keep the old values (they are realised before the write); views of the buffer see the new ones. */
  Tensor& assign(const Tensor& x, CallLoc loc = CallLoc::current());
  /** In place, like torch's `t += x`: x broadcasts to this shape, the result keeps this dtype (a float result into
   *  an int or bool tensor is an error). Every handle sharing this tensor sees the new value: a realised buffer is
   *  updated with assign(), a lazy tensor's graph is replaced. Refused on a tensor that requires grad (outside
   *  NoGrad), as torch refuses it on a leaf. */
  Tensor& operator+=(const Tensor& x);
  /// in-place subtraction, as operator+=
  Tensor& operator-=(const Tensor& x);
  /// in-place multiplication, as operator+=
  Tensor& operator*=(const Tensor& x);
  /// in-place true division, as operator+= (into an int tensor: a tg::Error, the quotient is float)
  Tensor& operator/=(const Tensor& x);

  // ---- elementwise (see also the operators below)
  /** Broadcasting + promotion. Integer IDIV/MOD truncate, as C, and are defined for every divisor: x / 0 = 0,
   *  x % 0 = 0, INT_MIN / -1 = INT_MIN (no kernel divides by 0 or by -1; see README "Semantics"). */
  Tensor alu(Ops op, const Tensor& b, CallLoc loc = CallLoc::current()) const;
  /// values converted to dtype d (floats to ints truncate; to bool: nonzero)
  Tensor cast(DType d, CallLoc loc = CallLoc::current()) const;
  /// the same bits read as dtype d (another item size is a tg::Error)
  Tensor bitcast(DType d) const;
  /// -x
  Tensor neg() const;
  /// 2^x
  Tensor exp2() const;
  /// log base 2 (NaN below 0, -inf at 0)
  Tensor log2() const;
  /// e^x
  Tensor exp() const;
  /// natural log (NaN below 0, -inf at 0)
  Tensor log() const;
  /// sine (radians)
  Tensor sin() const;
  /// cosine (radians)
  Tensor cos() const;
  /// square root (NaN below 0)
  Tensor sqrt() const;
  /// 1 / x
  Tensor reciprocal() const;
  /// rounds towards zero
  Tensor trunc() const;
  /// max(x, 0)
  Tensor relu() const;
  /// 1 / (1 + e^-x)
  Tensor sigmoid() const;
  /// |x|
  Tensor abs() const;
  /// elementwise max with b (broadcasting, promoting)
  Tensor maximum(const Tensor& b, CallLoc loc = CallLoc::current()) const;
  /// elementwise min with b (broadcasting, promoting)
  Tensor minimum(const Tensor& b, CallLoc loc = CallLoc::current()) const;
  Tensor where(const Tensor& a, const Tensor& b, CallLoc loc = CallLoc::current()) const;  ///< this is the condition
  Tensor div(const Tensor& b) const;                       ///< true division
  /** Division rounded as torch's rounding_mode: "trunc" (toward 0) or "floor"; ints stay ints (x / 0 = 0). */
  Tensor div(const Tensor& b, const std::string& rounding_mode) const;
  Tensor idiv(const Tensor& b) const;                      ///< floor division (ints), like torch's //; x // 0 = 0
  Tensor mod(const Tensor& b) const;                       ///< floor remainder, like torch's %; int x % 0 = 0
  /// x^b elementwise (broadcasting), as torch.pow
  Tensor pow(const Tensor& b) const;
  /// !x as bool
  Tensor logical_not() const;

  // ---- movement
  Tensor reshape(Shape s, CallLoc loc = CallLoc::current()) const;  ///< one -1 allowed
  /** Symbolic dims (no -1): each symbolic dim stays a dim of its own, at the same place in the layout. */
  Tensor reshape(const SymShape& s) const;
  /// reshape() with a braced shape of ints or sints
  Tensor reshape(std::initializer_list<sint> s) const { return reshape(SymShape(s)); }
  /// dims reordered: dim i of the result is dim order[i] (a view)
  Tensor permute(std::vector<int64_t> order, CallLoc loc = CallLoc::current()) const;
  Tensor expand(Shape s, CallLoc loc = CallLoc::current()) const;   ///< -1 keeps a dim
  /// expand() to symbolic sizes
  Tensor expand(const SymShape& s) const;
  /// expand() with a braced shape of ints or sints
  Tensor expand(std::initializer_list<sint> s) const { return expand(SymShape(s)); }
  /// (before, after) elements of `value` added to each dim
  Tensor pad(const std::vector<std::pair<int64_t, int64_t>>& p, double value = 0, CallLoc loc = CallLoc::current()) const;
  /** Symbolic amounts: `x.pad({{p, 0}})` puts x after the first p positions (cat along a symbolic dim). */
  Tensor pad(const std::vector<std::pair<sint, sint>>& p, double value = 0) const;
  /// pad() with a braced list of pairs
  Tensor pad(std::initializer_list<std::pair<sint, sint>> p, double value = 0) const {
    return pad(std::vector<std::pair<sint, sint>>(p), value);
  }
  /// the sub-tensor [begin, end) of each dim (a view)
  Tensor shrink(const std::vector<std::pair<int64_t, int64_t>>& s, CallLoc loc = CallLoc::current()) const;
  /** Symbolic bounds: `cache.shrink({{0, 1}, {0, pos + 1}})`, `freqs.shrink({{pos, pos + 1}, {0, 64}})`. */
  Tensor shrink(const std::vector<std::pair<sint, sint>>& s) const;
  /// shrink() with a braced list of pairs
  Tensor shrink(std::initializer_list<std::pair<sint, sint>> s) const { return shrink(std::vector<std::pair<sint, sint>>(s)); }
  /// the elements of these dims in reverse order
  Tensor flip(std::vector<int64_t> axes, CallLoc loc = CallLoc::current()) const;
  /// dims a and b swapped
  Tensor transpose(int64_t a = 1, int64_t b = 0, CallLoc loc = CallLoc::current()) const;
  /// dims 0 and 1 swapped (a matrix's transpose)
  Tensor T(CallLoc loc = CallLoc::current()) const { return transpose(1, 0, loc); }
  /// dims start..end (inclusive) merged into one
  Tensor flatten(int64_t start = 0, int64_t end = -1, CallLoc loc = CallLoc::current()) const;
  /// size-1 dims removed (only `dim` when given; a dim of another size is kept)
  Tensor squeeze(std::optional<int64_t> dim = std::nullopt, CallLoc loc = CallLoc::current()) const;
  /// a size-1 dim inserted at `dim` (negative counts from the end of the result)
  Tensor unsqueeze(int64_t dim, CallLoc loc = CallLoc::current()) const;
  /// one Slice per leading dim (Python's t[a:b:c, ...]); the rest kept whole
  Tensor slice(const std::vector<Slice>& s, CallLoc loc = CallLoc::current()) const;
  /** `t[i]` selects along dim 0 and drops it (negative counts from the end); `t[Slice{1, 3}]` slices dim 0;
   *  `t[{0, Slice::all(), NewAxis}]` indexes several dims, as index(). */
  Tensor operator[](const TensorIndex& i) const;
  /// several dims at once, as index()
  Tensor operator[](std::initializer_list<TensorIndex> idx) const;

  // ---- reductions (axes empty = all)
  /// sum over `axes` (all when empty), keepdim keeps them as size 1; ints and bool sum in a wider dtype
  Tensor sum(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const;
  /// sum over one axis
  Tensor sum(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return sum(std::vector<int64_t>{axis}, keepdim, loc); }
  /** The sum accumulated and returned in `dtype` (torch's and tinygrad's sum(dtype=)): the input is cast first. */
  Tensor sum(std::vector<int64_t> axes, bool keepdim, DType dtype, CallLoc loc = CallLoc::current()) const;
  /// maximum over `axes` (all when empty)
  Tensor max(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const;
  /// maximum over one axis (values only; see max_with_indices)
  Tensor max(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return max(std::vector<int64_t>{axis}, keepdim, loc); }
  /// minimum over `axes` (all when empty)
  Tensor min(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const;
  /// minimum over one axis (values only; see min_with_indices)
  Tensor min(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return min(std::vector<int64_t>{axis}, keepdim, loc); }
  /** The maximum along dim and the index (int64) of its first occurrence, as torch.max(dim). */
  ValuesIndices max_with_indices(int64_t dim, bool keepdim = false) const;
  /** The minimum along dim and the index (int64) of its first occurrence, as torch.min(dim). */
  ValuesIndices min_with_indices(int64_t dim, bool keepdim = false) const;
  /// product over `axes` (all when empty)
  Tensor prod(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const;
  /// product over one axis
  Tensor prod(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return prod(std::vector<int64_t>{axis}, keepdim, loc); }
  /** The product accumulated and returned in `dtype` (torch's and tinygrad's prod(dtype=)): the input is cast first. */
  Tensor prod(std::vector<int64_t> axes, bool keepdim, DType dtype, CallLoc loc = CallLoc::current()) const;
  /// mean over `axes` (all when empty); ints give float
  Tensor mean(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const;
  /// mean over one axis
  Tensor mean(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return mean(std::vector<int64_t>{axis}, keepdim, loc); }
  /// exp(x) / sum(exp(x)) along axis, computed stably (max subtracted)
  Tensor softmax(int64_t axis = -1, CallLoc loc = CallLoc::current()) const;
  /** softmax computed and returned in `dtype` (torch's and tinygrad's softmax(dtype=)): the input is cast first. */
  Tensor softmax(int64_t axis, DType dtype, CallLoc loc = CallLoc::current()) const;

  /// the values in a buffer of their own, row-major (a copy kernel unless already so)
  Tensor contiguous() const;
  /// the same value without gradient tracking (requires_grad false)
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
  /** tinygrad's Tensor.const: a 0-d constant. Without a dtype it is weak (a whole number int, else float), as a
   *  literal is: it takes the other operand's dtype in arithmetic. */
  static Tensor const_(double b, std::optional<DType> dtype = std::nullopt);
  /** tinygrad's ufix: a scalar as a 0-d constant of this tensor's dtype, on its device. */
  Tensor ufix(double x) const;
  /// tinygrad's ufix of a tensor: the tensor itself
  Tensor ufix(const Tensor& x) const { return x; }
  /** tinygrad's usum: this + others[0] + ... (OR for bool), broadcasting. */
  Tensor usum(const std::vector<Tensor>& others) const;
  /** tinygrad's uprod: this * others[0] * ... (AND for bool), broadcasting. */
  Tensor uprod(const std::vector<Tensor>& others) const;
  /** Same shape and device, filled with a value (dtype defaults to this tensor's). */
  Tensor full_like(double value, std::optional<DType> dtype = std::nullopt) const;
  /// zeros of this shape and device (dtype defaults to this tensor's)
  Tensor zeros_like(std::optional<DType> dtype = std::nullopt) const;
  /// ones of this shape and device (dtype defaults to this tensor's)
  Tensor ones_like(std::optional<DType> dtype = std::nullopt) const;
  /// rand() of this shape and device (a float dtype)
  Tensor rand_like(std::optional<DType> dtype = std::nullopt) const;
  /// randn() of this shape and device (a float dtype; else a tg::Error)
  Tensor randn_like(std::optional<DType> dtype = std::nullopt) const;
  /** Lower / upper triangle of the last two dims (elements above / below `diagonal` set to 0). */
  Tensor tril(int64_t diagonal = 0) const;
  /// the upper triangle (elements below `diagonal` set to 0)
  Tensor triu(int64_t diagonal = 0) const;

  // ---- math (ops_math.cpp); results of int inputs are float like torch. Inverse trig functions and erf use
  // float32-accurate approximations (absolute error below 2e-7), also in float64.
  /// tangent (radians)
  Tensor tan() const;
  /** Abramowitz-Stegun 4.4.46 polynomial; NaN outside [-1, 1]. */
  Tensor asin() const;
  /// arccosine in [0, pi]; NaN outside [-1, 1]
  Tensor acos() const;
  /// arctangent in (-pi/2, pi/2)
  Tensor atan() const;
  /// hyperbolic sine
  Tensor sinh() const;
  /// hyperbolic cosine
  Tensor cosh() const;
  /// hyperbolic tangent
  Tensor tanh() const;
  /// inverse hyperbolic sine
  Tensor asinh() const;
  /// inverse hyperbolic cosine; NaN below 1
  Tensor acosh() const;
  /// inverse hyperbolic tangent; NaN outside [-1, 1]
  Tensor atanh() const;
  /** Taylor series below |x| = 0.5, a Chebyshev fit of erfc above (derivatives accurate to ~3e-7). */
  Tensor erf() const;
  /// log base 10
  Tensor log10() const;
  /// log(1 + x)
  Tensor log1p() const;
  /// e^x - 1
  Tensor expm1() const;
  /// 1 / sqrt(x)
  Tensor rsqrt() const;
  /// x * x (keeps int dtypes)
  Tensor square() const;
  /** x ** e for a float scalar exponent: int inputs give float (small integral exponents are exact products). */
  Tensor pow(double e) const;
  /** x ** e for an int scalar exponent: int inputs stay int (torch's rule for an int scalar). */
  Tensor pow(int e) const;
  /** -1, 0 or 1 in the input's dtype. */
  Tensor sign() const;
  /// rounds down
  Tensor floor() const;
  /// rounds up
  Tensor ceil() const;
  /** Round half to even, like torch.round. */
  Tensor round() const;
  /** min(max(x, min), max); an int tensor with integral bounds stays int. The gradient passes where min <= x <= max. */
  Tensor clamp(double min, double max) const;
  /** clamp with broadcast tensor bounds. */
  Tensor clamp(const Tensor& min, const Tensor& max) const;
  /// max(x, min)
  Tensor clamp_min(double min) const;
  /// min(x, max)
  Tensor clamp_max(double max) const;
  /// clamp(min, max)
  Tensor clip(double min, double max) const { return clamp(min, max); }
  /** this + weight * (end - this). */
  Tensor lerp(const Tensor& end, const Tensor& weight) const;
  /** Elementwise tests (bool); always false (isfinite: true) for int and bool tensors. */
  Tensor isnan() const;
  /// whether an element is +-inf
  Tensor isinf() const;
  /** Whether an element is +inf (detect_positive) or -inf (detect_negative), as tinygrad's isinf. */
  Tensor isinf(bool detect_positive, bool detect_negative) const;
  /// whether an element is neither inf nor NaN
  Tensor isfinite() const;

  // ---- activations (ops_math.cpp), with torch's definitions and default constants
  /// min(max(x, 0), 6)
  Tensor relu6() const;
  /// x where x >= 0, negative_slope * x below
  Tensor leaky_relu(double negative_slope = 0.01) const;
  /// x where x > 0, alpha * (e^x - 1) below
  Tensor elu(double alpha = 1.0) const;
  /// max(0, x) + min(0, alpha * (e^(x/alpha) - 1))
  Tensor celu(double alpha = 1.0) const;
  /// scale * elu(x, alpha) with SELU's constants (scale 1.0507, alpha 1.6733)
  Tensor selu() const;
  /** approximate: "none" (exact, via erf) or "tanh". */
  Tensor gelu(const std::string& approximate = "none") const;
  /** x * sigmoid(1.702 x). */
  Tensor quick_gelu() const;
  /// x * sigmoid(x)
  Tensor silu() const;
  /// silu()
  Tensor swish() const { return silu(); }
  /// x * tanh(softplus(x))
  Tensor mish() const;
  /** log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch). */
  Tensor softplus(double beta = 1.0, double threshold = 20.0) const;
  /// x / (1 + |x|)
  Tensor softsign() const;
  /// relu6(x + 3) / 6
  Tensor hardsigmoid() const;
  /** clamp(alpha x + beta, 0, 1) (tinygrad's hardsigmoid; alpha 1/6, beta 0.5 is torch's). */
  Tensor hardsigmoid(double alpha, double beta) const;
  /// x * relu6(x + 3) / 6
  Tensor hardswish() const;
  /// clamp(x, min_val, max_val)
  Tensor hardtanh(double min_val = -1.0, double max_val = 1.0) const;
  /// log(sigmoid(x)), computed stably
  Tensor logsigmoid() const;

  // ---- comparisons, logical and bitwise ops (ops_math.cpp), broadcasting; comparisons and logical ops give bool
  /// x == b
  Tensor eq(const Tensor& b) const;
  /// x != b
  Tensor ne(const Tensor& b) const;
  /// x < b
  Tensor lt(const Tensor& b) const;
  /// x <= b
  Tensor le(const Tensor& b) const;
  /// x > b
  Tensor gt(const Tensor& b) const;
  /// x >= b
  Tensor ge(const Tensor& b) const;
  /// x && b (nonzero is true)
  Tensor logical_and(const Tensor& b) const;
  /// x || b (nonzero is true)
  Tensor logical_or(const Tensor& b) const;
  /// exactly one of x, b nonzero
  Tensor logical_xor(const Tensor& b) const;
  /// x & b (int and bool tensors)
  Tensor bitwise_and(const Tensor& b) const;
  /// x | b (int and bool tensors)
  Tensor bitwise_or(const Tensor& b) const;
  /// x ^ b (int and bool tensors)
  Tensor bitwise_xor(const Tensor& b) const;
  /// ~x (bool: logical not)
  Tensor bitwise_not() const;
  /** Shifts of int tensors (rshift is arithmetic for signed types). */
  Tensor lshift(const Tensor& b) const;
  /// x >> b (arithmetic for signed types)
  Tensor rshift(const Tensor& b) const;

  // ---- movement and indexing (ops_movement.cpp)
  /** Tile the tensor `repeats[i]` times along each dim (torch.Tensor.repeat; extra leading repeats add dims). */
  Tensor repeat(const std::vector<int64_t>& repeats, CallLoc loc = CallLoc::current()) const;
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
  /// roll along one dim
  Tensor roll(int64_t shift, int64_t dim) const { return roll(std::vector<int64_t>{shift}, std::vector<int64_t>{dim}); }
  /** Split one dim into several (one -1 allowed). */
  Tensor unflatten(int64_t dim, const std::vector<int64_t>& sizes) const;
  /** The diagonal of dims (dim1, dim2) with an offset, as a new last dim. */
  Tensor diagonal(int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1) const;
  /** out[i][j] = this[i][index[i][j]] along dim (torch.gather). An index out of range is a tg::Error when the
   *  index tensor is already realised in host memory (checked there); a lazy or device index out of range reads 0. */
  Tensor gather(int64_t dim, const Tensor& index, CallLoc loc = CallLoc::current()) const;
  /** Rows (along dim) picked by a 1-D or 0-d integer index. */
  Tensor index_select(int64_t dim, const Tensor& index, CallLoc loc = CallLoc::current()) const;
  /** A copy with src[i][j] written at this[i][index[i][j]] along dim (indices must not repeat). */
  Tensor scatter(int64_t dim, const Tensor& index, const Tensor& src) const;
  /// scatter of one value at every index
  Tensor scatter(int64_t dim, const Tensor& index, double value) const;
  /** scatter(reduce=): "add" or "multiply" combines src with this tensor's values (repeated indices all count). */
  Tensor scatter(int64_t dim, const Tensor& index, const Tensor& src, const std::string& reduce) const;
  /** Scatter with a reduction: "sum", "prod", "mean", "amax" or "amin"; include_self adds this tensor's values. */
  Tensor scatter_reduce(int64_t dim, const Tensor& index, const Tensor& src, const std::string& reduce, bool include_self = true) const;
  /** value where mask (broadcast) is true, this elsewhere; keeps this dtype. */
  Tensor masked_fill(const Tensor& mask, const Tensor& value) const;
  /** The elements where mask (broadcast with this) is true, flattened in order (torch.masked_select). The output
   *  size depends on the data: this realises the mask's count (one sync); the gather costs numel x count. */
  Tensor masked_select(const Tensor& mask) const;
  /** numpy/torch indexing: ints, Slices, integer tensors (broadcast together, advanced indexing), NewAxis, Ellipsis. */
  Tensor index(const std::vector<TensorIndex>& idx, CallLoc loc = CallLoc::current()) const;
  /** A copy with `value` (broadcast) written into the slice (the functional form of `t[slices] = value`). */
  Tensor set_slice(const std::vector<Slice>& s, const Tensor& value) const;
  /** A copy with `value` written at the positions an index selects (ints, slices and integer tensors). */
  Tensor index_put(const std::vector<TensorIndex>& idx, const Tensor& value) const;
  /** pad with a mode: "constant" (value), "reflect", "replicate" or "circular"; pairs per dim, negative shrinks. */
  Tensor pad(const std::vector<std::pair<int64_t, int64_t>>& p, const std::string& mode, double value = 0) const;
  /** int tensor -> (…, num_classes) one-hot int64 (torch.nn.functional.one_hot). */
  Tensor one_hot(int64_t num_classes, CallLoc loc = CallLoc::current()) const;

  // ---- reductions and scans (ops_reduce.cpp)
  /** Variance with Bessel's `correction` (1 = unbiased, like torch). */
  Tensor var(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  /// standard deviation: sqrt(var)
  Tensor std(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  /// (var, mean) in one call
  std::pair<Tensor, Tensor> var_mean(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  /// (std, mean) in one call
  std::pair<Tensor, Tensor> std_mean(std::vector<int64_t> axes = {}, bool keepdim = false, double correction = 1) const;
  /** Index (int64) of the first maximum along axis; no axis: of the flattened tensor. */
  Tensor argmax(std::optional<int64_t> axis = std::nullopt, bool keepdim = false) const;
  /// index (int64) of the first minimum along axis; no axis: of the flattened tensor
  Tensor argmin(std::optional<int64_t> axis = std::nullopt, bool keepdim = false) const;
  /// whether any element over axes is nonzero (bool)
  Tensor any(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  /// whether every element over axes is nonzero (bool)
  Tensor all(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  /// running sum along axis
  Tensor cumsum(int64_t axis = 0) const;
  /// running product along axis
  Tensor cumprod(int64_t axis = 0) const;
  /** Running maximum and the index (int64) where it was found (the last one among equal values, like torch). */
  std::pair<Tensor, Tensor> cummax(int64_t axis = 0) const;
  /// running minimum and the index (int64) where it was found
  std::pair<Tensor, Tensor> cummin(int64_t axis = 0) const;
  /// log(sum(exp(x))) over axes, computed stably
  Tensor logsumexp(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  /// running log(sum(exp(x))) along axis
  Tensor logcumsumexp(int64_t axis = 0) const;
  /// log(softmax(x)) along axis, computed stably
  Tensor log_softmax(int64_t axis = -1, CallLoc loc = CallLoc::current()) const;
  /** log_softmax computed and returned in `dtype` (torch's and tinygrad's log_softmax(dtype=)). */
  Tensor log_softmax(int64_t axis, DType dtype, CallLoc loc = CallLoc::current()) const;
  /// softmax(-x) along axis
  Tensor softmin(int64_t axis = -1) const;
  /// softmin computed and returned in `dtype`
  Tensor softmin(int64_t axis, DType dtype) const { return cast(dtype).softmin(axis); }
  /** Sorted values and their original indices (int64), stable (equal values keep their order; NaN sorts as the
   *  largest value, like torch). Values by a bitonic network (O(n log^2 n) compare-exchanges, tinygrad's); indices
   *  by matching each sorted value to the input positions holding it. */
  std::pair<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false) const;
  /// the indices (int64) sort() would return
  Tensor argsort(int64_t dim = -1, bool descending = false) const;
  /** The k largest (or smallest) values along dim, sorted, and their indices. */
  std::pair<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true) const;
  /** topk with torch's and tinygrad's `sorted` flag: false lets the order be any (tg returns it sorted either way). */
  std::pair<Tensor, Tensor> topk(int64_t k, int64_t dim, bool largest, bool sorted) const {
    (void)sorted;
    return topk(k, dim, largest);
  }

  // ---- linear algebra (ops_linalg.cpp)
  /** torch.matmul: 1-D/1-D dot, matrix-vector, and batched matmul with broadcasting of the batch dims. */
  Tensor matmul(const Tensor& b, CallLoc loc = CallLoc::current()) const;
  /// matmul(b)
  Tensor dot(const Tensor& b, CallLoc loc = CallLoc::current()) const { return matmul(b, loc); }
  /** matmul computed and returned in `dtype` (tinygrad's matmul(dtype=): e.g. float16 operands accumulated in
   *  float32): both operands are cast first, so the products are exact in a wider dtype. */
  Tensor matmul(const Tensor& b, DType dtype, CallLoc loc = CallLoc::current()) const;
  /// matmul(b, dtype)
  Tensor dot(const Tensor& b, DType dtype, CallLoc loc = CallLoc::current()) const { return matmul(b, dtype, loc); }
  /** x @ weight.T + bias with weight (out_features, in_features), like torch.nn.functional.linear. */
  Tensor linear(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, CallLoc loc = CallLoc::current()) const;
  /** linear computed and returned in `dtype` (tinygrad's linear(dtype=)). */
  Tensor linear(const Tensor& weight, const std::optional<Tensor>& bias, DType dtype, CallLoc loc = CallLoc::current()) const;

  // ---- nn functional (ops_nn.cpp); layouts are torch's (N, C, *spatial)
  /** N-d convolution (the number of spatial dims comes from the weight); padding_mode: "zeros", "reflect",
   *  "replicate" or "circular". A negative pad crops the input (as tinygrad; padding_mode "zeros" only). */
  Tensor conv(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, ConvPadding padding = 0,
              IntArg dilation = 1, int64_t groups = 1, const std::string& padding_mode = "zeros") const;
  /// conv() on (N, C, L) with weight (out, C / groups, k)
  Tensor conv1d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, ConvPadding padding = 0,
                IntArg dilation = 1, int64_t groups = 1, const std::string& padding_mode = "zeros") const;
  /// conv() on (N, C, H, W) with weight (out, C / groups, kh, kw)
  Tensor conv2d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, ConvPadding padding = 0,
                IntArg dilation = 1, int64_t groups = 1, const std::string& padding_mode = "zeros", CallLoc loc = CallLoc::current()) const;
  /// conv() on (N, C, D, H, W) with weight (out, C / groups, kd, kh, kw)
  Tensor conv3d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, ConvPadding padding = 0,
                IntArg dilation = 1, int64_t groups = 1, const std::string& padding_mode = "zeros") const;
  /** Transposed convolution; weight (C_in, C_out / groups, *k) like torch. */
  Tensor conv_transpose(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, IntArg padding = 0,
                        IntArg output_padding = 0, int64_t groups = 1, IntArg dilation = 1) const;
  /// conv_transpose() on (N, C, L)
  Tensor conv_transpose1d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, IntArg padding = 0,
                          IntArg output_padding = 0, int64_t groups = 1, IntArg dilation = 1) const;
  /// conv_transpose() on (N, C, H, W)
  Tensor conv_transpose2d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, IntArg stride = 1, IntArg padding = 0,
                          IntArg output_padding = 0, int64_t groups = 1, IntArg dilation = 1) const;
  /** Max pool over the last kernel.size() dims; stride defaults to the kernel; padding pads with -inf: one value per
   *  spatial dim (both sides), or 2 per spatial dim ((begin, end) for each dim in order; also for avg_pool). */
  Tensor max_pool(IntArg kernel, IntArg stride = {}, IntArg padding = 0, IntArg dilation = 1, bool ceil_mode = false) const;
  /// max_pool() over the last dim
  Tensor max_pool1d(IntArg kernel, IntArg stride = {}, IntArg padding = 0, IntArg dilation = 1, bool ceil_mode = false) const;
  /// max_pool() over the last two dims
  Tensor max_pool2d(IntArg kernel, IntArg stride = {}, IntArg padding = 0, IntArg dilation = 1, bool ceil_mode = false) const;
  /** Average pool over the last kernel.size() dims (torch semantics for count_include_pad and ceil_mode). */
  Tensor avg_pool(IntArg kernel, IntArg stride = {}, IntArg padding = 0, bool ceil_mode = false, bool count_include_pad = true) const;
  /// avg_pool() over the last dim
  Tensor avg_pool1d(IntArg kernel, IntArg stride = {}, IntArg padding = 0, bool ceil_mode = false, bool count_include_pad = true) const;
  /// avg_pool() over the last two dims
  Tensor avg_pool2d(IntArg kernel, IntArg stride = {}, IntArg padding = 0, bool ceil_mode = false, bool count_include_pad = true) const;
  /** Adaptive pools over the last output_size.size() dims (torch's window rule, any sizes). */
  Tensor adaptive_avg_pool(const std::vector<int64_t>& output_size) const;
  /// maximum over each adaptive window, to output_size
  Tensor adaptive_max_pool(const std::vector<int64_t>& output_size) const;
  /// adaptive_avg_pool() over the last dim
  Tensor adaptive_avg_pool1d(int64_t output_size) const { return adaptive_avg_pool({output_size}); }
  /// adaptive_avg_pool() over the last two dims
  Tensor adaptive_avg_pool2d(IntArg output_size) const;
  /// adaptive_max_pool() over the last dim
  Tensor adaptive_max_pool1d(int64_t output_size) const { return adaptive_max_pool({output_size}); }
  /// adaptive_max_pool() over the last two dims
  Tensor adaptive_max_pool2d(IntArg output_size) const;
  /** torch.nn.functional.batch_norm over dim 1. training: batch statistics (and the running stats, when given, are
   *  updated in place with `momentum` via assign); otherwise the running stats. */
  Tensor batch_norm(const std::optional<Tensor>& running_mean, const std::optional<Tensor>& running_var,
                    const std::optional<Tensor>& weight = std::nullopt, const std::optional<Tensor>& bias = std::nullopt,
                    bool training = false, double momentum = 0.1, double eps = 1e-5) const;
  /** Normalise over the last normalized_shape.size() dims, which must equal normalized_shape. */
  Tensor layer_norm(const std::vector<int64_t>& normalized_shape, const std::optional<Tensor>& weight = std::nullopt,
                    const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5, CallLoc loc = CallLoc::current()) const;
  /// normalise (N, C, *) over each group of channels and the spatial dims, then scale and shift per channel
  Tensor group_norm(int64_t num_groups, const std::optional<Tensor>& weight = std::nullopt,
                    const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5) const;
  /** x / sqrt(mean(x^2) + eps) * weight over the last normalized_shape.size() dims; eps defaults to float eps. */
  Tensor rms_norm(const std::vector<int64_t>& normalized_shape, const std::optional<Tensor>& weight = std::nullopt,
                  std::optional<double> eps = std::nullopt) const;
  /** Zero elements with probability p (from rand) and scale the rest by 1/(1-p); identity unless training. */
  Tensor dropout(double p = 0.5, bool training = true) const;
  /** softmax(q k^T * scale + mask) v; a bool mask keeps where true, a float mask is added. enable_gqa: key and value
   *  may have fewer heads (dim -3) than the query, a divisor of its count; each serves a group of query heads. */
  Tensor scaled_dot_product_attention(const Tensor& key, const Tensor& value, const std::optional<Tensor>& attn_mask = std::nullopt,
                                      double dropout_p = 0.0, bool is_causal = false, std::optional<double> scale = std::nullopt,
                                      bool enable_gqa = false) const;
  /** Resize the last size.size() dims: mode "nearest", "linear" (also "bilinear", "trilinear"), align_corners for linear. */
  Tensor interpolate(const std::vector<int64_t>& size, const std::string& mode = "nearest", bool align_corners = false) const;

  // ---- losses (ops_loss.cpp); reduction: "mean", "sum" or "none"; this is the prediction
  /** Logits (N, C, *) or (C,) against class indices (int, (N, *)) or class probabilities (float, same shape). */
  Tensor cross_entropy(const Tensor& target, const std::string& reduction = "mean", double label_smoothing = 0.0,
                       int64_t ignore_index = -100, const std::optional<Tensor>& weight = std::nullopt, CallLoc loc = CallLoc::current()) const;
  /** Log-probabilities (N, C, *) or (C,) against class indices. */
  Tensor nll_loss(const Tensor& target, const std::optional<Tensor>& weight = std::nullopt, int64_t ignore_index = -100,
                  const std::string& reduction = "mean") const;
  /** tinygrad's: logits (…, C) against class indices (…), ignore_index -1 by default. */
  Tensor sparse_categorical_crossentropy(const Tensor& target, int64_t ignore_index = -1, double label_smoothing = 0.0,
                                         const std::string& reduction = "mean") const;
  /** Probabilities against targets in [0, 1] (logs clamped at -100 like torch). */
  Tensor binary_crossentropy(const Tensor& target, const std::string& reduction = "mean") const;
  /// binary_crossentropy of sigmoid(this), computed stably; pos_weight scales the positive term
  Tensor binary_crossentropy_with_logits(const Tensor& target, const std::string& reduction = "mean",
                                         const std::optional<Tensor>& pos_weight = std::nullopt) const;
  /// (this - target)^2, reduced
  Tensor mse_loss(const Tensor& target, const std::string& reduction = "mean") const;
  /// |this - target|, reduced
  Tensor l1_loss(const Tensor& target, const std::string& reduction = "mean") const;
  /// Huber-like: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, reduced
  Tensor smooth_l1_loss(const Tensor& target, const std::string& reduction = "mean", double beta = 1.0) const;

  // ---- the rest of tinygrad's Tensor API (tinygrad a9069c177a); compositions of the ops above
  /** Bytes per element. */
  int64_t element_size() const;
  /** numel() * element_size(). */
  int64_t nbytes() const;
  /** Whether the dtype is a float type. */
  bool is_floating_point() const;
  /** The number of elements of max_shape() (numel() for a tensor without variables). */
  int64_t max_numel() const;
  /** The raw bytes of the realised tensor, row-major (tinygrad's data()). */
  std::vector<uint8_t> data(CallLoc loc = CallLoc::current()) const;
  /** The values as nested lists (tinygrad's tolist): a 0-d tensor gives a leaf, a dim of size 0 an empty list. */
  NestedList tolist(CallLoc loc = CallLoc::current()) const;
  /** The values on the host as an array (tinygrad's numpy(): dtype, shape, strides, bytes). */
  HostArray numpy(CallLoc loc = CallLoc::current()) const;
  /** The bytes at `url` as a 1-d uint8 tensor on `device` (tinygrad's from_url): http:// and https://
   *  (cpp-httplib; https where it has OpenSSL), file:// or a plain path; gunzip inflates a gzip body (several
   *  members too). A status other than 200 or a failed read is a tg::Error naming the URL. */
  static Tensor from_url(const std::string& url, bool gunzip = false, const std::string& device = "");
  /** Marks this tensor (all handles of it) as a parameter or not (tinygrad's is_param_); returns it. */
  Tensor& is_param_(bool is_param = true);
  /// whether is_param_ marked it
  bool is_param() const;
  /** A placeholder for argument `slot` of a function body (tinygrad's as_param): this tensor's dtype, shape and
   *  device, no value. Ops on placeholders build the body; call() substitutes arguments; realising a graph
   *  that still holds one is a tg::Error. */
  Tensor as_param(int64_t slot) const;
  /** The function body `fxn` applied to (this, args...) (tinygrad's call): placeholder slot i is replaced by the
   *  i-th of them (dtype and shape must match, each slot must be given). */
  Tensor call(const std::vector<Tensor>& args, const Tensor& fxn) const;
  /** The schedule that realises this tensor and `others` (tinygrad's linear_with_vars; kernels in order, as
   *  create_schedule) with the values of its bound variables. The tensors become views of the schedule's output
   *  buffers at once: run it (run_schedule, schedule.hpp) before reading them. */
  std::pair<Schedule, std::vector<std::pair<std::string, int64_t>>> linear_with_vars(const std::vector<Tensor>& others = {}) const;
  /** linear_with_vars without variables (tinygrad's schedule_linear); a bound variable is a tg::Error. */
  Schedule schedule_linear(const std::vector<Tensor>& others = {}) const;
  /** this @ w as tinygrad's IMAGE path computes it: a 1x1 image_conv2d of (1, k, m, 1) with w as (n, k, 1, 1);
   *  the values of matmul (dtype: the accumulation and result dtype, as matmul's). */
  Tensor image_dot(const Tensor& w, std::optional<DType> dtype = std::nullopt) const;
  /** conv2d as tinygrad's IMAGE path lays it out: input and output channels zero-padded to multiples of 4 (unless
   *  1 with groups a multiple of 4), channels last, the extra output channels dropped: the values of conv2d. */
  Tensor image_conv2d(const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt, int64_t groups = 1, IntArg stride = 1,
                      IntArg dilation = 1, ConvPadding padding = 0, std::optional<DType> dtype = std::nullopt) const;
  /** A copy in a buffer of its own (later assigns to this tensor do not change it); gradients flow through. */
  Tensor clone() const;
  /** A copy on `device` (tinygrad's clone(device=)); the same device gives clone(). */
  Tensor clone(const std::string& device) const;
  /** Same shape and device, uninitialised (dtype defaults to this tensor's). */
  Tensor empty_like(std::optional<DType> dtype = std::nullopt) const;
  /** An uninitialised tensor (tinygrad's invalids: empty() whose values no kernel may rely on). */
  static Tensor invalids(const Shape& shape, DType dtype = dtypes::float32, const std::string& device = "");
  /** A 0-d constant of this tensor's dtype (or `dtype`) on its device, broadcast to its shape. */
  Tensor const_like(double value, std::optional<DType> dtype = std::nullopt) const;
  /** Casts named like tinygrad's (a trailing _ where the name is a C++ keyword). */
  Tensor half() const;
  Tensor bfloat16() const;  ///< cast(dtypes::bfloat16)
  Tensor float_() const;  ///< cast(dtypes::float32) (tinygrad's float)
  Tensor double_() const;  ///< cast(dtypes::float64) (tinygrad's double)
  Tensor int_() const;  ///< cast(dtypes::int32) (tinygrad's int)
  Tensor long_() const;  ///< cast(dtypes::int64) (tinygrad's long)
  Tensor short_() const;  ///< cast(dtypes::int16) (tinygrad's short)
  Tensor bool_() const;  ///< cast(dtypes::bool_) (tinygrad's bool): nonzero is true
  /** this + b, this - b, this * b as methods (tinygrad's add, sub, mul). */
  Tensor add(const Tensor& b) const;
  Tensor sub(const Tensor& b) const;  ///< *this - b (broadcasting, promoting)
  Tensor mul(const Tensor& b) const;  ///< *this * b (broadcasting, promoting)
  /** C's remainder: the sign follows the dividend (torch.fmod); ints keep their dtype, x fmod 0 = 0. */
  Tensor fmod(const Tensor& b) const;
  /** |this| with the sign of b (negative zero counts as negative, like torch); the result is float. */
  Tensor copysign(const Tensor& b) const;
  /** log(exp(this) + exp(b)) without overflow. */
  Tensor logaddexp(const Tensor& b) const;
  /** |this - b| <= atol + rtol * |b| elementwise (bool); infinities equal themselves; NaN close to NaN if equal_nan. */
  Tensor isclose(const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false) const;
  /** isclose(...).all(): a 0-d bool tensor. */
  Tensor allclose(const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false) const;
  /** this / max(||this||_p along dim, eps) (torch.nn.functional.normalize). */
  Tensor normalize(double p = 2.0, int64_t dim = 1, double eps = 1e-12) const;
  /** 1-D: the square matrix with this on its diagonal; 2-D: the main diagonal (torch.diag). */
  Tensor diag() const;
  /** Windows of `size` every `step` along dim: dim becomes (n_windows, ...) with a new last dim of `size`. */
  Tensor unfold(int64_t dim, int64_t size, int64_t step) const;
  /** reshape under torch's name. */
  Tensor view(Shape s) const;
  /** einops-style rearrange: "b (h w) c -> b h w c" with sizes for the split axes ({{"h", 4}}), "..." allowed. */
  Tensor rearrange(const std::string& formula, const std::vector<std::pair<std::string, int64_t>>& sizes = {}) const;
  /** Pad each dim at its end up to shape[i] (-1 keeps a dim) with `value`. */
  Tensor pad_to(const Shape& shape, double value = 0) const;
  /** Keep the first shape[i] elements of each dim (-1 keeps a dim). */
  Tensor shrink_to(const Shape& shape) const;
  /** The indices (int64, (count, ndim)) of the non-zero elements in row-major order; the count is read back (one
   *  sync). With `size`: exactly size rows, padded with fill_value or truncated, and no sync. */
  Tensor nonzero(std::optional<int64_t> size = std::nullopt, int64_t fill_value = 0) const;
  /** max_pool2d(return_indices=true): values and the flat index (int64) of each maximum in its input plane, as torch. */
  ValuesIndices max_pool2d_with_indices(IntArg kernel, IntArg stride = {}, IntArg padding = 0, IntArg dilation = 1,
                                        bool ceil_mode = false) const;
  /** The same for any number of spatial dims (kernel.size()). */
  ValuesIndices max_pool_with_indices(IntArg kernel, IntArg stride = {}, IntArg padding = 0, IntArg dilation = 1,
                                      bool ceil_mode = false) const;
  /** The partial inverse of max_pool2d: each value written at its index in a zero plane (torch.max_unpool2d); any
   *  number of spatial dims (kernel.size()); output_size defaults to the pool's input size. */
  Tensor max_unpool2d(const Tensor& indices, IntArg kernel, IntArg stride = {}, IntArg padding = 0,
                      const std::vector<int64_t>& output_size = {}) const;
  /** A random permutation of 0..n-1 (the argsort of n uniform values, tinygrad's). */
  static Tensor randperm(int64_t n, DType dtype = dtypes::int64, const std::string& device = "");
  /** Indices (int64) drawn from the categorical distributions in this tensor's rows (1-D or 2-D, weights >= 0). */
  Tensor multinomial(int64_t num_samples = 1, bool replacement = false) const;
  /** n random uint32 values from the seeded generator (the bits rand() turns into floats). */
  static Tensor random_bits(int64_t n, const std::string& device = "");
  /** threefry2x32-20 of this uint64 tensor (counter: low word x0, high word x1) keyed by a uint64 key, as a uint64. */
  Tensor threefry(const Tensor& key) const;
  /** Householder QR of the last two dims: (Q, R) with Q orthogonal (m, m) and R upper triangular (m, n). */
  std::pair<Tensor, Tensor> qr() const;
  /** SVD of the last two dims by one-sided Jacobi rotations (tinygrad's): (U, S, V^T), S descending. */
  std::tuple<Tensor, Tensor, Tensor> svd(bool full_matrices = true) const;
  /** `steps` Newton-Schulz iterations of the odd polynomial with coefficients `params` (Muon's orthogonalisation). */
  Tensor newton_schulz(int64_t steps, const std::vector<double>& params, double eps = 1e-7) const;
  /** Keccak over the last dim's bytes: "sha3_224", "sha3_256" or "shake_128" (the digest as uint8, (..., bytes)). */
  Tensor keccak(const std::string& cfg = "sha3_256") const;
  /** keccak with an explicit (rate, domain byte). */
  Tensor keccak(int64_t rate, int64_t dsbyte) const;
  /** tinygrad's 16-byte tree hash of the tensor's bytes (shake_128 over 1 MiB blocks). */
  Tensor hash() const;
  /** Identity forward; the gradient is made contiguous on its way back. */
  Tensor contiguous_backward() const;
  /** Apply the functions in order: fs[n-1](...fs[0](this)). */
  Tensor sequential(const std::vector<std::function<Tensor(const Tensor&)>>& fs) const;
  /** Make this handle (and its copies) hold x's value (shapes must match; dtype and device may differ). */
  Tensor& replace(const Tensor& x);
  /** Move to a device in place (this handle and its copies). */
  Tensor& to_(const std::string& device);
  /** tinygrad's layernorm: normalise over `axes` (default the last), no affine parameters. */
  Tensor layernorm(std::vector<int64_t> axes = {-1}, double eps = 1e-5) const;
  /** tinygrad's batchnorm: (x - mean) * invstd * weight + bias, the statistics broadcast along dim 1. */
  Tensor batchnorm(const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, const Tensor& mean,
                   const Tensor& invstd) const;
  /** binary_crossentropy_with_logits under tinygrad's name. */
  Tensor binary_crossentropy_logits(const Tensor& target, const std::string& reduction = "mean",
                                    const std::optional<Tensor>& pos_weight = std::nullopt) const {
    return binary_crossentropy_with_logits(target, reduction, pos_weight);
  }

  // ---- autograd (symbolic: gradients are UOp graphs built by the rule table in gradient.hpp)
  /** Mark this tensor as a leaf whose gradient backward() computes. */
  Tensor& requires_grad_(bool on = true);
  /// whether gradients flow to or through this tensor
  bool requires_grad() const;
  /** The accumulated gradient (a tensor of this shape); throws if none was computed. */
  Tensor grad() const;
  /// whether a gradient was computed (grad() would not throw)
  bool has_grad() const;
  /// drops the accumulated gradient
  void zero_grad();
  /** Gradients of this scalar (or with `seed` for a non-scalar) into every requires_grad tensor it depends on,
   *  added to what they hold. The gradient graph is lazy: realise it (or an optimiser step) to compute it.
   *  A second backward() of the same tensor is a tg::Error, as torch's second backward through a freed graph,
   *  unless the earlier call passed {.retain_graph = true}: then the gradients add up again, as in torch. */
  void backward(BackwardOptions opts = {});
  /// backward() with the gradient of this tensor given (its shape)
  void backward(const Tensor& seed, BackwardOptions opts = {});
  /** d(this)/d(wrt) for each target (zeros where this does not depend on it); works on gradients too. */
  std::vector<Tensor> gradient(const std::vector<Tensor>& wrt, const Tensor* seed = nullptr) const;
  /** A custom gradient, like a torch.autograd.Function's backward: the result has this tensor's value, and its
   *  gradient with respect to `inputs` is backward(grad, value, inputs) (one entry per input, nullopt for none)
   *  instead of the differentiated graph that computes the value (which gradients do not enter). The forward
   *  graph is unchanged for the scheduler. `key` names the rule: calls with the same key must pass functions that
   *  compute the same thing (the first one registered is used). Under NoGrad it returns this tensor. */
  using CustomBackward = std::function<std::vector<std::optional<Tensor>>(const Tensor& grad, const Tensor& value,
                                                                          const std::vector<Tensor>& inputs)>;
  /// this value with the gradient rule `backward` for `inputs`, registered under `key` (see CustomBackward)
  Tensor custom_gradient(const std::vector<Tensor>& inputs, const std::string& key, CustomBackward backward) const;

  /** Builds a custom kernel's AST from its parameters (Tensor::custom_kernel). */
  using CustomKernelFn = std::function<UOpRef(const std::vector<KernelParam>& params)>;
  /** A kernel written in UOps (tinygrad's Tensor.custom_kernel): fxn gets one KernelParam per source and returns
   *  SINK(STORE(INDEX(PARAM, i), value), ...) as the scheduler's kernels are (RANGE loops, REDUCE(value, ranges)
   *  for reductions, LOADs of the parameters). The tensor graph gets one CALL over the sources; it runs as one
   *  kernel, as written (nothing fuses into it or across it), after its sources are realised. Returns one tensor
   *  per source: a source the kernel stores into is returned as the kernel's output, a new buffer of its shape and
   *  dtype (the source gives only those: the output starts uninitialised, and the kernel's loads of that
   *  parameter read the output); any other source is returned as it is. Gradient: `backward` is called for each
   *  output as a CustomBackward (grad, output, sources) returning one entry per source; without one, backward()
   *  through an output is a tg::Error. Bad ASTs (a PARAM beyond the sources, a dtype that is not the source's, an
   *  index outside a source, tensor-graph ops) are tg::Errors naming custom_kernel. */
  static std::vector<Tensor> custom_kernel(const std::vector<Tensor>& srcs, const CustomKernelFn& fxn,
                                           CustomBackward backward = {});
  /** tinygrad's callify: the computation of this tensor and `others` becomes one CALL in the tensor graph. Each
   *  tensor now reads its value after that CALL: realising any of them runs the whole CALL (one schedule that
   *  computes all of them into buffers of their own), and their consumers read those buffers (nothing fuses
   *  across the CALL; an elementwise consumer realised with them may share their kernel as a further output, the
   *  scheduler's multi-output kernels, which still store them). A graph of the same structure reuses the CALL's schedule (the schedule cache). Returns this
   *  tensor. Realised tensors are left as they are. */
  Tensor& callify(const std::vector<Tensor*>& others = {});

  /** Realise several tensors together (one schedule). */
  static void realize_all(std::vector<Tensor*> ts);
  /** The shared state (a tg::Error for an undefined tensor). */
  std::shared_ptr<TensorImpl> impl() const {
    (void)im();
    return impl_;
  }

 private:
  friend void replace_realized(const std::vector<std::pair<const UOp*, UOpRef>>&);
  Tensor check_numel(size_t n, const char* op) const;
  void copy_to_host(void* dst, size_t bytes) const;
  size_t read_count() const;
  Tensor reduce(Ops op, std::vector<int64_t> axes, bool keepdim, const char* name) const;
  Tensor mov(Ops op, Arg arg, Shape out) const;
  int64_t norm_axis(int64_t a, const char* op) const;
  /** detail::const_like (a 0-d constant of t's dtype), which the member const_like hides inside members. */
  static Tensor const_like(const Tensor& t, double v);
  /** The shared state; a tg::Error for an undefined tensor. */
  TensorImpl& im() const;
  std::shared_ptr<TensorImpl> impl_;
};

/** Shared state behind Tensor handles. */
struct TensorImpl {
  /// the tensor-graph node computing the value (replaced by a buffer view once realised)
  UOpRef uop;
  /// the shape (the largest values, for a symbolic tensor)
  Shape shape;
  /// the device name
  std::string device;
  bool weak = false;           ///< a Python-like scalar (weakly typed)
  bool requires_grad = false;  ///< a leaf whose gradient is wanted, or computed from one
  /// the accumulated gradient, or null
  std::shared_ptr<TensorImpl> grad;
  bool retain_graph = true;    ///< whether another backward() with this tensor as the root is allowed
  bool is_param = false;       ///< marked by is_param_ (tinygrad's flag)
};

/** Graph nodes walked so far to substitute realised buffers into live tensors' graphs (a statistic for tests: a
 *  host read in the middle of a graph walks only what was built after the nodes it realised). */
size_t becomes_visits();

/// A tensor's values as nested lists (Tensor::tolist): a leaf holds one value, a list its items.
struct NestedList {
  /// a leaf's value (unused in a list)
  std::variant<double, int64_t, uint64_t, bool> value;
  /// a list's items (empty for a leaf, and for a list of none)
  std::vector<NestedList> items;
  /// whether this is a list (a dim) rather than a leaf
  bool is_list = false;
};

/// A reduction's values and the indices (int64) where they were found (max_with_indices, min_with_indices).
struct ValuesIndices {
  /// the reduced values, and the index of each along the reduced dim
  ///@{
  Tensor values, indices;
  ///@}
};

/** Printing like torch, after realising the tensor. For example
 *  `tensor([[1., 2.], [3., 4.]], shape=(2, 2), dtype=float32, device=CPU)`, one row a line. Floats print with 4
 *  decimals ("1." when every value is integral, scientific when the magnitudes need it), all with one width; more
 *  than 1000 elements print the first and last 3 of each dim around "...". An undefined tensor prints as
 *  `tensor(undefined)`. */
std::string to_string(const Tensor& t);
/// writes to_string(t)
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/** One entry of Tensor::index: an int, a Slice, an integer Tensor (advanced indexing), NewAxis or Ellipsis. */
struct TensorIndex {
  /// which member holds the index (NewAxis and Ellipsis need none)
  ///@{
  enum class Kind { Int, Slice, Tensor, NewAxis, Ellipsis } kind;
  ///@}
  /// the int index (negative counts from the end)
  int64_t i = 0;
  /// the slice
  tg::Slice s;
  /// the integer index tensor
  tg::Tensor t;
  /// an int index: selects one position and drops the dim
  TensorIndex(int v) : kind(Kind::Int), i(v) {}      // NOLINT
  /// an int index: selects one position and drops the dim
  TensorIndex(int64_t v) : kind(Kind::Int), i(v) {}  // NOLINT
  /// a slice of the dim
  TensorIndex(tg::Slice v) : kind(Kind::Slice), s(v) {}             // NOLINT
  /// an integer tensor (advanced indexing)
  TensorIndex(tg::Tensor v) : kind(Kind::Tensor), t(std::move(v)) {}  // NOLINT
  /// a new size-1 dim at this place
  TensorIndex(NewAxisT) : kind(Kind::NewAxis) {}                    // NOLINT
  /// as many whole dims as the other entries leave
  TensorIndex(EllipsisT) : kind(Kind::Ellipsis) {}                  // NOLINT
};

/** Concatenate along dim (shapes equal elsewhere; dtypes promote). */
Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0, CallLoc loc = CallLoc::current());
/** Stack along a new dim. */
Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0, CallLoc loc = CallLoc::current());
/** cond ? a : b with broadcasting. */
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, CallLoc loc = CallLoc::current());
/** Einstein summation: "ij,jk->ik", batch dims, "..." and repeated indices (diagonals) like torch.einsum. */
Tensor einsum(const std::string& formula, const std::vector<Tensor>& operands, CallLoc loc = CallLoc::current());
/** Rows of weight (num, dim) picked by integer indices of any shape: (*indices.shape, dim). */
Tensor embedding(const Tensor& indices, const Tensor& weight, CallLoc loc = CallLoc::current());
/** Coordinate grids ("ij" or "xy" indexing) from 1-D tensors. */
std::vector<Tensor> meshgrid(const std::vector<Tensor>& ts, const std::string& indexing = "ij");

/** While one of these lives (per thread), new tensors do not require gradients. */
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;
  /// whether a NoGrad lives on this thread
  static bool active();

 private:
  bool prev_;
};

// ================================================================ operators and static dtype kinds

/** What is known about a tensor's dtype at compile time: its kind. A plain Tensor's kind is Unknown; a
 *  TensorOf<float|int|bool> is a Tensor whose dtype is of that kind (any width), checked when it is made. */
enum class Kind { Unknown, Bool, Int, Float };

template <class E>
class TensorOf;

namespace et {

template <class T>
struct typed : std::false_type {};
template <class T>
struct typed<TensorOf<T>> : std::true_type {};

/** The kind of an operand type: TensorOf<T>'s, a C++ scalar's, Unknown for a Tensor. */
template <class T>
constexpr Kind kind_of() {
  using U = std::remove_cvref_t<T>;
  if constexpr (typed<U>::value) return U::kind;
  else if constexpr (std::is_same_v<U, bool>) return Kind::Bool;
  else if constexpr (std::is_integral_v<U>) return Kind::Int;
  else if constexpr (std::is_floating_point_v<U>) return Kind::Float;
  else return Kind::Unknown;
}

template <class T>
/// whether T is Tensor or derived from it (TensorOf)
inline constexpr bool is_tensorish = std::is_base_of_v<Tensor, std::remove_cvref_t<T>>;
template <class T>
/// whether T can be an operator's operand: a tensor or a C++ arithmetic scalar
inline constexpr bool is_operand = is_tensorish<T> || std::is_arithmetic_v<std::remove_cvref_t<T>>;

/** An operand as a Tensor: tensors as they are, C++ scalars as weak 0-d tensors (like Python scalars). */
inline const Tensor& lower(const Tensor& t) { return t; }
/// a C++ scalar as a weak 0-d tensor (bool stays bool, integers become int, floats double)
template <class T>
  requires std::is_arithmetic_v<T>
Tensor lower(T v) {
  if constexpr (std::is_same_v<T, bool>) return Tensor(v);
  else if constexpr (std::is_integral_v<T>) return Tensor(int(v));
  else return Tensor(double(v));
}

/** The operators' ops (comparisons as written: > and >= are built from < like tinygrad). */
enum class Op { Add, Sub, Mul, Div, Mod, And, Or, Xor, Shl, Shr, Lt, Gt, Le, Ge, Eq, Ne, Neg, Invert };

/// &, |, ^, << or >>
constexpr bool is_bitwise(Op o) { return o == Op::And || o == Op::Or || o == Op::Xor || o == Op::Shl || o == Op::Shr; }
/// << or >>
constexpr bool is_shift(Op o) { return o == Op::Shl || o == Op::Shr; }
/// +, -, *, / or %
constexpr bool is_arith(Op o) { return o == Op::Add || o == Op::Sub || o == Op::Mul || o == Op::Div || o == Op::Mod; }
/// a comparison (<, >, <=, >=, ==, !=), whose result is bool
constexpr bool is_cmp(Op o) { return o >= Op::Lt && o <= Op::Ne; }

/** The result kind of `a op b` (promotion as torch: a float operand makes a float, division is always float). */
constexpr Kind result_kind(Op o, Kind a, Kind b) {
  if (is_cmp(o)) return Kind::Bool;
  if (o == Op::Div) return Kind::Float;
  if (a == Kind::Float || b == Kind::Float) return Kind::Float;
  if (a == Kind::Int && b == Kind::Int) return Kind::Int;
  if (a == Kind::Bool && b == Kind::Bool) return Kind::Bool;
  return Kind::Unknown;
}

/// The typed tensor for a static dtype kind (plain Tensor when unknown; see typed_t).
template <Kind K>
struct typed_for {
  /// a plain Tensor (the kind is not known statically)
  using type = Tensor;
};
/// Float results are TensorOf<float>.
template <>
struct typed_for<Kind::Float> {
  /// the typed tensor for a float result
  using type = TensorOf<float>;
};
/// Int results are TensorOf<int>.
template <>
struct typed_for<Kind::Int> {
  /// the typed tensor for an int result
  using type = TensorOf<int>;
};
/// Bool results are TensorOf<bool>.
template <>
struct typed_for<Kind::Bool> {
  /// the typed tensor for a bool result
  using type = TensorOf<bool>;
};
/** The result type of an operator: TensorOf<...> when the kind is known, else Tensor. */
template <Kind K>
using typed_t = typename typed_for<K>::type;

/** The operators' work (one non-template function: broadcasting, promotion, the op). */
Tensor binary(Op o, const Tensor& a, const Tensor& b);
/// the work of unary - and ~
Tensor unary(Op o, const Tensor& a);
/** Throws unless t's dtype is of kind k (an undefined t passes: it has no dtype yet). */
void check_kind(const Tensor& t, Kind k);

}  // namespace et

/** A Tensor whose dtype kind (float, int or bool; any width) is part of its type, so misuse is a compile error:
 *  `TensorOf<float> x(Tensor::randn({3}));  x & 1;  // error: bitwise ops need int or bool operands`.
 *  Operators return one when both operands' kinds decide the result's (`a / b`, `a < b`, `i + 1` for an int i), a
 *  plain Tensor otherwise. It converts to Tensor wherever one is expected; a Tensor becomes one explicitly, or by
 *  assignment, with a check of its dtype. The methods whose result kind follows from this one's keep the static
 *  kind (`x.reshape({2, 3}).exp().sum() & 1` is a compile error for any x; `i.mean()` is TensorOf<float>):
 *  movement ops, the float math (float results for every kind, as Tensor promotes), reductions, comparisons. The
 *  others return plain Tensors. */
template <class E>
class TensorOf : public Tensor {
  static_assert(std::is_same_v<E, float> || std::is_same_v<E, int> || std::is_same_v<E, bool>,
                "[tensor] TensorOf<T> takes float, int or bool: the dtype's kind, of any width");

 public:
  /// the dtype kind this type guarantees
  static constexpr Kind kind = et::kind_of<E>();
  /** Undefined, as a default Tensor. */
  TensorOf() = default;
  /** t, checked to be of this kind (a tg::Error otherwise). */
  explicit TensorOf(Tensor t) : Tensor(std::move(t)) { et::check_kind(*this, kind); }
  /// t, checked to be of this kind (a tg::Error otherwise)
  TensorOf& operator=(const Tensor& t) {
    et::check_kind(t, kind);
    Tensor::operator=(t);
    return *this;
  }
  /// Integer-only methods refused on float tensors at compile time, as the operators are.
  ///@{
  Tensor bitwise_and(const Tensor& b) const {
    static_assert(kind != Kind::Float, "[tensor] bitwise_and needs an int or bool tensor, and this one is statically float");
    return Tensor::bitwise_and(b);
  }
  Tensor bitwise_or(const Tensor& b) const {
    static_assert(kind != Kind::Float, "[tensor] bitwise_or needs an int or bool tensor, and this one is statically float");
    return Tensor::bitwise_or(b);
  }
  Tensor bitwise_xor(const Tensor& b) const {
    static_assert(kind != Kind::Float, "[tensor] bitwise_xor needs an int or bool tensor, and this one is statically float");
    return Tensor::bitwise_xor(b);
  }
  Tensor bitwise_not() const {
    static_assert(kind != Kind::Float, "[tensor] bitwise_not needs an int or bool tensor, and this one is statically float");
    return Tensor::bitwise_not();
  }
  Tensor lshift(const Tensor& b) const {
    static_assert(kind == Kind::Int, "[tensor] lshift needs an int tensor");
    return Tensor::lshift(b);
  }
  Tensor rshift(const Tensor& b) const {
    static_assert(kind == Kind::Int, "[tensor] rshift needs an int tensor");
    return Tensor::rshift(b);
  }
  ///@}

  /// the same kind (a movement op, a copy, max/min, abs, rounding)
  using Same = TensorOf<E>;
  /// float math promotes int and bool to float
  using Float = TensorOf<float>;
  /// a sum of bools counts them (int); other kinds stay
  using Summed = TensorOf<std::conditional_t<std::is_same_v<E, bool>, int, E>>;
  /// comparisons and tests give bool
  using Bool = TensorOf<bool>;

  /// Tensor's overloads stay visible; those below return the typed result.
  ///@{
  using Tensor::clamp;
  using Tensor::expand;
  using Tensor::max;
  using Tensor::mean;
  using Tensor::min;
  using Tensor::pad;
  using Tensor::reshape;
  using Tensor::shrink;
  using Tensor::sum;
  ///@}

  /// Movement ops and copies: the kind is kept.
  ///@{
  Same reshape(Shape s, CallLoc loc = CallLoc::current()) const { return Same(Tensor::reshape(std::move(s), loc)); }
  Same reshape(std::initializer_list<sint> s) const { return Same(Tensor::reshape(s)); }
  Same permute(std::vector<int64_t> order, CallLoc loc = CallLoc::current()) const { return Same(Tensor::permute(std::move(order), loc)); }
  Same expand(Shape s, CallLoc loc = CallLoc::current()) const { return Same(Tensor::expand(std::move(s), loc)); }
  Same expand(std::initializer_list<sint> s) const { return Same(Tensor::expand(s)); }
  Same pad(const std::vector<std::pair<int64_t, int64_t>>& p, double value = 0, CallLoc loc = CallLoc::current()) const {
    return Same(Tensor::pad(p, value, loc));
  }
  Same pad(std::initializer_list<std::pair<sint, sint>> p, double value = 0) const { return Same(Tensor::pad(p, value)); }
  Same shrink(const std::vector<std::pair<int64_t, int64_t>>& r, CallLoc loc = CallLoc::current()) const { return Same(Tensor::shrink(r, loc)); }
  Same shrink(std::initializer_list<std::pair<sint, sint>> r) const { return Same(Tensor::shrink(r)); }
  Same flip(std::vector<int64_t> axes, CallLoc loc = CallLoc::current()) const { return Same(Tensor::flip(std::move(axes), loc)); }
  Same transpose(int64_t a = 1, int64_t b = 0, CallLoc loc = CallLoc::current()) const { return Same(Tensor::transpose(a, b, loc)); }
  Same T(CallLoc loc = CallLoc::current()) const { return Same(Tensor::T(loc)); }
  Same flatten(int64_t start = 0, int64_t end = -1, CallLoc loc = CallLoc::current()) const { return Same(Tensor::flatten(start, end, loc)); }
  Same squeeze(std::optional<int64_t> dim = std::nullopt, CallLoc loc = CallLoc::current()) const { return Same(Tensor::squeeze(dim, loc)); }
  Same unsqueeze(int64_t dim, CallLoc loc = CallLoc::current()) const { return Same(Tensor::unsqueeze(dim, loc)); }
  Same repeat(const std::vector<int64_t>& r, CallLoc loc = CallLoc::current()) const { return Same(Tensor::repeat(r, loc)); }
  Same view(Shape s) const { return Same(Tensor::view(std::move(s))); }
  Same contiguous() const { return Same(Tensor::contiguous()); }
  Same detach() const { return Same(Tensor::detach()); }
  Same clone() const { return Same(Tensor::clone()); }
  // the overloads with a dtype or device stay visible next to the typed ones
  using Tensor::clone;
  using Tensor::isinf;
  using Tensor::log_softmax;
  using Tensor::softmax;
  Same to(const std::string& device, CallLoc loc = CallLoc::current()) const { return Same(Tensor::to(device, loc)); }
  ///@}

  /// Elementwise ops that keep the kind.
  ///@{
  Same abs() const { return Same(Tensor::abs()); }
  Same square() const { return Same(Tensor::square()); }
  Same sign() const { return Same(Tensor::sign()); }
  Same floor() const { return Same(Tensor::floor()); }
  Same ceil() const { return Same(Tensor::ceil()); }
  Same round() const { return Same(Tensor::round()); }
  Same trunc() const { return Same(Tensor::trunc()); }
  Same clamp(double lo, double hi) const { return Same(Tensor::clamp(lo, hi)); }
  Same neg() const {
    static_assert(kind != Kind::Bool, "[tensor] negation of a bool tensor: use logical_not (or ~)");
    return Same(Tensor::neg());
  }
  /// relu of bools counts as int (max with 0 promotes)
  Summed relu() const { return Summed(Tensor::relu()); }
  ///@}

  /// Float math: a float result for every kind.
  ///@{
  Float exp() const { return Float(Tensor::exp()); }
  Float exp2() const { return Float(Tensor::exp2()); }
  Float log() const { return Float(Tensor::log()); }
  Float log2() const { return Float(Tensor::log2()); }
  Float sin() const { return Float(Tensor::sin()); }
  Float cos() const { return Float(Tensor::cos()); }
  Float sqrt() const { return Float(Tensor::sqrt()); }
  Float rsqrt() const { return Float(Tensor::rsqrt()); }
  Float reciprocal() const { return Float(Tensor::reciprocal()); }
  Float sigmoid() const { return Float(Tensor::sigmoid()); }
  Float tanh() const { return Float(Tensor::tanh()); }
  Float erf() const { return Float(Tensor::erf()); }
  Float silu() const { return Float(Tensor::silu()); }
  Float gelu(const std::string& approximate = "none") const { return Float(Tensor::gelu(approximate)); }
  Float softmax(int64_t axis = -1, CallLoc loc = CallLoc::current()) const { return Float(Tensor::softmax(axis, loc)); }
  Float log_softmax(int64_t axis = -1, CallLoc loc = CallLoc::current()) const { return Float(Tensor::log_softmax(axis, loc)); }
  ///@}

  /// Reductions: max and min keep the kind, sum counts bools as int, mean is float.
  ///@{
  Summed sum(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const {
    return Summed(Tensor::sum(std::move(axes), keepdim, loc));
  }
  Summed sum(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return Summed(Tensor::sum(axis, keepdim, loc)); }
  Summed cumsum(int64_t axis = 0) const { return Summed(Tensor::cumsum(axis)); }
  Same max(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const {
    return Same(Tensor::max(std::move(axes), keepdim, loc));
  }
  Same max(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return Same(Tensor::max(axis, keepdim, loc)); }
  Same min(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const {
    return Same(Tensor::min(std::move(axes), keepdim, loc));
  }
  Same min(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return Same(Tensor::min(axis, keepdim, loc)); }
  Float mean(std::vector<int64_t> axes = {}, bool keepdim = false, CallLoc loc = CallLoc::current()) const {
    return Float(Tensor::mean(std::move(axes), keepdim, loc));
  }
  Float mean(int64_t axis, bool keepdim = false, CallLoc loc = CallLoc::current()) const { return Float(Tensor::mean(axis, keepdim, loc)); }
  ///@}

  /// Comparisons and tests: bool.
  ///@{
  Bool eq(const Tensor& b) const { return Bool(Tensor::eq(b)); }
  Bool ne(const Tensor& b) const { return Bool(Tensor::ne(b)); }
  Bool lt(const Tensor& b) const { return Bool(Tensor::lt(b)); }
  Bool le(const Tensor& b) const { return Bool(Tensor::le(b)); }
  Bool gt(const Tensor& b) const { return Bool(Tensor::gt(b)); }
  Bool ge(const Tensor& b) const { return Bool(Tensor::ge(b)); }
  Bool isnan() const { return Bool(Tensor::isnan()); }
  Bool isinf() const { return Bool(Tensor::isinf()); }
  Bool logical_not() const { return Bool(Tensor::logical_not()); }
  ///@}
};

// The operators. Each checks what the operands' static kinds rule out (one static_assert per mistake, so the
// message is the first error the compiler prints) and returns a TensorOf when the result's kind is known.
#define TG_BINARY_OPERATOR(sym, OP)                                                                                    \
  template <class A, class B>                                                                                          \
    requires(et::is_operand<A> && et::is_operand<B> && (et::is_tensorish<A> || et::is_tensorish<B>))                  \
  auto operator sym(const A& a, const B& b) {                                                                          \
    constexpr Kind ka = et::kind_of<A>(), kb = et::kind_of<B>();                                                       \
    static_assert(!(et::is_bitwise(et::Op::OP) && (ka == Kind::Float || kb == Kind::Float)),                           \
                  "[tensor] bitwise ops need int or bool operands, and this operand is statically float");             \
    static_assert(!(et::is_shift(et::Op::OP) && (ka == Kind::Bool || kb == Kind::Bool)),                               \
                  "[tensor] shifts need int operands");                                                                \
    static_assert(!(et::is_arith(et::Op::OP) && ka == Kind::Bool && kb == Kind::Bool),                                 \
                  "[tensor] arithmetic on two bool operands: cast one to a number dtype, or use logical_and/logical_or"); \
    return et::typed_t<et::result_kind(et::Op::OP, ka, kb)>(et::binary(et::Op::OP, et::lower(a), et::lower(b)));     \
  }
TG_BINARY_OPERATOR(+, Add)
TG_BINARY_OPERATOR(-, Sub)
TG_BINARY_OPERATOR(*, Mul)
TG_BINARY_OPERATOR(/, Div)
TG_BINARY_OPERATOR(%, Mod)
TG_BINARY_OPERATOR(&, And)
TG_BINARY_OPERATOR(|, Or)
TG_BINARY_OPERATOR(^, Xor)
TG_BINARY_OPERATOR(<<, Shl)
TG_BINARY_OPERATOR(>>, Shr)
TG_BINARY_OPERATOR(<, Lt)
TG_BINARY_OPERATOR(>, Gt)
TG_BINARY_OPERATOR(<=, Le)
TG_BINARY_OPERATOR(>=, Ge)
TG_BINARY_OPERATOR(==, Eq)
TG_BINARY_OPERATOR(!=, Ne)
#undef TG_BINARY_OPERATOR

/// -a (a bool tensor: a compile error)
template <class A>
  requires et::is_tensorish<A>
auto operator-(const A& a) {
  static_assert(et::kind_of<A>() != Kind::Bool, "[tensor] negation of a bool tensor: use logical_not (or ~)");
  return et::typed_t<et::kind_of<A>()>(et::unary(et::Op::Neg, a));
}
/// ~a, bitwise not (a float tensor: a compile error)
template <class A>
  requires et::is_tensorish<A>
auto operator~(const A& a) {
  static_assert(et::kind_of<A>() != Kind::Float, "[tensor] ~ needs an int or bool operand");
  return et::typed_t<et::kind_of<A>()>(et::unary(et::Op::Invert, a));
}
/** Realise several tensors in one schedule. */
template <class... Ts>
void realize(Ts&... ts) {
  Tensor::realize_all({&ts...});
}

}  // namespace tg
