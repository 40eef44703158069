#pragma once
// The KV cache's write, shared by the models (internal to src/models/).
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

namespace tg::models::detail {

/** Rows [start, start + T) of a (B, M, heads, hd) cache assigned x (B, T, heads, hd): an assign into a view of the
 *  cache's buffer, which writes those rows only. Realise the result (alone or with others) before reading the cache. */
inline Tensor cache_rows(Tensor& cache, const Tensor& x, const sint& start) {
  if (!contiguous_buffer(cache.uop().get())) cache.realize();  // a pending reset: the view must be of the buffer
  const Shape& s = cache.shape();
  Tensor rows = cache.shrink({{sint(0), sint(s[0])}, {start, start + x.shape()[1]}, {sint(0), sint(s[2])}, {sint(0), sint(s[3])}});
  rows.assign(x);
  return rows;
}

}  // namespace tg::models::detail
