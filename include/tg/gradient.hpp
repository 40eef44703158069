#pragma once
// Symbolic autograd: the gradient of each primitive op is a rule (pattern -> TUPLE of source gradients)
// in one table, so a backward pass is just another UOp graph that fuses and compiles like the forward one.
// Thread-safety: the table is immutable; compute_gradient builds new nodes only.
#include "tg/config.hpp"

#include <span>
#include <vector>

#include "tg/pattern.hpp"
#include "tg/tensor.hpp"

namespace tg {

/** The gradient rule table: matched on a forward node with the incoming gradient in the context, it returns
 *  TUPLE(g_src0, g_src1, ...) with NOOP where a source gets no gradient. */
const PatternMatcher& pm_gradient();

/** d(root)/d(target) for each target, given d(loss)/d(root) = root_grad. `shape_of` gives the shape of any
 *  forward node (tensor-graph UOps carry no shape). Targets root does not depend on get a null UOpRef. */
std::vector<UOpRef> compute_gradient(const UOpRef& root, const UOpRef& root_grad, std::span<const UOpRef> targets,
                                     const std::string& device);

}  // namespace tg
