#pragma once
// Shared by the renderers: validation of a linear program (codegen.hpp's format) before any text is emitted,
// so every renderer refuses the same malformed programs with the same messages.
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tg/uop.hpp"

namespace tg::render_detail {

/** What a renderer needs to know about a checked program. */
struct LinearInfo {
  std::vector<const UOp*> params;                    // by PARAM index
  std::vector<const UOp*> vars;                      // DEFINE_VARs in order of appearance
  std::unordered_map<const UOp*, int> var_index;     // DEFINE_VAR -> position in `vars`
  std::unordered_map<const UOp*, int> uses;          // number of uses of each node in the program
};

/** Check `program` and collect its arguments. Throws tg::Error "[render] kernel NAME: ..." naming the node:
 *  unknown or unsupported ops (the `extra_ops` are allowed too), unsupported dtypes, a source used before it is
 *  defined or outside the loop/if it was defined in, an END/ENDIF that does not close the innermost scope,
 *  unclosed scopes, missing or repeated PARAM indices. */
LinearInfo check_linear(const std::string& who, const std::string& name, const std::vector<const UOp*>& program,
                        const std::function<bool(DType)>& supports, const std::vector<Ops>& extra_ops = {});

/** The RANGE an END closes (its last source), or null. */
const UOp* end_range(const UOp* end);

/** `s` made safe inside a one-line comment of any renderer: printable ASCII only, no comment terminators. */
std::string comment_safe(const std::string& s);

/** "ADD float32 arg=..." for error messages. */
std::string describe(const UOp* u);

}  // namespace tg::render_detail
