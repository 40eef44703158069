// nn: datasets (IDX), optimisers, state, JIT.
#include <doctest/doctest.h>

#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "scoped_env.hpp"
#include "tg/nn/datasets.hpp"

using namespace tg;

namespace {
std::string tmp_path(const std::string& name) {
  // one folder a process, removed at exit: meson runs this binary as two tests at once (nn, nn_nvrtc), which wrote
  // each other's files
  struct Folder {
    std::filesystem::path d = std::filesystem::temp_directory_path() / ("tg_nn_tests_" + std::to_string(::getpid()));
    ~Folder() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  };
  static Folder f;
  std::filesystem::create_directories(f.d);
  return (f.d / name).string();
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

// torch: w = torch.tensor([1., 2., 3.], requires_grad=True); loss = (w * w).sum(); loss.backward();
// torch.optim.SGD([w], lr=0.1).step(); loss.item() -> 14.0, w -> [0.8, 1.6, 2.4], w.grad -> [2., 4., 6.]
TEST_CASE("a loss read after the optimizer step is the loss before it, and so is the gradient") {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3});
  nn::optim::SGD opt({w}, 0.1);
  Tensor loss = Tensor(w * w).sum();
  loss.backward();
  opt.step();
  CHECK(loss.item<float>() == 14.f);
  CHECK(w.grad().to_vector<float>() == std::vector<float>{2, 4, 6});
  auto got = w.to_vector<float>();
  std::vector<float> want{0.8f, 1.6f, 2.4f};
  for (size_t i = 0; i < 3; i++) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

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
    std::unique_ptr<nn::optim::Optimizer> opt;
    if (wd == 0) opt = std::make_unique<nn::optim::Adam>(std::vector<Tensor>{w}, 0.01);
    else opt = std::make_unique<nn::optim::AdamW>(std::vector<Tensor>{w}, 0.01, 0.9, 0.999, 1e-8, wd);
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

TEST_CASE("a lazy tensor defined before a TinyJit replay keeps its value") {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3});
  TinyJit step([&](const std::vector<Tensor>&) -> std::vector<Tensor> {
    Tensor loss = Tensor(w * 2).sum();
    w.assign(Tensor(w + 1));  // an in-place update, as an optimizer step
    return {loss, w};
  });
  for (int call = 0; call < 3; call++) step({});  // runs and captures: w = [4, 5, 6]
  REQUIRE(step.replaying());
  Tensor before = Tensor(w * 10).sum();          // lazy: 150 while w = [4, 5, 6]
  Tensor view = w.reshape({3, 1});               // a view of w's buffer: an alias
  Tensor out = step({})[0];                      // replay: w = [5, 6, 7]
  Tensor twice = out * 2;                        // lazy reader of the output buffer, which replays overwrite
  step({});                                      // w = [6, 7, 8]
  CHECK(before.item<float>() == 150.f);
  CHECK(twice.item<float>() == 60.f);            // 2 * (2 * (4 + 5 + 6)), not 2 * (2 * (5 + 6 + 7))
  CHECK(out.item<float>() == 36.f);              // outputs are the same buffers on every call (README)
  CHECK(view.to_vector<float>() == std::vector<float>{6, 7, 8});
}

TEST_CASE("TinyJit: the intermediates of the schedules a step realises share storage once captured") {
  // Each realize is a schedule of its own, whose result the schedule's planner must keep; once the next one has read
  // it, only the capture holds it, and the capture's planner gives its storage to a later one: two buffers for six.
  constexpr size_t n = 4096;
  std::vector<float> wv(n);
  for (size_t i = 0; i < n; i++) wv[i] = 1.f + float(i % 7) / 8.f;
  Tensor w = Tensor::from_vector(wv);
  w.realize();
  auto step = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    Tensor h = in[0];
    for (int i = 0; i < 6; i++) {
      h = Tensor(h * w + float(i)).contiguous();
      h.realize();
    }
    return {Tensor(h * 0.5f)};
  };
  TinyJit jit(step);
  Allocator& mem = get_device(default_device()).allocator();  // the suite also runs on OpenCL
  const size_t base = mem.live_bytes();
  for (int call = 0; call < 6; call++) {
    std::vector<float> xv(n);
    for (size_t i = 0; i < n; i++) xv[i] = float(call) - float(i % 5);
    Tensor x = Tensor::from_vector(xv);
    x.realize();
    std::vector<float> got = jit({x})[0].to_vector<float>();
    // from the capture that replays on: this call's input, the captured call's (a replay substitutes it; the same
    // on the capturing call), the output, and two buffers for the six intermediates (six without the planner)
    if (call >= 2) CHECK(mem.live_bytes() - base == size_t(call == 2 ? 4 : 5) * n * sizeof(float));
    CHECK(got == step({x})[0].to_vector<float>());  // the same kernels, eagerly
  }
  CHECK(jit.replaying());
  CHECK(jit.captured_kernels() == 7);
}

TEST_CASE("TinyJit refuses changed inputs") {
  TinyJit jit([](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {Tensor(in[0] * 2)}; });
  jit({Tensor::from_vector(std::vector<float>{1, 2})});
  CHECK_THROWS_AS(jit({Tensor::from_vector(std::vector<float>{1, 2, 3})}), Error);
  CHECK_THROWS_AS(jit({Tensor::from_vector(std::vector<int32_t>{1, 2})}), Error);
}

namespace {
// rand, randint and randn inside a step, beside the input doubled.
std::vector<Tensor> random_step(const std::vector<Tensor>& in) {
  return {Tensor(in[0] * 2), Tensor::rand({5}), Tensor::randint(0, 1000, {3}), Tensor::randn({2, 2})};
}
// The random numbers of one call, flattened.
std::vector<float> random_part(const std::vector<Tensor>& out) {
  std::vector<float> v;
  for (size_t k = 1; k < out.size(); k++)
    for (double d : out[k].to_doubles()) v.push_back(float(d));
  return v;
}
// `calls` calls of random_step after manual_seed(seed), jitted or not, then one eager draw.
std::vector<std::vector<float>> random_calls(uint64_t seed, bool use_jit, int calls) {
  Tensor::manual_seed(seed);
  TinyJit jit(random_step);
  std::vector<std::vector<float>> vals;
  for (int i = 0; i < calls; i++) {
    Tensor x = Tensor::from_vector(std::vector<float>{float(i)});
    auto out = use_jit ? jit({x}) : random_step({x});
    CHECK(out[0].item<float>() == float(2 * i));
    vals.push_back(random_part(out));
  }
  if (use_jit) CHECK(jit.replaying());
  vals.push_back(Tensor::rand({4}).to_vector<float>());
  return vals;
}
}  // namespace

TEST_CASE("TinyJit: random numbers drawn inside are fresh on every replay and the same as eager calls'") {
  auto eager = random_calls(5, false, 8), jitted = random_calls(5, true, 8), other = random_calls(6, true, 8);
  CHECK(eager == jitted);  // calls 4..8 are replays; the eager draw after them continues the same sequence
  for (size_t i = 0; i < jitted.size(); i++) {
    CHECK(jitted[i] != other[i]);  // another seed, other numbers
    for (size_t j = 0; j < i; j++) CHECK(jitted[i] != jitted[j]);  // replays draw new numbers
  }
}

TEST_CASE("TinyJit: manual_seed resets the generator that captured kernels use") {
  Tensor::manual_seed(3);
  TinyJit jit([](const std::vector<Tensor>&) -> std::vector<Tensor> { return {Tensor::rand({3})}; });
  std::vector<std::vector<float>> first, again;
  for (int i = 0; i < 5; i++) first.push_back(jit({})[0].to_vector<float>());
  Tensor::manual_seed(3);
  for (int i = 0; i < 5; i++) again.push_back(jit({})[0].to_vector<float>());  // all replays
  CHECK(first == again);
  CHECK(first[3] != first[4]);
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

// ---------------------------------------------------------------- LARS, Muon, fused optimisers

namespace {

// A row-major matrix of doubles: the reference arithmetic of the optimiser tests.
struct DMat {
  int64_t r = 0, c = 0;
  std::vector<double> v;
  double& at(int64_t i, int64_t j) { return v[size_t(i * c + j)]; }
  double at(int64_t i, int64_t j) const { return v[size_t(i * c + j)]; }
};
DMat dmat(int64_t r, int64_t c, std::vector<double> v) { return DMat{r, c, std::move(v)}; }
DMat transpose(const DMat& a) {
  DMat t{a.c, a.r, std::vector<double>(a.v.size())};
  for (int64_t i = 0; i < a.r; i++)
    for (int64_t j = 0; j < a.c; j++) t.at(j, i) = a.at(i, j);
  return t;
}
DMat matmul(const DMat& a, const DMat& b) {
  DMat o{a.r, b.c, std::vector<double>(size_t(a.r * b.c), 0.0)};
  for (int64_t i = 0; i < a.r; i++)
    for (int64_t k = 0; k < a.c; k++)
      for (int64_t j = 0; j < b.c; j++) o.at(i, j) += a.at(i, k) * b.at(k, j);
  return o;
}
// tinygrad's newton_schulz in double precision
DMat ns_ref(const DMat& g, int steps, const std::vector<double>& coef) {
  if (g.r > g.c) return transpose(ns_ref(transpose(g), steps, coef));
  double n = 0;
  for (double x : g.v) n += x * x;
  DMat G = g;
  for (double& x : G.v) x /= std::sqrt(n) + 1e-7;
  for (int s = 0; s < steps; s++) {
    DMat A = matmul(G, transpose(G)), term = G, acc = G;
    for (double& x : acc.v) x *= coef[0];
    for (size_t i = 1; i < coef.size(); i++) {
      term = matmul(A, term);
      for (size_t k = 0; k < acc.v.size(); k++) acc.v[k] += coef[i] * term.v[k];
    }
    G = acc;
  }
  return G;
}
double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// Parameters of several shapes and a quadratic loss sum((p - target)^2)/2 (gradient p - target).
struct QuadProblem {
  std::vector<Shape> shapes;
  std::vector<std::vector<double>> init, target;
  std::vector<Tensor> params() const {
    std::vector<Tensor> out;
    for (size_t i = 0; i < shapes.size(); i++)
      out.push_back(Tensor::from_vector(std::vector<float>(init[i].begin(), init[i].end()), shapes[i]));
    return out;
  }
  Tensor loss(const std::vector<Tensor>& ps) const {
    Tensor l = Tensor::zeros({});
    for (size_t i = 0; i < ps.size(); i++) {
      Tensor d = ps[i] - Tensor::from_vector(std::vector<float>(target[i].begin(), target[i].end()), shapes[i]);
      l = l + Tensor(d * d).sum() * 0.5;
    }
    return l;
  }
};
std::vector<double> seq(size_t n, double a, double step) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; i++) v[i] = a + step * double(i) + 0.37 * std::sin(double(i) * 1.7);
  return v;
}
// values are float32 from the start, so the double reference starts where tg does
std::vector<double> f32(std::vector<double> v) {
  for (double& x : v) x = double(float(x));
  return v;
}

}  // namespace

TEST_CASE("LARS matches a double-precision reference of tinygrad's rule (trust ratio, classic and nesterov)") {
  QuadProblem q{{{4}, {2, 3}, {2}},
                {f32(seq(4, -1, 0.6)), f32(seq(6, 0.5, -0.3)), {1.5, -0.5}},
                {f32(seq(4, 0.2, 0.1)), f32(seq(6, -0.1, 0.2)), {1.5, -0.5}}};  // the last one has a zero gradient
  const double lr = 0.1, mom = 0.9, wd = 0.01, tcoef = 0.5;
  for (auto mode : {std::pair{true, false}, std::pair{true, true}, std::pair{false, false}}) {
    const bool classic = mode.first, nesterov = mode.second;  // not bindings: clang 14 cannot capture them
    CAPTURE(classic);
    CAPTURE(nesterov);
    auto ps = q.params();
    nn::optim::LARS opt(ps, lr, mom, wd, nesterov, classic, tcoef);
    auto ref = q.init;
    std::vector<std::vector<double>> buf;
    for (auto& r : ref) buf.emplace_back(r.size(), 0.0);
    for (int step = 0; step < 4; step++) {
      opt.zero_grad();
      q.loss(ps).backward();
      opt.step();
      for (size_t p = 0; p < ref.size(); p++) {
        std::vector<double> g(ref[p].size());
        for (size_t i = 0; i < g.size(); i++) g[i] = ref[p][i] - q.target[p][i];
        double r1 = norm(ref[p]), r2 = norm(g);
        double r = r1 > 0 && r2 > 0 ? tcoef * r1 / (r2 + wd * r1) : 1.0;
        for (size_t i = 0; i < g.size(); i++) {
          double gi = g[i] + wd * ref[p][i];
          if (classic) gi *= r * lr;
          buf[p][i] = mom * buf[p][i] + gi;
          gi = nesterov ? gi + mom * buf[p][i] : buf[p][i];
          if (!classic) gi *= r * lr;
          ref[p][i] -= gi;
        }
      }
    }
    for (size_t p = 0; p < ps.size(); p++) {
      auto got = ps[p].to_vector<float>();
      for (size_t i = 0; i < got.size(); i++) CHECK(got[i] == doctest::Approx(ref[p][i]).epsilon(2e-6));
    }
  }
}

TEST_CASE("newton_schulz: the odd polynomial iteration; the cubic one converges to the orthogonal factor") {
  Tensor g = Tensor::from_vector(std::vector<float>{3, 1, 0, 2, -1, 1, 0.5f, 2, -2, 1, 1, 0}, {3, 4});
  Tensor o = nn::optim::newton_schulz(g, 40, {1.5, -0.5});
  auto oo = o.matmul(o.T()).to_vector<float>();  // rows orthonormal: O O^T = I
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) CHECK(oo[size_t(i * 3 + j)] == doctest::Approx(i == j ? 1.0 : 0.0).epsilon(1e-5));
  // a tall input is handled through its transpose
  auto ot = nn::optim::newton_schulz(g.T(), 40, {1.5, -0.5}).to_vector<float>();
  auto ov = o.T().contiguous().to_vector<float>();
  for (size_t i = 0; i < ot.size(); i++) CHECK(ot[i] == doctest::Approx(ov[i]).epsilon(1e-6));
  CHECK_THROWS_AS(nn::optim::newton_schulz(Tensor::zeros({3}), 5, {1.5, -0.5}), Error);
  CHECK_THROWS_AS(nn::optim::newton_schulz(g, 5, {}), Error);
}

TEST_CASE("Muon matches a double-precision reference: nesterov momentum, Newton-Schulz of (shape[0], -1), decoupled decay") {
  QuadProblem q{{{3, 5}, {4, 2}, {3}, {2, 2, 3}},
                {f32(seq(15, -1, 0.13)), f32(seq(8, 0.7, -0.2)), f32(seq(3, 0.1, 0.3)), f32(seq(12, -0.4, 0.07))},
                {f32(seq(15, 0.3, -0.05)), f32(seq(8, -0.2, 0.1)), f32(seq(3, -0.6, 0.2)), f32(seq(12, 0.5, -0.1))}};
  const double lr = 0.05, mom = 0.95, wd = 0.1;
  const std::vector<double> coef{3.4445, -4.775, 2.0315};
  auto ps = q.params();
  nn::optim::Muon opt(ps, lr, mom, wd);
  auto ref = q.init;
  std::vector<std::vector<double>> buf;
  for (auto& r : ref) buf.emplace_back(r.size(), 0.0);
  for (int step = 0; step < 3; step++) {
    opt.zero_grad();
    q.loss(ps).backward();
    opt.step();
    for (size_t p = 0; p < ref.size(); p++) {
      size_t n = ref[p].size();
      std::vector<double> g(n);
      for (size_t i = 0; i < n; i++) {
        double gi = ref[p][i] - q.target[p][i];
        buf[p][i] = mom * buf[p][i] + gi;
        g[i] = gi + mom * buf[p][i];
      }
      int64_t rows = q.shapes[p][0];
      DMat o = ns_ref(dmat(rows, int64_t(n) / rows, g), 5, coef);
      for (size_t i = 0; i < n; i++) ref[p][i] = ref[p][i] * (1 - lr * wd) - lr * o.v[i];
    }
  }
  for (size_t p = 0; p < ps.size(); p++) {
    CAPTURE(p);
    auto got = ps[p].to_vector<float>();
    for (size_t i = 0; i < got.size(); i++) CHECK(got[i] == doctest::Approx(ref[p][i]).epsilon(1e-5));
  }
}

TEST_CASE("optimiser arguments are checked") {
  auto ps = [] { return std::vector<Tensor>{Tensor::ones({2, 2})}; };
  CHECK_THROWS_AS(nn::optim::SGD(ps(), -0.1), Error);
  CHECK_THROWS_AS(nn::optim::SGD(ps(), 0.1, -0.9), Error);
  CHECK_THROWS_AS(nn::optim::SGD(ps(), 0.1, 0, 0, true), Error);  // nesterov without momentum
  CHECK_THROWS_AS(nn::optim::LARS(ps(), 0.1, 0.9, -1e-4), Error);
  CHECK_THROWS_AS(nn::optim::Muon(ps(), 0.1, 0.95, 0.1, 0), Error);
  CHECK_THROWS_AS(nn::optim::Muon(ps(), 0.1, 0.95, 0.1, 5, {}), Error);
  CHECK_THROWS_AS(nn::optim::Muon({Tensor::ones({})}, 0.1), Error);  // a 0-d parameter has no rows
  CHECK_THROWS_AS(nn::optim::LAMB(ps(), 0.1, 1.0), Error);
  CHECK_THROWS_AS(nn::optim::Adam(ps(), 0.1, 0.9, 0.999, -1), Error);
  nn::optim::SGD opt(ps(), 0.1);
  CHECK_THROWS_AS(opt.set_lr(-1), Error);
  CHECK_THROWS_AS(nn::optim::StepLR(opt, 0), Error);
  CHECK_THROWS_AS(nn::optim::CosineAnnealingLR(opt, 0), Error);
  CHECK_THROWS_AS(nn::optim::OneCycleLR(opt, 1.0, 0), Error);
  // per-parameter norms cannot be taken over one flat buffer
  CHECK_THROWS_AS(nn::optim::LAMB(ps(), 0.1, 0.9, 0.999, 1e-6, 0, false, true), Error);
  CHECK_THROWS_AS(nn::optim::LARS(ps(), 0.1, 0.9, 1e-4, false, true, 0.001, true), Error);
  CHECK_NOTHROW(nn::optim::LARS(ps(), 0.1, 0.9, 1e-4, false, true, 0.0, true));
  try {
    nn::optim::LAMB(ps(), 0.1, 0.9, 0.999, 1e-6, 0, false, true);
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("[LAMB] fused") != std::string::npos);
  }
}

namespace {
// A small MLP with a learnable 0-d temperature, trained a few steps; returns the parameters' values and the number
// of kernels the last step ran.
std::pair<std::vector<std::vector<float>>, size_t> train_mlp(
    const std::function<std::unique_ptr<nn::optim::Optimizer>(std::vector<Tensor>)>& make) {
  Tensor::manual_seed(21);
  std::vector<Tensor> ps{Tensor::uniform({6, 5}, -0.5, 0.5), Tensor::uniform({6}, -0.1, 0.1), Tensor::uniform({3, 6}, -0.5, 0.5),
                         Tensor::uniform({3}, -0.1, 0.1), Tensor::full({}, 1.5)};
  for (auto& p : ps) p = p.contiguous().realize();
  Tensor x = Tensor::uniform({8, 5}, -1, 1).contiguous().realize();
  Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 0, 1, 2, 2, 1});
  auto opt = make(ps);
  size_t kernels = 0;
  for (int s = 0; s < 4; s++) {
    size_t k0 = kernels_run();
    opt->zero_grad();
    Tensor logits = Tensor(x.linear(ps[0], ps[1]).relu().linear(ps[2], ps[3]) * ps[4]);
    logits.sparse_categorical_crossentropy(y).backward();
    opt->step();
    kernels = kernels_run() - k0;
  }
  std::vector<std::vector<float>> out;
  for (auto& p : ps) out.push_back(p.to_vector<float>());
  return {out, kernels};
}
}  // namespace

TEST_CASE("fused optimisers update all parameters as one flat buffer, multi-output kernels update each parameter and its "
          "state in one kernel: the same numbers in fewer kernels") {
  using MakeOpt = std::function<std::unique_ptr<nn::optim::Optimizer>(std::vector<Tensor>, bool)>;
  struct Opt {
    const char* name;
    size_t state_kinds;  // momentum; or m and v
    MakeOpt make;
    // whether the state's update can join the parameter's kernel: not where it reads the parameter's old value (SGD's
    // weight decay is added to the gradient the momentum sums) that the same kernel would overwrite
    bool joins = true;
  };
  std::vector<Opt> opts{
      {"SGD", 1, [](std::vector<Tensor> p, bool f) { return std::make_unique<nn::optim::SGD>(p, 0.1, 0.9, 0.01, true, false, f); }, false},
      {"SGD classic", 1,
       [](std::vector<Tensor> p, bool f) { return std::make_unique<nn::optim::SGD>(p, 0.1, 0.9, 0.0, false, true, f); }},
      {"Adam", 2, [](std::vector<Tensor> p, bool f) { return std::make_unique<nn::optim::Adam>(p, 0.01, 0.9, 0.999, 1e-8, f); }},
      {"AdamW", 2, [](std::vector<Tensor> p, bool f) { return std::make_unique<nn::optim::AdamW>(p, 0.01, 0.9, 0.999, 1e-8, 0.1, f); }},
  };
  for (const Opt& o : opts) {  // plain variables, not bindings: clang 14 cannot capture bindings in lambdas
    std::string name = o.name;
    const size_t kinds = o.state_kinds;
    const MakeOpt& make = o.make;
    CAPTURE(name);
    auto run = [&](bool fused, bool multi) {
      ScopedEnv env("MULTI_OUTPUT", multi ? "1" : "0");
      return train_mlp([&](std::vector<Tensor> p) { return make(p, fused); });
    };
    const auto single = run(false, false), fused_single = run(true, false), plain = run(false, true), fused = run(true, true);
    INFO(name << ": kernels per step, one output per kernel: " << single.second << " unfused, " << fused_single.second
              << " fused; multi-output kernels: " << plain.second << " unfused, " << fused.second << " fused");
    for (const auto* r : {&fused_single, &plain, &fused})
      for (size_t p = 0; p < single.first.size(); p++)
        for (size_t i = 0; i < single.first[p].size(); i++)
          CHECK(r->first[p][i] == doctest::Approx(single.first[p][i]).epsilon(1e-6));
    // one output per kernel: each state kind is one kernel instead of five (one per parameter), plus the flat update
    CHECK(fused_single.second + 4 * kinds - 1 <= single.second);
    // multi-output kernels: each of the five parameters' state updates joins the kernel of its update
    if (o.joins) CHECK(plain.second + 5 * kinds <= single.second);
    else CHECK(plain.second == single.second);
  }
}

TEST_CASE("ConvTranspose layers: output shapes, parameters, bad channel counts") {
  nn::ConvTranspose2d up(4, 2, 3, 2, 1, 1);  // doubles 5x5 -> 10x10
  CHECK(up.weight.shape() == Shape{4, 2, 3, 3});
  CHECK(up(Tensor::rand({1, 4, 5, 5})).shape() == Shape{1, 2, 10, 10});
  CHECK(up.state_dict().size() == 2);
  nn::ConvTranspose1d c1(3, 6, 4, 1, 0, 0, 3, false);
  CHECK(c1.weight.shape() == Shape{3, 2, 4});
  CHECK(c1.bias == nullptr);
  CHECK(c1(Tensor::rand({2, 3, 5})).shape() == Shape{2, 6, 8});
  nn::ConvTranspose3d c3(2, 2, {1, 2, 3});
  CHECK(c3(Tensor::rand({1, 2, 2, 2, 2})).shape() == Shape{1, 2, 2, 3, 4});
  CHECK_THROWS_AS(nn::ConvTranspose2d(3, 4, 3, 1, 0, 0, 2), Error);  // 3 input channels in 2 groups
  CHECK_THROWS_AS(nn::ConvTranspose2d(4, 4, {3, 3, 3}), Error);      // a 3-d kernel for a 2-d layer
  CHECK_THROWS_AS(nn::ConvTranspose1d(4, 4, 0), Error);
  CHECK_THROWS_AS(up(Tensor::rand({1, 3, 5, 5})), Error);             // wrong input channels
}

TEST_CASE("every optimiser trains a small conv net under TinyJit exactly as it does eagerly") {
  using MakeOpt = std::function<std::unique_ptr<nn::optim::Optimizer>(std::vector<Tensor>)>;
  std::vector<std::pair<std::string, MakeOpt>> opts{
      {"SGD", [](std::vector<Tensor> p) { return std::make_unique<nn::optim::SGD>(p, 0.05, 0.9, 1e-3, true); }},
      {"LARS", [](std::vector<Tensor> p) { return std::make_unique<nn::optim::LARS>(p, 0.5, 0.9, 1e-4, false, true, 0.02); }},
      {"Muon", [](std::vector<Tensor> p) { return std::make_unique<nn::optim::Muon>(p, 0.05); }},
      {"LAMB", [](std::vector<Tensor> p) { return std::make_unique<nn::optim::LAMB>(p, 0.05); }},
      {"AdamW", [](std::vector<Tensor> p) { return std::make_unique<nn::optim::AdamW>(p, 0.02); }},
      {"Adam fused", [](std::vector<Tensor> p) { return std::make_unique<nn::optim::Adam>(p, 0.02, 0.9, 0.999, 1e-8, true); }},
  };
  Tensor x = Tensor::uniform({6, 1, 6, 6}, 0, 1).contiguous().realize();
  Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 0, 1, 2});
  for (const auto& entry : opts) {
    const std::string& name = entry.first;
    const MakeOpt& make = entry.second;
    CAPTURE(name);
    auto run = [&](bool use_jit) {
      Tensor::manual_seed(3);
      auto seq = std::make_shared<nn::Sequential>();
      seq->add(std::make_shared<nn::Conv2d>(1, 4, 3)).add(std::make_shared<nn::BatchNorm>(4));
      seq->add(std::make_shared<nn::Lambda>([](const Tensor& t) { return t.relu().flatten(1); }));
      seq->add(std::make_shared<nn::Linear>(4 * 4 * 4, 3));
      auto opt = make(seq->parameters());
      auto step = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        opt->zero_grad();
        Tensor loss = (*seq)(in[0]).sparse_categorical_crossentropy(in[1]);
        loss.backward();
        auto out = opt->schedule_step();
        out.push_back(loss);
        std::vector<Tensor*> ptrs;
        for (auto& t : out) ptrs.push_back(&t);
        Tensor::realize_all(ptrs);
        return out;
      };
      TinyJit jit(step);
      std::vector<float> losses;
      for (int i = 0; i < 6; i++) losses.push_back((use_jit ? jit({x, y}) : step({x, y})).back().item<float>());
      return losses;
    };
    auto eager = run(false), jitted = run(true);
    CHECK(eager == jitted);
    CHECK(eager.back() < eager.front());
  }
}

TEST_CASE("TinyJit refuses a function that reads a value computed from its inputs on the host; other host reads are fine") {
  Tensor w = Tensor::from_vector<float>({1, 2, 3}).realize();
  TinyJit data_read([&](const std::vector<Tensor>& in) {
    float s = Tensor(in[0] * 1.0f).sum().item<float>();  // a value of the input, read while capturing
    return std::vector<Tensor>{Tensor(in[0] + s)};
  });
  TinyJit weight_read([&](const std::vector<Tensor>& in) {
    float s = w.sum().item<float>();  // no input in it: the same on every call
    return std::vector<Tensor>{Tensor(in[0] + s)};
  });
  std::string err;
  for (int i = 0; i < 5; i++) {
    Tensor x = Tensor::full({3}, float(i)).realize();
    if (err.empty()) {
      try {
        data_read({x});
      } catch (const Error& e) {
        err = e.what();
      }
    }
    CHECK(weight_read({x})[0].to_vector<float>() == std::vector<float>{float(i) + 6, float(i) + 6, float(i) + 6});
  }
  CHECK(err.find("computed from its inputs on the host") != std::string::npos);
  CHECK(data_read.reads_inputs_on_host());
  CHECK_FALSE(weight_read.reads_inputs_on_host());
}
