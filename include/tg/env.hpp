#pragma once
// Environment knobs (DEBUG, SPEC, BEAM, ...). Values are read once per process and cached.
// Thread-safety: safe; the cache is filled under a lock.
#include "tg/config.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

namespace tg {

/** Integer value of an environment variable, `dflt` when unset or empty.
 *  A value that is not an integer throws tg::EnvError naming the variable and the text. */
int64_t getenv_int(std::string_view name, int64_t dflt = 0);
/** The same, and a set value outside [lo, hi] throws tg::EnvError naming the variable, the value and the range
 *  (`dflt` may lie outside it: it stands for "unset", e.g. THREADS unset = every CPU, THREADS=0 an error). */
int64_t getenv_int(std::string_view name, int64_t dflt, int64_t lo, int64_t hi);
/** Floating-point value of an environment variable, `dflt` when unset or empty; a value that is not a number
 *  throws tg::EnvError naming the variable and the text. Not cached (read where a search starts). */
double getenv_double(std::string_view name, double dflt);
/** String value of an environment variable, `dflt` when unset. */
std::string getenv_str(std::string_view name, std::string_view dflt = "");
/** The DEBUG level (0 when unset; negative values are an EnvError). */
inline int debug_level() { return int(std::min<int64_t>(getenv_int("DEBUG", 0, 0, INT64_MAX), 1000)); }
/** Forget cached values (tests change the environment). */
void env_reset_cache();

}  // namespace tg
