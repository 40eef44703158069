#pragma once
// Helpers shared by the ops_*.cpp files (not installed): error messages, dim handling, constants, windows.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "tg/tensor.hpp"

#include <atomic>

namespace tg::detail {

/** How many as_param placeholders were made: while none, realize skips looking for them in its graphs. */
extern std::atomic<int64_t> params_made;

/** "(1, 2, 3)" */
std::string ints_str(const std::vector<int64_t>& v);
/** Throws Error("[op] msg"). */
[[noreturn]] void fail(const std::string& op, const std::string& msg);

/** A dim in [-ndim, ndim) made non-negative; `extra` allows ndim (for unsqueeze-like positions). */
int64_t norm_dim(int64_t d, int64_t ndim, const std::string& op, bool extra = false);
/** Axes made non-negative, sorted and unique; empty means all. */
std::vector<int64_t> norm_axes(const std::vector<int64_t>& axes, int64_t ndim, const std::string& op);

/** A 0-d constant of dtype d on t's device. */
Tensor const_of(const Tensor& t, double v, DType d);
/** A 0-d constant of t's dtype on t's device. */
inline Tensor const_like(const Tensor& t, double v) { return const_of(t, v, t.dtype()); }
/** The smallest / largest value of a dtype (-inf / inf for floats). */
double dtype_min(DType d);
double dtype_max(DType d);
/** The dtype to_float gives: d itself when float, else the smallest float that holds it. */
DType float_dtype(DType d);
/** t as a float tensor (itself when already float). */
Tensor to_float(const Tensor& t);
/** The float type statistics of t are computed in (torch's "opmath" type): float32 for float16, bfloat16 and the
 *  fp8 types, whose sums and squares overflow at 65504 (float16) or keep 8 bits (bfloat16); else least_upper_float. */
DType opmath_dtype(DType d);
/** t cast to opmath_dtype (itself when already that type). */
Tensor to_opmath(const Tensor& t);
/** arange(n) reshaped to n at position `dim` of an ndim-shaped view (ones elsewhere). */
Tensor arange_at(int64_t n, int64_t dim, int64_t ndim, const std::string& device, DType d = dtypes::int32);
/** Expand an IntArg to n values (one value repeats); an empty IntArg gives `dflt`. */
std::vector<int64_t> expand_arg(const IntArg& a, size_t n, const std::string& op, const char* what,
                                const std::vector<int64_t>& dflt = {});

/** Sliding windows over the last k.size() dims: (..., o_1..o_n, k_1..k_n) (tinygrad's _pool, movement ops only). */
Tensor pool_windows(const Tensor& x, const std::vector<int64_t>& k, const std::vector<int64_t>& stride,
                    const std::vector<int64_t>& dilation, const std::string& op);
/** Constant-pad the last pads.size() dims with (begin, end) pairs. */
Tensor pad_last(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, double value = 0);
/** (index == arange(n)) with the class axis appended last: (*index.shape, n) bool. With checked_op, an index
 *  outside [0, n) (other than except) makes the kernel that gathers with the mask throw (mark_index_check). */
Tensor one_hot_mask(const Tensor& index, int64_t n, const char* checked_op = nullptr, std::optional<int64_t> except = {});
/** The compare of a one-hot mask marked for IndexCheck: the kernel that folds the mask's sum into a load checks the
 *  index there, on every device, lazy or not (see IndexCheck in tg/schedule.hpp). */
Tensor mark_index_check(const Tensor& mask, const char* op, std::optional<int64_t> except = {});
/** Apply a loss reduction: "mean", "sum" or "none". */
Tensor reduce_loss(const Tensor& t, const std::string& reduction, const std::string& op);
/** Throws unless reduction is one of "mean", "sum", "none". */
void check_reduction(const std::string& reduction, const std::string& op);

/** Which range [lo, hi) of a dim of size n a Slice keeps, its |step| and the number of elements it yields. */
struct SliceBounds {
  int64_t lo, hi, step, len;
};
SliceBounds slice_bounds(const Slice& s, int64_t n);

}  // namespace tg::detail
