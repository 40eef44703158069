// tg against libtorch in the same run, each case printing a line and a JSON record (bench_util.hpp): a 4-layer MLP
// (784-512-512-512-10, batch 256, ReLU, cross-entropy) forward and forward+backward; conv2d (N=128, C=32, 28x28,
// 5x5 -> 32, bias) forward and forward+backward; a batched matmul (32 x 256x256 @ 256x256); a GPT-2-small-sized
// transformer block forward (batch 1, 128 tokens, d=768, 12 heads, MLP 3072, causal attention, GELU (tanh)).
// Both sides start from the same values and the outputs are compared first. tg is timed eagerly (build the graph,
// schedule from the caches, run) and, for the MLP, under TinyJit as well. Medians of the timed runs after a warm-up
// that compiles; run through bench/run, which gives the peer its best settings for the ISA tg compiles for
// (bench/peer_env): an OPENBLAS_CORETYPE where OpenBLAS misdetects the CPU, and under TG_CPU=haswell on an AVX-512
// machine ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2. libtorch's float convolutions run in oneDNN, which
// picks its ISA from cpuid and ignores ATEN_CPU_CAPABILITY (ONEDNN_VERBOSE=1 prints each primitive's implementation:
// `jit:avx512_core` natively, `jit:avx2` with the limit). Freed blocks stay in glibc's heap for the whole run
// (mallopt in main), as tg's allocator keeps its freed buffers: libtorch frees and maps afresh each 12.8 MB
// activation of the conv case, and the first touch of those pages cost it 40-130 ms per oneDNN reorder on the VM
// (its conv fwd+bwd 284 ms instead of 65 ms on one Zen 5 core).
#include <torch/torch.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "tg/jit.hpp"
#include "tg/tensor.hpp"
#include "triad.hpp"

namespace {

using bench::median_ms;

tg::Tensor to_tg(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  std::vector<int64_t> s(c.sizes().begin(), c.sizes().end());
  tg::DType d = c.scalar_type() == torch::kLong ? tg::dtypes::int64 : tg::dtypes::float32;
  tg::Tensor r = tg::Tensor::from_blob(c.data_ptr(), s, d);
  r.realize();
  return r;
}

void report(const char* what, const std::string& json_case, double tg_ms, double th_ms) {
  std::printf("%-34s tg %9.2f ms   libtorch %8.2f ms   speedup %6.2fx\n", what, tg_ms, th_ms, th_ms / tg_ms);
  bench::json(json_case, "default", tg_ms, "libtorch", th_ms);
}

double max_diff(const tg::Tensor& t, const torch::Tensor& h) {
  std::vector<float> v = t.to_vector<float>();
  return (torch::from_blob(v.data(), h.sizes()).clone() - h.detach()).abs().max().item<double>();
}

void bench_mlp() {
  const int64_t B = 256;
  const std::vector<int64_t> dims{784, 512, 512, 512, 10};
  torch::manual_seed(0);
  torch::Tensor hx = torch::rand({B, dims[0]}), hy = torch::randint(0, 10, {B}, torch::kLong);
  std::vector<torch::Tensor> hw, hb;
  for (size_t i = 0; i + 1 < dims.size(); i++) {
    double bound = 1.0 / std::sqrt(double(dims[i]));
    hw.push_back(torch::empty({dims[i + 1], dims[i]}).uniform_(-bound, bound).requires_grad_());
    hb.push_back(torch::empty({dims[i + 1]}).uniform_(-bound, bound).requires_grad_());
  }
  tg::Tensor tx = to_tg(hx), ty = to_tg(hy);
  std::vector<tg::Tensor> tw, tb, params;
  for (size_t i = 0; i < hw.size(); i++) {
    tw.push_back(to_tg(hw[i].detach()).requires_grad_());
    tb.push_back(to_tg(hb[i].detach()).requires_grad_());
    params.push_back(tw.back());
    params.push_back(tb.back());
  }
  std::vector<torch::Tensor> hparams;
  for (size_t i = 0; i < hw.size(); i++) {
    hparams.push_back(hw[i]);
    hparams.push_back(hb[i]);
  }
  auto tg_forward = [&](const tg::Tensor& x) {
    tg::Tensor h = x;
    for (size_t i = 0; i < tw.size(); i++) {
      h = h.linear(tw[i], tb[i]);
      if (i + 1 < tw.size()) h = h.relu();
    }
    return h;
  };
  auto th_forward = [&](const torch::Tensor& x) {
    torch::Tensor h = x;
    for (size_t i = 0; i < hw.size(); i++) {
      h = torch::linear(h, hw[i], hb[i]);
      if (i + 1 < hw.size()) h = torch::relu(h);
    }
    return h;
  };
  // correctness first: the same loss and first-layer gradient
  tg::Tensor tl = tg_forward(tx).cross_entropy(ty);
  auto tgr = tl.gradient(params);
  tg::Tensor::realize_all({&tl, &tgr[0]});
  torch::Tensor hl = torch::cross_entropy_loss(th_forward(hx), hy);
  auto hgr = torch::autograd::grad({hl}, hparams);
  double gdiff = (torch::from_blob(tgr[0].to_vector<float>().data(), hgr[0].sizes()).clone() - hgr[0]).abs().max().item<double>();
  std::printf("MLP 784-512-512-512-10, batch 256: loss tg %.6f libtorch %.6f; max |dW1| difference %.2e\n", tl.item<float>(),
              hl.item<float>(), gdiff);

  double tg_f = median_ms([&] {
    tg::Tensor o = tg_forward(tx);
    o.realize();
  });
  double th_f = median_ms([&] {
    torch::NoGradGuard ng;
    th_forward(hx);
  });
  report("MLP forward", "mlp_fwd_b256", tg_f, th_f);
  double tg_fb = median_ms([&] {
    tg::Tensor loss = tg_forward(tx).cross_entropy(ty);
    auto g = loss.gradient(params);
    std::vector<tg::Tensor*> all{&loss};
    for (auto& t : g) all.push_back(&t);
    tg::Tensor::realize_all(all);
  });
  double th_fb = median_ms([&] {
    torch::Tensor loss = torch::cross_entropy_loss(th_forward(hx), hy);
    torch::autograd::grad({loss}, hparams);
  });
  report("MLP forward+backward", "mlp_fwdbwd_b256", tg_fb, th_fb);
  tg::TinyJit step([&](const std::vector<tg::Tensor>& in) {
    tg::Tensor loss = tg_forward(in[0]).cross_entropy(in[1]);
    auto g = loss.gradient(params);
    g.insert(g.begin(), loss);
    std::vector<tg::Tensor*> all;
    for (auto& t : g) all.push_back(&t);
    tg::Tensor::realize_all(all);
    return g;
  });
  for (int i = 0; i < 3; i++) step({tx, ty});  // compile and capture
  double tg_jit = median_ms([&] { step({tx, ty}); });
  report("MLP forward+backward (TinyJit)", "mlp_fwdbwd_b256_jit", tg_jit, th_fb);
}

void bench_conv() {
  torch::manual_seed(1);
  torch::Tensor hx = torch::rand({128, 32, 28, 28}).requires_grad_(), hw = (torch::rand({32, 32, 5, 5}) - 0.5).requires_grad_(),
                hb = torch::rand({32}).requires_grad_();
  torch::Tensor hseed = torch::randn({128, 32, 24, 24});
  tg::Tensor tx = to_tg(hx.detach()).requires_grad_(), tw = to_tg(hw.detach()).requires_grad_(), tb = to_tg(hb.detach()).requires_grad_();
  tg::Tensor tseed = to_tg(hseed);
  tg::Tensor ty = tx.conv2d(tw, tb);
  auto tgr = ty.gradient({tx, tw, tb}, &tseed);
  tg::Tensor::realize_all({&ty, &tgr[1]});
  torch::Tensor hy = torch::conv2d(hx, hw, hb);
  auto hgr = torch::autograd::grad({hy}, {hx, hw, hb}, {hseed});
  double ydiff = (torch::from_blob(ty.to_vector<float>().data(), hy.sizes()).clone() - hy).abs().max().item<double>();
  double wdiff = (torch::from_blob(tgr[1].to_vector<float>().data(), hgr[1].sizes()).clone() - hgr[1]).abs().max().item<double>();
  std::printf("conv2d N=128 C=32 28x28, 5x5 -> 32: max |y| difference %.2e, max |dW| difference %.2e (|dW| up to %.1f)\n", ydiff,
              wdiff, hgr[1].abs().max().item<double>());

  double tg_f = median_ms([&] {
    tg::NoGrad ng;  // as libtorch's NoGradGuard below: an inference's forward (conv's cost model picks for it alone)
    tg::Tensor y = tx.conv2d(tw, tb);
    y.realize();
  }, 5);
  double th_f = median_ms([&] {
    torch::NoGradGuard ng;
    torch::conv2d(hx, hw, hb);
  });
  report("conv2d forward", "conv2d_fwd_n128", tg_f, th_f);
  double tg_fb = median_ms([&] {
    tg::Tensor y = tx.conv2d(tw, tb);
    auto g = y.gradient({tx, tw, tb}, &tseed);
    tg::Tensor::realize_all({&y, &g[0], &g[1], &g[2]});
  }, 5);
  double th_fb = median_ms([&] {
    torch::Tensor y = torch::conv2d(hx, hw, hb);
    torch::autograd::grad({y}, {hx, hw, hb}, {hseed});
  });
  report("conv2d forward+backward", "conv2d_fwdbwd_n128", tg_fb, th_fb);
}

// The input gradient of a convolution whose windows do not overlap (1x1; 2x2 stride 2, a downsampling or patchify
// layer): no window is summed over repeats, so the gradient is one product of the output's gradient and the weight.
void bench_conv_dx(int64_t n, int64_t ci, int64_t co, int64_t hw, int64_t k, int64_t stride) {
  torch::manual_seed(3);
  torch::Tensor hx = torch::rand({n, ci, hw, hw}).requires_grad_(), hw_ = (torch::rand({co, ci, k, k}) - 0.5);
  int64_t oh = (hw - k) / stride + 1;
  torch::Tensor hseed = torch::randn({n, co, oh, oh});
  tg::Tensor tx = to_tg(hx.detach()).requires_grad_(), tw = to_tg(hw_), tseed = to_tg(hseed);
  auto dx = [&] { return tx.conv2d(tw, std::nullopt, stride).gradient({tx}, &tseed)[0]; };
  torch::Tensor hdx = torch::autograd::grad({torch::conv2d(hx, hw_, {}, stride)}, {hx}, {hseed})[0];
  char what[96], json[64];
  std::snprintf(what, sizeof what, "conv2d %lldx%lld s%lld d/dx", (long long)k, (long long)k, (long long)stride);
  std::snprintf(json, sizeof json, "conv2d_dx_k%lld_s%lld", (long long)k, (long long)stride);
  std::printf("%s N=%lld %lld->%lld %lldx%lld: max |dx| difference %.2e\n", what, (long long)n, (long long)ci,
              (long long)co, (long long)hw, (long long)hw, max_diff(dx(), hdx));
  double tg_ms = median_ms([&] { dx().realize(); }, 5);
  torch::Tensor xd = hx.detach();  // libtorch's input-gradient kernel alone (no forward)
  double th_ms = median_ms([&] {
    at::convolution_backward(hseed, xd, hw_, c10::nullopt, {stride, stride}, {0, 0}, {1, 1}, false, {0, 0}, 1,
                             {true, false, false});
  });
  report(what, json, tg_ms, th_ms);
}

// Memory-bound kernels against libtorch's and against a best-effort STREAM triad (bench/triad.hpp; bench/bandwidth
// judges the same kernels against it alone): an elementwise add of 2^24 floats, softmax and layer norm (no affine)
// over the rows of a 4096x4096 matrix; GB/s counts each input read once and the output written once. tg, libtorch and
// the triad run in turn, 15 rounds, each twice a round (bench::interleaved: whichever runs first after another is
// slower): tg against libtorch by the medians of each round's better run, tg against the triad by bests (the triad's
// best in the same rounds: the VM's bandwidth moves from one minute to the next). glibc maps each 64 MiB result afresh (mmap
// above its 32 MiB threshold) and the first touch of its pages cost libtorch 250-380 ms per call on the VM (0.5
// GB/s): freed blocks stay in the heap (main), as tg's allocator keeps its freed buffers, so both sides reuse warm memory.
void bench_memory() {
  torch::manual_seed(4);
  const int64_t n = int64_t(1) << 24, R = 4096;
  torch::Tensor hx = torch::rand({n}), hy = torch::rand({n}), hm = torch::rand({R, R});
  tg::Tensor tx = to_tg(hx), ty = to_tg(hy), tm = to_tg(hm);
  std::printf("add 2^24: max difference %.2e; softmax 4096x4096: %.2e; layernorm 4096x4096: %.2e\n",
              max_diff(tg::Tensor(tx + ty), hx + hy), max_diff(tm.softmax(-1), hm.softmax(-1)),
              max_diff(tm.layer_norm({R}), torch::layer_norm(hm, {R})));
  torch::NoGradGuard ng;
  bench::Triad triad;
  triad.best_ms(3);
  triad.check();
  std::printf("triad: %s\n", triad.describe().c_str());
  auto one = [&](const char* what, const char* json, double bytes, auto&& tg_f, auto&& th_f) {
    tg_f(), th_f();  // compile, warm
    bench::Rounds r = bench::interleaved(triad, {tg_f, th_f}, 15);
    double tg_best = r.best(0), tri_ms = r.triad_ms, tg_med = r.median(0), th_med = r.median(1);
    char line[96];
    std::snprintf(line, sizeof line, "%s (%.1f / %.1f GB/s)", what, bytes / tg_med / 1e6, bytes / th_med / 1e6);
    report(line, json, tg_med, th_med);
    double tg_gbs = bytes / tg_best / 1e6, tri_gbs = triad.gbs(tri_ms);
    std::printf("%-34s tg best %.1f GB/s   triad best %.1f GB/s   tg/triad %.2f\n", "", tg_gbs, tri_gbs,
                tg_gbs / tri_gbs);
  };
  one("add 2^24", "add_f32_2^24", 12.0 * double(n), [&] { tg::Tensor(tx + ty).realize(); }, [&] { hx + hy; });
  one("softmax 4096x4096", "softmax_4096x4096", 8.0 * double(R * R), [&] { tm.softmax(-1).realize(); },
      [&] { hm.softmax(-1); });
  one("layernorm 4096x4096", "layernorm_4096x4096", 8.0 * double(R * R), [&] { tm.layer_norm({R}).realize(); },
      [&] { torch::layer_norm(hm, {R}); });
  std::printf("triad best of the run: ordinary stores %.1f GB/s, non-temporal %.1f GB/s\n", triad.best_gbs(false),
              triad.best_gbs(true));
}

void bench_bmm() {
  const int64_t B = 32, N = 256;
  torch::manual_seed(2);
  torch::Tensor ha = torch::rand({B, N, N}), hb = torch::rand({B, N, N});
  tg::Tensor ta = to_tg(ha), tb = to_tg(hb);
  double diff = max_diff(ta.matmul(tb), torch::bmm(ha, hb));
  std::printf("batched matmul %lld x %lldx%lld @ %lldx%lld: max |c| difference %.2e\n", (long long)B, (long long)N,
              (long long)N, (long long)N, (long long)N, diff);
  double tg_ms = median_ms([&] { ta.matmul(tb).realize(); });
  double th_ms = median_ms([&] { torch::bmm(ha, hb); });
  report("batched matmul (32x256^3)", "bmm_f32_32x256", tg_ms, th_ms);
}

// A GPT-2-small block (pre-LayerNorm): x + proj(attn(ln1(x))), then + fc2(gelu(fc1(ln2(x)))). Weights in torch's
// [out, in] layout on both sides.
void bench_gpt2_block() {
  const int64_t T = 128, D = 768, H = 12, F = 3072;
  torch::manual_seed(3);
  auto w = [](int64_t o, int64_t i) { return torch::randn({o, i}) * 0.02; };
  torch::Tensor hx = torch::randn({1, T, D}), ln1w = 1 + 0.1 * torch::randn({D}), ln1b = 0.1 * torch::randn({D}),
                ln2w = 1 + 0.1 * torch::randn({D}), ln2b = 0.1 * torch::randn({D}), wqkv = w(3 * D, D),
                bqkv = 0.02 * torch::randn({3 * D}), wo = w(D, D), bo = 0.02 * torch::randn({D}), w1 = w(F, D),
                b1 = 0.02 * torch::randn({F}), w2 = w(D, F), b2 = 0.02 * torch::randn({D});
  torch::Tensor causal = torch::ones({T, T}, torch::kBool).tril();
  auto th_block = [&](const torch::Tensor& x) {
    torch::Tensor h = torch::layer_norm(x, {D}, ln1w, ln1b);
    auto qkv = torch::linear(h, wqkv, bqkv).split(D, 2);
    auto heads = [&](const torch::Tensor& t) { return t.view({1, T, H, D / H}).transpose(1, 2); };
    torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(D / H));
    att = att.masked_fill(causal.logical_not(), -INFINITY).softmax(-1);
    torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({1, T, D});
    torch::Tensor x1 = x + torch::linear(y, wo, bo);
    torch::Tensor m = torch::gelu(torch::linear(torch::layer_norm(x1, {D}, ln2w, ln2b), w1, b1), "tanh");
    return x1 + torch::linear(m, w2, b2);
  };
  tg::Tensor tx = to_tg(hx), tln1w = to_tg(ln1w), tln1b = to_tg(ln1b), tln2w = to_tg(ln2w), tln2b = to_tg(ln2b),
             twqkv = to_tg(wqkv), tbqkv = to_tg(bqkv), two = to_tg(wo), tbo = to_tg(bo), tw1 = to_tg(w1), tb1 = to_tg(b1),
             tw2 = to_tg(w2), tb2 = to_tg(b2);
  auto tg_block = [&](const tg::Tensor& x) {
    tg::Tensor h = x.layer_norm({D}, tln1w, tln1b);
    auto qkv = h.linear(twqkv, tbqkv).split(D, 2);
    auto heads = [&](const tg::Tensor& t) { return t.reshape({1, T, H, D / H}).transpose(1, 2); };
    tg::Tensor y = heads(qkv[0]).scaled_dot_product_attention(heads(qkv[1]), heads(qkv[2]), std::nullopt, 0.0, true);
    tg::Tensor x1 = x + y.transpose(1, 2).reshape({1, T, D}).linear(two, tbo);
    tg::Tensor m = x1.layer_norm({D}, tln2w, tln2b).linear(tw1, tb1).gelu("tanh");
    return x1 + m.linear(tw2, tb2);
  };
  torch::Tensor href;
  {
    torch::NoGradGuard ng;
    href = th_block(hx);
  }
  std::printf("GPT-2-small block, 1 x %lld tokens, d=%lld, %lld heads, MLP %lld: max |y| difference %.2e (|y| up to %.1f)\n",
              (long long)T, (long long)D, (long long)H, (long long)F, max_diff(tg_block(tx), href),
              href.abs().max().item<double>());
  double tg_ms = median_ms([&] { tg_block(tx).realize(); }, 15);
  double th_ms = median_ms([&] {
    torch::NoGradGuard ng;
    th_block(hx);
  }, 15);
  report("GPT-2 block forward (T=128)", "gpt2_block_fwd_t128", tg_ms, th_ms);
}

}  // namespace

// Random numbers: normal ones (tg: Box-Muller over its threefry uniforms, a log, a sqrt and a cos an element) and
// dropout, against libtorch's generators. The values differ by construction; their mean and deviation are checked.
void bench_random() {
  const int64_t R = 4096, C = 4096;
  std::vector<float> v = tg::Tensor::randn({R, C}).to_vector<float>();
  double sum = 0, sq = 0;
  for (float x : v) sum += x, sq += double(x) * x;
  const double mean = sum / double(v.size()), sd = std::sqrt(sq / double(v.size()) - mean * mean);
  std::printf("randn %lldx%lld: mean %.2e, deviation %.4f (libtorch's generator differs; these must be 0 and 1)\n",
              (long long)R, (long long)C, mean, sd);
  if (std::fabs(mean) > 1e-3 || std::fabs(sd - 1) > 1e-3) {
    std::fprintf(stderr, "torch_compare: randn's moments are off\n");
    std::exit(1);
  }
  report("randn 4096x4096", "randn_f32_4096", median_ms([&] { tg::Tensor::randn({R, C}).realize(); }),
         median_ms([&] { torch::randn({R, C}); }));
  // uniform numbers in rows of 12 (its two loops merge into one, split_ranges: before, 12 copies of the threefry in
  // scalar code, 7 ns an element)
  report("rand 262144x12", "rand_f32_262144x12", median_ms([&] { tg::Tensor::rand({262144, 12}).realize(); }),
         median_ms([&] { torch::rand({262144, 12}); }));
  // a count that no vector divides (999000 = 2 threads x 4 x 124875): padded to whole vectors (PADTO); before, 30
  // copies of the threefry in scalar code, 23-33 ms
  report("randn 1000x999", "randn_f32_1000x999", median_ms([&] { tg::Tensor::randn({1000, 999}).realize(); }),
         median_ms([&] { torch::randn({1000, 999}); }));
  tg::Tensor tx = tg::Tensor::rand({R, C}).realize();
  torch::Tensor hx = torch::rand({R, C});
  report("dropout 0.5, 4096x4096", "dropout_f32_4096", median_ms([&] { tg::Tensor(tx.dropout(0.5)).realize(); }),
         median_ms([&] { torch::dropout(hx, 0.5, true); }));
}

int main(int argc, char** argv) {
  // freed blocks stay in glibc's heap (no mmap per large block, no trimming): both sides reuse warm memory
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // the peer on as many threads as tg (every core, or THREADS=N; libtorch's default here is 1 intra-op thread)
  torch::set_num_threads(bench::tg_threads());
  std::printf("libtorch %s, %d intra-op threads; tg on CPU; %ld cores\n", TORCH_VERSION, torch::get_num_threads(),
              sysconf(_SC_NPROCESSORS_ONLN));
  bench::LoadReport load;
  // `torch_compare [CASE...]`: only the cases named (mlp, conv, conv_dx, memory, bmm, gpt2, random)
  auto want = [&](const char* c) { return argc < 2 || std::find_if(argv + 1, argv + argc, [&](const char* a) { return std::string(a) == c; }) != argv + argc; };
  if (want("mlp")) bench_mlp();
  if (want("conv")) bench_conv();
  if (want("conv_dx")) {
    bench_conv_dx(64, 128, 128, 28, 1, 1);
    bench_conv_dx(64, 64, 128, 56, 2, 2);
  }
  if (want("memory")) bench_memory();
  if (want("bmm")) bench_bmm();
  if (want("gpt2")) bench_gpt2_block();
  if (want("random")) bench_random();
  return 0;
}
