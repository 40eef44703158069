#pragma once
// The scheduler's stages (internal to src/schedule/). create_schedule (schedule.cpp) runs them in order over one
// ScheduleCtx, as lower_kernel runs the lowering's stages:
//   multi           (multi.cpp)         multi-device graphs -> per-device graphs + COPY (ALLREDUCE lowered): pm_multi;
//                                       runs in create_schedule before normalisation, on graphs with a MULTI only
//   layouts         (layout.cpp)        pm_layout: memory layouts by the device's capabilities
//   bounds          (bounds.cpp)        early rewrites: pm_bounds writes facts of the tensor graph a kernel cannot
//                                       see (x - max(x) <= 0 under an exp2) as the ops the lowering reads
//   split reduceop  (split_reduce.cpp)  early rewrites: a graph_rewrite with pm_split_reduceop
//   realize map     (realize_map.cpp)   which nodes materialise: pm_realize_map visited over the graph decides,
//                                       pm_add_bufferize wraps each such node in a BUFFERIZE (ctx.graph), and the
//                                       source of each row-fused EXPAND in a row BUFFERIZE (kept in its kernel)
//   group outputs   (group.cpp)         multi-output kernels: nodes that read each other element for element
//                                       join one kernel: its leader BUFFERIZE(value, DEVICE, members...)
//   bufferize to store (schedule.cpp)   pm_bufferize_to_store: each BUFFERIZE a kernel boundary, with a numbered buffer
//                                       (ctx.bufs) and what fills it: a copy, or a kernel that STOREs the value, whose
//                                       AST rangeify builds (rangeify.cpp: the BUFFERIZEs below are its LOADs), then
//                                       pm_kernel_ast (kernel_ast.cpp)
//                                       then the kernel graph (kernel_graph.cpp), in UOps alone: each BUFFERIZE
//                                       becomes AFTER(BUFFER, CALL(program, buffers...)) and its readers read that,
//                                       an in-place write's output AFTER(BUFFER, CALLs reading the old contents); the
//                                       BUFFERs hold device, dtype and size. A kernel that would recompute a row
//                                       BUFFERIZE refuses it: pm_refuse_row_fusion puts its reduces in BUFFERIZE nodes
//                                       of the tensor graph, and the stages run again from the realize map (which
//                                       keeps them)
//   linearize       (linearize.cpp)     the kernel graph's CALLs in an order it allows: one LINEAR of CALLs over
//                                       BUFFERs (the AFTERs dropped)
//   plan memory     (linearize.cpp)     intermediate buffers reused once their last reader has run: pm_plan_memory
//                                       rewrites the LINEAR (read off its BUFFERs and the kernel graph's roots)
//   items           (linearize.cpp)     the template (slots, items, results) read off the LINEAR and the kernel
//                                       graph's roots, in the LINEAR's order
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tg/pattern.hpp"
#include "tg/schedule.hpp"
#include "tg/symbolic.hpp"
#include "tg/tensor.hpp"

namespace tg::sched {

using ShapeMap = std::unordered_map<const UOp*, Shape>;
using NodeSet = std::unordered_set<const UOp*>;

/** Shapes of tensor-graph nodes, computed on demand and memoised. The cache holds the nodes it has seen: a node
 *  freed while its shape is cached could be replaced by another at the same address. */
struct ShapeCache {
  ShapeMap shapes;
  std::vector<UOpRef> keep;
  const Shape& of(const UOp* u);
};

/** Where a kernel's buffer comes from: an input BUFFER of the graph (by its normalised number) or a new one. */
struct Slot {
  int input = -1;  // >= 0: the input-th BUFFER of the graph
  std::string device;
  DType dtype;
  int64_t size = 0;
};

/** A schedule with buffers as slots: built once per graph structure, instantiated for each realize. */
struct Template {
  struct Item {
    ScheduleItem::Kind kind;
    UOpRef ast;
    std::vector<int> slots;  // outputs first
    std::string device;
    std::vector<int> old_reads;  // positions in slots read through their BUFFER node: the contents before this schedule
    int n_out = 1;               // slots[0, n_out) are written
    bool index_check = false;    // slots.back() is the kernel's IndexCheck record
    std::vector<IndexDiag> diags;  // its checks as diagnostic kernels
  };
  std::vector<Slot> slots;
  std::vector<Item> items;
  std::vector<std::pair<size_t, int>> becomes;  // root index -> slot
  std::vector<Shape> root_shapes;
};

/** The environment knobs the stages read. They are part of the schedule cache's key: a template is built for one
 *  setting of them (a test that turns one off sees its effect on a graph scheduled before). */
struct Knobs {
  bool packed_matmul = true;        // PACKED_MATMUL=0: no panelled matmul
  bool channels_last = true;        // CHANNELS_LAST=0: convolutions in NCHW on the CPU too
  bool conv_input_grad = true;      // CONV_INPUT_GRAD=0: a convolution's input gradient as autograd writes it
  bool split_reduceop = true;       // SPLIT_REDUCEOP=0: no split reduce
  int64_t split_threshold = 16384;  // REDUCEOP_SPLIT_THRESHOLD: input/output ratio from which a reduce splits
  bool fuse_rows = true;            // FUSE_REDUCE_ROWS=0: no row fusion
  bool simplify_valid = true;       // SIMPLIFY_VALID=0: indices not simplified under their load's valid
  bool multi_output = true;         // MULTI_OUTPUT=0: one output per kernel
  bool share_layouts = true;        // SHARE_LAYOUTS=0: a value copied into several layouts is stored as computed, then copied
  bool int_dot = true;              // INT_DOT=0: quantised weights dequantised to float in the matvec (else integer block sums, x quantised)
  bool int_gemm = true;             // INT_GEMM=0: from 32 rows the quantised product is the packed float GEMM (else the int8 GEMM, with VNNI)
  bool follow_layouts = true;       // FOLLOW_LAYOUTS=0: an intermediate computed from channels-last values is stored NCHW
  bool pad_planes = true;           // PAD_PLANES=0: an intermediate read across planes 4 KiB-multiples apart stays row-major
  static Knobs from_env();
  std::string key() const;
};

/** A BUFFERIZE node: BUFFERIZE(value, DEVICE), a value the realize map materialises into a buffer of its own on that
 *  device, with the value's dtype and shape (row-major). Its arg: whether it is a result of the schedule (a root),
 *  then the layout the layout stage chose for it (the permutation of the stored view of the value it copies: a
 *  channels-last input (0, 2, 3, 1), a matmul operand's panels (0, 2, 1); none: the value as computed), and the
 *  strides it is stored with (none: row-major over its shape; else one per axis, in elements, an outer axis's
 *  planes a cache line further apart than their size: padded_strides in the realize map).
 *  A row BUFFERIZE is no kernel boundary: the source of a row-fused EXPAND, a reduce's value computed once per row
 *  inside its reader's kernel (as tinygrad's BUFFERIZE into a kernel-local address space); the kernels that read
 *  it look through it. */
struct BufferizeOpts {
  bool output = false;
  bool row = false;
  std::vector<int64_t> perm;
  std::vector<int64_t> strides;
  Arg arg() const;  // {output | row << 1, perm...}; with strides {output | row << 1 | 4, |perm|, perm..., strides...}
  static BufferizeOpts of(const UOp* b);
  std::string str() const;  // "output, layout (0, 2, 1)", "intermediate, as computed, strides (4616, 1)"
};
/** The elements a stored BUFFERIZE's buffer holds: its shape's product, or the span of its strides. */
int64_t stored_numel(const Shape& s, const BufferizeOpts& o);
/** BUFFERIZE(value) on `device`. */
UOpRef bufferize(const UOpRef& value, const std::string& device, const BufferizeOpts& opts);
/** The sources of `u`, each replaced by its entry in `done` (the node a walk rebuilt it as; every source has one);
 *  `changed`: whether any differs from the original. */
std::vector<UOpRef> mapped_sources(const UOp* u, const std::unordered_map<const UOp*, UOpRef>& done, bool& changed);
/** The permutation that undoes `perm`: inv[perm[i]] = i. */
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm);
/** (0, 2, ..., rank - 1, 1): the axes of an (N, C, ...) value in channels-last order. */
std::vector<int64_t> channels_last_perm(size_t rank);
/** Whether u is a row BUFFERIZE (a row-fused reduce's value, inside its reader's kernel). */
bool is_row_bufferize(const UOp* u);
/** Whether u is a kernel boundary: a BUFFERIZE that is not a row BUFFERIZE. */
inline bool is_stored_bufferize(const UOp* u) { return u->op == Ops::BUFFERIZE && !is_row_bufferize(u); }

/** What every stage reads and writes. */
struct ScheduleCtx {
  Knobs knobs;
  std::vector<UOpRef> roots;                // the tensor graph (normalised: BUFFER args are -1 - input number)
  std::vector<const UOp*> topo;             // its nodes, sources first
  ShapeMap shapes;                          // of the tensor graph's and the bufferized graph's nodes
  std::unordered_map<const UOp*, int> consumers;
  // the realize map: the tensor graph with every materialised node wrapped in a BUFFERIZE
  std::vector<UOpRef> graph;                          // the roots (a root that materialises: its BUFFERIZE)
  std::vector<const UOp*> gtopo;                      // its nodes, sources first
  std::unordered_map<const UOp*, const UOp*> origin;  // a rebuilt node of graph -> the tensor graph's node
  std::vector<std::vector<UOpRef>> old_graphs;        // earlier passes' graphs: their nodes keep their shapes' keys
  // bufferize to store: the buffers, numbered (the first n_inputs the graph's input BUFFERs by their normalised
  // number); each becomes a BUFFER node of the kernel graph holding its device, dtype and size
  std::vector<Slot> bufs;
  std::unordered_map<const UOp*, int> slot_of;  // BUFFERs and realised nodes -> slot
  int n_inputs = 0;
  bool has_assign = false;
  // bufferize to store: the kernel graph, SINK of the roots with each BUFFERIZE replaced by the buffer it reads,
  // AFTER(BUFFER, CALL) (a BUFFER alone: an input nothing in the schedule writes)
  UOpRef kernels;
  UOpRef linear;  // the schedule as a LINEAR of CALLs (linearize, plan memory)
  Template t;     // the template, derived from the LINEAR and the kernel graph's roots (items)
};

// ---- the stages' entry points

/** multi: the per-device roots of a graph over MULTI nodes. A root that is a MULTI gives one root per part. */
struct MultiLowered {
  struct Root {
    std::vector<size_t> parts;  // indices into roots
    UOpRef dev;                 // a MULTI root's DEVICE node (null: an ordinary root)
    int64_t axis = -1;
  };
  std::vector<UOpRef> roots;
  std::vector<Root> by_root;  // one per original root
};
bool has_multi(std::span<const UOp* const> topo);
MultiLowered lower_multi(std::span<const UOpRef> roots);
/** The sharded axis of a multi-device value once lowered (absent: replicated or on one device). */
std::optional<int> multi_axis(const UOpRef& u);

/** layouts: pm_layout, memory layouts chosen by the device's capabilities (the panelled matmul). */
std::vector<UOpRef> apply_layouts(std::span<const UOpRef> roots, const Knobs& knobs);
/** bounds: pm_bounds, exp2 of x - max(x) (softmax's) gets its bound <= 0 as a clamp the exp2 decomposition reads. */
std::vector<UOpRef> apply_bounds(std::span<const UOpRef> roots);
/** split reduceop: big reductions become two kernels (SPLIT_REDUCEOP, REDUCEOP_SPLIT_THRESHOLD). */
std::vector<UOpRef> split_reduceop(std::span<const UOpRef> roots, const Knobs& knobs);
/** The tensor graph's facts the realize map reads: ctx.topo, ctx.shapes and ctx.consumers of ctx.roots. */
void graph_facts(ScheduleCtx& ctx);
/** realize map: ctx.graph (BUFFERIZE nodes; a row-fused EXPAND reads a row BUFFERIZE), ctx.gtopo and ctx.origin
 *  from ctx.roots, topo, shapes and consumers. */
void realize_map(ScheduleCtx& ctx);
/** Row fusion refused where a kernel would recompute it: the reduces under each of these row BUFFERIZEs (nodes of
 *  ctx.graph) materialise, as BUFFERIZE nodes in ctx.roots (pm_refuse_row_fusion), for the next realize map. */
void refuse_row_fusion(ScheduleCtx& ctx, std::span<const UOp* const> row_bufferizes);
/** group outputs: materialised elementwise nodes that read each other element for element join one kernel: the
 *  group's last BUFFERIZE (its leader) becomes BUFFERIZE(value, DEVICE, the other members...) in ctx.graph. */
void group_outputs(ScheduleCtx& ctx);
/** A leader's other members (sources first; empty for any other node): its kernel stores them, then the leader. */
std::span<const UOpRef> group_members(const UOp* b);
/** One kernel: its AST (a SINK of one STORE per output: PARAM 0..n-1 for the group's members, or PARAM 0), the
 *  materialised nodes it reads (PARAM n..), and the row BUFFERIZEs whose value it would recompute. */
struct KernelAst {
  UOpRef ast;
  std::vector<const UOp*> params;
  std::vector<const UOp*> not_hoisted;
  bool index_check = false;  // PARAM params.size() + outputs is the kernel's IndexCheck record
  std::vector<IndexDiag> diags;  // its checks as diagnostic kernels (IndexCheck)
};
KernelAst rangeify(ScheduleCtx& ctx, const UOp* root);  // root: a BUFFERIZE
/** The kernel AST stage after rangeify: pm_kernel_ast (one-hot sums become indexed loads). A fold of a marked
 *  compare (or, for the ops IndexCheck checks unfolded, the compare itself) also stores the IndexCheck record,
 *  PARAM check_param, sets *index_check and adds each check's diagnostic kernel to *diags. */
UOpRef kernel_ast_rules(const UOpRef& ast, int check_param, bool* index_check, std::vector<IndexDiag>* diags = nullptr);
/** CALL nodes of the tensor graph (call.cpp). A custom kernel's CALL(sources...): which sources its AST stores
 *  (outputs) and which it reads (LOADs; a stored source it also reads is read through its output). */
struct CallParams {
  std::vector<bool> stored, read;
};
CallParams call_params(const UOp* call, size_t nsrc);
/** The AST with PARAM i renumbered to to[i]. */
UOpRef renumber_params(const UOpRef& ast, const std::vector<int64_t>& to);
/** The roots with every callified tensor's siblings added (AFTER(value i, CALL) for each value of its CALL): one
 *  schedule computes them all. */
std::vector<UOpRef> with_callify_siblings(std::span<const UOpRef> roots);
/** The kernel graph of bufferize to store: ctx.kernels from the items bufferize to store made (over ctx.bufs) and
 *  ctx.graph. Its CALLs are linear_call's, their buffers read through AFTER nodes. */
void kernel_graph(ScheduleCtx& ctx, std::vector<Template::Item> items);
/** linearize: ctx.linear, the kernel graph's CALLs in an order it allows (kernels after those whose results they read,
 *  in-place writes after the readers of the old contents). */
void linearize(ScheduleCtx& ctx);
/** plan memory: an intermediate buffer whose last reader has run is reused by a later one of its kind (a rewrite of
 *  ctx.linear). */
void plan_memory(ScheduleCtx& ctx);
/** items: the template (its slots, items and results) read off ctx.linear and the kernel graph's roots: the LINEAR's
 *  buffers numbered anew (the graph's inputs first, by their number), its CALLs the items in its order. */
void items_from_linear(ScheduleCtx& ctx);

/** A CALL of the LINEAR holds what it runs (as tinygrad's CALL holds its kernel's AST):
 *  CALL(program, buffers..., diagnostic ASTs...), the program a kernel's AST (SINK) or a copy's COPY, the buffers
 *  slot BUFFERs (outputs first), then its index checks' diagnostic kernels; arg {outputs, buffers, index check, then
 *  per diagnostic: code, size, number of parameters, parameters...}. */
UOpRef linear_call(const Template::Item& it, std::vector<UOpRef> buffers);
/** A LINEAR CALL's buffers. */
std::span<const UOpRef> call_buffers(const UOp* call);
/** The item a LINEAR CALL runs (its slots: its buffers' numbers). */
Template::Item call_item(const UOp* call);

// ---- shared helpers

/** Buffer sl of bufs as a BUFFER node: arg {-1 - sl, size} (the normalised graph's numbering of its inputs). */
UOpRef slot_buffer(const std::vector<Slot>& bufs, int sl);
int slot_number(const UOp* b);
/** The slot holding u's value, contiguous: its own (a BUFFER, a stored BUFFERIZE) or the buffer it views. */
int value_slot(const ScheduleCtx& c, const UOp* u);

/** graph_rewrite of the roots together (one SINK of them): the rewritten roots, in order. */
std::vector<UOpRef> rewrite_roots(std::span<const UOpRef> roots, const PatternMatcher& pm, void* ctx, const char* name);

/** The device a node's value lives on. */
std::string device_of(const UOp* u);

}  // namespace tg::sched
