#pragma once
// The expander's entry point with the lowering's knowledge of the vectorize stage (include/tg/opt.hpp has the
// public two-argument form, which never packs).
#include "tg/opt.hpp"

namespace tg {

/** expand_upcasts (tg/opt.hpp) where the lowering packs copies into vector ops (`packs`: the vectorize stage runs and
 *  the renderer takes vectors of the machine's width): the UPCAST an elementwise kernel's stores are contiguous in
 *  then stays copies (vector loads, ops and stores in tg's IR) where every load and store moves 32- or 64-bit
 *  elements, instead of a Lane loop left to the compiler's loop vectoriser. `kept_copies` (if given): whether it did.
 *  `pack_rows`: a row kernel's output UPCAST too (Opt NONTEMPORAL: its stores become vectors the lowering can mark). */
UOpRef expand_upcasts(const UOpRef& ast, bool lanes, bool packs, bool* kept_copies, bool pack_rows = false);

}  // namespace tg
