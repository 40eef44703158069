// state: safetensors (round trips, the DISK device), GGUF (metadata, dequantisation), IDX from memory, module
// state helpers, and every loader's refusal of bad input.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "tg/device.hpp"
#include "tg/nn/datasets.hpp"
#include "tg/nn/nn.hpp"
#include "tg/nn/state.hpp"
#include "tg/schedule.hpp"
#include "../src/nn/gguf_grids.hpp"

using namespace tg;
using Bytes = std::vector<uint8_t>;

namespace {

std::string tmp_path(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("tg_state_tests_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return (d / name).string();
}
void write_bytes(const std::string& p, const Bytes& b) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(b.data()), int64_t(b.size()));
}
// resize + memcpy (g++ 12 reports false -Warray-bounds for vector::insert of a few bytes at -O3)
void append(Bytes& o, const void* p, size_t n) {
  size_t at = o.size();
  o.resize(at + n);
  if (n) std::memcpy(o.data() + at, p, n);
}
Bytes read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}
// The message of the tg::Error fn throws ("" if it throws none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
#define CHECK_ERROR(expr, ...)                                                 \
  do {                                                                         \
    std::string msg_ = error_of([&] { (void)(expr); });                        \
    CHECK_MESSAGE(!msg_.empty(), "no tg::Error from " #expr);                  \
    for (const char* part_ : {__VA_ARGS__})                                    \
      CHECK_MESSAGE(msg_.find(part_) != std::string::npos, "'" << part_ << "' not in: " << msg_); \
  } while (0)

// IEEE half bits -> double, written out here (independent of tg's conversion).
double half_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

// ---- a small GGUF writer

struct GGUFWriter {
  Bytes b;
  uint32_t version = 3;
  std::vector<Bytes> kvs;
  struct T {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    Bytes data;
  };
  std::vector<T> tensors;
  uint64_t align = 32;

  template <class V>
  static void put(Bytes& o, V v) {
    append(o, &v, sizeof(V));
  }
  static void put_str(Bytes& o, const std::string& s) {
    put<uint64_t>(o, s.size());
    append(o, s.data(), s.size());
  }
  // a key, a type and the already-encoded value
  void kv(const std::string& k, uint32_t type, const Bytes& value) {
    Bytes o;
    put_str(o, k);
    put<uint32_t>(o, type);
    append(o, value.data(), value.size());
    kvs.push_back(o);
  }
  template <class V>
  static Bytes enc(V v) {
    Bytes o;
    put(o, v);
    return o;
  }
  static Bytes enc_str(const std::string& s) {
    Bytes o;
    put_str(o, s);
    return o;
  }
  Bytes build() const {
    Bytes o{'G', 'G', 'U', 'F'};
    put<uint32_t>(o, version);
    put<uint64_t>(o, tensors.size());
    put<uint64_t>(o, kvs.size());
    for (auto& k : kvs) append(o, k.data(), k.size());
    uint64_t off = 0;
    std::vector<uint64_t> offs;
    for (auto& t : tensors) {
      put_str(o, t.name);
      put<uint32_t>(o, uint32_t(t.dims.size()));
      for (uint64_t d : t.dims) put<uint64_t>(o, d);
      put<uint32_t>(o, t.type);
      put<uint64_t>(o, off);
      offs.push_back(off);
      off += (t.data.size() + align - 1) / align * align;
    }
    while (o.size() % align) o.push_back(0);
    size_t start = o.size();
    for (size_t i = 0; i < tensors.size(); i++) {
      o.resize(start + offs[i], 0);
      append(o, tensors[i].data.data(), tensors[i].data.size());
    }
    return o;
  }
};

nn::GGUFFile gguf_of(const Bytes& b) { return nn::gguf_load_bytes(b.data(), b.size(), "mem.gguf"); }

// ---- a safetensors image with a given header and data size
Bytes st_image(const std::string& header, size_t data_bytes) {
  Bytes b(8 + header.size() + data_bytes, 0);
  for (int i = 0; i < 8; i++) b[size_t(i)] = uint8_t((header.size() >> (8 * i)) & 0xff);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

Bytes gzip_bytes(const Bytes& in) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  Bytes out(deflateBound(&zs, uLong(in.size())) + 32);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = uInt(in.size());
  zs.next_out = out.data();
  zs.avail_out = uInt(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// Float bit patterns: compared, they are exact, and -0 differs from 0.
std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// Each tensor of `want`, of the GGML type its name gives: read at load (g) and dequantised by tensor ops from its
// blocks as stored (k), the same bits; the stored blocks written back as they are (file `again`) read the same bits.
void check_blocks_exact(const nn::GGUFFile& g, const nn::GGUFFile& k, const std::map<std::string, std::vector<float>>& want,
                        const std::string& again) {
  std::map<std::string, Tensor> raw;
  std::map<std::string, std::string> types;
  for (const auto& entry : want) {
    const std::string name = entry.first;  // a plain variable: clang 14 cannot capture bindings (CAPTURE)
    CAPTURE(name);
    CHECK(g.tensor_types.at(name) == name);
    CHECK(bits(g.tensors.at(name).to_vector<float>()) == bits(entry.second));
    Tensor y = nn::ggml_dequantize(k.tensors.at(name).to(default_device()), name);
    CHECK(y.shape() == g.tensors.at(name).shape());
    CHECK(bits(y.to_vector<float>()) == bits(entry.second));
    raw[name] = k.tensors.at(name), types[name] = name;
  }
  std::string p2 = tmp_path(again);
  nn::gguf_save(p2, {}, raw, types);
  auto g2 = nn::gguf_load(p2);
  for (const auto& entry : want) CHECK(bits(g2.tensors.at(entry.first).to_vector<float>()) == bits(entry.second));
}

}  // namespace

// ================================================================ safetensors

TEST_CASE("safetensors round trip of every dtype, views and metadata, onto the default device and DISK") {
  std::map<std::string, Tensor> sd;
  std::vector<float> fv{1.5f, -2.f, 3.25f, 0.f, -0.5f, 65504.f};
  Tensor f = Tensor::from_vector(fv, {2, 3});
  sd.emplace("f32", f);
  sd.emplace("f32_T", f.permute({1, 0}));            // non-contiguous
  sd.emplace("f32_slice", f.shrink({{0, 2}, {1, 3}}));  // non-contiguous
  sd.emplace("f64", Tensor::from_vector(std::vector<double>{1e300, -1.0 / 3}));
  sd.emplace("f16", f.cast(dtypes::float16));
  sd.emplace("bf16", f.shrink({{0, 2}, {0, 2}}).cast(dtypes::bfloat16));
  sd.emplace("i8", Tensor::from_vector(std::vector<int8_t>{-128, 127, 0}));
  sd.emplace("u8", Tensor::from_vector(std::vector<uint8_t>{7, 255}));
  sd.emplace("i16", Tensor::from_vector(std::vector<int16_t>{-32768, 5}));
  sd.emplace("u16", Tensor::from_vector(std::vector<uint16_t>{65535, 1}));
  sd.emplace("i32", Tensor::from_vector(std::vector<int32_t>{INT32_MIN, 9}));
  sd.emplace("u32", Tensor::from_vector(std::vector<uint32_t>{UINT32_MAX}));
  sd.emplace("i64", Tensor::from_vector(std::vector<int64_t>{-1, 1LL << 40}));
  sd.emplace("u64", Tensor::from_vector(std::vector<uint64_t>{UINT64_MAX, 3}));
  sd.emplace("bool", Tensor::from_vector(std::vector<bool>{true, false, true}));
  sd.emplace("scalar", Tensor::from_vector(std::vector<float>{42.f}).reshape({}));
  sd.emplace("empty", Tensor::zeros({0, 4}));
  std::string p = tmp_path("all.safetensors");
  nn::safe_save(sd, p, {{"format", "pt"}, {"note", "tg"}});
  CHECK(nn::safe_metadata(p) == std::map<std::string, std::string>{{"format", "pt"}, {"note", "tg"}});
  for (std::string dev : {std::string(""), std::string("DISK")}) {
    CAPTURE(dev);
    auto back = nn::safe_load(p, dev);
    REQUIRE(back.size() == sd.size());
    for (auto& kv : sd) {
      const std::string& k = kv.first;  // not a structured binding: clang 14 cannot capture one (CAPTURE)
      const Tensor& t = kv.second;
      CAPTURE(k);
      const Tensor& b = back.at(k);
      CHECK(b.shape() == t.shape());
      CHECK(b.dtype() == t.dtype());
      CHECK(b.device() == (dev.empty() ? default_device() : "DISK"));
      // exact: every value read back equals the original (halves widen exactly). fp8 is not in the round trip:
      // the CPU renderer has no fp8 casts yet, so fp8 values cannot be compared here.
      if (dtypes::is_float(t.dtype()) && t.dtype().itemsize() < 4)
        CHECK(b.to(default_device()).cast(dtypes::float32).to_vector<float>() == t.cast(dtypes::float32).to_vector<float>());
      else if (t.dtype() == dtypes::uint64 || t.dtype() == dtypes::int64)
        CHECK(b.to(default_device()).bitcast(dtypes::uint64).to_vector<uint64_t>() == t.bitcast(dtypes::uint64).to_vector<uint64_t>());
      else
        CHECK(b.to_doubles() == t.to_doubles());
    }
  }
  // the file itself: an 8-byte little-endian header length, a JSON header padded to 8 bytes, then the data
  Bytes raw = read_bytes(p);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[size_t(i)];
  CHECK((8 + hl) % 8 == 0);
  CHECK(raw[8] == '{');
}

TEST_CASE("safe_load onto DISK copies nothing until a tensor is used") {
  std::string p = tmp_path("disk.safetensors");
  nn::safe_save({{"w", Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3})}}, p);
  size_t k0 = kernels_run();
  auto sd = nn::safe_load(p, "DISK");
  Tensor w = sd.at("w");
  CHECK(w.device() == "DISK");
  CHECK(kernels_run() == k0);  // loading ran nothing
  // The tensor's bytes are the file's: overwrite them in place after loading and the tensor reads the new values
  // (the DISK buffer is a view of the shared page cache, not a copy taken at load).
  Bytes raw = read_bytes(p);
  size_t data = raw.size() - 24;
  float nine = 9.f;
  std::memcpy(&raw[data], &nine, 4);
  {
    std::fstream fs(p, std::ios::binary | std::ios::in | std::ios::out);  // same inode, no truncation
    fs.seekp(int64_t(data));
    fs.write(reinterpret_cast<const char*>(&nine), 4);
  }
  CHECK(w.to_vector<float>() == std::vector<float>{9, 2, 3, 4, 5, 6});
  // moving copies (a COPY, no kernel), and the copy is an ordinary tensor on the target device
  Tensor c = w.to(default_device());
  c.realize();
  CHECK(kernels_run() == k0);
  CHECK(c.device() == default_device());
  CHECK(Tensor(c * 2.0).to_vector<float>() == std::vector<float>{18, 4, 6, 8, 10, 12});
  // views of a DISK tensor read back directly and move with their view
  CHECK(w.permute({1, 0}).to_vector<float>() == std::vector<float>{9, 4, 2, 5, 3, 6});
  CHECK(w.shrink({{1, 2}, {0, 3}}).reshape({3}).to(default_device()).to_vector<float>() == std::vector<float>{4, 5, 6});
  CHECK(w.flip({1}).to(default_device()).sum().item<float>() == 29.f);
}

TEST_CASE("a DISK tensor's mapping lives as long as the tensor") {
  std::string p = tmp_path("alive.safetensors");
  nn::safe_save({{"a", Tensor::from_vector(std::vector<int32_t>{10, 20, 30})}, {"b", Tensor::from_vector(std::vector<int32_t>{1})}}, p);
  Tensor a;
  {
    auto sd = nn::safe_load(p, "DISK");
    a = sd.at("a");
  }
  std::filesystem::remove(p);  // the mapping keeps the data after the name is gone
  CHECK(a.to_vector<int32_t>() == std::vector<int32_t>{10, 20, 30});
}

TEST_CASE("kernels cannot run on DISK: the error names the kernel's op and says to move the tensor") {
  std::string p = tmp_path("nokernel.safetensors");
  nn::safe_save({{"x", Tensor::from_vector(std::vector<float>{1, 2, 3})}}, p);
  Tensor x = nn::safe_load(p, "DISK").at("x");
  Tensor cpu = Tensor::from_vector(std::vector<float>{1, 1, 1});
  CHECK_ERROR(Tensor(x * 2.0).realize(), "[DISK]", "MUL", "would run on DISK", ".to(\"CPU\")");
  CHECK_ERROR(x.cast(dtypes::int32).to_vector<int32_t>(), "[to]", "computed (CAST)", ".to(");
  CHECK_ERROR(Tensor(cpu + x).realize(), "[DISK]", "ADD", "reads a tensor on DISK", ".to(\"CPU\")");
  CHECK_ERROR(x.sum().to(default_device()), "[to]", "computed (REDUCE");
  CHECK_ERROR(cpu.to("DISK"), "[to]", "cannot copy into DISK");
  CHECK_ERROR(Tensor::from_vector(std::vector<float>{1}, {1}, "DISK"), "[DISK]", "cannot allocate");
  CHECK(cpu.to_vector<float>() == std::vector<float>{1, 1, 1});  // nothing else was touched
  CHECK(Tensor(cpu + x.to(default_device())).to_vector<float>() == std::vector<float>{2, 3, 4});
}

TEST_CASE("DISK tensors load into a module and save again") {
  nn::Linear a(3, 2), b(3, 2);
  std::string p = tmp_path("linear.safetensors");
  nn::safe_save(nn::get_state_dict(a), p);
  auto sd = nn::safe_load(p, "DISK");
  nn::load_state_dict(b, sd);
  CHECK(b.weight.to_vector<float>() == a.weight.to_vector<float>());
  CHECK(b.bias->to_vector<float>() == a.bias->to_vector<float>());
  CHECK(nn::get_parameters(b).size() == 2);
  std::string p2 = tmp_path("linear2.safetensors");
  nn::safe_save(sd, p2);  // DISK tensors are read out for saving
  CHECK(read_bytes(p2) == read_bytes(p));
  // strict loading names what is wrong
  auto bad = sd;
  bad.erase("bias");
  CHECK_ERROR(nn::load_state_dict(b, bad), "missing key 'bias'");
  bad = sd;
  bad.emplace("extra", Tensor::zeros({1}));
  CHECK_ERROR(nn::load_state_dict(b, bad), "unexpected key 'extra'");
  bad = sd;
  bad.at("weight") = Tensor::zeros({3, 2});
  CHECK_ERROR(nn::load_state_dict(b, bad), "'weight' has shape (3, 2)", "(2, 3)");
}

TEST_CASE("safe_load_bytes reads an image in memory, also onto DISK") {
  std::string p = tmp_path("mem.safetensors");
  nn::safe_save({{"v", Tensor::from_vector(std::vector<int16_t>{-3, 4})}}, p);
  Bytes raw = read_bytes(p);
  auto sd = nn::safe_load_bytes(raw.data(), raw.size(), "mem", "DISK");
  raw.assign(raw.size(), 0);  // the DISK tensor views its own copy
  CHECK(sd.at("v").to_vector<int16_t>() == std::vector<int16_t>{-3, 4});
}

TEST_CASE("malformed safetensors files are errors naming the file and the problem") {
  auto load = [](const Bytes& b) { return nn::safe_load_bytes(b.data(), b.size(), "bad.safetensors"); };
  CHECK_ERROR(load(Bytes{1, 2, 3}), "bad.safetensors", "shorter than the 8-byte header length");
  Bytes huge(16, 0);
  huge[7] = 0x7f;  // header length ~2^63
  CHECK_ERROR(load(huge), "bad.safetensors", "past the end of the file");
  CHECK_ERROR(load(st_image("{not json", 0)), "bad JSON header");
  CHECK_ERROR(load(st_image("[1, 2]", 0)), "not a JSON object");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)), "tensor 'a'",
              "outside the file's 4 data bytes");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)), "tensor 'a'",
              "needs 3 x 4 bytes, the offsets give 8");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", 8)), "unknown dtype 'Q9'");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32"}})", 8)), "tensor 'a' has no shape array");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32","shape":[2]}})", 8)), "has no data_offsets pair");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)), "not a non-negative integer");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", 8)), "not a non-negative integer");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)), "outside the file");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8)), "data offset that is not");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8)),
              "element count overflows");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", 8)), "needs");
  CHECK_ERROR(load(st_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
              "'a' and 'b' overlap");
  CHECK_ERROR(load(st_image(R"({"__metadata__":{"k":1}})", 0)), "__metadata__ value of 'k' is not a string");
  CHECK_ERROR(load(st_image(R"({"a":[]})", 0)), "tensor 'a' is not an object");
  CHECK_ERROR(nn::safe_load(tmp_path("does_not_exist.safetensors")), "does_not_exist.safetensors", "cannot open");
  CHECK_ERROR(nn::safe_load(std::filesystem::temp_directory_path().string()), "not a regular file");
  // every truncation of a valid file is refused (never a crash or an out-of-bounds read)
  std::string p = tmp_path("trunc.safetensors");
  nn::safe_save({{"a", Tensor::from_vector(std::vector<float>{1, 2})}, {"b", Tensor::from_vector(std::vector<uint8_t>{3})}}, p);
  Bytes raw = read_bytes(p);
  for (size_t n = 0; n < raw.size(); n++) {
    CAPTURE(n);
    CHECK_THROWS_AS(load(Bytes(raw.begin(), raw.begin() + int64_t(n))), Error);
  }
  CHECK(load(raw).size() == 2);
}

TEST_CASE("safe_save that fails to write keeps the old file and leaves no temporary file") {
  std::string dir = tmp_path("atomic");
  std::filesystem::create_directories(dir);
  std::string p = dir + "/m.safetensors";
  nn::safe_save({{"a", Tensor::from_vector(std::vector<float>{1, 2, 3})}}, p);
  Bytes good = read_bytes(p);
  // Bool tensors are read back without a kernel (none runs in the forked child). The limit falls in the last
  // (small, buffered) tensor: only the final write fails, which an unchecked final flush would miss.
  std::map<std::string, Tensor> sd{{"a", Tensor::from_vector(std::vector<bool>(1 << 16, true), {1 << 16})},
                                   {"b", Tensor::from_vector(std::vector<bool>(100, true), {100})}};
  nn::safe_save(sd, dir + "/size_probe");
  rlim_t limit = rlim_t(std::filesystem::file_size(dir + "/size_probe")) - 50;
  std::filesystem::remove(dir + "/size_probe");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the file-size limit stands in for a full disk: the write fails with EFBIG
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{limit, limit};
    setrlimit(RLIMIT_FSIZE, &lim);
    int code = 1;
    try {
      nn::safe_save(sd, p);
    } catch (const Error& e) {
      std::string m = e.what();
      code = m.find("[safe_save]") == 0 && m.find(p) != std::string::npos && m.find("write failed") != std::string::npos ? 0 : 2;
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // 1: reported success, 2: another error
  CHECK(read_bytes(p) == good);
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    files++;
    CHECK(e.path().filename() == "m.safetensors");
  }
  CHECK(files == 1);
  CHECK(nn::safe_load(p).at("a").to_vector<float>() == std::vector<float>{1, 2, 3});
}

TEST_CASE("safe_save's temporary file is unique: a file named like another saver's temporary is left alone") {
  std::string dir = tmp_path("unique");
  std::filesystem::create_directories(dir);
  std::string p = dir + "/m.safetensors";
  write_bytes(p + ".tmp", Bytes{'o', 't', 'h', 'e', 'r'});
  mode_t old_mask = umask(022);
  nn::safe_save({{"a", Tensor::from_vector(std::vector<int32_t>{4, 5})}}, p);
  umask(old_mask);
  CHECK(read_bytes(p + ".tmp") == Bytes{'o', 't', 'h', 'e', 'r'});
  CHECK(nn::safe_load(p).at("a").to_vector<int32_t>() == std::vector<int32_t>{4, 5});
  CHECK((std::filesystem::status(p).permissions() & std::filesystem::perms::all) == std::filesystem::perms(0644));  // not mkstemp's 0600
}

TEST_CASE("safe_save into a directory that does not exist is an error naming the file") {
  std::string p = tmp_path("no_such_dir") + "/m.safetensors";
  try {
    nn::safe_save({{"a", Tensor::from_vector(std::vector<float>{1})}}, p);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("[safe_save] " + p) == 0);
  }
}

// ================================================================ GGUF

TEST_CASE("GGUF metadata of every value type, arrays, alignment, versions 2 and 3") {
  for (uint32_t version : {2u, 3u}) {
    CAPTURE(version);
    GGUFWriter w;
    w.version = version;
    w.align = 64;
    w.kv("general.alignment", 4, w.enc<uint32_t>(64));
    w.kv("u8", 0, w.enc<uint8_t>(200));
    w.kv("i8", 1, w.enc<int8_t>(-100));
    w.kv("u16", 2, w.enc<uint16_t>(60000));
    w.kv("i16", 3, w.enc<int16_t>(-30000));
    w.kv("u32", 4, w.enc<uint32_t>(4000000000u));
    w.kv("i32", 5, w.enc<int32_t>(-2000000000));
    w.kv("f32", 6, w.enc<float>(0.1f));
    w.kv("bool", 7, w.enc<uint8_t>(1));
    w.kv("general.name", 8, w.enc_str("tiny"));
    w.kv("u64", 10, w.enc<uint64_t>(1ULL << 60));
    w.kv("i64", 11, w.enc<int64_t>(-(1LL << 60)));
    w.kv("f64", 12, w.enc<double>(1.0 / 3));
    Bytes arr;  // array of 3 strings
    GGUFWriter::put<uint32_t>(arr, 8);
    GGUFWriter::put<uint64_t>(arr, 3);
    for (const char* s : {"a", "", "token"}) GGUFWriter::put_str(arr, s);
    w.kv("tokens", 9, arr);
    Bytes nested;  // array of 2 arrays of int32
    GGUFWriter::put<uint32_t>(nested, 9);
    GGUFWriter::put<uint64_t>(nested, 2);
    for (int k = 0; k < 2; k++) {
      GGUFWriter::put<uint32_t>(nested, 5);
      GGUFWriter::put<uint64_t>(nested, uint64_t(k + 1));
      for (int j = 0; j <= k; j++) GGUFWriter::put<int32_t>(nested, 10 * k + j);
    }
    w.kv("nested", 9, nested);
    Bytes f32;
    for (float v : {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}) GGUFWriter::put(f32, v);
    w.tensors.push_back({"a", {3, 2}, 0, f32});  // GGUF dims (3, 2): 2 rows of 3
    w.tensors.push_back({"b", {1}, 0, GGUFWriter::enc<float>(-7.f)});
    auto g = gguf_of(w.build());
    CHECK(g.version == version);
    CHECK(g.metadata.size() == 15);
    CHECK(g.metadata.at("general.alignment").as_int() == 64);
    CHECK(g.metadata.at("u8").as_int() == 200);
    CHECK(g.metadata.at("u8").type == nn::GGUFValue::Type::UINT8);
    CHECK(g.metadata.at("i8").as_int() == -100);
    CHECK(g.metadata.at("u16").as_int() == 60000);
    CHECK(g.metadata.at("i16").as_int() == -30000);
    CHECK(g.metadata.at("u32").as_int() == 4000000000LL);
    CHECK(g.metadata.at("i32").as_int() == -2000000000);
    CHECK(g.metadata.at("f32").as_double() == double(0.1f));
    CHECK(g.metadata.at("bool").as_int() == 1);
    CHECK(g.metadata.at("general.name").as_string() == "tiny");
    CHECK(g.metadata.at("u64").as_int() == (1LL << 60));
    CHECK(g.metadata.at("i64").as_int() == -(1LL << 60));
    CHECK(g.metadata.at("f64").as_double() == 1.0 / 3);
    auto& toks = g.metadata.at("tokens").as_array();
    CHECK(g.metadata.at("tokens").elem_type == nn::GGUFValue::Type::STRING);
    REQUIRE(toks.size() == 3);
    CHECK(toks[2].as_string() == "token");
    CHECK(toks[1].as_string().empty());
    auto& nest = g.metadata.at("nested").as_array();
    REQUIRE(nest.size() == 2);
    CHECK(nest[1].as_array().size() == 2);
    CHECK(nest[1].as_array()[1].as_int() == 11);
    CHECK_ERROR(g.metadata.at("general.name").as_int(), "[gguf]", "string value is not an integer");
    CHECK(g.tensors.at("a").shape() == Shape{2, 3});
    CHECK(g.tensors.at("a").to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(g.tensors.at("b").to_vector<float>() == std::vector<float>{-7});
    CHECK(g.tensor_types.at("a") == "f32");
  }
}

TEST_CASE("GGUF dequantisation is exact: f16, bf16, q8_0, q4_0, q4_1, q4_K, q5_K, q6_K, on the host and by tensor ops") {
  GGUFWriter w;
  const uint16_t d_bits = 0x2E4B, m_bits = 0xB8CD;  // d ~ 0.0983, m ~ -0.6001 (non-trivial mantissas)
  double d = half_value(d_bits), m = half_value(m_bits);
  std::vector<float> want_f16, want_bf16, want_q8, want_q4_0, want_q4_1, want_q6;
  // f16: a few special values (subnormal, max, negative zero, infinity)
  Bytes f16;
  for (uint16_t h : {uint16_t(0x3C00), uint16_t(0x0001), uint16_t(0x7BFF), uint16_t(0x8000), uint16_t(0xFC00), d_bits}) {
    GGUFWriter::put(f16, h);
    want_f16.push_back(float(half_value(h)));
  }
  want_f16[4] = -INFINITY;
  Bytes bf16;
  for (uint16_t h : {uint16_t(0x3F80), uint16_t(0xC2F7)}) {  // 1.0, -123.5
    GGUFWriter::put(bf16, h);
    uint32_t u = uint32_t(h) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    want_bf16.push_back(v);
  }
  CHECK(want_bf16[1] == -123.5f);
  // q8_0: 2 blocks of 32
  Bytes q8;
  for (int blk = 0; blk < 2; blk++) {
    GGUFWriter::put(q8, d_bits);
    for (int j = 0; j < 32; j++) {
      int8_t q = int8_t(blk ? 127 - 9 * j : -128 + 5 * j);
      GGUFWriter::put(q8, q);
      want_q8.push_back(float(double(q) * d));
    }
  }
  // q4_0 and q4_1: element j of a block is nibble j; nibbles 0..15 are the low halves of bytes 0..15
  std::vector<int> nib(32);
  for (int j = 0; j < 32; j++) nib[size_t(j)] = (7 * j + 3) % 16;
  Bytes q40, q41;
  GGUFWriter::put(q40, d_bits);
  GGUFWriter::put(q41, d_bits);
  GGUFWriter::put(q41, m_bits);
  for (int j = 0; j < 16; j++) {
    uint8_t byte = uint8_t(nib[size_t(j)] | nib[size_t(j + 16)] << 4);
    q40.push_back(byte);
    q41.push_back(byte);
  }
  for (int j = 0; j < 32; j++) {
    want_q4_0.push_back(float((nib[size_t(j)] - 8) * d));
    want_q4_1.push_back(float(nib[size_t(j)] * d + m));  // exact in double, one rounding to float
  }
  // q6_K: 256 six-bit values L, 16 int8 scales (one per 16 elements), d; packed as ggml's quantize_row_q6_K
  std::vector<int> L(256);
  for (int i = 0; i < 256; i++) L[size_t(i)] = (37 * i + 11) % 64;
  int8_t sc[16];
  for (int i = 0; i < 16; i++) sc[i] = int8_t(i % 2 ? -3 * i - 1 : 5 * i + 2);
  uint8_t ql[128] = {}, qh[64] = {};
  for (int j = 0, half = 0; j < 256; j += 128, half++)
    for (int l = 0; l < 32; l++) {
      const int* Lj = &L[size_t(j)];
      ql[64 * half + l] = uint8_t((Lj[l] & 0xF) | (Lj[l + 64] & 0xF) << 4);
      ql[64 * half + l + 32] = uint8_t((Lj[l + 32] & 0xF) | (Lj[l + 96] & 0xF) << 4);
      qh[32 * half + l] = uint8_t((Lj[l] >> 4) | (Lj[l + 32] >> 4) << 2 | (Lj[l + 64] >> 4) << 4 | (Lj[l + 96] >> 4) << 6);
    }
  Bytes q6(ql, ql + 128);
  append(q6, qh, 64);
  append(q6, sc, 16);
  GGUFWriter::put(q6, d_bits);
  REQUIRE(q6.size() == 210);
  for (int i = 0; i < 256; i++) want_q6.push_back(float(d * sc[i / 16] * (L[size_t(i)] - 32)));

  // q4_K and q5_K: 8 sub-blocks of 32 with 6-bit scales S and mins M packed in 12 bytes, d and dmin (f16);
  // y = d * S * L - dmin * M (L: 4 or 5 bits); packed as ggml's quantize_row_q4_K_ref / q5_K_ref
  const uint16_t dmin_bits = 0x2A3D;  // ~ 0.0487
  double dmin = half_value(dmin_bits);
  int S[8], M[8];
  for (int j = 0; j < 8; j++) S[j] = (23 * j + 50) % 64, M[j] = (41 * j + 7) % 64;  // high bits set in several
  uint8_t scales[12] = {};
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      scales[j] = uint8_t(S[j]), scales[j + 4] = uint8_t(M[j]);
    } else {
      scales[j + 4] = uint8_t((S[j] & 0xF) | (M[j] & 0xF) << 4);
      scales[j - 4] |= uint8_t((S[j] >> 4) << 6);
      scales[j] |= uint8_t((M[j] >> 4) << 6);
    }
  }
  std::vector<int> L5(256);
  for (int i = 0; i < 256; i++) L5[size_t(i)] = (29 * i + 5) % 32;
  uint8_t q4k[128], q5l[128], q5h[32] = {};
  for (int n = 0; n < 256; n += 64)
    for (int l = 0; l < 32; l++) {
      int a = L5[size_t(n + l)], b = L5[size_t(n + l + 32)];
      q4k[n / 2 + l] = uint8_t((a & 0xF) | (b & 0xF) << 4);
      q5l[n / 2 + l] = q4k[n / 2 + l];
      q5h[l] |= uint8_t((a >> 4) << (n / 32) | (b >> 4) << (n / 32 + 1));
    }
  Bytes q4K, q5K;
  for (Bytes* b : {&q4K, &q5K}) {
    GGUFWriter::put(*b, d_bits);
    GGUFWriter::put(*b, dmin_bits);
    append(*b, scales, 12);
  }
  append(q4K, q4k, 128);
  append(q5K, q5h, 32);
  append(q5K, q5l, 128);
  REQUIRE(q4K.size() == 144);
  REQUIRE(q5K.size() == 176);
  std::vector<float> want_q4K, want_q5K;
  for (int i = 0; i < 256; i++) {
    int L = L5[size_t(i)], j = i / 32;
    want_q4K.push_back(float(d * S[j] * (L & 0xF) - dmin * M[j]));  // exact in double, one rounding to float
    want_q5K.push_back(float(d * S[j] * L - dmin * M[j]));
  }

  w.tensors.push_back({"f16", {6}, 1, f16});
  w.tensors.push_back({"bf16", {2}, 30, bf16});
  w.tensors.push_back({"q8_0", {32, 2}, 8, q8});
  w.tensors.push_back({"q4_0", {32}, 2, q40});
  w.tensors.push_back({"q4_1", {32}, 3, q41});
  w.tensors.push_back({"q6_K", {256}, 14, q6});
  w.tensors.push_back({"q4_K", {256}, 12, q4K});
  w.tensors.push_back({"q5_K", {256}, 13, q5K});
  Bytes file = w.build();
  std::string p = tmp_path("quant.gguf");
  write_bytes(p, file);
  auto g = nn::gguf_load(p);
  CHECK(bits(g.tensors.at("f16").to_vector<float>()) == bits(want_f16));
  CHECK(bits(g.tensors.at("bf16").to_vector<float>()) == bits(want_bf16));
  CHECK(g.tensors.at("q8_0").shape() == Shape{2, 32});
  CHECK(bits(g.tensors.at("q8_0").to_vector<float>()) == bits(want_q8));
  CHECK(bits(g.tensors.at("q4_0").to_vector<float>()) == bits(want_q4_0));
  CHECK(bits(g.tensors.at("q4_1").to_vector<float>()) == bits(want_q4_1));
  CHECK(bits(g.tensors.at("q6_K").to_vector<float>()) == bits(want_q6));
  CHECK(bits(g.tensors.at("q4_K").to_vector<float>()) == bits(want_q4K));
  CHECK(bits(g.tensors.at("q5_K").to_vector<float>()) == bits(want_q5K));
  CHECK(g.tensor_types.at("q6_K") == "q6_K");
  // kept as stored (on DISK, viewing the mapping), then dequantised by tensor ops on the default device: the same bits
  std::map<std::string, std::vector<float>> want = {{"f16", want_f16}, {"bf16", want_bf16}, {"q8_0", want_q8},
                                                    {"q4_0", want_q4_0}, {"q4_1", want_q4_1}, {"q6_K", want_q6},
                                                    {"q4_K", want_q4K}, {"q5_K", want_q5K}};
  auto k = nn::gguf_load(p, "DISK", false);
  CHECK(k.tensors.at("q8_0").dtype() == dtypes::uint8);
  CHECK(k.tensors.at("q8_0").shape() == Shape{2, 1, 34});
  CHECK(k.tensors.at("q6_K").shape() == Shape{1, 210});
  CHECK(k.tensors.at("f16").dtype() == dtypes::float16);
  CHECK(k.shapes.at("q8_0") == Shape{2, 32});
  CHECK(k.tensors.at("q4_K").device() == "DISK");
  for (const auto& entry : want) {
    const std::string name = entry.first;  // a plain variable: clang 14 cannot capture bindings (CAPTURE)
    CAPTURE(name);
    const std::string type = k.tensor_types.at(name);
    Tensor y = nn::ggml_dequantize(k.tensors.at(name).to(default_device()), type);
    CHECK(y.shape() == k.shapes.at(name));
    CHECK(bits(y.to_vector<float>()) == bits(entry.second));
  }
  CHECK_ERROR(nn::ggml_dequantize(k.tensors.at("q4_0").to(default_device()), "q8_0"), "q8_0 blocks must be uint8 (..., blocks, 34)");
  CHECK_ERROR(nn::ggml_dequantize(k.tensors.at("q4_0").to(default_device()), "q8_K"), "unknown type 'q8_K'");
  CHECK_ERROR(nn::ggml_dequantize(k.tensors.at("f16").to(default_device()), "bf16"), "a bf16 tensor must be bfloat16");
  CHECK_ERROR(nn::gguf_load(p, "DISK"), "dequantised tensors cannot be placed on DISK");
  // written back as they are: the same file bytes for the blocks
  std::map<std::string, Tensor> raw;
  std::map<std::string, std::string> types;
  for (const char* name : {"q6_K", "q4_K", "q5_K", "q4_1"}) raw[name] = k.tensors.at(name), types[name] = name;
  std::string p2 = tmp_path("quant_raw.gguf");
  nn::gguf_save(p2, {}, raw, types);
  auto g2 = nn::gguf_load(p2);
  for (const char* name : {"q6_K", "q4_K", "q5_K", "q4_1"}) CHECK(bits(g2.tensors.at(name).to_vector<float>()) == bits(want.at(name)));
  CHECK_ERROR(nn::gguf_save(p2, {}, {{"x", Tensor::zeros({2, 34}).cast(dtypes::uint8)}}, {{"x", "q4_K"}}),
              "q4_K blocks must be (..., blocks, 144)");
}

// The [start, end) address ranges of the process's mappings of `path` (/proc/self/maps).
std::vector<std::pair<uintptr_t, uintptr_t>> mappings_of(const std::string& path) {
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  std::ifstream f("/proc/self/maps");
  std::string line, canon = std::filesystem::canonical(path).string();
  while (std::getline(f, line))
    if (line.size() > canon.size() && line.compare(line.size() - canon.size(), canon.size(), canon) == 0)
      r.emplace_back(std::stoull(line.substr(0, line.find('-')), nullptr, 16), std::stoull(line.substr(line.find('-') + 1), nullptr, 16));
  return r;
}

TEST_CASE("gguf_load onto the CPU as stored views the file's mapping: no copy; a write copies its pages and never reaches the file") {
  std::string p = tmp_path("view.gguf");
  std::vector<float> wv(64 * 2);
  for (size_t i = 0; i < wv.size(); i++) wv[i] = float(int(i % 17) - 8) * 0.25f;
  nn::gguf_save(p, {}, {{"w", Tensor::from_vector(wv, {2, 64})}, {"q", Tensor::from_vector(wv, {2, 64})}}, {{"q", "q8_0"}});
  std::vector<float> q_want = nn::gguf_load(p).tensors.at("q").to_vector<float>();
  auto g = nn::gguf_load(p, "", false);
  Tensor w = g.tensors.at("w"), q = g.tensors.at("q");
  CHECK(w.device() == default_device());
  CHECK(q.dtype() == dtypes::uint8);
  auto maps = mappings_of(p);
  REQUIRE(!maps.empty());
  for (const Tensor* t : {&w, &q}) {
    const UOp* u = t->uop().get();
    while (u->op != Ops::BUFFER && u->nsrc() > 0) u = u->src(0);
    REQUIRE(u->op == Ops::BUFFER);
    auto addr = reinterpret_cast<uintptr_t>(buffer_of(u)->ptr());
    CHECK(std::any_of(maps.begin(), maps.end(), [&](const auto& m) { return addr >= m.first && addr < m.second; }));
  }
  CHECK(w.to_vector<float>() == wv);
  CHECK(bits(nn::ggml_dequantize(q, "q8_0").to_vector<float>()) == bits(q_want));
  // a write into the weight (an optimizer step, an assign) changes the tensor, not the file nor another load of it
  auto g2 = nn::gguf_load(p, "", false);
  w.assign(w * 2.0f).realize();
  std::vector<float> twice(wv.size());
  for (size_t i = 0; i < wv.size(); i++) twice[i] = wv[i] * 2.0f;
  CHECK(w.to_vector<float>() == twice);
  CHECK(g2.tensors.at("w").to_vector<float>() == wv);
  CHECK(nn::gguf_load(p, "DISK", false).tensors.at("w").to(default_device()).to_vector<float>() == wv);
}

TEST_CASE("GGUF q5_0, q5_1, iq4_nl, iq4_xs and mxfp4 blocks dequantise exactly, on the host and by tensor ops") {
  // blocks packed by hand as ggml-common.h lays them out; the expected values computed in double (each exact there)
  // and rounded once to float, as ggml's dequantize_row_* computes them in float
  const int8_t kv_nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  const int8_t kv_mx[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const uint16_t d_bits = 0x2E4B, m_bits = 0xB8CD;  // d ~ 0.0983, m ~ -0.6001
  double d = half_value(d_bits), m = half_value(m_bits);
  std::map<std::string, std::vector<float>> want;
  GGUFWriter w;
  // q5_0 / q5_1: element j = nibble j | bit j of qh (u32, little-endian) << 4
  std::vector<int> Q(32);
  for (int j = 0; j < 32; j++) Q[size_t(j)] = (13 * j + 7) % 32;
  uint32_t qh = 0;
  for (int j = 0; j < 32; j++) qh |= uint32_t(Q[size_t(j)] >> 4) << j;
  Bytes q50, q51;
  GGUFWriter::put(q50, d_bits);
  GGUFWriter::put(q51, d_bits);
  GGUFWriter::put(q51, m_bits);
  GGUFWriter::put(q50, qh);
  GGUFWriter::put(q51, qh);
  for (int j = 0; j < 16; j++) {
    uint8_t byte = uint8_t((Q[size_t(j)] & 15) | (Q[size_t(j + 16)] & 15) << 4);
    q50.push_back(byte);
    q51.push_back(byte);
  }
  REQUIRE(q50.size() == 22);
  REQUIRE(q51.size() == 24);
  for (int j = 0; j < 32; j++) {
    want["q5_0"].push_back(float((Q[size_t(j)] - 16) * d));
    want["q5_1"].push_back(float(Q[size_t(j)] * d + m));
  }
  // iq4_nl: y = d * kvalues_iq4nl[code]
  Bytes nl;
  GGUFWriter::put(nl, d_bits);
  std::vector<int> C(256);
  for (int i = 0; i < 256; i++) C[size_t(i)] = (5 * i + 1 + i / 16) % 16;
  for (int j = 0; j < 16; j++) nl.push_back(uint8_t(C[size_t(j)] | C[size_t(j + 16)] << 4));
  for (int j = 0; j < 32; j++) want["iq4_nl"].push_back(float(d * kv_nl[C[size_t(j)]]));
  // iq4_xs: 8 six-bit scales ls (low nibbles in scales_l[ib/2], high 2 bits in scales_h), y = (d * (ls - 32)) * kv
  int ls[8];
  uint8_t sl[4] = {};
  uint16_t sh = 0;
  for (int ib = 0; ib < 8; ib++) {
    ls[ib] = (19 * ib + 3) % 64;
    sl[ib / 2] = uint8_t(sl[ib / 2] | (ls[ib] & 15) << 4 * (ib % 2));
    sh = uint16_t(sh | (ls[ib] >> 4) << 2 * ib);
  }
  Bytes xs;
  GGUFWriter::put(xs, d_bits);
  GGUFWriter::put(xs, sh);
  append(xs, sl, 4);
  for (int ib = 0; ib < 8; ib++)
    for (int j = 0; j < 16; j++) xs.push_back(uint8_t(C[size_t(32 * ib + j)] | C[size_t(32 * ib + 16 + j)] << 4));
  REQUIRE(xs.size() == 136);
  for (int i = 0; i < 256; i++) want["iq4_xs"].push_back(float(d * (ls[i / 32] - 32) * kv_nl[C[size_t(i)]]));
  // mxfp4: 3 blocks with exponents e = 1 (the denormal scale 2^-127), 131, 254; y = kvalues_mxfp4[code] * 2^(e-128)
  Bytes mx;
  for (int b = 0; b < 3; b++) {
    int e = b == 0 ? 1 : b == 1 ? 131 : 254;
    mx.push_back(uint8_t(e));
    for (int j = 0; j < 16; j++) mx.push_back(uint8_t(C[size_t(32 * b + j)] | C[size_t(32 * b + 16 + j)] << 4));
    for (int j = 0; j < 32; j++) want["mxfp4"].push_back(float(std::ldexp(double(kv_mx[C[size_t(32 * b + j)]]), e - 128)));
  }
  CHECK(want["mxfp4"][1] == float(std::ldexp(double(kv_mx[C[1]]), -127)));
  w.tensors.push_back({"q5_0", {32}, 6, q50});
  w.tensors.push_back({"q5_1", {32}, 7, q51});
  w.tensors.push_back({"iq4_nl", {32}, 20, nl});
  w.tensors.push_back({"iq4_xs", {256}, 23, xs});
  w.tensors.push_back({"mxfp4", {32, 3}, 39, mx});
  std::string p = tmp_path("quant2.gguf");
  write_bytes(p, w.build());
  auto g = nn::gguf_load(p);
  auto k = nn::gguf_load(p, "DISK", false);
  CHECK(g.tensors.at("mxfp4").shape() == Shape{3, 32});
  CHECK(k.tensors.at("mxfp4").shape() == Shape{3, 1, 17});
  CHECK(k.tensors.at("iq4_xs").shape() == Shape{1, 136});
  check_blocks_exact(g, k, want, "quant2_raw.gguf");
  CHECK_ERROR(nn::ggml_dequantize(k.tensors.at("q5_0").to(default_device()), "q5_1"), "q5_1 blocks must be uint8 (..., blocks, 24)");
}

TEST_CASE("GGUF q1_0, q2_K and q3_K blocks dequantise exactly, on the host and by tensor ops") {
  // blocks packed by hand from chosen codes as ggml-common.h lays them out; expected values computed in double (each
  // product exact there) and rounded once to float, as ggml's dequantize_row_* computes them in float
  const uint16_t d_bits = 0x2E4B, m_bits = 0x38CD;  // d ~ 0.0983, dmin ~ 0.6001
  double d = half_value(d_bits), dmin = half_value(m_bits);
  std::map<std::string, std::vector<float>> want;
  // q1_0: 2 blocks of 128; element j of a block is bit j%8 of qs[j/8]; y = bit ? d : -d
  Bytes q1;
  for (int b = 0; b < 2; b++) {
    GGUFWriter::put(q1, d_bits);
    uint8_t qs[16] = {};
    for (int j = 0; j < 128; j++) {
      int bit = (7 * j + 3 * b + j / 5) % 3 == 0;
      qs[j / 8] = uint8_t(qs[j / 8] | bit << (j % 8));
      want["q1_0"].push_back(float(bit ? d : -d));
    }
    append(q1, qs, 16);
  }
  REQUIRE(q1.size() == 36);
  // q2_K / q3_K: 2 blocks of 256. Element e = 128h + 32j + 16k + l (sub-block s = 8h + 2j + k of 16) holds a 2-bit
  // code in bits 2j, 2j+1 of qs[32h + 16k + l]; q3_K adds a high bit, bit 4h + j of hmask[16k + l]
  Bytes q2, q3;
  for (int b = 0; b < 2; b++) {
    uint8_t qs[64] = {}, hmask[32] = {}, sc2[16], sc3[12] = {};
    int ls2[16], lm2[16], ls3[16], code[256], high[256];
    for (int s = 0; s < 16; s++) {
      ls2[s] = (5 * s + 3 + b) % 16, lm2[s] = (11 * s + 7 * b) % 16, ls3[s] = (37 * s + 13 + 9 * b) % 64;
      sc2[s] = uint8_t(ls2[s] | lm2[s] << 4);
      // q3_K's 6-bit scale s: low nibble in nibble s/8 of byte s%8, high 2 bits in bits 2(s/4) of byte 8 + s%4
      sc3[s % 8] = uint8_t(sc3[s % 8] | (ls3[s] & 15) << 4 * (s / 8));
      sc3[8 + s % 4] = uint8_t(sc3[8 + s % 4] | (ls3[s] >> 4) << 2 * (s / 4));
    }
    for (int h = 0; h < 2; h++)
      for (int j = 0; j < 4; j++)
        for (int k = 0; k < 2; k++)
          for (int l = 0; l < 16; l++) {
            int e = 128 * h + 32 * j + 16 * k + l;
            code[e] = (3 * e + b + e / 7) % 4, high[e] = (e * 5 + b) % 3 != 0;
            qs[32 * h + 16 * k + l] = uint8_t(qs[32 * h + 16 * k + l] | code[e] << 2 * j);
            hmask[16 * k + l] = uint8_t(hmask[16 * k + l] | high[e] << (4 * h + j));
          }
    for (int e = 0; e < 256; e++) {
      int s = (e / 128) * 8 + (e % 128) / 32 * 2 + (e % 32) / 16;
      want["q2_K"].push_back(float(d * ls2[s] * code[e] - dmin * lm2[s]));
      want["q3_K"].push_back(float(d * (ls3[s] - 32) * (code[e] - (high[e] ? 0 : 4))));
    }
    append(q2, sc2, 16);
    append(q2, qs, 64);
    GGUFWriter::put(q2, d_bits);
    GGUFWriter::put(q2, m_bits);
    append(q3, hmask, 32);
    append(q3, qs, 64);
    append(q3, sc3, 12);
    GGUFWriter::put(q3, d_bits);
  }
  REQUIRE(q2.size() == 2 * 84);
  REQUIRE(q3.size() == 2 * 110);
  CHECK(*std::min_element(want["q3_K"].begin(), want["q3_K"].end()) < 0);
  GGUFWriter w;
  w.tensors.push_back({"q1_0", {128, 2}, 41, q1});
  w.tensors.push_back({"q2_K", {256, 2}, 10, q2});
  w.tensors.push_back({"q3_K", {256, 2}, 11, q3});
  std::string p = tmp_path("quant3.gguf");
  write_bytes(p, w.build());
  auto g = nn::gguf_load(p);
  auto k = nn::gguf_load(p, "DISK", false);
  CHECK(g.tensors.at("q3_K").shape() == Shape{2, 256});
  CHECK(k.tensors.at("q1_0").shape() == Shape{2, 1, 18});
  CHECK(k.tensors.at("q2_K").shape() == Shape{2, 1, 84});
  check_blocks_exact(g, k, want, "quant3_raw.gguf");
  CHECK_ERROR(nn::ggml_dequantize(k.tensors.at("q2_K").to(default_device()), "q3_K"), "q3_K blocks must be uint8 (..., blocks, 110)");
}

TEST_CASE("GGUF IQ blocks (iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s) dequantise exactly") {
  // blocks packed by hand from chosen grid indices, sign bits and scales as ggml-common.h lays them out; magnitudes
  // from ggml's grids (gguf_grids.hpp, generated and checked against tinygrad's copy by scripts/gen_gguf_grids.py);
  // the 7-bit sign codes expanded here by their definition (bit 7 = parity), not by ksigns_iq2xs; expected values
  // computed in double (each exact there) and rounded once
  namespace G = nn::ggml_grids;
  const uint16_t d_bits = 0x2E4B;  // d ~ 0.0983
  double d = half_value(d_bits);
  auto sign_byte = [](int code) { return code | (__builtin_popcount(unsigned(code)) % 2) << 7; };
  auto u8 = [](uint64_t g, int j) { return double((g >> 8 * j) & 0xFF); };
  auto s8 = [](uint64_t g, int j) { return double(int8_t(uint8_t(g >> 8 * j))); };
  auto sgn = [](int bits, int j) { return (bits >> j) & 1 ? -1.0 : 1.0; };
  auto pick = [](int i, int mod) { return int((uint32_t(i) * 2654435761u >> 7) % uint32_t(mod)); };
  std::map<std::string, std::vector<float>> want;
  std::map<std::string, Bytes> blocks;
  {  // iq2_xxs: per 32: u32 of 4 grid indices (bytes), u32 of 4 7-bit sign codes | 4-bit scale << 28; db = d(0.5+s)/4
    Bytes b;
    GGUFWriter::put(b, d_bits);
    for (int ib = 0; ib < 8; ib++) {
      int sc = pick(ib, 16);
      uint32_t idx = 0, codes = uint32_t(sc) << 28;
      for (int l = 0; l < 4; l++) {
        int gi = pick(4 * ib + l + 100, 256), code = pick(4 * ib + l + 200, 128);
        idx |= uint32_t(gi) << 8 * l, codes |= uint32_t(code) << 7 * l;
        for (int j = 0; j < 8; j++)
          want["iq2_xxs"].push_back(float(d * (0.5 + sc) * 0.25 * u8(G::iq2xxs_grid[gi], j) * sgn(sign_byte(code), j)));
      }
      GGUFWriter::put(b, idx);
      GGUFWriter::put(b, codes);
    }
    blocks["iq2_xxs"] = b;
  }
  {  // iq2_xs: 32 u16 (9-bit grid index | 7-bit sign code << 9), then 8 bytes of two 4-bit scales (groups 0-1, 2-3)
    Bytes b, scales;
    GGUFWriter::put(b, d_bits);
    for (int ib = 0; ib < 8; ib++) {
      int s0 = pick(ib + 300, 16), s1 = pick(ib + 310, 16);
      scales.push_back(uint8_t(s0 | s1 << 4));
      for (int l = 0; l < 4; l++) {
        int gi = pick(4 * ib + l + 400, 512), code = pick(4 * ib + l + 500, 128);
        GGUFWriter::put(b, uint16_t(gi | code << 9));
        for (int j = 0; j < 8; j++)
          want["iq2_xs"].push_back(float(d * (0.5 + (l < 2 ? s0 : s1)) * 0.25 * u8(G::iq2xs_grid[gi], j) * sgn(sign_byte(code), j)));
      }
    }
    append(b, scales.data(), 8);
    blocks["iq2_xs"] = b;
  }
  {  // iq2_s: qs[32] (index low 8 bits), signs[32] (a bit per element), qh[8] (2 high index bits per group), scales[8]
    uint8_t qs[32], signs[32], qh[8] = {}, scales[8];
    for (int ib = 0; ib < 8; ib++) {
      int s0 = pick(ib + 600, 16), s1 = pick(ib + 610, 16);
      scales[ib] = uint8_t(s0 | s1 << 4);
      for (int l = 0; l < 4; l++) {
        int gi = pick(4 * ib + l + 700, 1024), sg = pick(4 * ib + l + 800, 256);
        qs[4 * ib + l] = uint8_t(gi & 0xFF), signs[4 * ib + l] = uint8_t(sg);
        qh[ib] = uint8_t(qh[ib] | (gi >> 8) << 2 * l);
        for (int j = 0; j < 8; j++)
          want["iq2_s"].push_back(float(d * (0.5 + (l < 2 ? s0 : s1)) * 0.25 * u8(G::iq2s_grid[gi], j) * sgn(sg, j)));
      }
    }
    Bytes b;
    GGUFWriter::put(b, d_bits);
    for (const uint8_t* part : {qs, signs}) append(b, part, 32);
    append(b, qh, 8);
    append(b, scales, 8);
    blocks["iq2_s"] = b;
  }
  {  // iq3_xxs: qs[64] (grid indices, 4 values each; 2 per 8 elements), per 32 a u32 of 4 sign codes | scale << 28
    uint8_t qs[64];
    Bytes tail;
    for (int ib = 0; ib < 8; ib++) {
      int sc = pick(ib + 900, 16);
      uint32_t codes = uint32_t(sc) << 28;
      for (int l = 0; l < 4; l++) {
        int g1 = pick(8 * ib + 2 * l + 1000, 256), g2 = pick(8 * ib + 2 * l + 1001, 256), code = pick(4 * ib + l + 1100, 128);
        qs[8 * ib + 2 * l] = uint8_t(g1), qs[8 * ib + 2 * l + 1] = uint8_t(g2);
        codes |= uint32_t(code) << 7 * l;
        for (int j = 0; j < 8; j++)
          want["iq3_xxs"].push_back(float(d * (0.5 + sc) * 0.5 * u8(G::iq3xxs_grid[j < 4 ? g1 : g2], j % 4) * sgn(sign_byte(code), j)));
      }
      GGUFWriter::put(tail, codes);
    }
    Bytes b;
    GGUFWriter::put(b, d_bits);
    append(b, qs, 64);
    append(b, tail.data(), tail.size());
    blocks["iq3_xxs"] = b;
  }
  {  // iq3_s: qs[64] (index low bits), qh[8] (bit 2l / 2l+1 of qh[ib]: 9th bit of index 2l / 2l+1), signs[32],
     // scales[4] (4-bit s per 32, db = d(1 + 2s))
    uint8_t qs[64], qh[8] = {}, signs[32], scales[4] = {};
    for (int ib = 0; ib < 8; ib++) {
      int sc = pick(ib + 1200, 16);
      scales[ib / 2] = uint8_t(scales[ib / 2] | sc << 4 * (ib % 2));
      for (int l = 0; l < 4; l++) {
        int g1 = pick(8 * ib + 2 * l + 1300, 512), g2 = pick(8 * ib + 2 * l + 1301, 512), sg = pick(4 * ib + l + 1400, 256);
        qs[8 * ib + 2 * l] = uint8_t(g1 & 0xFF), qs[8 * ib + 2 * l + 1] = uint8_t(g2 & 0xFF), signs[4 * ib + l] = uint8_t(sg);
        qh[ib] = uint8_t(qh[ib] | (g1 >> 8) << 2 * l | (g2 >> 8) << (2 * l + 1));
        for (int j = 0; j < 8; j++)
          want["iq3_s"].push_back(float(d * (1 + 2 * sc) * u8(G::iq3s_grid[j < 4 ? g1 : g2], j % 4) * sgn(sg, j)));
      }
    }
    Bytes b;
    GGUFWriter::put(b, d_bits);
    append(b, qs, 64);
    append(b, qh, 8);
    append(b, signs, 32);
    append(b, scales, 4);
    blocks["iq3_s"] = b;
  }
  {  // iq1_s: qs[32] (index low bits), qh[8] u16: 3 high bits per group of 8 (bits 3l), scale s (bits 12-14), the
     // sign of delta (bit 15); y = d(2s + 1) * (grid value + delta), delta = +-1/8
    uint8_t qs[32];
    Bytes b, hs;
    for (int ib = 0; ib < 8; ib++) {
      int sc = pick(ib + 1500, 8), neg = pick(ib + 1510, 2);
      uint16_t qh = uint16_t(sc << 12 | neg << 15);
      for (int l = 0; l < 4; l++) {
        int gi = pick(4 * ib + l + 1600, 2048);
        qs[4 * ib + l] = uint8_t(gi & 0xFF);
        qh = uint16_t(qh | (gi >> 8) << 3 * l);
        for (int j = 0; j < 8; j++) want["iq1_s"].push_back(float(d * (2 * sc + 1) * (s8(G::iq1s_grid[gi], j) + (neg ? -0.125 : 0.125))));
      }
      GGUFWriter::put(hs, qh);
    }
    GGUFWriter::put(b, d_bits);
    append(b, qs, 32);
    append(b, hs.data(), hs.size());
    blocks["iq1_s"] = b;
  }
  {  // iq1_m: qs[32], qh[16] (per group of 8: 3 high index bits and the sign of delta, a nibble each), scales as 4 u16:
     // 3-bit scales (bits 6(ib%2) and +3 of u16 ib/2: groups 0-1 and 2-3 of 32), d's f16 bits in their top nibbles
    const uint16_t dm_bits = 0x3A21;
    double dm = half_value(dm_bits);
    uint8_t qs[32], qh[16] = {};
    uint16_t sc[4] = {};
    for (int q = 0; q < 4; q++) sc[q] = uint16_t(((dm_bits >> 4 * q) & 0xF) << 12);
    for (int ib = 0; ib < 8; ib++) {
      int s1 = pick(ib + 1700, 8), s2 = pick(ib + 1710, 8);
      sc[ib / 2] = uint16_t(sc[ib / 2] | s1 << 6 * (ib % 2) | s2 << (6 * (ib % 2) + 3));
      for (int l = 0; l < 4; l++) {
        int gi = pick(4 * ib + l + 1800, 2048), neg = pick(4 * ib + l + 1900, 2);
        qs[4 * ib + l] = uint8_t(gi & 0xFF);
        qh[2 * ib + l / 2] = uint8_t(qh[2 * ib + l / 2] | ((gi >> 8) | neg << 3) << 4 * (l % 2));
        for (int j = 0; j < 8; j++)
          want["iq1_m"].push_back(float(dm * (2 * (l < 2 ? s1 : s2) + 1) * (s8(G::iq1s_grid[gi], j) + (neg ? -0.125 : 0.125))));
      }
    }
    Bytes b;
    append(b, qs, 32);
    append(b, qh, 16);
    for (uint16_t v : sc) GGUFWriter::put(b, v);
    blocks["iq1_m"] = b;
  }
  const std::map<std::string, std::pair<uint32_t, size_t>> code = {{"iq2_xxs", {16, 66}}, {"iq2_xs", {17, 74}},
      {"iq3_xxs", {18, 98}}, {"iq1_s", {19, 50}}, {"iq3_s", {21, 110}}, {"iq2_s", {22, 82}}, {"iq1_m", {29, 56}}};
  GGUFWriter w;
  for (const auto& entry : blocks) {
    const std::string name = entry.first;
    CAPTURE(name);
    CHECK(entry.second.size() == code.at(name).second);
    CHECK(want.at(name).size() == 256);
    w.tensors.push_back({name, {256}, code.at(name).first, entry.second});
  }
  std::string p = tmp_path("quant_iq.gguf");
  write_bytes(p, w.build());
  auto g = nn::gguf_load(p);
  auto k = nn::gguf_load(p, "DISK", false);
  for (const auto& entry : want) {
    const std::string name = entry.first;
    CAPTURE(name);
    CHECK(g.tensor_types.at(name) == name);
    CHECK(bits(g.tensors.at(name).to_vector<float>()) == bits(entry.second));
    CHECK(k.tensors.at(name).shape() == Shape{1, int64_t(code.at(name).second)});
    // one byte short: an error naming the file
    Bytes one;
    GGUFWriter t;
    t.tensors.push_back({name, {256}, code.at(name).first, Bytes(blocks.at(name).begin(), blocks.at(name).end() - 1)});
    one = t.build();
    CHECK_ERROR(gguf_of(one), "mem.gguf", "lies past the end of the file");
  }
  CHECK(bits(g.tensors.at("iq1_s").to_vector<float>()) != bits(g.tensors.at("iq1_m").to_vector<float>()));
  CHECK_ERROR(nn::ggml_dequantize(k.tensors.at("iq2_s").to(default_device()), "iq2_s"), "[ggml_dequantize] iq2_s",
              "dequantised on load only");
  // kept as stored, they are written back as they are
  std::map<std::string, Tensor> raw;
  std::map<std::string, std::string> types;
  for (const auto& entry : blocks) raw[entry.first] = k.tensors.at(entry.first), types[entry.first] = entry.first;
  std::string p2 = tmp_path("quant_iq_raw.gguf");
  nn::gguf_save(p2, {}, raw, types);
  auto g2 = nn::gguf_load(p2);
  for (const auto& entry : want) CHECK(bits(g2.tensors.at(entry.first).to_vector<float>()) == bits(entry.second));
}

TEST_CASE("GGUF int8/16/32/64 and float64 tensors keep their dtype and values") {
  GGUFWriter w;
  std::vector<int8_t> i8 = {-128, -1, 0, 127};
  std::vector<int16_t> i16 = {-32768, 12345, -2, 32767};
  std::vector<int32_t> i32 = {INT32_MIN, 16777217, -7, INT32_MAX};
  std::vector<int64_t> i64 = {INT64_MIN, (int64_t(1) << 53) + 1, -3, INT64_MAX};
  std::vector<double> f64 = {0.1, -1e300, 5e-324, 1.0 / 3};
  auto bytes_of = [](const auto& v) {
    Bytes b;
    append(b, v.data(), v.size() * sizeof(v[0]));
    return b;
  };
  w.tensors.push_back({"i8", {4}, 24, bytes_of(i8)});
  w.tensors.push_back({"i16", {2, 2}, 25, bytes_of(i16)});
  w.tensors.push_back({"i32", {4}, 26, bytes_of(i32)});
  w.tensors.push_back({"i64", {2, 2}, 27, bytes_of(i64)});
  w.tensors.push_back({"f64", {4}, 28, bytes_of(f64)});
  std::string p = tmp_path("native.gguf");
  write_bytes(p, w.build());
  for (bool deq : {true, false}) {
    CAPTURE(deq);
    auto g = nn::gguf_load(p, "", deq);
    CHECK(g.tensor_types.at("i64") == "i64");
    CHECK(g.tensors.at("i8").dtype() == dtypes::int8);
    CHECK(g.tensors.at("i16").shape() == Shape{2, 2});
    CHECK(g.tensors.at("i8").to_vector<int8_t>() == i8);
    CHECK(g.tensors.at("i16").to_vector<int16_t>() == i16);
    CHECK(g.tensors.at("i32").to_vector<int32_t>() == i32);
    CHECK(g.tensors.at("i64").to_vector<int64_t>() == i64);
    CHECK(g.tensors.at("f64").to_vector<double>() == f64);
  }
  auto k = nn::gguf_load(p, "DISK", false);
  CHECK(k.tensors.at("i64").to(default_device()).to_vector<int64_t>() == i64);
  CHECK(nn::ggml_dequantize(k.tensors.at("i32").to(default_device()), "i32").to_vector<float>() ==
        std::vector<float>{-2147483648.f, 16777216.f, -7.f, 2147483648.f});
  CHECK(nn::ggml_dequantize(k.tensors.at("f64").to(default_device()), "f64").to_vector<float>() ==
        std::vector<float>{0.1f, -INFINITY, 0.f, float(1.0 / 3)});
  CHECK_ERROR(nn::ggml_dequantize(k.tensors.at("i8").to(default_device()), "i16"), "a i16 tensor must be int16");
  // written back (from DISK views and from a computed tensor) and read again: the same elements
  std::map<std::string, Tensor> back;
  std::map<std::string, std::string> types;
  for (const char* name : {"i8", "i16", "i32", "i64", "f64"}) back[name] = k.tensors.at(name), types[name] = name;
  back["i32"] = Tensor::from_vector(i32, {4}) + 0;
  std::string p2 = tmp_path("native_back.gguf");
  nn::gguf_save(p2, {}, back, types);
  auto g2 = nn::gguf_load(p2);
  CHECK(g2.tensors.at("i16").shape() == Shape{2, 2});
  CHECK(g2.tensors.at("i8").to_vector<int8_t>() == i8);
  CHECK(g2.tensors.at("i16").to_vector<int16_t>() == i16);
  CHECK(g2.tensors.at("i32").to_vector<int32_t>() == i32);
  CHECK(g2.tensors.at("i64").to_vector<int64_t>() == i64);
  CHECK(g2.tensors.at("f64").to_vector<double>() == f64);
  CHECK_ERROR(nn::gguf_save(p2, {}, {{"x", Tensor::zeros({2})}}, {{"x", "i32"}}), "tensor 'x' is float32; type i32 stores int32 tensors");
}

TEST_CASE("a truncated tensor of each newly read GGUF type is an error naming the file") {
  struct Case {
    uint32_t type;
    uint64_t elems, bytes;
  };
  for (Case c : {Case{41, 128, 18}, Case{10, 256, 84}, Case{11, 256, 110}, Case{24, 4, 4}, Case{25, 4, 8},
                 Case{26, 4, 16}, Case{27, 4, 32}, Case{28, 4, 32}}) {
    CAPTURE(c.type);
    GGUFWriter w;
    w.tensors.push_back({"t", {c.elems}, c.type, Bytes(size_t(c.bytes), 1)});
    Bytes full = w.build();
    CHECK_NOTHROW(gguf_of(full));
    Bytes cut(full.begin(), full.end() - 1);
    CHECK_ERROR(gguf_of(cut), "mem.gguf", "tensor 't'", "lies past the end of the file");
    CHECK_ERROR(nn::gguf_load_bytes(cut.data(), cut.size(), "mem.gguf", "DISK", false), "mem.gguf", "lies past the end");
  }
}

TEST_CASE("gguf_save writes metadata and f32/f16/q8_0/q4_0 tensors that gguf_load reads back") {
  using G = nn::GGUFValue;
  std::map<std::string, G> md = {{"general.architecture", G::str("llama")}, {"a.u32", G::u32(7)}, {"a.i32", G::i32(-5)},
                                 {"a.u64", G::u64(1ULL << 40)}, {"a.f32", G::f32(0.5f)}, {"a.bool", G::boolean(true)},
                                 {"a.strs", G::strings({"x", "\xE2\x96\x81y", ""})}, {"a.floats", G::floats({1.5f, -2.f})},
                                 {"a.ints", G::ints({3, -4})}};
  std::vector<float> xs(2 * 3 * 32), blk(64);
  for (size_t i = 0; i < xs.size(); i++) xs[i] = std::sin(float(i)) * 3.f;
  for (size_t i = 0; i < blk.size(); i++) blk[i] = (float(i % 32) - 16.f) * 0.25f * (i < 32 ? 1.f : -0.01f);
  std::vector<float> halves = {0.5f, -1.25f, 1024.f, 0.f};
  std::map<std::string, Tensor> ts = {{"f32", Tensor::from_vector(xs, {2, 3, 32})}, {"f16", Tensor::from_vector(halves, {2, 2})},
                                      {"q8", Tensor::from_vector(blk, {2, 32})}, {"q4", Tensor::from_vector(blk, {2, 32})}};
  std::string p = tmp_path("saved.gguf");
  nn::gguf_save(p, md, ts, {{"f16", "f16"}, {"q8", "q8_0"}, {"q4", "q4_0"}});
  auto g = nn::gguf_load(p);
  CHECK(g.version == 3);
  CHECK(g.metadata.at("general.alignment").as_int() == 32);
  CHECK(g.metadata.at("general.architecture").as_string() == "llama");
  CHECK(g.metadata.at("a.u32").type == G::Type::UINT32);
  CHECK(g.metadata.at("a.u32").as_int() == 7);
  CHECK(g.metadata.at("a.i32").as_int() == -5);
  CHECK(g.metadata.at("a.u64").as_int() == int64_t(1) << 40);
  CHECK(g.metadata.at("a.f32").as_double() == 0.5);
  CHECK(g.metadata.at("a.bool").as_int() == 1);
  CHECK(g.metadata.at("a.strs").as_array().size() == 3);
  CHECK(g.metadata.at("a.strs").as_array()[1].as_string() == "\xE2\x96\x81y");
  CHECK(g.metadata.at("a.floats").as_array()[1].as_double() == -2.0);
  CHECK(g.metadata.at("a.ints").elem_type == G::Type::INT32);
  CHECK(g.metadata.at("a.ints").as_array()[1].as_int() == -4);
  CHECK(g.tensors.at("f32").shape() == Shape{2, 3, 32});
  CHECK(g.tensors.at("f32").to_vector<float>() == xs);
  CHECK(g.tensors.at("f16").to_vector<float>() == halves);
  CHECK(g.tensor_types.at("q8") == "q8_0");
  CHECK(g.tensor_types.at("q4") == "q4_0");
  // ggml's reference quantisers: q8_0 d = max|x|/127 (as f16), q = round(x/d); q4_0 d = (the value of largest
  // magnitude)/-8, q = min(15, int(x/d + 8.5)); the error is at most d/2 (q4_0: d, where the clamp cuts -max)
  std::vector<float> q8 = g.tensors.at("q8").to_vector<float>(), q4 = g.tensors.at("q4").to_vector<float>();
  for (int b = 0; b < 2; b++) {
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; j++)
      if (std::fabs(blk[size_t(32 * b + j)]) > amax) amax = std::fabs(blk[size_t(32 * b + j)]), mx = blk[size_t(32 * b + j)];
    float d8 = half_bits_to_float(float_to_half_bits(amax / 127)), d4 = half_bits_to_float(float_to_half_bits(mx / -8));
    for (int j = 0; j < 32; j++) {
      size_t i = size_t(32 * b + j);
      CAPTURE(i);
      CHECK(q8[i] == std::roundf(blk[i] * (1 / (amax / 127))) * d8);
      CHECK(std::fabs(q8[i] - blk[i]) <= 0.5f * d8 * 1.01f);
      CHECK(std::fabs(q4[i] - blk[i]) <= std::fabs(d4) * 1.01f);
    }
  }
  CHECK(q4[0] == blk[0]);  // the value of largest magnitude is exact: -8 * d
  CHECK_ERROR(nn::gguf_save(p, md, ts, {{"q8", "q5_1"}}), "[gguf_save]", p.c_str(), "tensor 'q8' has type 'q5_1'");
  CHECK_ERROR(nn::gguf_save(p, md, ts, {{"nope", "f16"}}), "a type is given for 'nope'");
  CHECK_ERROR(nn::gguf_save(p, md, {{"odd", Tensor::zeros({2, 20})}}, {{"odd", "q8_0"}}), "(2, 20) cannot be stored as q8_0",
              "multiple of 32");
  CHECK_ERROR(nn::gguf_save(p, {{"general.alignment", G::u32(64)}}, ts), "general.alignment is set by the writer");
  CHECK(nn::gguf_load(p).tensors.size() == 4);  // the failed saves left the file as it was
}

TEST_CASE("malformed GGUF files are errors naming the file and the problem") {
  auto base = [] {
    GGUFWriter w;
    w.kv("general.name", 8, GGUFWriter::enc_str("x"));
    w.tensors.push_back({"t", {2}, 0, Bytes(8, 0)});
    return w;
  };
  CHECK_ERROR(gguf_of(Bytes{'G', 'G'}), "mem.gguf", "ends inside the magic");
  CHECK_ERROR(gguf_of(Bytes{'G', 'G', 'U', 'X', 3, 0, 0, 0}), "mem.gguf", "not a GGUF file");
  {
    GGUFWriter w = base();
    w.version = 1;
    CHECK_ERROR(gguf_of(w.build()), "version 1 is not supported");
  }
  Bytes good = base().build();
  CHECK(gguf_of(good).tensors.size() == 1);
  auto patched = [&](size_t at, uint64_t v, int n) {
    Bytes b = good;
    std::memcpy(&b[at], &v, size_t(n));
    return b;
  };
  CHECK_ERROR(gguf_of(patched(8, 1ULL << 62, 8)), "claims 4611686018427387904 tensors");
  CHECK_ERROR(gguf_of(patched(16, 1ULL << 62, 8)), "metadata entries, more than the file can hold");
  CHECK_ERROR(gguf_of(patched(24, 1ULL << 40, 8)), "metadata key 0", "past the end of the file");
  CHECK_ERROR(gguf_of(patched(24 + 8 + 12, 99, 4)), "'general.name' has unknown value type 99");
  {
    GGUFWriter w = base();
    Bytes a;
    GGUFWriter::put<uint32_t>(a, 4);
    GGUFWriter::put<uint64_t>(a, 1ULL << 61);
    w.kv("arr", 9, a);
    CHECK_ERROR(gguf_of(w.build()), "array 'arr' claims 2305843009213693952 uint32 elements");
  }
  {
    GGUFWriter w = base();
    Bytes a;
    for (int i = 0; i < 6; i++) GGUFWriter::put<uint32_t>(a, 9), GGUFWriter::put<uint64_t>(a, 1);
    w.kv("deep", 9, a);
    CHECK_ERROR(gguf_of(w.build()), "nested more than 4 deep");
  }
  {
    GGUFWriter w = base();
    w.kv("b", 7, GGUFWriter::enc<uint8_t>(2));
    CHECK_ERROR(gguf_of(w.build()), "bool value of 'b' is 2");
  }
  {
    GGUFWriter w = base();
    w.kv("general.name", 8, GGUFWriter::enc_str("y"));
    CHECK_ERROR(gguf_of(w.build()), "'general.name' appears twice");
  }
  {
    GGUFWriter w = base();
    w.kv("general.alignment", 4, GGUFWriter::enc<uint32_t>(24));
    CHECK_ERROR(gguf_of(w.build()), "general.alignment 24 is not a power of two");
    w.kvs.pop_back();
    w.kv("general.alignment", 10, GGUFWriter::enc<uint64_t>(32));
    CHECK_ERROR(gguf_of(w.build()), "general.alignment must be a uint32");
  }
  {
    GGUFWriter w = base();
    w.tensors[0].dims = {1, 1, 1, 1, 2};
    CHECK_ERROR(gguf_of(w.build()), "tensor 't' has 5 dimensions");
    w.tensors[0].dims = {1ULL << 32, 1ULL << 32};
    CHECK_ERROR(gguf_of(w.build()), "tensor 't' has too many elements");
    w.tensors[0].dims = {4};
    CHECK_ERROR(gguf_of(w.build()), "'t'", "lies past the end of the file");
    w.tensors[0].dims = {2};
    w.tensors[0].type = 9;
    CHECK_ERROR(gguf_of(w.build()), "type q8_1, which tg does not dequantise");
    w.tensors[0].type = 99;
    CHECK_ERROR(gguf_of(w.build()), "unknown ggml type 99");
    w.tensors[0].type = 12;  // q4_K: blocks of 256 elements, 144 bytes
    CHECK_ERROR(gguf_of(w.build()), "'t' (q4_K) has a first dimension of 2, not a multiple of the block size 256");
    w.tensors[0].dims = {256};
    CHECK_ERROR(gguf_of(w.build()), "tensor 't' (256 q4_K elements) is larger than the file");
    Bytes img = w.build();
    CHECK_ERROR(nn::gguf_load_bytes(img.data(), img.size(), "mem.gguf", "DISK", false), "mem.gguf",
                "tensor 't' (256 q4_K elements) is larger than the file");
    w.tensors[0].dims = {2};
    w.tensors[0].type = 8;  // q8_0 needs a multiple of 32
    CHECK_ERROR(gguf_of(w.build()), "not a multiple of the block size 32");
  }
  {
    GGUFWriter w = base();
    w.tensors.push_back({"t", {2}, 0, Bytes(8, 0)});
    CHECK_ERROR(gguf_of(w.build()), "tensor 't' appears twice");
  }
  {
    GGUFWriter w = base();
    w.tensors.push_back({"u", {2}, 0, Bytes(8, 0)});
    Bytes b = w.build();
    // the offset field of 'u' (the last tensor info) holds 32; 0 makes 'u' overlap 't'
    size_t info = 8 + 1 + 4 + 8 + 4 + 8;  // name length, name, dimension count, one dimension, type, offset
    size_t pos = 24 + w.kvs[0].size() + info + info - 8;
    uint64_t at;
    std::memcpy(&at, &b[pos], 8);
    REQUIRE(at == 32);
    Bytes o = b;
    std::memset(&o[pos], 0, 8);
    CHECK_ERROR(gguf_of(o), "tensors 't' and 'u' overlap");
    uint64_t mis = 4;
    std::memcpy(&o[pos], &mis, 8);
    CHECK_ERROR(gguf_of(o), "starts at offset 4, not a multiple of the alignment 32");
    uint64_t far = 1ULL << 62;
    std::memcpy(&o[pos], &far, 8);
    CHECK_ERROR(gguf_of(o), "'u'", "lies past the end");
  }
  CHECK_ERROR(nn::gguf_load(tmp_path("none.gguf")), "none.gguf", "cannot open");
  // every truncation of a valid file is refused
  for (size_t n = 0; n < good.size(); n++) {
    CAPTURE(n);
    CHECK_THROWS_AS(gguf_of(Bytes(good.begin(), good.begin() + int64_t(n))), Error);
  }
}

// ================================================================ IDX

// ---- torch.save files written by hand (the libtorch comparison is tests/torch/torch_state.cpp)

// A protocol-2 pickle of {name: torch._utils._rebuild_tensor_v2(storage, offset, sizes, strides, False, OrderedDict())}
// for each tensor; the storage is the persistent id ('storage', torch.<type>, key, 'cpu', numel), memoised per key
// so that tensors of one key share it, as torch writes it.
struct PtTensor {
  std::string name, key, type;
  int64_t numel, offset;
  std::vector<int64_t> sizes, strides;
};
Bytes pt_pickle(const std::vector<PtTensor>& ts, bool legacy = false) {
  Bytes o = {0x80, 2, '}'};
  auto str = [&](const std::string& x) {
    o.push_back('X');
    GGUFWriter::put<uint32_t>(o, uint32_t(x.size()));
    append(o, x.data(), x.size());
  };
  auto global = [&](const std::string& g) {
    o.push_back('c');
    append(o, g.data(), g.size());
  };
  auto integer = [&](int64_t v) {
    o.push_back('J');
    GGUFWriter::put<int32_t>(o, int32_t(v));
  };
  std::map<std::string, uint8_t> memo;
  o.push_back('(');
  for (const PtTensor& t : ts) {
    str(t.name);
    global("torch._utils\n_rebuild_tensor_v2\n");
    o.push_back('(');
    if (memo.count(t.key)) {
      o.push_back('h');
      o.push_back(memo[t.key]);
    } else {
      o.push_back('(');
      str("storage");
      global("torch\n" + t.type + "\n");
      str(t.key);
      str("cpu");
      integer(t.numel);
      if (legacy) o.push_back('N');  // the legacy format's view metadata
      o.push_back('t');
      o.push_back('Q');
      memo[t.key] = uint8_t(memo.size());
      o.push_back('q');
      o.push_back(memo[t.key]);
    }
    integer(t.offset);
    o.push_back('(');
    for (int64_t v : t.sizes) integer(v);
    o.push_back('t');
    o.push_back('(');
    for (int64_t v : t.strides) integer(v);
    o.push_back('t');
    o.push_back(0x89);
    global("collections\nOrderedDict\n");
    o.push_back(')');
    o.push_back('R');
    o.push_back('t');
    o.push_back('R');
  }
  o.push_back('u');
  o.push_back('.');
  return o;
}
// A zip of stored entries, as torch.save writes them (no alignment padding: the reader must not need it).
Bytes zip_of(const std::vector<std::pair<std::string, Bytes>>& entries) {
  Bytes z, cd;
  for (const auto& entry : entries) {
    const std::string& name = entry.first;  // plain references: clang 14 cannot capture bindings in the lambda
    const Bytes& data = entry.second;
    uint32_t crc = uint32_t(crc32(0L, data.data(), uInt(data.size())));
    uint32_t off = uint32_t(z.size());
    auto header = [&](Bytes& o, bool central) {
      GGUFWriter::put<uint32_t>(o, central ? 0x02014b50 : 0x04034b50);
      if (central) GGUFWriter::put<uint16_t>(o, 20);
      for (uint16_t v : {uint16_t(20), uint16_t(0), uint16_t(0), uint16_t(0), uint16_t(0)}) GGUFWriter::put(o, v);
      GGUFWriter::put(o, crc);
      GGUFWriter::put<uint32_t>(o, uint32_t(data.size()));
      GGUFWriter::put<uint32_t>(o, uint32_t(data.size()));
      GGUFWriter::put<uint16_t>(o, uint16_t(name.size()));
      GGUFWriter::put<uint16_t>(o, 0);
      if (central) {
        for (uint16_t v : {uint16_t(0), uint16_t(0), uint16_t(0)}) GGUFWriter::put(o, v);
        GGUFWriter::put<uint32_t>(o, 0);
        GGUFWriter::put(o, off);
      }
      append(o, name.data(), name.size());
    };
    header(z, false);
    append(z, data.data(), data.size());
    header(cd, true);
  }
  uint32_t cd_off = uint32_t(z.size());
  append(z, cd.data(), cd.size());
  GGUFWriter::put<uint32_t>(z, 0x06054b50);
  for (uint16_t v : {uint16_t(0), uint16_t(0), uint16_t(entries.size()), uint16_t(entries.size())}) GGUFWriter::put(z, v);
  GGUFWriter::put<uint32_t>(z, uint32_t(cd.size()));
  GGUFWriter::put(z, cd_off);
  GGUFWriter::put<uint16_t>(z, 0);
  return z;
}
template <class T>
Bytes raw_bytes(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST_CASE("torch_load reads hand-written torch.save files: zip and legacy, views and shared storages") {
  std::vector<float> st(12);
  for (int i = 0; i < 12; i++) st[size_t(i)] = float(i) * 1.5f - 4;
  std::vector<int16_t> sh = {-7, 300, 12};
  std::vector<PtTensor> ts = {{"w", "0", "FloatStorage", 12, 0, {3, 4}, {4, 1}},
                              {"w_t", "0", "FloatStorage", 12, 0, {4, 3}, {1, 4}},     // transposed view, shared
                              {"cols", "0", "FloatStorage", 12, 5, {2, 2}, {4, 2}},    // offset and strides
                              {"s", "1", "ShortStorage", 3, 1, {2}, {1}}};
  Bytes zip = zip_of({{"model/data.pkl", pt_pickle(ts)}, {"model/data/0", raw_bytes(st)}, {"model/data/1", raw_bytes(sh)},
                      {"model/version", {'3'}}});
  std::string p = tmp_path("hand.pt");
  write_bytes(p, zip);
  auto got = nn::torch_load(p);
  CHECK(got.size() == 4);
  CHECK(got.at("w").to_vector<float>() == st);
  CHECK(got.at("w_t").shape() == Shape{4, 3});
  CHECK(got.at("w_t").to_vector<float>() == (std::vector<float>{st[0], st[4], st[8], st[1], st[5], st[9], st[2], st[6], st[10], st[3], st[7], st[11]}));
  CHECK(got.at("cols").to_vector<float>() == (std::vector<float>{st[5], st[7], st[9], st[11]}));
  CHECK(got.at("s").dtype() == dtypes::int16);
  CHECK(got.at("s").to_vector<int16_t>() == (std::vector<int16_t>{300, 12}));
  // the legacy format (torch < 1.6): magic, protocol 1001, system info, the object, the keys, then the storages
  Bytes legacy = {0x80, 2, 0x8a, 10, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
  append(legacy, "\x80\x02M\xe9\x03.\x80\x02}.", 10);
  Bytes obj = pt_pickle(ts, true);
  append(legacy, obj.data(), obj.size());
  append(legacy, "\x80\x02(X\x01\x00\x00\x00\x30X\x01\x00\x00\x00\x31l.", 17);
  for (const Bytes& b : {raw_bytes(st), raw_bytes(sh)}) {
    GGUFWriter::put<int64_t>(legacy, int64_t(b.size() / (b.size() == 48 ? 4 : 2)));
    append(legacy, b.data(), b.size());
  }
  auto old = nn::torch_load_bytes(legacy.data(), legacy.size(), "legacy.pt");
  CHECK(old.at("w_t").to_vector<float>() == got.at("w_t").to_vector<float>());
  CHECK(old.at("s").to_vector<int16_t>() == (std::vector<int16_t>{300, 12}));
}

TEST_CASE("torch_load onto DISK views the file: the same values, DISK tensors, nothing copied or run at load") {
  std::vector<float> st(12);
  for (int i = 0; i < 12; i++) st[size_t(i)] = float(i) * 1.5f - 4;
  std::vector<int16_t> sh = {-7, 300, 12};
  std::vector<PtTensor> ts = {{"w", "0", "FloatStorage", 12, 0, {3, 4}, {4, 1}},
                              {"w_t", "0", "FloatStorage", 12, 0, {4, 3}, {1, 4}},     // transposed: a permute
                              {"rows", "0", "FloatStorage", 12, 4, {2, 2}, {4, 2}},    // offset and strides: shrinks
                              {"cols", "0", "FloatStorage", 12, 5, {2, 2}, {4, 2}},    // past the storage's end as a grid
                              {"bcast", "0", "FloatStorage", 12, 2, {2, 3}, {0, 1}},   // stride 0: an expand
                              {"overlap", "0", "FloatStorage", 12, 1, {3, 2}, {1, 1}}, // overlapping: gathered
                              {"s", "1", "ShortStorage", 3, 1, {2}, {1}}};
  Bytes zip = zip_of({{"model/data.pkl", pt_pickle(ts)}, {"model/data/0", raw_bytes(st)}, {"model/data/1", raw_bytes(sh)},
                      {"model/version", {'3'}}});
  std::string p = tmp_path("disk.pt");
  write_bytes(p, zip);
  auto ref = nn::torch_load(p);
  size_t k0 = kernels_run();
  auto got = nn::torch_load(p, "DISK");
  CHECK(kernels_run() == k0);
  REQUIRE(got.size() == ts.size());
  for (auto& kv : got) {
    const std::string& k = kv.first;
    const Tensor& t = kv.second;
    CAPTURE(k);
    CHECK(t.device() == "DISK");
    CHECK(t.shape() == ref.at(k).shape());
    CHECK(t.dtype() == ref.at(k).dtype());
  }
  for (const char* k : {"w", "w_t", "rows", "cols", "bcast", "overlap"})
    CHECK(got.at(k).to_vector<float>() == ref.at(k).to_vector<float>());
  CHECK(got.at("s").to_vector<int16_t>() == (std::vector<int16_t>{300, 12}));
  CHECK(got.at("rows").to_vector<float>() == (std::vector<float>{st[4], st[6], st[8], st[10]}));
  // the views read the file's bytes: element 6 of storage 0 overwritten in place shows in every view of it (the
  // gathered overlapping view is a copy taken at load)
  auto at = std::search(zip.begin(), zip.end(), reinterpret_cast<const uint8_t*>(st.data()),
                        reinterpret_cast<const uint8_t*>(st.data()) + 48);
  REQUIRE(at != zip.end());
  float nine = 99.f;
  {
    std::fstream fs(p, std::ios::binary | std::ios::in | std::ios::out);  // same inode, no truncation
    fs.seekp(int64_t(at - zip.begin()) + 6 * 4);
    fs.write(reinterpret_cast<const char*>(&nine), 4);
  }
  CHECK(got.at("w").to_vector<float>()[6] == 99.f);
  CHECK(got.at("w_t").to_vector<float>()[2 * 3 + 1] == 99.f);  // w_t[2][1] = storage 1 * 4 + 2
  CHECK(got.at("rows").to_vector<float>()[1] == 99.f);
  CHECK(got.at("overlap").to_vector<float>() == ref.at("overlap").to_vector<float>());
  // moved to a device that runs kernels: an ordinary tensor there
  CHECK(Tensor(got.at("w_t").to(default_device()) * 2.f).to_vector<float>()[2 * 3 + 1] == 198.f);
  // bytes in memory (the legacy format's reader too): DISK tensors view a copy of them
  auto mem = nn::torch_load_bytes(zip.data(), zip.size(), "mem.pt", "DISK");
  CHECK(mem.at("w_t").device() == "DISK");
  CHECK(mem.at("w_t").to_vector<float>() == ref.at("w_t").to_vector<float>());
}

TEST_CASE("malformed torch.save files are errors naming the file and what was expected") {
  std::vector<float> st(12, 1.f);
  auto pt = [&](const std::vector<PtTensor>& ts, const Bytes& data) {
    return zip_of({{"archive/data.pkl", pt_pickle(ts)}, {"archive/data/0", data}});
  };
  auto load = [](const Bytes& b) { return nn::torch_load_bytes(b.data(), b.size(), "bad.pt"); };
  PtTensor ok = {"w", "0", "FloatStorage", 12, 0, {3, 4}, {4, 1}};
  Bytes good = pt({ok}, raw_bytes(st));
  CHECK(load(good).at("w").shape() == Shape{3, 4});
  CHECK_ERROR(nn::torch_load(tmp_path("missing.pt")), "[torch_load]", "missing.pt");
  // truncated: no directory; every cut is an error, never a crash
  for (size_t len = 0; len < good.size(); len += 5) CHECK_ERROR(load(Bytes(good.begin(), good.begin() + int64_t(len))), "[torch_load] bad.pt: ");
  // a view past its storage: offset, size and stride each
  PtTensor v = ok;
  v.offset = 1;
  CHECK_ERROR(load(pt({v}, raw_bytes(st))), "tensor 'w'", "reads element 12 of storage '0', which has 12");
  v = ok, v.strides = {5, 1};
  CHECK_ERROR(load(pt({v}, raw_bytes(st))), "reads element 13");
  v = ok, v.strides = {-4, 1};
  CHECK_ERROR(load(pt({v}, raw_bytes(st))), "negative size or stride");
  v = ok, v.sizes = {3};
  CHECK_ERROR(load(pt({v}, raw_bytes(st))), "1 sizes and 2 strides");
  // an expand (stride 0) of one element to 2^40 elements stays lazy; an overlapping view may not blow up
  v = ok, v.sizes = {1 << 20, 1 << 20}, v.strides = {0, 0}, v.offset = 11;
  Tensor big = load(pt({v}, raw_bytes(st))).at("w");
  CHECK(big.shape() == Shape{1 << 20, 1 << 20});
  CHECK(big.shrink({{5, 7}, {0, 2}}).to_vector<float>() == std::vector<float>(4, 1.f));
  v = ok, v.strides = {1, 0}, v.sizes = {12, 3};  // each element of the storage repeated along a stride-0 dim
  CHECK(load(pt({v}, raw_bytes(st))).at("w").shape() == Shape{12, 3});
  v.sizes = {6000, 6000, 7}, v.strides = {0, 1, 1};
  v.numel = 12;
  CHECK_ERROR(load(pt({v}, raw_bytes(st))), "reads element");
  Bytes wide(size_t(1) << 16, 0);
  v.numel = 1 << 14, v.sizes = {1 << 13, 1 << 13}, v.strides = {1, 1};
  CHECK_ERROR(load(pt({v}, wide)), "a view of 67108864 elements with overlapping strides over a storage of 16384");
  // a storage file shorter than its element count, a missing storage, a corrupt storage (CRC)
  CHECK_ERROR(load(pt({ok}, Bytes(40))), "storage '0' holds 40 bytes, fewer than its 12 float32 elements");
  CHECK_ERROR(load(zip_of({{"archive/data.pkl", pt_pickle({ok})}})), "storage '0' is not in the file");
  Bytes flip = good;
  flip[flip.size() - 22 - (46 + 16) - (46 + 14) - 1] ^= 1;  // the storage's last byte (before the directory, the EOCD)
  CHECK_ERROR(load(flip), "zip entry 'archive/data/0' is corrupt (CRC-32 mismatch)");
  // pickle: an unsupported opcode, an unsupported storage type, an unsupported torch object
  Bytes pk = pt_pickle({ok});
  pk[2] = 0xA0;
  CHECK_ERROR(load(zip_of({{"archive/data.pkl", pk}, {"archive/data/0", raw_bytes(st)}})), "opcode 0xa0 is not supported");
  v = ok, v.type = "ComplexFloatStorage";
  CHECK_ERROR(load(pt({v}, raw_bytes(st))), "storage type torch.ComplexFloatStorage is not supported");
  Bytes q = pt_pickle({ok});
  std::string qs(q.begin(), q.end());
  qs.replace(qs.find("_rebuild_tensor_v2"), 18, "_rebuild_qtensor");  // GLOBAL is line-framed: no length to fix
  CHECK_ERROR(load(zip_of({{"archive/data.pkl", Bytes(qs.begin(), qs.end())}, {"archive/data/0", raw_bytes(st)}})),
              "torch._utils._rebuild_qtensor is not supported");
  CHECK_ERROR(load(zip_of({{"x/other.pkl", pk}})), "zip file without an ARCHIVE/data.pkl entry");
  CHECK_ERROR(load(Bytes{0x80, 2, 'K', 1, '.'}), "wrong magic number");
  CHECK_ERROR(load(Bytes{'h', 'i'}), "neither a zip file nor a legacy torch.save file");
}

TEST_CASE("IDX images in memory, plain and gzip (several members), match the file loader") {
  Bytes idx{0, 0, 0x0B, 2, 0, 0, 0, 2, 0, 0, 0, 3};  // int16 (2, 3), big-endian
  for (int16_t v : {-1, 2, -300, 400, 5, 32767}) idx.push_back(uint8_t(uint16_t(v) >> 8)), idx.push_back(uint8_t(v & 0xff));
  std::vector<int16_t> want{-1, 2, -300, 400, 5, 32767};
  Tensor a = nn::load_idx_bytes(idx.data(), idx.size(), "a.idx");
  CHECK(a.shape() == Shape{2, 3});
  CHECK(a.to_vector<int16_t>() == want);
  Bytes gz = gzip_bytes(idx);
  CHECK(nn::load_idx_bytes(gz.data(), gz.size(), "a.idx.gz").to_vector<int16_t>() == want);
  Bytes two = gzip_bytes(Bytes(idx.begin(), idx.begin() + 10));  // two gzip members, split mid-header
  Bytes rest = gzip_bytes(Bytes(idx.begin() + 10, idx.end()));
  append(two, rest.data(), rest.size());
  CHECK(nn::load_idx_bytes(two.data(), two.size(), "two.gz").to_vector<int16_t>() == want);
  std::string p = tmp_path("two.idx.gz");
  write_bytes(p, two);
  CHECK(nn::load_idx(p).to_vector<int16_t>() == want);
}

TEST_CASE("malformed IDX data is an error naming the file and the problem") {
  auto load = [](const Bytes& b) { return nn::load_idx_bytes(b.data(), b.size(), "bad.idx"); };
  CHECK_ERROR(load(Bytes{0, 0}), "bad.idx", "ends inside the header");
  CHECK_ERROR(load(Bytes{1, 0, 8, 1}), "not an IDX file");
  CHECK_ERROR(load(Bytes{0, 0, 0x0A, 1}), "unknown IDX element type 0x0A");
  CHECK_ERROR(load(Bytes{0, 0, 8, 0}), "at least one dimension");
  CHECK_ERROR(load(Bytes{0, 0, 8, 2, 0, 0, 0}), "ends inside the dimension sizes");
  CHECK_ERROR(load(Bytes{0, 0, 8, 1, 0, 0, 0, 4, 1, 2}), "file ends inside the data", "needs 4 bytes, the file has 2");
  CHECK_ERROR(load(Bytes{0, 0, 8, 1, 0, 0, 0, 1, 1, 2}), "more data than the header's (1,) elements");
  // absurd dimensions: refused before allocating, or read only as far as the data goes
  CHECK_ERROR(load(Bytes{0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 2}), "more than 2^36 elements");
  CHECK_ERROR(load(Bytes{0, 0, 0x0E, 2, 0, 1, 0, 0, 0, 1, 0, 0, 1}), "needs 34359738368 bytes, the file has 1");
  Bytes gz = gzip_bytes(Bytes{0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3});
  CHECK_ERROR(load(Bytes(gz.begin(), gz.end() - 12)), "bad.idx");
  Bytes corrupt = gz;
  corrupt[12] ^= 0xff;
  corrupt[13] ^= 0x55;
  CHECK_THROWS_AS(load(corrupt), Error);
  Bytes tail = gz;
  tail.push_back('x');
  CHECK_ERROR(load(tail), "data after the end of the gzip stream");
  for (size_t n = 0; n < gz.size(); n++) CHECK_THROWS_AS(load(Bytes(gz.begin(), gz.begin() + int64_t(n))), Error);
  CHECK_ERROR(nn::load_idx(tmp_path("")), "is a folder");
  CHECK_ERROR(nn::load_idx(tmp_path("nope.idx")), "nope.idx", "cannot open");
  CHECK_ERROR(nn::mnist("/nonexistent/mnist_folder"), "[mnist]", "'/nonexistent/mnist_folder' does not exist");
  CHECK_ERROR(nn::fashion_mnist("/nonexistent/fashion"), "[fashion_mnist]", "'/nonexistent/fashion' does not exist");
}

TEST_CASE("get_parameters returns every tensor of the state dict; get_state_dict names them") {
  nn::Linear l(4, 3);
  auto sd = nn::get_state_dict(l);
  CHECK(sd.size() == 2);
  CHECK(sd.count("weight") == 1);
  CHECK(sd.at("weight").shape() == Shape{3, 4});
  auto ps = nn::get_parameters(l);
  REQUIRE(ps.size() == 2);
  CHECK(ps[0].shape() == Shape{3});  // name order: bias, weight
  CHECK(ps[1].shape() == Shape{3, 4});
}
