// IDX loading through zlib (gzip or plain files alike).
#include "tg/nn/datasets.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "tg/env.hpp"

namespace tg::nn {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

[[noreturn]] void bad(const std::string& path, const std::string& why) { throw Error("[load_idx] " + path + ": " + why); }

// A byte stream: read(dst, n) returns how many bytes it gave (0 at the end), throwing on a read error.
using ReadFn = std::function<size_t(uint8_t*, size_t)>;

void read_exact(const ReadFn& rd, uint8_t* p, size_t n, const std::string& path, const char* what) {
  while (n > 0) {
    size_t got = rd(p, n);
    if (got == 0) bad(path, std::string("the file ends inside the ") + what);
    p += got;
    n -= got;
  }
}

// The IDX format: 0, 0, element type, dimension count, big-endian uint32 sizes, big-endian elements.
Tensor parse_idx(const ReadFn& rd, const std::string& path, const std::string& device) {
  uint8_t magic[4];
  read_exact(rd, magic, 4, path, "header");
  if (magic[0] != 0 || magic[1] != 0) bad(path, "not an IDX file (magic must start with two zero bytes)");
  DType dt;
  switch (magic[2]) {
    case 0x08: dt = dtypes::uint8; break;
    case 0x09: dt = dtypes::int8; break;
    case 0x0B: dt = dtypes::int16; break;
    case 0x0C: dt = dtypes::int32; break;
    case 0x0D: dt = dtypes::float32; break;
    case 0x0E: dt = dtypes::float64; break;
    default: {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", magic[2]);
      bad(path, std::string("unknown IDX element type ") + hex + " (expected 0x08, 0x09, 0x0B, 0x0C, 0x0D or 0x0E)");
    }
  }
  int nd = magic[3];
  if (nd < 1) bad(path, "IDX files have at least one dimension, the header says 0");
  Shape shape;
  uint64_t n = 1;
  for (int i = 0; i < nd; i++) {
    uint8_t b[4];
    read_exact(rd, b, 4, path, "dimension sizes");
    uint32_t d = uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | b[3];
    shape.push_back(int64_t(d));
    if (__builtin_mul_overflow(n, uint64_t(d), &n) || n > (uint64_t(1) << 36))
      bad(path, "dimensions " + shape_str(shape) + "... hold more than 2^36 elements");
  }
  size_t isz = size_t(dt.itemsize()), want = size_t(n) * isz;
  // Grown as bytes arrive: a header claiming more than the file holds allocates no more than the file gives.
  std::vector<uint8_t> data;
  while (data.size() < want) {
    size_t at = data.size(), chunk = std::min(want - at, std::max<size_t>(at, 1 << 16));  // doubling from 64 KiB
    data.resize(at + chunk);
    uint8_t* p = data.data() + at;
    while (chunk > 0) {
      size_t got = rd(p, chunk);
      if (got == 0)
        bad(path, "the file ends inside the data: the header's " + shape_str(shape) + " " + dt.name() + " needs " +
                      std::to_string(want) + " bytes, the file has " + std::to_string(size_t(p - data.data())));
      p += got;
      chunk -= got;
    }
  }
  uint8_t extra;
  if (rd(&extra, 1) > 0) bad(path, "more data than the header's " + shape_str(shape) + " elements");
  if (isz > 1)  // IDX is big-endian
    for (size_t i = 0; i < data.size(); i += isz) std::reverse(data.begin() + int64_t(i), data.begin() + int64_t(i + isz));
  return Tensor::from_blob(data.data(), shape, dt, device);
}

}  // namespace

Tensor load_idx(const std::string& path, const std::string& device) {
  if (std::filesystem::is_directory(path)) bad(path, "is a folder, not an IDX file");
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) bad(path, "cannot open");
  ReadFn rd = [&](uint8_t* p, size_t n) -> size_t {  // gzread reads plain files too
    int got = gzread(f.get(), p, unsigned(std::min<size_t>(n, 1u << 30)));
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f.get(), &err);
      bad(path, std::string("read error: ") + (msg ? msg : "unknown"));
    }
    return size_t(got);
  };
  return parse_idx(rd, path, device);
}

Tensor load_idx_bytes(const uint8_t* data, size_t size, const std::string& name, const std::string& device) {
  if (size < 2 || data[0] != 0x1f || data[1] != 0x8b) {  // plain IDX
    size_t off = 0;
    ReadFn rd = [&](uint8_t* p, size_t n) {
      size_t k = std::min(n, size - off);
      if (k) std::memcpy(p, data + off, k);
      off += k;
      return k;
    };
    return parse_idx(rd, name, device);
  }
  // gzip (concatenated members allowed, as gzread reads them)
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) bad(name, "zlib inflateInit2 failed");
  std::unique_ptr<z_stream, void (*)(z_stream*)> guard(&zs, [](z_stream* z) { inflateEnd(z); });
  zs.next_in = const_cast<Bytef*>(data);
  zs.avail_in = uInt(std::min<size_t>(size, 1u << 30));
  size_t fed = zs.avail_in;
  bool ended = false;
  ReadFn rd = [&](uint8_t* p, size_t n) -> size_t {
    size_t out = 0;
    while (out < n) {
      if (ended) {  // a member ended: the input ends too, or another member follows
        if (zs.avail_in == 0 && fed == size) break;
        if (zs.avail_in == 0) zs.avail_in = uInt(std::min<size_t>(size - fed, 1u << 30)), fed += zs.avail_in;
        if (zs.next_in[0] != 0x1f) bad(name, "data after the end of the gzip stream");
        if (inflateReset(&zs) != Z_OK) bad(name, "zlib inflateReset failed");
        ended = false;
      }
      if (zs.avail_in == 0 && fed < size) zs.avail_in = uInt(std::min<size_t>(size - fed, 1u << 30)), fed += zs.avail_in;
      zs.next_out = p + out;
      zs.avail_out = uInt(std::min<size_t>(n - out, 1u << 30));
      size_t before = zs.avail_out;
      int rc = inflate(&zs, Z_NO_FLUSH);
      out += before - zs.avail_out;
      if (rc == Z_STREAM_END) ended = true;
      else if (rc == Z_BUF_ERROR) bad(name, "the gzip stream is truncated");  // no progress: the input is used up
      else if (rc != Z_OK) bad(name, std::string("corrupt gzip data: ") + (zs.msg ? zs.msg : "zlib error " + std::to_string(rc)));
    }
    return out;
  };
  return parse_idx(rd, name, device);
}

namespace {
std::string find(const std::string& dir, const std::string& base) {
  for (const char* ext : {".gz", ""}) {
    std::string p = dir + "/" + base + ext;
    if (std::filesystem::exists(p)) return p;
  }
  throw Error("[mnist] " + dir + "/" + base + "[.gz] not found (run scripts/datasets, or point TG_MNIST_DIR at the "
              "folder with the MNIST IDX files)");
}

Dataset load_split(const std::string& dir, const std::string& device, const char* who) {
  if (!std::filesystem::is_directory(dir))
    throw Error(std::string("[") + who + "] dataset folder '" + dir + "' does not exist (run scripts/datasets, or point " +
                "TG_MNIST_DIR at the folder with the MNIST IDX files)");
  Dataset d;
  d.X_train = load_idx(find(dir, "train-images-idx3-ubyte"), device);
  d.Y_train = load_idx(find(dir, "train-labels-idx1-ubyte"), device);
  d.X_test = load_idx(find(dir, "t10k-images-idx3-ubyte"), device);
  d.Y_test = load_idx(find(dir, "t10k-labels-idx1-ubyte"), device);
  for (Tensor* x : {&d.X_train, &d.X_test})
    if (x->ndim() != 3) throw Error(std::string("[") + who + "] images must be (N, rows, cols), got " + shape_str(x->shape()));
  if (d.X_train.shape()[0] != d.Y_train.shape()[0] || d.X_test.shape()[0] != d.Y_test.shape()[0])
    throw Error(std::string("[") + who + "] image and label counts differ in " + dir);
  d.X_train = d.X_train.reshape({d.X_train.shape()[0], 1, d.X_train.shape()[1], d.X_train.shape()[2]});
  d.X_test = d.X_test.reshape({d.X_test.shape()[0], 1, d.X_test.shape()[1], d.X_test.shape()[2]});
  return d;
}
}  // namespace

Dataset mnist(const std::string& dir, const std::string& device) {
  std::string d = dir;
  if (d.empty()) d = getenv_str("TG_MNIST_DIR", "data/mnist");
  return load_split(d, device, "mnist");
}

Dataset fashion_mnist(const std::string& dir, const std::string& device) { return load_split(dir, device, "fashion_mnist"); }

}  // namespace tg::nn
