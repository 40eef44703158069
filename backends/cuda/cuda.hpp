#pragma once
// The CUDA backend: kernels rendered as CUDA C, compiled by NVRTC (libnvrtc, loaded at run time) to a cubin for
// the GPU's architecture (PTX when NVRTC does not know it), run through the CUDA driver API (libcuda.so.1, loaded
// at run time). tg builds and runs without either library; opening "CUDA" then throws a tg::Error saying what is
// missing. Registered as "CUDA" (CUDA:N for the N-th GPU).
// Thread-safety: the compiler may be used from several threads; programs and the allocator make the device's
// context current on the calling thread.
#include <memory>
#include <string>

#include "tg/device.hpp"

namespace tg::cuda {

/** NVRTC: CUDA C -> cubin for sm_`sm` (`cubin` false: PTX for compute_`sm`). Throws tg::Error when libnvrtc
 *  cannot be loaded; a kernel that does not compile throws with NVRTC's log and the source. */
std::unique_ptr<Compiler> make_nvrtc_compiler(int sm, bool cubin = true);

/** NVRTC's version as "13.0", or throws tg::Error when libnvrtc cannot be loaded. */
std::string nvrtc_version();

}  // namespace tg::cuda
