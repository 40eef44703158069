// nn: datasets (IDX), optimisers, state, JIT.
#include <doctest/doctest.h>

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tg/nn/datasets.hpp"

using namespace tg;

namespace {
std::string tmp_path(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / "tg_nn_tests";
  std::filesystem::create_directories(d);
  return (d / name).string();
}
void write_file(const std::string& p, const std::vector<uint8_t>& bytes, bool gz) {
  if (gz) {
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), int64_t(bytes.size()));
  }
}
}  // namespace

TEST_CASE("IDX files load with their shape and big-endian values, gzip or plain") {
  std::vector<uint8_t> u8{0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6};
  write_file(tmp_path("a.idx"), u8, false);
  write_file(tmp_path("a.idx.gz"), u8, true);
  for (auto p : {tmp_path("a.idx"), tmp_path("a.idx.gz")}) {
    Tensor t = nn::load_idx(p);
    CHECK(t.shape() == Shape{2, 3});
    CHECK(t.dtype() == dtypes::uint8);
    CHECK(t.to_vector<uint8_t>() == std::vector<uint8_t>{1, 2, 3, 4, 5, 6});
  }
  std::vector<uint8_t> i32{0, 0, 0x0C, 1, 0, 0, 0, 2, 0xFF, 0xFF, 0xFF, 0xFE, 0, 0, 1, 0};
  write_file(tmp_path("b.idx"), i32, false);
  CHECK(nn::load_idx(tmp_path("b.idx")).to_vector<int32_t>() == std::vector<int32_t>{-2, 256});
}

TEST_CASE("malformed IDX files are errors naming the file") {
  auto expect = [](const std::vector<uint8_t>& bytes, const char* what) {
    std::string p = tmp_path("bad.idx");
    write_file(p, bytes, false);
    try {
      nn::load_idx(p);
      FAIL("no error for " << what);
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("bad.idx") != std::string::npos);
    }
  };
  expect({0, 0, 0x08}, "short header");
  expect({1, 0, 0x08, 1, 0, 0, 0, 1, 7}, "bad magic");
  expect({0, 0, 0x07, 1, 0, 0, 0, 1, 7}, "bad type");
  expect({0, 0, 0x08, 1, 0, 0, 0, 4, 1, 2}, "truncated data");
  expect({0, 0, 0x08, 1, 0, 0, 0, 1, 1, 2}, "trailing data");
  expect({0, 0, 0x08, 3, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, "huge dims");
  CHECK_THROWS_AS(nn::load_idx(tmp_path("missing.idx")), Error);
  CHECK_THROWS_AS(nn::mnist(tmp_path("nowhere")), Error);
}

TEST_CASE("Fashion-MNIST from Debian's package has the standard shapes") {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")) return;
  nn::Dataset d = nn::fashion_mnist();
  CHECK(d.X_train.shape() == Shape{60000, 1, 28, 28});
  CHECK(d.Y_train.shape() == Shape{60000});
  CHECK(d.X_test.shape() == Shape{10000, 1, 28, 28});
  auto y = d.Y_test.to_vector<uint8_t>();
  for (uint8_t v : y) CHECK(v < 10);
}
