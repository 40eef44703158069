#include "tg/env.hpp"

#include <charconv>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "tg/error.hpp"

namespace tg {
namespace {
std::mutex g_mu;
std::unordered_map<std::string, std::optional<int64_t>> g_int_cache;  // nullopt: unset or empty

// The parsed value of `name`, nullopt when unset or empty (cached).
std::optional<int64_t> read_int(std::string_view name) {
  std::string key(name);
  {
    std::lock_guard lk(g_mu);
    if (auto it = g_int_cache.find(key); it != g_int_cache.end()) return it->second;
  }
  const char* v = std::getenv(key.c_str());
  std::optional<int64_t> out;
  if (v && *v) {
    std::string_view s(v);
    int64_t x = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec != std::errc() || ptr != s.data() + s.size())
      throw EnvError("[getenv] " + key + "='" + std::string(s) + "' is not an integer; expected e.g. " + key + "=1");
    out = x;
  }
  std::lock_guard lk(g_mu);
  g_int_cache[key] = out;
  return out;
}
}  // namespace

int64_t getenv_int(std::string_view name, int64_t dflt) { return read_int(name).value_or(dflt); }

int64_t getenv_int(std::string_view name, int64_t dflt, int64_t lo, int64_t hi) {
  std::optional<int64_t> v = read_int(name);
  if (!v) return dflt;
  if (*v < lo || *v > hi)
    throw EnvError("[getenv] " + std::string(name) + "=" + std::to_string(*v) + " is out of range; expected " +
                   (hi == INT64_MAX ? "an integer >= " + std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi)));
  return *v;
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
