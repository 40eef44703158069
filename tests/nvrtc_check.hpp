#pragma once
// TG_NVRTC_CHECK=1: every kernel the suite compiles (on any device) is also rendered for CUDA and compiled with
// NVRTC for sm_80 and sm_90. The suites run as usual; the main prints a summary and fails when any did not compile.
namespace tg::test {

/** Install the engine's compile hook. */
void install_nvrtc_check();
/** Print "nvrtc check: N kernels ..." and the first failures; returns the number of failures. */
int nvrtc_check_report();

/** For a suite's main: installs the check when TG_NVRTC_CHECK > 0. Returns whether it is on; throws tg::Error
 *  when it is asked for but cannot run (no NVRTC). */
bool nvrtc_check_from_env();
/** A suite's exit code: `rc`, or 1 when the check is on and some kernel did not compile (prints the report). */
int nvrtc_check_exit(bool on, int rc);

}  // namespace tg::test
