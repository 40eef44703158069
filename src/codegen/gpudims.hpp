#pragma once
// GPU launch dimensions: a kernel's output loops become SPECIAL work-item indices (see gpudims.cpp).
#include "tg/device.hpp"
#include "tg/uop.hpp"

namespace tg {

/** Replace the constant-size output loops of `ast` by SPECIALs within `lim`; fills the launch `dims`. */
UOpRef add_gpu_dims(const UOpRef& ast, const Renderer::GridLimits& lim, LaunchDims& dims);

}  // namespace tg
