// The last of tinygrad's Tensor names (scripts/api_missing): tolist, numpy, from_url (file://, http:// against a
// cpp-httplib server on 127.0.0.1, gzip), is_param_, as_param and call, linear_with_vars / schedule_linear, and
// the errors of each. image_dot and image_conv2d are compared with libtorch in tests/torch/torch_ops_d.cpp.
#include <doctest/doctest.h>
#include <httplib.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <thread>

#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

#include "test_util.hpp"

using namespace tg;
using tg::test::error_of;

namespace {
std::vector<uint8_t> gzip_of(const std::string& s) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<uint8_t> out(deflateBound(&z, uLong(s.size())) + 32);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  z.avail_in = uInt(s.size());
  z.next_out = out.data();
  z.avail_out = uInt(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}
std::string tmp(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("tg_api_names_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return (d / name).string();
}
double leaf_double(const NestedList& l) { return std::get<double>(l.value); }
}  // namespace

TEST_CASE("tolist nests one list per dim; leaves are double, int64, uint64 or bool by dtype") {
  NestedList a = Tensor::from_vector<float>({1.5f, -2, 3, 4, 5, 6.25f}, {2, 3}).tolist();
  REQUIRE(a.is_list);
  REQUIRE(a.items.size() == 2);
  CHECK(a.items[1].items.size() == 3);
  CHECK(leaf_double(a.items[0].items[0]) == 1.5);
  CHECK(leaf_double(a.items[1].items[2]) == 6.25);
  NestedList i = Tensor::from_vector<int32_t>({-7, 9}, {2}).tolist();
  CHECK(std::get<int64_t>(i.items[0].value) == -7);
  CHECK(std::get<uint64_t>(Tensor::from_vector<uint64_t>({~0ULL}, {1}).tolist().items[0].value) == ~0ULL);
  CHECK(std::get<bool>(Tensor::from_vector<bool>({false, true}, {2}).tolist().items[1].value));
  NestedList s = Tensor(2.5).tolist();  // 0-d: a leaf
  CHECK(!s.is_list);
  CHECK(leaf_double(s) == 2.5);
  NestedList h = Tensor::from_vector<float>({0.5f}, {1, 1}).cast(dtypes::float16).tolist();  // half reads as float
  CHECK(leaf_double(h.items[0].items[0]) == 0.5);
  NestedList e = Tensor::zeros({2, 0, 3}).tolist();  // (2, 0, 3): two empty lists
  CHECK(e.items.size() == 2);
  CHECK(e.items[0].is_list);
  CHECK(e.items[0].items.empty());
}

TEST_CASE("numpy gives dtype, shape, row-major byte strides and the bytes") {
  Tensor t = Tensor::arange(24, dtypes::int32).reshape({2, 3, 4}).permute({2, 0, 1});
  HostArray a = t.numpy();
  CHECK(a.dtype == dtypes::int32);
  CHECK(a.shape == std::vector<int64_t>{4, 2, 3});
  CHECK(a.strides == std::vector<int64_t>{24, 12, 4});
  std::vector<int32_t> want = t.to_vector<int32_t>();
  REQUIRE(a.bytes.size() == want.size() * 4);
  CHECK(std::memcmp(a.data<int32_t>(), want.data(), a.bytes.size()) == 0);
  CHECK(a.data<int32_t>()[1] == 4);  // element (0, 0, 1) of the permuted view
  CHECK(error_of([&] { (void)a.data<double>(); }).find("element size 8 asked") != std::string::npos);
}

TEST_CASE("from_url reads file:// and http:// bytes, gunzips, and names the URL in errors") {
  std::string body = "tg from_url \x01\x02\xff test";
  std::string path = tmp("blob.bin");
  std::ofstream(path, std::ios::binary) << body;
  auto as_string = [](const Tensor& t) {
    std::vector<uint8_t> v = t.to_vector<uint8_t>();
    return std::string(v.begin(), v.end());
  };
  Tensor f = Tensor::from_url("file://" + path);
  CHECK(f.dtype() == dtypes::uint8);
  CHECK(f.shape() == Shape{int64_t(body.size())});
  CHECK(as_string(f) == body);
  CHECK(as_string(Tensor::from_url(path)) == body);
  // two gzip members back to back inflate to both
  std::vector<uint8_t> gz = gzip_of(body), gz2 = gzip_of("second");
  gz.insert(gz.end(), gz2.begin(), gz2.end());
  std::ofstream(tmp("blob.gz"), std::ios::binary).write(reinterpret_cast<const char*>(gz.data()), int64_t(gz.size()));
  CHECK(as_string(Tensor::from_url("file://" + tmp("blob.gz"), true)) == body + "second");
  CHECK(error_of([&] { (void)Tensor::from_url("file://" + path, true); }).find("not valid gzip data") != std::string::npos);
  CHECK(error_of([&] { (void)Tensor::from_url("file://" + tmp("none")); }).find("[from_url] file://" + tmp("none") + ": cannot open") == 0);
  CHECK(error_of([&] { (void)Tensor::from_url("ftp://example.com/x"); }).find("unknown scheme") != std::string::npos);
  // http: a server on a free port of 127.0.0.1
  httplib::Server srv;
  srv.Get("/data.bin", [&](const httplib::Request&, httplib::Response& res) { res.set_content(body, "application/octet-stream"); });
  srv.Get("/data.gz", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(gz.begin(), gz.end()), "application/gzip");
  });
  int port = srv.bind_to_any_port("127.0.0.1");
  REQUIRE(port > 0);
  std::thread th([&] { srv.listen_after_bind(); });
  while (!srv.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::string base = "http://127.0.0.1:" + std::to_string(port);
  CHECK(as_string(Tensor::from_url(base + "/data.bin")) == body);
  CHECK(as_string(Tensor::from_url(base + "/data.gz", true)) == body + "second");
  CHECK(error_of([&] { (void)Tensor::from_url(base + "/missing"); }).find("HTTP status 404") != std::string::npos);
  srv.stop();
  th.join();
  CHECK(error_of([&] { (void)Tensor::from_url(base + "/data.bin"); }).find("request failed") != std::string::npos);
}

TEST_CASE("as_param placeholders and call: the body applied to the arguments; unapplied bodies do not realise") {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}), y = Tensor::from_vector<float>({0.5f, -1, 2}, {3});
  Tensor body = (x.as_param(0) * 2 + y.as_param(1).exp()).sum(1);
  CHECK(body.shape() == Shape{2});
  Tensor r = x.call({y}, body);
  CHECK(r.to_vector<float>() == (x * 2 + y.exp()).sum(1).to_vector<float>());
  // the same body on other arguments of the same shapes
  Tensor x2 = x * -1, y2 = y + 1;
  CHECK(x2.call({y2}, body).to_vector<float>() == (x2 * 2 + y2.exp()).sum(1).to_vector<float>());
  CHECK(error_of([&] { (void)body.to_vector<float>(); }).find("function parameter 0 (as_param)") != std::string::npos);
  CHECK(error_of([&] { (void)x.call({}, body); }).find("the body uses parameter 1, 1 tensors were given") != std::string::npos);
  CHECK(error_of([&] { (void)x.call({x}, body); }).find("[call] parameter 1 is float32 (3,), the argument is float32 (2, 3)") != std::string::npos);
  // is_param_: a flag on the tensor, seen by every handle
  Tensor w = Tensor::ones({2});
  Tensor w2 = w;
  CHECK(!w.is_param());
  CHECK(&w.is_param_() == &w);
  CHECK(w2.is_param());
  w2.is_param_(false);
  CHECK(!w.is_param());
}

TEST_CASE("schedule_linear builds the kernels without running them; run_schedule fills the tensors") {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  a.realize();
  Tensor b = (a * 3).sum(), c = (a + 1).contiguous();
  size_t before = kernels_run();
  Schedule s = b.schedule_linear({c});
  CHECK(kernels_run() == before);  // nothing ran
  CHECK(s.items.size() >= 2);
  run_schedule(s);
  CHECK(kernels_run() == before + s.items.size());
  CHECK(b.item<float>() == 30);
  CHECK(c.to_vector<float>() == std::vector<float>{2, 3, 4, 5});
  CHECK(kernels_run() == before + s.items.size());  // the tensors read the schedule's buffers: no recompute
  auto [s2, vars] = (a * 2).linear_with_vars();
  CHECK(vars.empty());
  CHECK(s2.items.size() == 1);
  // a realised tensor needs no kernel
  CHECK(a.schedule_linear().items.empty());
}
