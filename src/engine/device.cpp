// The backend-independent half of include/tg/device.hpp: the allocator's cache of freed blocks, the device
// registry, the program caches (memory and disk) and Buffer.
#include "tg/device.hpp"

#define XXH_STATIC_LINKING_ONLY
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <tuple>

#include "tg/env.hpp"
#include "tg/tensor.hpp"

namespace tg {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- Allocator

namespace {
// Bytes of freed blocks kept for reuse (TG_ALLOC_CACHE_MB, default 1 GiB; 0 keeps none).
size_t alloc_cache_limit() { return size_t(getenv_int("TG_ALLOC_CACHE_MB", 1024, 0, INT64_MAX >> 20)) << 20; }
// Rounds a freed block stays cached without being taken again (TG_ALLOC_CACHE_ROUNDS, default 16).
uint64_t alloc_cache_rounds() { return uint64_t(getenv_int("TG_ALLOC_CACHE_ROUNDS", 16, 0, INT64_MAX)); }
}  // namespace

void* Allocator::alloc(size_t bytes) {
  alloc_cache_limit();  // a malformed TG_ALLOC_CACHE_MB (or _ROUNDS) surfaces here rather than in a destructor
  alloc_cache_rounds();
  if (bytes > capacity())
    throw Error("[alloc] " + std::to_string(bytes) + " bytes is more than one allocation can hold (" +
                std::to_string(capacity()) + " bytes)");
  {
    std::lock_guard lk(mu_);
    if (auto it = by_size_.find(bytes); it != by_size_.end()) {
      auto lit = it->second.back();  // the most recently freed block of this size
      it->second.pop_back();
      if (it->second.empty()) by_size_.erase(it);
      void* p = lit->p;
      lru_.erase(lit);
      cached_ -= bytes;
      live_ += bytes;
      return p;
    }
  }
  void* p = nullptr;
  try {
    p = alloc_raw(bytes);
  } catch (const std::bad_alloc&) {
  }
  if (!p && cached_bytes() > 0) {  // out of memory: give the cached blocks back and try once more
    clear_cache();
    p = alloc_raw(bytes);
  }
  if (!p) throw Error("[alloc] out of memory allocating " + std::to_string(bytes) + " bytes");
  live_ += bytes;
  return p;
}

void Allocator::copyin_at(void* dst, size_t offset, const void* host_src, size_t bytes) {
  if (offset != 0) throw Error("[alloc] this device cannot copy into part of a buffer (offset " + std::to_string(offset) + ")");
  copyin(dst, host_src, bytes);
}

void Allocator::free(void* p, size_t bytes) {
  if (!p) return;
  live_ -= bytes;
  size_t limit = 0;
  try {
    limit = alloc_cache_limit();
  } catch (const Error&) {  // reported by alloc(); here the block is simply not cached
  }
  std::vector<std::pair<size_t, void*>> victims;
  {
    std::lock_guard lk(mu_);
    if (bytes > limit) {
      victims.emplace_back(bytes, p);
    } else {
      lru_.push_front(Cached{bytes, p, round_});
      by_size_[bytes].push_back(lru_.begin());
      cached_ += bytes;
      while (cached_ > limit) evict_oldest(victims);
    }
  }
  for (auto& [n, q] : victims) free_raw(q, n);
}

// The least recently freed block is the oldest entry of its size.
void Allocator::evict_oldest(std::vector<std::pair<size_t, void*>>& victims) {
  auto last = std::prev(lru_.end());
  auto it = by_size_.find(last->bytes);
  it->second.erase(it->second.begin());
  if (it->second.empty()) by_size_.erase(it);
  cached_ -= last->bytes;
  victims.emplace_back(last->bytes, last->p);
  lru_.erase(last);
}

void Allocator::end_round() {
  uint64_t keep = 16;
  try {
    keep = alloc_cache_rounds();
  } catch (const Error&) {  // a malformed setting: the default (the error surfaces where it can be thrown)
  }
  std::vector<std::pair<size_t, void*>> victims;
  {
    std::lock_guard lk(mu_);
    round_++;
    // the least recently freed are at the back: give back those older than `keep` rounds
    while (!lru_.empty() && lru_.back().round + keep < round_) evict_oldest(victims);
  }
  for (auto& [n, q] : victims) free_raw(q, n);
}

void Allocator::clear_cache() {
  std::list<Cached> all;
  {
    std::lock_guard lk(mu_);
    all.swap(lru_);
    by_size_.clear();
    cached_ = 0;
  }
  for (auto& c : all) free_raw(c.p, c.bytes);
}

size_t Allocator::cached_bytes() const {
  std::lock_guard lk(mu_);
  return cached_;
}

// ---------------------------------------------------------------- registry

namespace {

struct Registry {
  std::recursive_mutex mu;  // recursive: a factory may look up another device
  struct Backend {
    DeviceFactory factory;
    int priority;
  };
  std::map<std::string, Backend> backends;
  std::map<std::string, std::unique_ptr<Device>> devices;
  std::set<std::string> names;  // stable storage for the strings default_device() returns
};

// Never destroyed: Buffers and Programs held by static objects may outlive any destruction order.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string known_names(const Registry& r) {
  std::string s;
  for (auto& [n, b] : r.backends) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "(none registered)" : s;
}

// "cpu" -> "CPU", "CL:0" -> "CL", "CL:1" -> "CL:1"; the base must be registered.
std::string canonical(Registry& r, const std::string& name) {
  size_t colon = name.find(':');
  std::string base = upper(name.substr(0, colon)), num = colon == std::string::npos ? "" : name.substr(colon + 1);
  if (colon != std::string::npos &&
      (num.empty() || num.size() > 9 || !std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; })))
    throw Error("[get_device] bad device name '" + name + "'; expected NAME or NAME:N, e.g. CL:1");
  if (!r.backends.count(base))
    throw Error("[get_device] unknown device '" + name + "'; known devices: " + known_names(r));
  if (num.empty() || std::stoi(num) == 0) return base;
  return base + ":" + std::to_string(std::stoi(num));
}

std::vector<std::string> by_priority(const Registry& r) {
  std::vector<std::string> v;
  for (auto& [n, b] : r.backends) v.push_back(n);
  std::stable_sort(v.begin(), v.end(),
                   [&](const std::string& a, const std::string& b) { return r.backends.at(a).priority > r.backends.at(b).priority; });
  return v;
}

}  // namespace

bool register_device(const std::string& base, DeviceFactory f, int priority) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  return r.backends.insert_or_assign(upper(base), Registry::Backend{std::move(f), priority}).second;
}

Device& get_device(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  std::string full = canonical(r, name);
  auto it = r.devices.find(full);
  if (it != r.devices.end()) return *it->second;
  std::string base = full.substr(0, full.find(':'));
  std::unique_ptr<Device> d = r.backends.at(base).factory(full);
  if (!d) throw Error("[get_device] the " + base + " backend could not open '" + full + "'");
  Device& dev = *r.devices.emplace(full, std::move(d)).first->second;
  if (debug_level() >= 1 && dev.runs_kernels()) std::fprintf(stderr, "%s: %s\n", full.c_str(), to_string(dev.machine()).c_str());
  return dev;
}

std::string to_string(const MachineModel& m) {
  auto size = [](int64_t b) {
    if (b <= 0) return std::string("?");
    if (b % (1 << 20) == 0) return std::to_string(b >> 20) + " MiB";
    return std::to_string(b >> 10) + " KiB";
  };
  std::string s = m.cpu + " (" + m.source + "): " + (m.isa.empty() ? "" : m.isa + (m.int8_dot ? " (int8 dot)" : "") + ", ") +
                  std::to_string(m.vector_bits) +
                  "-bit x " + std::to_string(m.vector_registers) + " vector registers";
  char fma[96];
  std::snprintf(fma, sizeof fma, ", FMA latency %d x %g/cycle (%s)", m.fma_latency, m.fma_per_cycle, m.fma_source.c_str());
  s += fma;
  if (m.l1d_bytes || m.l2_bytes || m.l3_bytes)
  {
    s += ", L1d " + size(m.l1d_bytes) + ", L2 " + size(m.l2_bytes) + ", L3 " + size(m.l3_bytes);
    if (m.l3_share_bytes > 0 && m.l3_sharing > 0)
      s += " (ours " + size(m.l3_share_bytes) + ": " + std::to_string(m.cpus) + " of " + std::to_string(m.l3_sharing) +
           " CPUs)";
    s += " (" + m.cache_source + ")";
  }
  s += ", " + std::to_string(m.cores) + (m.cores == 1 ? " core" : " cores");
  if (!m.row_prefetch_source.empty()) s += std::string(", row prefetch ") + (m.row_prefetch ? "yes" : "no") + " (" + m.row_prefetch_source + ")";
  if (!m.fma_measured_source.empty()) {
    std::snprintf(fma, sizeof fma, ", FMA issue %g/cycle (%s)", m.fma_measured_per_cycle, m.fma_measured_source.c_str());
    s += fma;
  }
  return s;
}

std::string device_info(const std::string& device) {
  const std::string& name = device.empty() ? default_device() : device;
  Device& d = get_device(name);
  return d.name() + ": " + to_string(d.machine());
}

const std::string& default_device() {
  Registry& r = registry();
  std::string chosen, env = getenv_str("DEVICE");
  {
    std::lock_guard lk(r.mu);
    if (!env.empty()) {
      try {
        chosen = canonical(r, env);
      } catch (const Error& e) {
        throw EnvError("[getenv] DEVICE=" + env + ": " + e.what());
      }
    } else {
      for (const std::string& n : by_priority(r))
        if (getenv_int(n, 0) == 1) {
          chosen = n;
          break;
        }
      if (chosen.empty()) {
        if (r.backends.empty()) throw Error("[default_device] no device backends are registered");
        chosen = by_priority(r).front();
      }
    }
  }
  if (!env.empty()) {  // the device must exist (CL:5 on a machine with one; CPU:N always does)
    Device* d = nullptr;
    try {
      d = &get_device(chosen);
    } catch (const EnvError&) {
      throw;
    } catch (const Error& e) {
      throw EnvError("[getenv] DEVICE=" + env + ": " + e.what());
    }
    (void)d;
  }
  std::lock_guard lk(r.mu);
  return *r.names.insert(chosen).first;
}

std::vector<std::string> device_names() {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  return by_priority(r);
}

// ---------------------------------------------------------------- disk cache

std::string cache_dir() {
  if (std::string d = getenv_str("TG_CACHE_DIR"); !d.empty()) return d;
  if (std::string x = getenv_str("XDG_CACHE_HOME"); !x.empty()) return x + "/tg";
  if (std::string h = getenv_str("HOME"); !h.empty()) return h + "/.cache/tg";
  return (fs::temp_directory_path() / "tg-cache").string();
}

namespace {

// A cache file: magic, the key's length and the key, payload size, XXH3 of the payload, payload. A torn file, a
// foreign one or one whose key is not the one asked for (a valid entry copied or renamed) reads as a miss, and
// the first such miss of a process prints a warning: the caller then rebuilds the entry and writes it anew.
constexpr char kMagic[8] = {'T', 'G', 'K', 'C', 'A', 'C', 'H', '2'};
constexpr char kMagicV1[8] = {'T', 'G', 'K', 'C', 'A', 'C', 'H', '1'};  // before the key was stored: a silent miss

bool disk_cache_on() { return getenv_int("CACHELEVEL", 1) > 0; }

fs::path cache_path(const std::string& key) {
  if (key.empty() || !std::all_of(key.begin(), key.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }))
    throw Error("[disk_cache] key '" + key + "' must be letters, digits, '_' or '-'");
  return fs::path(cache_dir()) / "kernels" / key;
}

// The kernel cache's bound (TG_CACHE_MB, default 2 GiB). Every rebuilt library or new setting writes new entries
// and nothing reads the old ones again, so without a bound the folder only grows (287 MB after one day's builds).
uint64_t disk_cache_limit() { return uint64_t(getenv_int("TG_CACHE_MB", 2048, 1, INT64_MAX >> 20)) << 20; }

// Keeps the folder under its bound: when this process has written a tenth of it since the last look (and on its
// first write), the folder is listed and the least recently used entries (oldest modification time: a hit touches
// its file) are removed until it holds at most 90% of the bound. Another process may be evicting too: a file gone
// or an error on one file is skipped; a reader that opened a file before its removal still reads all of it.
void disk_cache_evict(uint64_t written) {
  static std::mutex mu;
  static uint64_t since = 0;
  static bool first = true;
  std::lock_guard lk(mu);
  const uint64_t limit = disk_cache_limit();
  since += written;
  if (!first && since < limit / 10) return;
  first = false, since = 0;
  std::error_code ec;
  std::vector<std::tuple<fs::file_time_type, uint64_t, fs::path>> files;
  uint64_t total = 0;
  for (fs::directory_iterator it(fs::path(cache_dir()) / "kernels", ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e;
    if (!it->is_regular_file(e) || e) continue;
    uint64_t size = it->file_size(e);
    auto t = e ? fs::file_time_type::min() : it->last_write_time(e);
    if (e) continue;
    files.emplace_back(t, size, it->path());
    total += size;
  }
  if (total <= limit) return;
  std::sort(files.begin(), files.end());
  size_t removed = 0;
  for (auto& [t, size, path] : files) {
    if (total <= limit / 10 * 9) break;
    std::error_code e;
    if (fs::remove(path, e)) total -= std::min(total, size), removed++;
  }
  if (debug_level() >= 1)
    std::fprintf(stderr, "tg: kernel cache over TG_CACHE_MB=%llu: removed %zu least recently used entries\n",
                 (unsigned long long)(limit >> 20), removed);
}

bool repaired(const fs::path& p, const char* why) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fprintf(stderr, "tg: warning: the kernel cache entry %s %s; it is rebuilt (this warning is printed once)\n",
                 p.c_str(), why);
  return false;
}

}  // namespace

bool disk_cache_get(const std::string& key, std::vector<uint8_t>& out) {
  if (!disk_cache_on()) return false;
  fs::path p = cache_path(key);
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  char magic[8];
  uint64_t klen = 0, size = 0, hash = 0;
  if (!f.read(magic, 8)) return repaired(p, "is truncated");
  if (std::memcmp(magic, kMagicV1, 8) == 0) return false;
  if (std::memcmp(magic, kMagic, 8) != 0) return repaired(p, "is not a kernel cache file");
  if (!f.read(reinterpret_cast<char*>(&klen), 8) || klen > 4096) return repaired(p, "is corrupt");
  std::string stored(klen, '\0');
  if (!f.read(stored.data(), std::streamsize(klen))) return repaired(p, "is truncated");
  if (stored != key) return repaired(p, ("holds the entry of key " + stored).c_str());
  if (!f.read(reinterpret_cast<char*>(&size), 8) || !f.read(reinterpret_cast<char*>(&hash), 8)) return repaired(p, "is truncated");
  if (size > (uint64_t(1) << 34)) return repaired(p, "is corrupt");
  std::vector<uint8_t> data(size);
  if (size && !f.read(reinterpret_cast<char*>(data.data()), std::streamsize(size))) return repaired(p, "is truncated");
  if (f.peek() != std::char_traits<char>::eof() || XXH3_64bits(data.data(), data.size()) != hash)
    return repaired(p, "is corrupt (its checksum does not match)");
  out = std::move(data);
  std::error_code ec;  // used now: the last to be evicted
  fs::last_write_time(cache_path(key), fs::file_time_type::clock::now(), ec);
  return true;
}

void disk_cache_put(const std::string& key, const std::vector<uint8_t>& data) {
  if (!disk_cache_on()) return;
  fs::path dst = cache_path(key);
  static std::atomic<uint64_t> counter{0};
  fs::path tmp = dst;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++) + "." +
         std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()) & 0xFFFF);
  std::error_code ec;
  fs::create_directories(dst.parent_path(), ec);
  bool ok = false;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    uint64_t klen = key.size(), size = data.size(), hash = XXH3_64bits(data.data(), data.size());
    ok = f && f.write(kMagic, 8) && f.write(reinterpret_cast<const char*>(&klen), 8) && f.write(key.data(), std::streamsize(klen)) &&
         f.write(reinterpret_cast<const char*>(&size), 8) && f.write(reinterpret_cast<const char*>(&hash), 8) &&
         f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size())) && f.flush();
  }
  if (ok) fs::rename(tmp, dst, ec);  // atomic: readers see the old file or the whole new one
  if (!ok || ec) {
    fs::remove(tmp, ec);
    if (debug_level() >= 1) std::fprintf(stderr, "tg: could not write the kernel cache file %s\n", dst.c_str());
    return;
  }
  disk_cache_evict(data.size() + key.size() + 32);
}

bool measured_once(const std::string& prefix, const std::string& what, const std::function<bool()>& measure) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(what.data(), what.size())));
  const std::string key = prefix + hex;
  static std::recursive_mutex mu;  // held while measuring: a measurement may build a device's machine model
  static std::map<std::string, bool> known;
  std::lock_guard lock(mu);
  auto it = known.find(key);
  if (it == known.end()) {
    std::vector<uint8_t> cached;
    bool yes;
    if (disk_cache_get(key, cached) && cached.size() == 1) {
      yes = cached[0] != 0;
    } else {
      yes = measure();
      disk_cache_put(key, {uint8_t(yes)});
    }
    it = known.emplace(key, yes).first;
  }
  return it->second;
}

// ---------------------------------------------------------------- Device::get_program

struct Device::ProgramCache {
  static constexpr size_t kCapacity = 4096;
  std::mutex mu;
  std::list<std::pair<std::string, std::shared_ptr<Program>>> lru;  // most recently used first
  std::unordered_map<std::string, decltype(lru)::iterator> map;
  // sources being compiled now: a thread asking for one waits for that compile instead of repeating it (two kernels
  // of one schedule with different ASTs often render the same source)
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<Program>>> pending;
};

std::shared_ptr<Device::ProgramCache> Device::new_program_cache() { return std::make_shared<ProgramCache>(); }

std::shared_ptr<Program> Device::get_program(const std::string& src, const std::string& name) {
  std::string cid = compiler().id();
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  for (const std::string* s : std::initializer_list<const std::string*>{&cid, &name, &src}) {
    uint64_t n = s->size();
    XXH3_128bits_update(&st, &n, sizeof n);
    XXH3_128bits_update(&st, s->data(), s->size());
  }
  XXH128_hash_t h = XXH3_128bits_digest(&st);
  char key[33];
  std::snprintf(key, sizeof key, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);

  ProgramCache& c = *programs_;
  std::promise<std::shared_ptr<Program>> mine;
  {
    std::unique_lock lk(c.mu);
    if (auto it = c.map.find(key); it != c.map.end()) {
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      return it->second->second;
    }
    if (auto it = c.pending.find(key); it != c.pending.end()) {  // another thread compiles it: its result or error
      auto f = it->second;
      lk.unlock();
      return f.get();
    }
    c.pending.emplace(key, mine.get_future().share());
  }
  // Compile outside the lock so that kernels compile in parallel.
  std::shared_ptr<Program> prog;
  try {
    std::vector<uint8_t> bin;
    if (disk_cache_get(key, bin)) {
      try {
        prog = load(bin, name);
      } catch (const Error&) {  // an entry this build cannot load: compile afresh and replace it
        prog = nullptr;
      }
    }
    if (!prog) {
      bin = compiler().compile(src, name);
      disk_cache_put(key, bin);
      prog = load(bin, name);
    }
  } catch (...) {
    std::lock_guard lk(c.mu);
    c.pending.erase(key);
    mine.set_exception(std::current_exception());
    throw;
  }
  std::lock_guard lk(c.mu);
  c.pending.erase(key);
  mine.set_value(prog);
  c.lru.emplace_front(key, prog);
  c.map[key] = c.lru.begin();
  if (c.lru.size() > ProgramCache::kCapacity) {
    c.map.erase(c.lru.back().first);
    c.lru.pop_back();
  }
  return prog;
}

// ---------------------------------------------------------------- Buffer

namespace {
std::string gib(size_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", double(bytes) / double(1ull << 30));
  return b;
}
}  // namespace

size_t checked_nbytes(const std::string& op, const std::vector<int64_t>& shape, DType dtype, const std::string& device) {
  size_t n = 1, bytes = 0;
  bool over = false;
  for (int64_t d : shape) over |= d < 0 || __builtin_mul_overflow(n, size_t(d), &n);
  over |= __builtin_mul_overflow(n, size_t(dtype.itemsize()), &bytes);
  std::string what = "[" + op + "] shape " + shape_str(shape) + " of " + dtype.name() + (device.empty() ? "" : " on " + device);
  if (over) throw Error(what + " needs more than 2^64 bytes");
  if (device.empty()) return bytes;
  size_t cap = SIZE_MAX;  // a multi-device tensor ("CPU,CPU:1"): the smallest of its devices'
  for (size_t start = 0, c = 0; c != std::string::npos; start = c + 1) {
    c = device.find(',', start);
    cap = std::min(cap, get_device(device.substr(start, c == std::string::npos ? c : c - start)).allocator().capacity());
  }
  if (bytes > cap)
    throw Error(what + " needs " + std::to_string(bytes) + " bytes (" + gib(bytes) + "), more than one allocation there can hold (" +
                gib(cap) + ")");
  return bytes;
}

Buffer::Buffer(std::string device, DType dtype, size_t size) : device_(std::move(device)), dtype_(dtype), size_(size) {
  if (dtype.ptr || dtype == dtypes::void_ || dtypes::is_weak(dtype) || dtype.scalar == Scalar::Index)
    throw Error("[Buffer] cannot hold elements of dtype " + dtype.name() + " on " + device_);
  if (size > size_t(INT64_MAX)) throw Error("[Buffer] " + std::to_string(size) + " elements is more than 2^63");
  checked_nbytes("Buffer", {int64_t(size)}, dtype);  // the device's capacity is checked where it is allocated
}

Buffer::Buffer(std::string device, DType dtype, size_t size, void* memory, std::shared_ptr<const void> owner)
    : Buffer(std::move(device), dtype, size) {
  if ((!memory && size > 0) || !owner)
    throw Error("[Buffer] a buffer over outside memory needs the memory and its owner (" + std::to_string(size) + " x " +
                dtype.name() + " on " + device_ + ")");
  ptr_ = memory;
  owner_ = std::move(owner);
}

Buffer::~Buffer() {
  if (ptr_ && !owner_) dev_->allocator().free(ptr_, nbytes());
}

Device& Buffer::dev() {
  if (!dev_) dev_ = &get_device(device_);
  return *dev_;
}

void* Buffer::ptr() {
  if (!ptr_) ptr_ = dev().allocator().alloc(nbytes());
  return ptr_;
}

namespace {
void check_size(const char* op, const Buffer& b, size_t bytes) {
  if (bytes != b.nbytes())
    throw Error(std::string("[Buffer::") + op + "] got " + std::to_string(bytes) + " bytes, the buffer holds " +
                std::to_string(b.nbytes()) + " bytes (" + std::to_string(b.size()) + " x " + b.dtype().name() + " on " +
                b.device() + ")");
}

// Host access to a host-memory device's buffer waits for its launched kernels (CPU_DEVICE_THREADS runs them on
// the device's own thread); other devices order their copies themselves.
void host_sync(Buffer& b) {
  if (b.dev().allocator().host_memory()) b.dev().synchronize();
}
}  // namespace

void Buffer::copyin(const void* host, size_t bytes) {
  check_size("copyin", *this, bytes);
  host_sync(*this);
  void* p = ptr();
  dev().allocator().copyin(p, host, bytes);
}

namespace {
std::atomic<size_t> g_copies_staged{0};
}
size_t copies_staged() { return g_copies_staged.load(); }

void Buffer::copy_from(Buffer& src) {
  if (src.nbytes() != nbytes())
    throw Error("[copy] " + std::to_string(src.nbytes()) + " bytes on " + src.device() + " into a buffer of " +
                std::to_string(nbytes()) + " bytes on " + device());
  if (nbytes() == 0) return;
  if (dev().enqueue_copy(ptr(), src.dev(), src.ptr(), nbytes())) return;  // ordered on the devices' queues
  host_sync(src), host_sync(*this);
  if (dev().allocator().host_memory() && src.dev().allocator().host_memory()) {
    std::memcpy(ptr(), src.ptr(), nbytes());
    return;
  }
  g_copies_staged++;
  std::vector<uint8_t> host(nbytes());
  src.copyout(host.data(), host.size());
  copyin(host.data(), host.size());
}

void Buffer::copyin_at(size_t offset, const void* host, size_t bytes) {
  if (offset > nbytes() || bytes > nbytes() - offset)
    throw Error("[Buffer::copyin_at] bytes [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
                std::to_string(bytes) + ") are outside the buffer's " + std::to_string(nbytes()) + " bytes");
  host_sync(*this);
  void* p = ptr();
  dev().allocator().copyin_at(p, offset, host, bytes);
}

void Buffer::copyout(void* host, size_t bytes) {
  check_size("copyout", *this, bytes);
  host_sync(*this);
  void* p = ptr();
  dev().allocator().copyout(host, p, bytes);
}

}  // namespace tg
