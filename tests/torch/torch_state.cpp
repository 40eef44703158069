// torch_load against libtorch: torch::pickle_save writes the zip format of torch.save (ARCHIVE/data.pkl and the
// storages); tg reads it back and every tensor must equal libtorch's, bit for bit, for every storage dtype, views
// (transposes, slices with offsets, stride-0 expands), storages shared between tensors, 0-d and empty tensors, and
// nested dicts, lists and tuples. Every truncation of such a file is a tg::Error, never a crash.
// (torch's headers bring glog's CHECK macro: the doctest macros are spelled DOCTEST_CHECK here.)
#include <doctest/doctest.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tg/nn/state.hpp"

namespace {

std::string tmp_file(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("tg_torch_state_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return (d / name).string();
}

tg::DType tg_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return tg::dtypes::float32;
    case torch::kHalf: return tg::dtypes::float16;
    case torch::kBFloat16: return tg::dtypes::bfloat16;
    case torch::kDouble: return tg::dtypes::float64;
    case torch::kLong: return tg::dtypes::int64;
    case torch::kInt: return tg::dtypes::int32;
    case torch::kShort: return tg::dtypes::int16;
    case torch::kChar: return tg::dtypes::int8;
    case torch::kByte: return tg::dtypes::uint8;
    case torch::kBool: return tg::dtypes::bool_;
    default: return tg::dtypes::void_;
  }
}

// The tensor's elements in row-major order as raw bytes (the dtype's own encoding): exact comparison.
std::vector<uint8_t> torch_bytes(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * c.element_size());
}
template <class T>
std::vector<uint8_t> raw_of(const tg::Tensor& t) {
  std::vector<T> v = t.to_vector<T>();
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
std::vector<uint8_t> tg_bytes(const tg::Tensor& t) {
  using namespace tg::dtypes;
  tg::DType d = t.dtype();
  if (d == float32) return raw_of<float>(t);
  if (d == float16 || d == bfloat16) return raw_of<int16_t>(t.bitcast(int16));
  if (d == float64) return raw_of<int64_t>(t.bitcast(int64));
  if (d == int64) return raw_of<int64_t>(t);
  if (d == int32) return raw_of<int32_t>(t);
  if (d == int16) return raw_of<int16_t>(t);
  if (d == int8) return raw_of<int8_t>(t);
  if (d == uint8) return raw_of<uint8_t>(t);
  std::vector<bool> v = t.to_vector<bool>();
  return std::vector<uint8_t>(v.begin(), v.end());
}

void check_same(const std::map<std::string, tg::Tensor>& got, const std::string& name, const torch::Tensor& want) {
  DOCTEST_CAPTURE(name);
  auto it = got.find(name);
  DOCTEST_REQUIRE_MESSAGE(it != got.end(), "no tensor '" << name << "'");
  const tg::Tensor& t = it->second;
  DOCTEST_CHECK(t.dtype() == tg_dtype(want.scalar_type()));
  DOCTEST_CHECK(t.shape() == tg::Shape(want.sizes().begin(), want.sizes().end()));
  DOCTEST_CHECK(tg_bytes(t) == torch_bytes(want));
}

}  // namespace

TEST_CASE("torch_load reads libtorch's torch.save zip: every storage dtype, views, shared storages, nesting") {
  torch::manual_seed(7);
  torch::Tensor base = torch::randn({4, 6});
  std::map<std::string, torch::Tensor> want = {
      {"f32", torch::randn({3, 5})},
      {"f16", torch::randn({2, 3}).to(torch::kHalf)},
      {"bf16", torch::randn({5}).to(torch::kBFloat16)},
      {"f64", torch::randn({2, 2}, torch::kDouble)},
      {"i64", torch::randint(-(int64_t(1) << 40), int64_t(1) << 40, {7}, torch::kLong)},
      {"i32", torch::randint(-100000, 100000, {2, 4}, torch::kInt)},
      {"i16", torch::randint(-30000, 30000, {3}, torch::kShort)},
      {"i8", torch::randint(-128, 128, {9}, torch::kChar)},
      {"u8", torch::randint(0, 256, {2, 2, 2}, torch::kByte)},
      {"bool", torch::randn({6}) > 0},
      // views of one storage: the base itself, its transpose, a slice (offset and stride), a strided diagonal
      {"base", base},
      {"base_t", base.t()},
      {"slice", base.slice(1, 2, 5).slice(0, 1, 4)},
      {"diag", base.diagonal()},
      {"expanded", torch::randn({3, 1}).expand({3, 4})},  // stride 0
      {"scalar", torch::tensor(2.5)},
      {"empty", torch::zeros({0, 3})},
  };
  c10::Dict<std::string, torch::Tensor> sd;
  for (const auto& kv : want) sd.insert(kv.first, kv.second);
  std::vector<char> bytes = torch::pickle_save(sd);
  std::string path = tmp_file("state.pt");
  std::ofstream(path, std::ios::binary).write(bytes.data(), int64_t(bytes.size()));
  // the container is torch.save's: a zip (entries stored) with ARCHIVE/data.pkl
  DOCTEST_REQUIRE(bytes.size() > 4);
  DOCTEST_CHECK(std::memcmp(bytes.data(), "PK\x03\x04", 4) == 0);
  std::map<std::string, tg::Tensor> got = tg::nn::torch_load(path);
  DOCTEST_CHECK(got.size() == want.size());
  for (const auto& kv : want) check_same(got, kv.first, kv.second);
  // libtorch reads its own file back to the same values (the file is what torch.load reads)
  c10::Dict<c10::IValue, c10::IValue> back = torch::pickle_load(bytes).toGenericDict();
  DOCTEST_CHECK(torch::equal(back.at("base_t").toTensor(), want["base_t"]));

  // nested: {"model": state_dict, "epoch": 3, "opt": [tensor, (tensor, 1.5)]}
  c10::impl::GenericDict outer(c10::StringType::get(), c10::AnyType::get());
  torch::Tensor a = torch::randn({2, 3}), b = torch::arange(5, torch::kLong);
  outer.insert("model", sd);
  outer.insert("epoch", 3);
  outer.insert("opt", c10::impl::GenericList(c10::AnyType::get()));
  c10::impl::GenericList opt(c10::AnyType::get());
  opt.push_back(a);
  opt.push_back(c10::ivalue::Tuple::create({b, c10::IValue(1.5)}));
  outer.insert_or_assign("opt", opt);
  std::vector<char> nested = torch::pickle_save(outer);
  auto n = tg::nn::torch_load_bytes(reinterpret_cast<const uint8_t*>(nested.data()), nested.size(), "nested.pt");
  DOCTEST_CHECK(n.size() == want.size() + 2);
  check_same(n, "model.base_t", want["base_t"]);
  check_same(n, "model.u8", want["u8"]);
  check_same(n, "opt.0", a);
  check_same(n, "opt.1.0", b);

  // every truncation (and a sample of single-byte corruptions) is a tg::Error or a result, never a crash
  int errors = 0;
  for (size_t len = 0; len < nested.size(); len += 7) {
    try {
      (void)tg::nn::torch_load_bytes(reinterpret_cast<const uint8_t*>(nested.data()), len, "cut.pt");
    } catch (const tg::Error& e) {
      errors++;
      DOCTEST_CHECK(std::string(e.what()).find("[torch_load] cut.pt: ") == 0);
    }
  }
  DOCTEST_CHECK(errors == int((nested.size() + 6) / 7));  // a cut zip has no directory: every one fails
  for (size_t at = 0; at < nested.size(); at += 13) {
    std::vector<char> bad = nested;
    bad[at] = char(bad[at] ^ 0x5A);
    try {
      (void)tg::nn::torch_load_bytes(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), "flip.pt");
    } catch (const tg::Error&) {
    }
  }
}
