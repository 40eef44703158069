// safetensors: 8-byte little-endian header length, a JSON header (nlohmann::json), then the raw tensor bytes.
// Loading maps the file: DISK tensors view the mapping, other devices get a copy of each tensor's bytes.
#include "tg/nn/state.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "mapped.hpp"
#include "tg/device.hpp"
#include "tg/schedule.hpp"

namespace tg::nn {

// ---------------------------------------------------------------- mapped bytes

Bytes map_file(const std::string& path, const char* who) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(std::string("[") + who + "] " + path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(std::string("[") + who + "] " + path + ": not a regular file");
  }
  Bytes b;
  b.n = size_t(st.st_size);
  if (b.n > 0) {
    // private and writable: a tensor that views the mapping on a device computing in host memory (gguf_load onto
    // the CPU) may be written, which copies the pages it writes and leaves the file as it is
    void* m = mmap(nullptr, b.n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      throw Error(std::string("[") + who + "] " + path + ": mmap of " + std::to_string(b.n) + " bytes failed");
    }
    b.p = static_cast<const uint8_t*>(m);
    size_t n = b.n;
    b.owner = std::shared_ptr<const void>(m, [n](const void* q) { munmap(const_cast<void*>(q), n); });
  } else {
    b.owner = std::make_shared<int>(0);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  return b;
}

Bytes copy_bytes(const uint8_t* data, size_t n) {
  auto v = std::make_shared<std::vector<uint8_t>>(data, data + n);
  return Bytes{v->data(), n, v};
}

// ---------------------------------------------------------------- module state

std::map<std::string, Tensor> get_state_dict(Module& m) { return m.state_dict(); }

std::vector<Tensor> get_parameters(Module& m) {
  std::vector<Tensor> out;
  for (auto& [k, t] : m.state_dict()) out.push_back(t);
  return out;
}

void load_state_dict(Module& m, const std::map<std::string, Tensor>& sd, bool strict) { m.load_state_dict(sd, strict); }

// ---------------------------------------------------------------- safetensors

namespace {

using json = nlohmann::json;

const char* st_name(DType d) {
  switch (d.scalar) {
    case Scalar::Bool: return "BOOL";
    case Scalar::Int8: return "I8";
    case Scalar::UInt8: return "U8";
    case Scalar::Int16: return "I16";
    case Scalar::UInt16: return "U16";
    case Scalar::Int32: return "I32";
    case Scalar::UInt32: return "U32";
    case Scalar::Int64: return "I64";
    case Scalar::UInt64: return "U64";
    case Scalar::Float16: return "F16";
    case Scalar::BFloat16: return "BF16";
    case Scalar::Float32: return "F32";
    case Scalar::Float64: return "F64";
    case Scalar::Fp8E4M3: return "F8_E4M3";
    case Scalar::Fp8E5M2: return "F8_E5M2";
    default: throw Error("[safe_save] dtype " + d.name() + " has no safetensors name");
  }
}

const std::map<std::string, DType>& st_dtypes() {
  static const std::map<std::string, DType> m = {
      {"BOOL", dtypes::bool_}, {"I8", dtypes::int8},     {"U8", dtypes::uint8},      {"I16", dtypes::int16},
      {"U16", dtypes::uint16}, {"I32", dtypes::int32},   {"U32", dtypes::uint32},    {"I64", dtypes::int64},
      {"U64", dtypes::uint64}, {"F16", dtypes::float16}, {"BF16", dtypes::bfloat16}, {"F32", dtypes::float32},
      {"F64", dtypes::float64}, {"F8_E4M3", dtypes::fp8e4m3}, {"F8_E5M2", dtypes::fp8e5m2}};
  return m;
}

struct StEntry {
  std::string key;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // relative to the data section
};

struct StHeader {
  size_t data_start = 0;
  std::vector<StEntry> entries;
  std::map<std::string, std::string> metadata;
};

// The header, checked: every entry has a known dtype, a shape of non-negative integers whose bytes match its
// offsets, offsets inside the data section, and no two entries overlap.
StHeader parse_header(const Bytes& f, const std::string& path, const char* who) {
  auto bad = [&](const std::string& why) -> Error { return Error(std::string("[") + who + "] " + path + ": " + why); };
  if (f.n < 8) throw bad("shorter than the 8-byte header length (" + std::to_string(f.n) + " bytes)");
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | f.p[i];
  if (hl > f.n - 8)
    throw bad("header length " + std::to_string(hl) + " is past the end of the file (" + std::to_string(f.n) + " bytes)");
  if (hl > (uint64_t(100) << 20)) throw bad("header length " + std::to_string(hl) + " is over the 100 MiB limit");
  StHeader out;
  out.data_start = 8 + size_t(hl);
  uint64_t data = f.n - out.data_start;
  json h;
  try {
    h = json::parse(f.p + 8, f.p + 8 + hl);
  } catch (const json::exception& e) {
    throw bad(std::string("bad JSON header: ") + e.what());
  }
  if (!h.is_object()) throw bad("the header is not a JSON object");
  for (auto& [k, v] : h.items()) {
    if (k == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) throw bad("__metadata__ value of '" + mk + "' is not a string");
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string& key = k;  // clang 14 cannot capture a structured binding
    auto bad_t = [&](const std::string& why) { return bad("tensor '" + key + "' " + why); };
    if (!v.is_object()) throw bad_t("is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw bad_t("has no dtype string");
    if (!v.contains("shape") || !v["shape"].is_array()) throw bad_t("has no shape array");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw bad_t("has no data_offsets pair");
    StEntry e;
    e.key = k;
    std::string ds = v["dtype"].get<std::string>();
    auto it = st_dtypes().find(ds);
    if (it == st_dtypes().end()) throw bad_t("has unknown dtype '" + ds + "'");
    e.dtype = it->second;
    uint64_t n = 1;
    for (auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX)) throw bad_t(std::string("has a shape entry that is not a non-negative integer (a ") + d.type_name() + ")");
      uint64_t du = d.get<uint64_t>();
      if (__builtin_mul_overflow(n, du, &n)) throw bad_t("has a shape whose element count overflows");
      e.shape.push_back(int64_t(du));
    }
    for (auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) throw bad_t(std::string("has a data offset that is not a non-negative integer (a ") + o.type_name() + ")");
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.begin > e.end || e.end > data)
      throw bad_t("has data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] outside the file's " +
                  std::to_string(data) + " data bytes");
    uint64_t nbytes;
    if (__builtin_mul_overflow(n, uint64_t(e.dtype.itemsize()), &nbytes) || nbytes != e.end - e.begin)
      throw bad_t(shape_str(e.shape) + " " + e.dtype.name() + " needs " + std::to_string(n) + " x " +
                  std::to_string(e.dtype.itemsize()) + " bytes, the offsets give " + std::to_string(e.end - e.begin));
    out.entries.push_back(std::move(e));
  }
  std::vector<const StEntry*> by_off;
  for (auto& e : out.entries)
    if (e.end > e.begin) by_off.push_back(&e);
  std::stable_sort(by_off.begin(), by_off.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_off.size(); i++)
    if (by_off[i]->begin < by_off[i - 1]->end)
      throw bad("tensors '" + by_off[i - 1]->key + "' and '" + by_off[i]->key + "' overlap in the data section");
  return out;
}

std::map<std::string, Tensor> load_entries(const Bytes& f, const std::string& path, const std::string& device) {
  StHeader h = parse_header(f, path, "safe_load");
  bool disk = !device.empty() && !get_device(device).runs_kernels();
  std::string dev = disk ? get_device(device).name() : device;
  std::map<std::string, Tensor> out;
  for (auto& e : h.entries) {
    const uint8_t* p = f.p + h.data_start + e.begin;
    if (!disk) {
      out.emplace(e.key, Tensor::from_blob(p, e.shape, e.dtype, dev));
      continue;
    }
    size_t n = 1;
    for (int64_t d : e.shape) n *= size_t(d);
    auto buf = std::make_shared<Buffer>(dev, e.dtype, n, const_cast<uint8_t*>(p), f.owner);
    UOpRef b = buffer_uop(std::move(buf));
    out.emplace(e.key, Tensor(UOp::make(Ops::RESHAPE, e.dtype, {b}, std::vector<int64_t>(e.shape)), e.shape, dev));
  }
  return out;
}

// The process's umask (read from /proc: umask() itself changes it, racing other threads), else 022.
mode_t current_umask() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Umask:", 0) == 0) return mode_t(std::stoul(line.substr(6), nullptr, 8));
  return 022;
}

// Write `path` all or nothing: into a unique temporary file beside it (mkstemp: concurrent savers never share
// one), every write checked, fsync, then rename over `path`. On any failure the temporary file is removed, `path`
// keeps its old contents, and a tg::Error names the file and the reason.
}  // namespace

void write_file_atomic(const std::string& path, const char* who, const std::function<void(const std::function<void(const void*, size_t)>&)>& body) {
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = mkstemp(tmp.data());
  if (fd < 0) throw Error(std::string("[") + who + "] " + path + ": cannot create a temporary file beside it (" + std::strerror(errno) + ")");
  auto fail = [&](const std::string& what, int err) {
    if (fd >= 0) ::close(fd);
    fd = -1;
    ::unlink(tmp.c_str());
    throw Error(std::string("[") + who + "] " + path + ": " + what + " (" + std::strerror(err) + "); the file is unchanged");
  };
  fchmod(fd, 0666 & ~current_umask());  // mkstemp makes 0600; a saved file gets the usual mode
  try {
    body([&](const void* data, size_t n) {
      auto p = static_cast<const char*>(data);
      while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail("write failed", w < 0 ? errno : ENOSPC);
        p += w;
        n -= size_t(w);
      }
    });
  } catch (...) {
    if (fd >= 0) ::close(fd), ::unlink(tmp.c_str());  // an error thrown by the body itself (fail() cleaned up)
    throw;
  }
  if (::fsync(fd) != 0) fail("fsync failed", errno);
  int c = ::close(fd);
  fd = -1;
  if (c != 0) fail("close failed", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename " + tmp + " over it", errno);
}

void safe_save(const std::map<std::string, Tensor>& tensors, const std::string& path,
               const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  std::vector<std::vector<uint8_t>> blobs;
  for (auto& [k, t] : tensors) {
    if (k == "__metadata__") throw Error("[safe_save] '__metadata__' is reserved");
    const char* name = st_name(t.dtype());
    std::vector<uint8_t> b(size_t(t.numel()) * size_t(t.dtype().itemsize()));
    Tensor c = t;
    if (!get_device(c.device()).runs_kernels()) c = c.to(default_device());  // DISK: copy out first
    if (dtypes::is_bool(c.dtype())) {
      auto v = c.to_vector<bool>();
      for (size_t i = 0; i < v.size(); i++) b[i] = v[i];
    } else if (!b.empty()) {
      Tensor u = c.bitcast(c.dtype().itemsize() == 1 ? dtypes::uint8 : c.dtype().itemsize() == 2 ? dtypes::uint16
                                                                     : c.dtype().itemsize() == 4 ? dtypes::uint32
                                                                                                 : dtypes::uint64);
      switch (c.dtype().itemsize()) {
        case 1: { auto v = u.to_vector<uint8_t>(); std::memcpy(b.data(), v.data(), b.size()); break; }
        case 2: { auto v = u.to_vector<uint16_t>(); std::memcpy(b.data(), v.data(), b.size()); break; }
        case 4: { auto v = u.to_vector<uint32_t>(); std::memcpy(b.data(), v.data(), b.size()); break; }
        default: { auto v = u.to_vector<uint64_t>(); std::memcpy(b.data(), v.data(), b.size()); break; }
      }
    }
    h[k] = {{"dtype", name}, {"shape", t.shape()}, {"data_offsets", {off, off + b.size()}}};
    off += b.size();
    blobs.push_back(std::move(b));
  }
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8) hs += ' ';
  write_file_atomic(path, "safe_save", [&](const std::function<void(const void*, size_t)>& put) {
    uint8_t hl[8];
    for (int i = 0; i < 8; i++) hl[i] = uint8_t((uint64_t(hs.size()) >> (8 * i)) & 0xff);
    put(hl, 8);
    put(hs.data(), hs.size());
    for (auto& b : blobs) put(b.data(), b.size());
  });
}

std::map<std::string, Tensor> safe_load(const std::string& path, const std::string& device) {
  return load_entries(map_file(path, "safe_load"), path, device);
}

std::map<std::string, Tensor> safe_load_bytes(const uint8_t* data, size_t size, const std::string& name,
                                              const std::string& device) {
  return load_entries(copy_bytes(data, size), name, device);
}

std::map<std::string, std::string> safe_metadata(const std::string& path) {
  return parse_header(map_file(path, "safe_metadata"), path, "safe_metadata").metadata;
}

}  // namespace tg::nn
