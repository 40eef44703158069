// safetensors: 8-byte little-endian header length, a JSON header, then the raw tensor bytes.
#include "tg/nn/state.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tg::nn {

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

DType st_dtype(const std::string& s, const std::string& path, const std::string& key) {
  static const std::map<std::string, DType> m = {
      {"BOOL", dtypes::bool_}, {"I8", dtypes::int8},     {"U8", dtypes::uint8},     {"I16", dtypes::int16},
      {"U16", dtypes::uint16}, {"I32", dtypes::int32},   {"U32", dtypes::uint32},   {"I64", dtypes::int64},
      {"U64", dtypes::uint64}, {"F16", dtypes::float16}, {"BF16", dtypes::bfloat16}, {"F32", dtypes::float32},
      {"F64", dtypes::float64}, {"F8_E4M3", dtypes::fp8e4m3}, {"F8_E5M2", dtypes::fp8e5m2}};
  auto it = m.find(s);
  if (it == m.end()) throw Error("[safe_load] " + path + ": tensor '" + key + "' has unknown dtype '" + s + "'");
  return it->second;
}

struct Mapped {
  const uint8_t* p = nullptr;
  size_t n = 0;
  int fd = -1;
  explicit Mapped(const std::string& path) {
    fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw Error("[safe_load] " + path + ": cannot open");
    struct stat st;
    if (fstat(fd, &st) != 0) throw Error("[safe_load] " + path + ": cannot stat");
    n = size_t(st.st_size);
    if (n > 0) {
      void* m = mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) throw Error("[safe_load] " + path + ": mmap failed");
      p = static_cast<const uint8_t*>(m);
    }
  }
  ~Mapped() {
    if (p) munmap(const_cast<uint8_t*>(p), n);
    if (fd >= 0) ::close(fd);
  }
};

// The header, checked: every entry's offsets lie inside the data and match its shape and dtype.
json read_header(const Mapped& f, const std::string& path, size_t& data_start) {
  if (f.n < 8) throw Error("[safe_load] " + path + ": shorter than the 8-byte header length");
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | f.p[i];
  if (hl > f.n - 8 || hl > (uint64_t(100) << 20)) throw Error("[safe_load] " + path + ": header length " + std::to_string(hl) + " is past the end");
  data_start = 8 + size_t(hl);
  json h;
  try {
    h = json::parse(f.p + 8, f.p + 8 + hl);
  } catch (const json::exception& e) {
    throw Error("[safe_load] " + path + ": bad JSON header: " + e.what());
  }
  if (!h.is_object()) throw Error("[safe_load] " + path + ": the header is not a JSON object");
  return h;
}

}  // namespace

void safe_save(const std::map<std::string, Tensor>& tensors, const std::string& path,
               const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  std::vector<std::vector<uint8_t>> blobs;
  for (auto& [k, t] : tensors) {
    if (k == "__metadata__") throw Error("[safe_save] '__metadata__' is reserved");
    std::vector<uint8_t> b(size_t(t.numel()) * size_t(t.dtype().itemsize()));
    Tensor c = t;
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
    h[k] = {{"dtype", st_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {off, off + b.size()}}};
    off += b.size();
    blobs.push_back(std::move(b));
  }
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8) hs += ' ';
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw Error("[safe_save] " + path + ": cannot write");
    uint64_t hl = hs.size();
    for (int i = 0; i < 8; i++) f.put(char((hl >> (8 * i)) & 0xff));
    f.write(hs.data(), int64_t(hs.size()));
    for (auto& b : blobs) f.write(reinterpret_cast<const char*>(b.data()), int64_t(b.size()));
    if (!f) throw Error("[safe_save] " + path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error("[safe_save] " + path + ": cannot rename the temporary file");
}

std::map<std::string, Tensor> safe_load(const std::string& path, const std::string& device) {
  Mapped f(path);
  size_t start = 0;
  json h = read_header(f, path, start);
  size_t data = f.n - start;
  std::map<std::string, Tensor> out;
  for (auto& [k, v] : h.items()) {
    if (k == "__metadata__") continue;
    try {
      DType dt = st_dtype(v.at("dtype").get<std::string>(), path, k);
      Shape s = v.at("shape").get<Shape>();
      auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data)
        throw Error("[safe_load] " + path + ": tensor '" + k + "' has offsets outside the file's " + std::to_string(data) + " data bytes");
      uint64_t n = 1;
      for (int64_t d : s) {
        if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) throw Error("[safe_load] " + path + ": tensor '" + k + "' has a bad shape");
      }
      if (n * uint64_t(dt.itemsize()) != offs[1] - offs[0])
        throw Error("[safe_load] " + path + ": tensor '" + k + "' " + shape_str(s) + " " + dt.name() + " needs " +
                    std::to_string(n * uint64_t(dt.itemsize())) + " bytes, the file gives " + std::to_string(offs[1] - offs[0]));
      out.emplace(k, Tensor::from_blob(f.p + start + offs[0], s, dt, device));
    } catch (const json::exception& e) {
      throw Error("[safe_load] " + path + ": tensor '" + k + "': " + e.what());
    }
  }
  return out;
}

std::map<std::string, std::string> safe_metadata(const std::string& path) {
  Mapped f(path);
  size_t start = 0;
  json h = read_header(f, path, start);
  std::map<std::string, std::string> out;
  if (h.contains("__metadata__")) {
    try {
      out = h["__metadata__"].get<std::map<std::string, std::string>>();
    } catch (const json::exception& e) {
      throw Error("[safe_metadata] " + path + ": " + e.what());
    }
  }
  return out;
}

}  // namespace tg::nn
