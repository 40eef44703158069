#include "tg/env.hpp"

#include <charconv>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "tg/error.hpp"

namespace tg {
namespace {
std::mutex g_mu;
std::unordered_map<std::string, int64_t> g_int_cache;
}  // namespace

int64_t getenv_int(std::string_view name, int64_t dflt) {
  std::string key(name);
  {
    std::lock_guard lk(g_mu);
    if (auto it = g_int_cache.find(key); it != g_int_cache.end()) return it->second;
  }
  const char* v = std::getenv(key.c_str());
  int64_t out = dflt;
  if (v && *v) {
    std::string_view s(v);
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || ptr != s.data() + s.size())
      throw EnvError("[getenv] " + key + "='" + std::string(s) + "' is not an integer; expected e.g. " + key + "=1");
  }
  std::lock_guard lk(g_mu);
  g_int_cache[key] = out;
  return out;
}

double getenv_double(std::string_view name, double dflt) {
  std::string key(name);
  const char* v = std::getenv(key.c_str());
  if (!v || !*v) return dflt;
  std::string_view s(v);
  double out = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || ptr != s.data() + s.size())
    throw EnvError("[getenv] " + key + "='" + std::string(s) + "' is not a number; expected e.g. " + key + "=30");
  return out;
}

std::string getenv_str(std::string_view name, std::string_view dflt) {
  const char* v = std::getenv(std::string(name).c_str());
  return v ? std::string(v) : std::string(dflt);
}

void env_reset_cache() {
  std::lock_guard lk(g_mu);
  g_int_cache.clear();
}

}  // namespace tg
