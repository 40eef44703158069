// nn: datasets (IDX), optimisers, state, JIT.
#include <doctest/doctest.h>

#include <zlib.h>

#include <cmath>
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

#include "tg/nn/optim.hpp"

namespace {
// loss = sum((w - target)^2) / 2: grad = w - target
Tensor quad_loss(const Tensor& w, const std::vector<float>& target) {
  Tensor d = w - Tensor::from_vector(target);
  return Tensor(d * d).sum() * 0.5;
}
}  // namespace

TEST_CASE("SGD with momentum and nesterov matches torch.optim.SGD's update rule") {
  for (bool nesterov : {false, true}) {
    std::vector<float> w0{1, -2, 3}, target{0.5f, 0.5f, 0.5f};
    Tensor w = Tensor::from_vector(w0);
    nn::optim::SGD opt({w}, 0.1, 0.9, 0.01, nesterov);
    std::vector<double> ref(w0.begin(), w0.end()), buf(3, 0);
    for (int step = 0; step < 5; step++) {
      opt.zero_grad();
      quad_loss(w, target).backward();
      opt.step();
      for (size_t i = 0; i < 3; i++) {
        double g = (ref[i] - target[i]) + 0.01 * ref[i];
        buf[i] = step == 0 ? g : 0.9 * buf[i] + g;
        double d = nesterov ? g + 0.9 * buf[i] : buf[i];
        ref[i] -= 0.1 * d;
      }
    }
    auto got = w.to_vector<float>();
    for (size_t i = 0; i < 3; i++) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-5));
  }
}

TEST_CASE("Adam and AdamW match torch.optim's update rule") {
  for (double wd : {0.0, 0.1}) {
    std::vector<float> w0{1, -2, 3, 0.25f}, target{0.5f, 0.5f, -1, 2};
    Tensor w = Tensor::from_vector(w0);
    auto opt = wd == 0 ? nn::optim::Adam({w}, 0.01) : nn::optim::AdamW({w}, 0.01, 0.9, 0.999, 1e-8, wd);
    std::vector<double> ref(w0.begin(), w0.end()), m(4, 0), v(4, 0);
    for (int t = 1; t <= 6; t++) {
      opt->zero_grad();
      quad_loss(w, target).backward();
      opt->step();
      for (size_t i = 0; i < 4; i++) {
        double g = ref[i] - target[i];
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
        ref[i] -= 0.01 * (mh / (std::sqrt(vh) + 1e-8) + wd * ref[i]);  // torch AdamW: decoupled decay
      }
    }
    auto got = w.to_vector<float>();
    for (size_t i = 0; i < 4; i++) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-5));
  }
}

TEST_CASE("learning-rate schedules") {
  Tensor w = Tensor::from_vector(std::vector<float>{1});
  nn::optim::SGD opt({w}, 1.0);
  nn::optim::StepLR s(opt, 2, 0.5);
  s.step();
  CHECK(opt.lr_value() == 1.0);
  s.step();
  CHECK(opt.lr_value() == 0.5);
  CHECK(opt.lr().to_vector<float>()[0] == 0.5f);
  nn::optim::CosineAnnealingLR c(opt, 10, 0.0);
  CHECK(c.lr_at(10) == doctest::Approx(0.0));
  CHECK(c.lr_at(5) == doctest::Approx(0.25));
  nn::optim::OneCycleLR oc(opt, 1.0, 100);
  CHECK(oc.lr_at(25) == doctest::Approx(1.0));
  CHECK(oc.lr_at(100) == doctest::Approx(1.0 / 25 / 1e4));
}

TEST_CASE("an optimiser step without gradients is an error") {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2});
  nn::optim::SGD opt({w}, 0.1);
  CHECK_THROWS_AS(opt.step(), Error);
  CHECK_THROWS_AS(nn::optim::SGD({}, 0.1), Error);
}

#include "tg/jit.hpp"
#include "tg/schedule.hpp"

TEST_CASE("TinyJit replays captured kernels with new inputs, without scheduling") {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3});
  TinyJit jit([&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    Tensor y = Tensor(in[0] * w + 1).sum();
    return {y};
  });
  for (int call = 0; call < 6; call++) {
    float s = float(call);
    Tensor x = Tensor::from_vector(std::vector<float>{s, s + 1, s + 2});
    size_t sched = schedules_built();
    auto out = jit({x});
    float want = s * 1 + (s + 1) * 2 + (s + 2) * 3 + 3;
    CHECK(out[0].item<float>() == want);
    if (call >= 3) {
      CHECK(jit.replaying());
      CHECK(schedules_built() == sched);
    }
  }
  CHECK(jit.captured_kernels() == 1);
}

TEST_CASE("TinyJit refuses changed inputs and random numbers inside") {
  TinyJit jit([](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {Tensor(in[0] * 2)}; });
  jit({Tensor::from_vector(std::vector<float>{1, 2})});
  CHECK_THROWS_AS(jit({Tensor::from_vector(std::vector<float>{1, 2, 3})}), Error);
  CHECK_THROWS_AS(jit({Tensor::from_vector(std::vector<int32_t>{1, 2})}), Error);
  TinyJit rnd([](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {Tensor(in[0] + Tensor::rand({2}))}; });
  auto x = Tensor::from_vector(std::vector<float>{1, 2});
  rnd({x});
  CHECK_THROWS_AS(rnd({x}), Error);
}

TEST_CASE("TinyJit detects a function whose kernels change between captures") {
  int n = 0;
  TinyJit jit([&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    n++;
    return {n == 3 ? Tensor(in[0] * 3).sum() : Tensor(in[0] * 2)};
  });
  auto x = Tensor::from_vector(std::vector<float>{1, 2});
  jit({x});
  jit({x});
  CHECK_THROWS_AS(jit({x}), Error);
}

TEST_CASE("a jitted training step replays the same updates as eager steps") {
  std::vector<float> w0{0.5f, -1.5f, 2.0f};
  auto run = [&](bool use_jit) {
    Tensor w = Tensor::from_vector(w0);
    nn::optim::SGD opt({w}, 0.1, 0.9);
    auto step = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      opt.zero_grad();
      Tensor d = w * in[0] - 1.0;
      Tensor loss = Tensor(d * d).mean();
      loss.backward();
      auto upd = opt.schedule_step();
      upd.push_back(loss);
      return upd;
    };
    TinyJit jit(step);
    std::vector<float> losses;
    for (int i = 0; i < 6; i++) {
      Tensor x = Tensor::from_vector(std::vector<float>{float(i + 1), 1, 0.5f});
      auto out = use_jit ? jit({x}) : step({x});
      if (!use_jit) {
        std::vector<Tensor*> p;
        for (auto& t : out) p.push_back(&t);
        Tensor::realize_all(p);
      }
      losses.push_back(out.back().item<float>());
    }
    return std::make_pair(losses, w.to_vector<float>());
  };
  auto [le, we] = run(false);
  auto [lj, wj] = run(true);
  CHECK(le == lj);
  CHECK(we == wj);
}

#include "tg/nn/state.hpp"

TEST_CASE("safetensors round trip of every dtype, with metadata") {
  std::map<std::string, Tensor> sd;
  sd.emplace("f32", Tensor::from_vector(std::vector<float>{1.5f, -2, 3}, {3, 1}));
  sd.emplace("i64", Tensor::from_vector(std::vector<int64_t>{-1, 1LL << 40}));
  sd.emplace("u8", Tensor::from_vector(std::vector<uint8_t>{7, 255}));
  sd.emplace("b", Tensor::from_vector(std::vector<bool>{true, false, true}));
  sd.emplace("h", Tensor::from_vector(std::vector<float>{0.5f, 65504}).cast(dtypes::float16));
  std::string p = tmp_path("t.safetensors");
  nn::safe_save(sd, p, {{"format", "pt"}});
  auto back = nn::safe_load(p);
  CHECK(back.size() == 5);
  CHECK(back.at("f32").shape() == Shape{3, 1});
  CHECK(back.at("f32").to_vector<float>() == std::vector<float>{1.5f, -2, 3});
  CHECK(back.at("i64").to_vector<int64_t>() == std::vector<int64_t>{-1, 1LL << 40});
  CHECK(back.at("u8").to_vector<uint8_t>() == std::vector<uint8_t>{7, 255});
  CHECK(back.at("b").to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(back.at("h").dtype() == dtypes::float16);
  CHECK(back.at("h").cast(dtypes::float32).to_vector<float>() == std::vector<float>{0.5f, 65504});
  CHECK(nn::safe_metadata(p).at("format") == "pt");
}

TEST_CASE("malformed safetensors files are errors naming the file") {
  std::string p = tmp_path("bad.safetensors");
  auto put = [&](const std::string& header, size_t data_bytes) {
    std::vector<uint8_t> b(8);
    for (int i = 0; i < 8; i++) b[size_t(i)] = uint8_t((header.size() >> (8 * i)) & 0xff);
    b.insert(b.end(), header.begin(), header.end());
    b.resize(b.size() + data_bytes, 0);
    write_file(p, b, false);
  };
  put(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);  // data past the end
  CHECK_THROWS_AS(nn::safe_load(p), Error);
  put(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);  // shape and size disagree
  CHECK_THROWS_AS(nn::safe_load(p), Error);
  put(R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", 8);   // unknown dtype
  CHECK_THROWS_AS(nn::safe_load(p), Error);
  put(R"({"a":{"dtype":"F32"}})", 8);                                    // missing fields
  CHECK_THROWS_AS(nn::safe_load(p), Error);
  put("{not json", 0);
  CHECK_THROWS_AS(nn::safe_load(p), Error);
  write_file(p, {1, 2, 3}, false);                                       // too short
  CHECK_THROWS_AS(nn::safe_load(p), Error);
  try {
    nn::safe_load(p);
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("bad.safetensors") != std::string::npos);
  }
}

#include "tg/nn/nn.hpp"

TEST_CASE("layers: shapes, parameters, state_dict round trip, strict loading") {
  auto seq = std::make_shared<nn::Sequential>();
  seq->add(std::make_shared<nn::Conv2d>(1, 4, 3)).add(std::make_shared<nn::BatchNorm>(4));
  seq->add(std::make_shared<nn::Lambda>([](const Tensor& x) { return x.relu().max_pool2d(2).flatten(1); }));
  seq->add(std::make_shared<nn::Linear>(4 * 3 * 3, 5));
  Tensor x = Tensor::rand({2, 1, 8, 8});
  Tensor y = (*seq)(x);
  CHECK(y.shape() == Shape{2, 5});
  auto sd = seq->state_dict();
  CHECK(sd.count("0.weight") == 1);
  CHECK(sd.at("0.weight").shape() == Shape{4, 1, 3, 3});
  CHECK(sd.count("1.running_mean") == 1);
  CHECK(sd.at("3.weight").shape() == Shape{5, 36});
  CHECK(seq->parameters().size() == 6);  // conv w,b; bn w,b; linear w,b
  auto copy = std::make_shared<nn::Linear>(36, 5);
  std::map<std::string, Tensor> lin{{"weight", sd.at("3.weight")}, {"bias", sd.at("3.bias")}};
  copy->load_state_dict(lin);
  CHECK(copy->weight.to_vector<float>() == sd.at("3.weight").to_vector<float>());
  lin.erase("bias");
  CHECK_THROWS_AS(copy->load_state_dict(lin), Error);
  lin.emplace("bias", Tensor::zeros({4}));
  CHECK_THROWS_AS(copy->load_state_dict(lin), Error);
}

TEST_CASE("a small conv net's loss goes down with Adam") {
  Tensor::manual_seed(3);
  auto seq = std::make_shared<nn::Sequential>();
  seq->add(std::make_shared<nn::Conv2d>(1, 4, 3)).add(std::make_shared<nn::BatchNorm>(4));
  seq->add(std::make_shared<nn::Lambda>([](const Tensor& x) { return x.relu().flatten(1); }));
  seq->add(std::make_shared<nn::Linear>(4 * 4 * 4, 3));
  auto opt = nn::optim::Adam(seq->parameters(), 0.05);
  Tensor x = Tensor::rand({6, 1, 6, 6});
  Tensor yv = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 0, 1, 2});
  float first = 0, last = 0;
  for (int i = 0; i < 8; i++) {
    opt->zero_grad();
    Tensor loss = (*seq)(x).sparse_categorical_crossentropy(yv);
    loss.backward();
    opt->step();
    float l = loss.item<float>();
    if (i == 0) first = l;
    last = l;
  }
  CHECK(last < first * 0.7f);
}
