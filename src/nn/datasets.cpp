// IDX loading through zlib (gzip or plain files alike).
#include "tg/nn/datasets.hpp"

#include <zlib.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "tg/env.hpp"

namespace tg::nn {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

[[noreturn]] void bad(const std::string& path, const std::string& why) { throw Error("[load_idx] " + path + ": " + why); }

void read_exact(gzFile f, void* dst, size_t n, const std::string& path, const char* what) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    unsigned chunk = unsigned(std::min<size_t>(n, 1u << 30));
    int got = gzread(f, p, chunk);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      bad(path, std::string("read error in ") + what + ": " + (msg ? msg : "unknown"));
    }
    if (got == 0) bad(path, std::string("file ends inside the ") + what);
    p += got;
    n -= size_t(got);
  }
}

}  // namespace

Tensor load_idx(const std::string& path, const std::string& device) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) bad(path, "cannot open");
  uint8_t magic[4];
  read_exact(f.get(), magic, 4, path, "header");
  if (magic[0] != 0 || magic[1] != 0) bad(path, "not an IDX file (magic must start with two zero bytes)");
  DType dt;
  switch (magic[2]) {
    case 0x08: dt = dtypes::uint8; break;
    case 0x09: dt = dtypes::int8; break;
    case 0x0B: dt = dtypes::int16; break;
    case 0x0C: dt = dtypes::int32; break;
    case 0x0D: dt = dtypes::float32; break;
    case 0x0E: dt = dtypes::float64; break;
    default: bad(path, "unknown IDX element type 0x" + std::to_string(magic[2]));
  }
  int nd = magic[3];
  if (nd < 1 || nd > 8) bad(path, "IDX files have 1 to 8 dimensions, header says " + std::to_string(nd));
  Shape shape;
  uint64_t n = 1;
  for (int i = 0; i < nd; i++) {
    uint8_t b[4];
    read_exact(f.get(), b, 4, path, "dimension sizes");
    uint32_t d = uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | b[3];
    shape.push_back(int64_t(d));
    if (__builtin_mul_overflow(n, uint64_t(d), &n) || n > (uint64_t(1) << 36)) bad(path, "dimensions too large");
  }
  size_t isz = size_t(dt.itemsize());
  std::vector<uint8_t> data(size_t(n) * isz);
  read_exact(f.get(), data.data(), data.size(), path, "data");
  uint8_t extra;
  if (gzread(f.get(), &extra, 1) > 0) bad(path, "more data than the header's " + shape_str(shape) + " elements");
  if (isz > 1)  // IDX is big-endian
    for (size_t i = 0; i < data.size(); i += isz) std::reverse(data.begin() + int64_t(i), data.begin() + int64_t(i + isz));
  return Tensor::from_blob(data.data(), shape, dt, device);
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
