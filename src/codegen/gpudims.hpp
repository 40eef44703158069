#pragma once
// GPU launch dimensions: a kernel's output loops become SPECIAL work-item indices (see gpudims.cpp).
#include "tg/device.hpp"
#include "tg/uop.hpp"

namespace tg {

/** What a SPECIAL (arg [axis] or [axis, kind]) indexes on its launch axis. */
enum class SpecialKind : int64_t { GlobalId = 0, GroupId = 1, LocalId = 2 };

/** Replace the constant-size output loops of `ast` by SPECIALs within `lim`; fills the launch `dims`. */
UOpRef add_gpu_dims(const UOpRef& ast, const Renderer::GridLimits& lim, LaunchDims& dims);

}  // namespace tg
