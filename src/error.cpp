// The user's call site on this thread, for tg::Error messages (see tg/error.hpp).
#include "tg/error.hpp"

#include <link.h>

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace tg {
namespace {

struct ActiveCall {
  CallLoc loc;
  bool set = false;
};
thread_local ActiveCall active_call;

// The address ranges of the loaded object holding tg's code, when tg is a shared library (empty when tg is linked
// into the program: then the object would be the user's too).
struct OwnImage {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  OwnImage() {
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* self) {
          auto* me = static_cast<OwnImage*>(self);
          const auto here = reinterpret_cast<uintptr_t>(&active_call_marker);
          std::vector<std::pair<uintptr_t, uintptr_t>> r;
          bool mine = false;
          for (int i = 0; i < info->dlpi_phnum; i++) {
            const auto& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_LOAD) continue;
            uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
            r.emplace_back(lo, hi);
            mine = mine || (here >= lo && here < hi);
          }
          if (!mine) return 0;
          if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') me->ranges = std::move(r);
          return 1;
        },
        this);
  }
  bool contains(const void* p) const {
    auto a = reinterpret_cast<uintptr_t>(p);
    for (auto& [lo, hi] : ranges)
      if (a >= lo && a < hi) return true;
    return false;
  }
  static void active_call_marker() {}
};

// The folder holding tg's src/ and include/ as this file was compiled ("../" from a build folder).
std::string_view source_root() {
  std::string_view f = CallLoc::current().file;
  size_t at = f.rfind("src/error.cpp");
  return at == std::string_view::npos ? std::string_view() : f.substr(0, at);
}

// A position in tg's own code, not the user's: a file name stored in tg's shared library (positions in the user's
// code are stored in the user's binary), or, when tg is linked into the program, a path under tg's src/ or include/tg/
// as tg's sources were compiled.
bool inside_tg(const CallLoc& loc) {
  static const OwnImage image;
  if (!image.ranges.empty()) return image.contains(loc.file);
  std::string_view file = loc.file, root = source_root();
  if (file.substr(0, root.size()) != root) return false;
  std::string_view rest = file.substr(root.size());
  return rest.starts_with("src/") || rest.starts_with("include/tg/");
}

}  // namespace

CallSite::CallSite(const CallLoc& loc) noexcept {
  if (active_call.set || inside_tg(loc)) return;
  active_call = {loc, true};
  owner_ = true;
}

CallSite::~CallSite() {
  if (owner_) active_call.set = false;
}

std::string CallSite::suffix() {
  if (!active_call.set) return "";
  return std::string(" (at ") + active_call.loc.file + ":" + std::to_string(active_call.loc.line) + ")";
}

}  // namespace tg
