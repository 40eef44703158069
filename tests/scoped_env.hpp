#pragma once
// Sets (or with nullptr unsets) an environment variable for one scope; tg's cached values are forgotten on both
// ends, so the next getenv_* reads the new value.
#include <cstdlib>
#include <optional>
#include <string>

#include "tg/env.hpp"

struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    if (v) setenv(n, v, 1);
    else unsetenv(n);
    tg::env_reset_cache();
  }
  ScopedEnv(const char* n, const std::string& v) : ScopedEnv(n, v.c_str()) {}
  ~ScopedEnv() {
    if (old) setenv(name.c_str(), old->c_str(), 1);
    else unsetenv(name.c_str());
    tg::env_reset_cache();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};
