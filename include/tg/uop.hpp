#pragma once
// The IR: Ops, UOp (immutable, interned), arguments, toposort, printing, integer bounds.
// Thread-safety: UOps are immutable and may be shared and built from any thread; interning is
// lock-sharded. A UOpRef is like a shared_ptr: copying one from several threads is safe.
#include "tg/config.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "tg/dtype.hpp"

namespace tg {

/** The op set (DESIGN §3). Grouped: defines, structure, memory, tensor graph, control, vector, const, ALU. */
#define TG_OPS(X)                                                                                   \
  /* defines */                                                                                     \
  X(PARAM) X(BUFFER) X(DEFINE_VAR) X(DEFINE_LOCAL) X(DEFINE_REG) X(SPECIAL) X(UNIQUE) X(DEVICE)     \
  /* structure */                                                                                   \
  X(SINK) X(AFTER) X(GROUP) X(CALL) X(FUNCTION) X(TUPLE) X(GETTUPLE) X(LINEAR) X(NOOP)              \
  /* memory */                                                                                      \
  X(INDEX) X(LOAD) X(STORE)                                                                         \
  /* tensor graph */                                                                                \
  X(RESHAPE) X(PERMUTE) X(EXPAND) X(PAD) X(SHRINK) X(FLIP) X(REDUCE_AXIS) X(REDUCE) X(CONTIGUOUS)   \
  X(DETACH) X(COPY) X(ALLREDUCE) X(ASSIGN) X(BUFFERIZE)                                             \
  /* control */                                                                                     \
  X(RANGE) X(END) X(IF) X(ENDIF) X(BARRIER)                                                         \
  /* vector */                                                                                      \
  X(VECTORIZE) X(GEP) X(WMMA)                                                                       \
  /* const */                                                                                       \
  X(CONST)                                                                                          \
  /* unary */                                                                                       \
  X(EXP2) X(LOG2) X(SIN) X(SQRT) X(RECIPROCAL) X(NEG) X(TRUNC) X(CAST) X(BITCAST)                   \
  /* binary */                                                                                      \
  X(ADD) X(MUL) X(SUB) X(FDIV) X(IDIV) X(MOD) X(MAX) X(CMPLT) X(CMPNE) X(CMPEQ) X(XOR) X(OR) X(AND) \
  X(SHL) X(SHR) X(POW) X(THREEFRY)                                                                  \
  /* ternary */                                                                                     \
  X(WHERE) X(MULACC)                                                                                \
  /* appended (op numbers are hashed into cache keys): a variable bound to a value, BIND(DEFINE_VAR, CONST) */ \
  X(BIND)                                                                                           \
  /* appended: multi-device tensors (src/schedule/multi.cpp lowers them before scheduling) */      \
  X(MULTI) X(MSELECT)                                                                               \
  /* appended: the identity whose gradient is made contiguous (the scheduler drops it) */          \
  X(CONTIGUOUS_BACKWARD)                                                                            \
  /* appended: a software prefetch PREFETCH(PARAM, index), no value (Opt PREFETCH; a hint: renderers  \
     without one emit nothing) */                                                                   \
  X(PREFETCH)

/// The UOp operations, tinygrad's Ops (listed by TG_OPS above).
enum class Ops : uint8_t {
#define TG_X(name) name,
  TG_OPS(TG_X)
#undef TG_X
};
#define TG_X(name) +1
/// number of Ops
inline constexpr int kNumOps = 0 TG_OPS(TG_X);
#undef TG_X

/** Name of an op, e.g. "ADD". */
const char* op_name(Ops op);

/** Op classes. */
constexpr bool is_unary(Ops o) { return o >= Ops::EXP2 && o <= Ops::TRUNC; }
/// two-source ALU ops (ADD .. THREEFRY)
constexpr bool is_binary(Ops o) { return o >= Ops::ADD && o <= Ops::THREEFRY; }
/// three-source ALU ops (WHERE, MULACC)
constexpr bool is_ternary(Ops o) { return o == Ops::WHERE || o == Ops::MULACC; }
/// unary, binary or ternary ALU ops
constexpr bool is_alu(Ops o) { return is_unary(o) || is_binary(o) || is_ternary(o); }
/// ops whose two sources may be swapped
constexpr bool is_commutative(Ops o) {
  return o == Ops::ADD || o == Ops::MUL || o == Ops::MAX || o == Ops::CMPNE || o == Ops::CMPEQ || o == Ops::XOR ||
         o == Ops::AND || o == Ops::OR;
}
/// CMPLT, CMPNE and CMPEQ (bool results)
constexpr bool is_comparison(Ops o) { return o == Ops::CMPLT || o == Ops::CMPNE || o == Ops::CMPEQ; }
/// RESHAPE .. FLIP (tensor-graph views)
constexpr bool is_movement(Ops o) { return o >= Ops::RESHAPE && o <= Ops::FLIP; }
/** Number of sources an op takes; -1 when it varies. Checked by the spec and by rule tables at compile time. */
constexpr int op_arity(Ops o) {
  if (is_unary(o) || o == Ops::CAST || o == Ops::BITCAST) return 1;
  if (is_binary(o)) return 2;
  if (is_ternary(o)) return 3;
  switch (o) {
    case Ops::CONST: case Ops::DEFINE_VAR: case Ops::UNIQUE: case Ops::DEVICE: case Ops::PARAM: return 0;
    case Ops::RANGE: case Ops::SPECIAL: case Ops::GETTUPLE: case Ops::DETACH: case Ops::CONTIGUOUS: case Ops::CONTIGUOUS_BACKWARD:
    case Ops::REDUCE_AXIS: case Ops::RESHAPE: case Ops::PERMUTE: case Ops::EXPAND: case Ops::PAD: case Ops::SHRINK:
    case Ops::FLIP: case Ops::GEP: case Ops::IF: return 1;
    case Ops::ASSIGN: case Ops::COPY: case Ops::BIND: case Ops::MSELECT: case Ops::PREFETCH: return 2;
    default: return -1;
  }
}
/** Ops whose dtype is always void (a dtype predicate on them is meaningless). */
constexpr bool has_no_dtype(Ops o) {
  return o == Ops::SINK || o == Ops::STORE || o == Ops::END || o == Ops::ENDIF || o == Ops::BARRIER ||
         o == Ops::GROUP || o == Ops::NOOP || o == Ops::PREFETCH;
}

/** Axis kinds of a RANGE (codegen optimisations change these). Lane: a short innermost reduce loop over
 *  independent accumulators (an UNROLL the expander kept as a loop for the renderer to vectorise). */
enum class AxisType : uint8_t { Loop, Global, Local, Reduce, Upcast, Unroll, Group, Outer, Lane };

/** The vector width a renderer asks for a Lane loop of `n` iterations: the largest power of two dividing n (the
 *  compilers take only powers of two; 24 lanes run as 3 vectors of 8). */
inline int64_t lane_vector_width(int64_t n) { return n > 0 ? n & -n : 1; }

/** Argument of a REDUCE_AXIS: the reduce op and the axes. */
struct ReduceArg {
  /// the reduction: ADD, MUL or MAX
  Ops op;
  /// the reduced axes (kept as size-1 dims)
  std::vector<int64_t> axes;
  /// same op and axes
  bool operator==(const ReduceArg&) const = default;
};
/** Argument of a DEFINE_VAR: a named integer with inclusive bounds. */
struct VarArg {
  /// the variable's name, as kernel parameters and shape strings show it
  std::string name;
  /// inclusive bounds of its values
  ///@{
  int64_t min, max;
  ///@}
  /// same name and bounds
  bool operator==(const VarArg&) const = default;
};

/** A UOp argument: nothing, an integer, a float, a string, an int tuple (shape, axes, range id + type), or structured args. */
using Arg = std::variant<std::monostate, int64_t, double, std::string, std::vector<int64_t>, ReduceArg, VarArg>;
bool arg_equal(const Arg& a, const Arg& b);  ///< floats compare by bits (-0.0 != 0.0, NaN == NaN)
/// an argument as DEBUG and VIZ print it
std::string arg_str(const Arg& a);

class UOp;

/** Intrusive reference to an interned UOp. Equality is identity (interning makes it structural equality). */
class UOpRef {
 public:
  UOpRef() = default;
  UOpRef(const UOp* p);  ///< adds a reference (implicit: rule code passes captured nodes around)
  /// another reference to the same node (adds a reference)
  UOpRef(const UOpRef& o);
  /// takes over o's reference (o becomes null)
  UOpRef(UOpRef&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  /// refers to o's node instead (releases the old reference)
  UOpRef& operator=(UOpRef o) noexcept { std::swap(p_, o.p_); return *this; }
  ~UOpRef();
  /// the node, or null
  const UOp* get() const { return p_; }
  /// the node's members
  const UOp* operator->() const { return p_; }
  /// the node
  const UOp& operator*() const { return *p_; }
  /// whether it refers to a node
  explicit operator bool() const { return p_ != nullptr; }
  /// same node (interned: structurally equal)
  bool operator==(const UOpRef& o) const { return p_ == o.p_; }
  /// refers to node o
  bool operator==(const UOp* o) const { return p_ == o; }
  /** Take over a pointer whose reference was already counted. */
  static UOpRef adopt(const UOp* p) { UOpRef r; r.p_ = p; return r; }

 private:
  friend class UOp;
  const UOp* take() { const UOp* p = p_; p_ = nullptr; return p; }
  const UOp* p_ = nullptr;
};

/** Bounds of an integer-valued node; `known` is false where no useful bound exists (floats, uint64). */
struct Bounds {
  /// smallest and largest value (meaningful when known)
  ///@{
  int64_t min, max;
  ///@}
  /// whether min and max bound the value
  bool known;
};

/** A node of the graph. Build with UOp::make (or the helpers below); never mutated after construction. */
class UOp {
 public:
  /// the operation
  const Ops op;
  /// the result's dtype (a pointer dtype for buffers and indexing)
  const DType dtype;
  /// the op's argument (constant value, shape, axes, variable, ...)
  const Arg arg;
  const uint64_t hash;  ///< structural, stable across processes

  /// the sources, in the op's order
  std::span<const UOpRef> src() const { return {srcs_, nsrc_}; }
  /// source i (unchecked)
  const UOp* src(size_t i) const { return srcs_[i].get(); }
  /// number of sources
  size_t nsrc() const { return nsrc_; }
  /// a new counted reference to this node
  UOpRef ref() const { return UOpRef(this); }

  /** The interned node with these fields (the same object as any live equal node). */
  static UOpRef make(Ops op, DType dtype, std::span<const UOpRef> src = {}, Arg arg = {});
  /// make with the sources as a braced list
  static UOpRef make(Ops op, DType dtype, std::initializer_list<UOpRef> src, Arg arg = {}) {
    return make(op, dtype, std::span<const UOpRef>(src.begin(), src.size()), std::move(arg));
  }
  /** A constant of `dtype` (ints/bool stored as int64, floats as double, rounded to the dtype). */
  static UOpRef cnst(DType dtype, double v);
  /// an integer constant of `dtype`
  static UOpRef cnst_int(DType dtype, int64_t v);
  /** A bounded integer variable (DEFINE_VAR). */
  static UOpRef variable(std::string name, int64_t min, int64_t max, DType dtype = dtypes::index);
  /** A RANGE over [0, end) with an id and axis type. */
  static UOpRef range(const UOpRef& end, int64_t id, AxisType type = AxisType::Loop);

  /** Same node with other sources / dtype / arg. */
  UOpRef replace_src(std::span<const UOpRef> src) const;
  /// the same node with dtype d
  UOpRef with_dtype(DType d) const;

  /// Builders for ALU nodes (no simplification; dtype of comparisons is bool).
  ///@{
  UOpRef alu(Ops op, const UOpRef& b) const;
  UOpRef alu(Ops op) const;
  UOpRef alu(Ops op, const UOpRef& b, const UOpRef& c) const;
  UOpRef cast(DType d) const;
  ///@}
  /** A constant of this node's dtype. */
  UOpRef const_like(double v) const;
  /// an integer constant of this node's dtype
  UOpRef const_like_int(int64_t v) const;

  /// whether it is a CONST
  bool is_const() const { return op == Ops::CONST; }
  /** The value of a CONST as int64 (floats truncated) / as double. */
  int64_t const_int() const;
  /// the value of a CONST as a double
  double const_float() const;

  /** Symbolic extents of a tensor-graph node whose shape depends on a variable: one index expression per dim (a
   *  CONST where the dim is concrete), computed at construction from the sources; null for every other node. The
   *  node's arguments hold the largest value of each (its "max shape", how its buffer is laid out). */
  const std::vector<UOpRef>* sym() const { return sym_.get(); }

  /** Exact integer bounds (vmin/vmax), computed at construction from the sources. */
  const Bounds& bounds() const { return bounds_; }
  /// smallest value (bounds().min)
  int64_t vmin() const { return bounds_.min; }
  /// largest value (bounds().max)
  int64_t vmax() const { return bounds_.max; }

  /** Content key: 128-bit structural hash as 32 hex digits, stable across processes (for disk caches). */
  std::string key() const;
  /** Number of live interned nodes (for tests and benchmarks). */
  static size_t live_count();
  /// references held now (for tests of the interning table)
  uint32_t refcount() const { return rc_.load(std::memory_order_relaxed); }
  /** Creation order: every source of a node was created before it, so has a smaller seq. A graph whose root
   *  has a smaller seq than a node cannot contain that node (used to skip graphs a realise cannot touch). */
  uint64_t seq() const { return seq_; }

  UOp(const UOp&) = delete;
  UOp& operator=(const UOp&) = delete;

 private:
  friend class UOpRef;
  friend struct Interner;
  UOp(Ops op, DType dtype, Arg arg, uint64_t hash, uint32_t nsrc);
  ~UOp() = default;
  static void release(const UOp* p);

  mutable std::atomic<uint32_t> rc_{1};
  uint32_t nsrc_;
  uint64_t seq_ = 0;
  Bounds bounds_{0, 0, false};
  std::unique_ptr<const std::vector<UOpRef>> sym_;
  UOpRef* srcs_;                       // trailing storage
  mutable const UOp* next_ = nullptr;  // intern table chain
};

inline UOpRef::UOpRef(const UOp* p) : p_(p) {
  if (p_) p_->rc_.fetch_add(1, std::memory_order_relaxed);
}
inline UOpRef::UOpRef(const UOpRef& o) : p_(o.p_) {
  if (p_) p_->rc_.fetch_add(1, std::memory_order_relaxed);
}
inline UOpRef::~UOpRef() {
  if (p_ && p_->rc_.fetch_sub(1, std::memory_order_acq_rel) == 1) UOp::release(p_);
}

/** All nodes reachable from `root`, sources before users (iterative; safe on any depth). */
std::vector<const UOp*> toposort(const UOp* root);
/// all nodes reachable from any of `roots`, sources before users
std::vector<const UOp*> toposort(std::span<const UOpRef> roots);

/** `root` rebuilt bottom-up: `leaf(u)` replaces a node outright (null: keep it and go on); a node whose sources
 *  changed is rebuilt by `rebuild(u, new_sources)` (unset: u->replace_src). */
UOpRef substitute(const UOpRef& root, const std::function<UOpRef(const UOp*)>& leaf,
                  const std::function<UOpRef(const UOp*, std::span<const UOpRef>)>& rebuild = {});

/** One line per node, tinygrad style: index, op, dtype, source indices, arg. */
std::string print_graph(const UOp* root);
/** Index arithmetic as an infix expression, e.g. "((x*4)+3)//4" (falls back to op names for non-ALU nodes). */
std::string render_expr(const UOp* root);

/** Evaluate one ALU op on constant values with C semantics for `dtype` (wrap-around ints, truncating IDIV/MOD,
 * IEEE floats rounded to the dtype). Values are carried as double for floats and as int64 bit patterns for ints. */
struct Value {
  /// the value of an integer dtype, as its int64 bit pattern
  int64_t i = 0;
  /// the value of a float dtype
  double f = 0;
};
/// op on constant sources of src_dtype, the result in dtype (see Value)
Value exec_alu(Ops op, DType dtype, std::span<const Value> src, DType src_dtype);
/** Wrap an integer to the width and signedness of `dtype` (bool -> 0/1). */
int64_t wrap_int(int64_t v, DType dtype);

/** Called with each BUFFER node as it is freed (the engine drops the device memory behind it). */
void set_buffer_free_hook(void (*hook)(const UOp*));

/** Check the whole graph against the spec (source counts, dtypes); throws tg::SpecError naming the node. */
void spec_check(const UOp* root);
/** Check one node (its sources are assumed checked). */
void spec_check_node(const UOp* u);
/** True when SPEC=1 (or higher) is set: UOp::make then checks every node it builds. */
bool spec_enabled();

}  // namespace tg

/// Hashes a UOpRef by node identity (for unordered containers of nodes).
template <>
struct std::hash<tg::UOpRef> {
  /// hash of the node's address
  size_t operator()(const tg::UOpRef& r) const noexcept { return std::hash<const void*>()(r.get()); }
};
