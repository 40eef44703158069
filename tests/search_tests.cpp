// BEAM search and its SQLite cache: the winner applies and computes what the plain loops compute, the user's
// buffers are never written, a second search is served from the cache, and bad input (environment values, a
// corrupt or locked database, a candidate that fails to compile) never crashes or changes a result.
#include <algorithm>
#include <mutex>
#include <doctest/doctest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "scoped_env.hpp"
#include "tg/codegen.hpp"
#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/schedule.hpp"
#include "tg/search.hpp"
#include "tg/symbolic.hpp"
#include "tg/tensor.hpp"

using namespace tg;
namespace fs = std::filesystem;

namespace {

struct Kern {
  UOpRef ast;
  std::vector<std::shared_ptr<Buffer>> bufs;
  std::vector<Buffer*> raw() const {
    std::vector<Buffer*> v;
    for (auto& b : bufs) v.push_back(b.get());
    return v;
  }
};
Kern last_kernel(const Tensor& t) {
  UOpRef root = t.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(!s.items.empty());
  return Kern{s.items.back().ast, s.items.back().bufs};
}

// Lower with explicit opts, compile and run on scratch copies of the buffers; the output's floats.
std::vector<float> run_with(const Kern& k, const std::vector<Opt>& opts) {
  Device& dev = get_device("CPU");
  LowerOptions lo;
  lo.opts = &opts;
  lo.config.threads = dev.threads();
  lo.index64 = dev.index64();
  static int n = 0;
  CompiledKernel ck = lower_kernel(k.ast, "search_k" + std::to_string(n++), dev.renderer(), lo);
  auto prog = dev.get_program(ck.src, ck.name);
  std::vector<std::unique_ptr<Buffer>> copies;
  std::vector<void*> ptrs;
  for (auto& b : k.bufs) {
    copies.push_back(std::make_unique<Buffer>(b->device(), b->dtype(), b->size()));
    std::vector<uint8_t> host(b->nbytes(), 0);
    if (b->allocated()) b->copyout(host.data(), host.size());
    copies.back()->copyin(host.data(), host.size());
    ptrs.push_back(copies.back()->ptr());
  }
  std::vector<int64_t> vars(std::max<size_t>(1, ck.var_names.size()), 0);
  LaunchDims dims;
  dims.n_vars = int(ck.var_names.size());
  if (ck.core_var >= 0) dims.core_var = ck.core_var, dims.global[0] = ck.threads;
  prog->run(ptrs.data(), vars.data(), dims);
  std::vector<float> out(copies[0]->nbytes() / 4);
  copies[0]->copyout(out.data(), out.size() * 4);
  return out;
}

Tensor randn(Shape s, uint32_t seed) {
  std::mt19937 g{seed};
  std::normal_distribution<float> d;
  int64_t n = 1;
  for (auto x : s) n *= x;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return Tensor::from_vector(v, s);
}

void check_close(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); i++) REQUIRE(std::abs(a[i] - b[i]) <= tol * (1 + std::abs(b[i])));
}

// A fresh folder under the temp dir, removed at scope exit.
struct TempDir {
  fs::path p;
  TempDir() {
    static int n = 0;
    p = fs::temp_directory_path() / ("tg_search_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
  std::string db() const { return (p / "beam.db").string(); }
};

// Set (or unset, with nullptr) an environment variable for the scope; the env cache is reset both ways.

std::vector<std::vector<uint8_t>> contents(const Kern& k) {
  std::vector<std::vector<uint8_t>> out;
  for (auto& b : k.bufs) {
    std::vector<uint8_t> v;
    if (b->allocated()) {
      v.resize(b->nbytes());
      b->copyout(v.data(), v.size());
    }
    out.push_back(std::move(v));
  }
  return out;
}

BeamOptions opts_with(BeamCache* c, int width = 2, double budget = 30) {
  BeamOptions o;
  o.width = width;
  o.budget_s = budget;
  o.cache = c;
  return o;
}

bool has_op(const std::vector<Opt>& opts, OptOp op) {
  for (const Opt& o : opts)
    if (o.op == op) return true;
  return false;
}

}  // namespace

TEST_CASE("BEAM's winners apply and compute what the plain loops compute (matmul, reduce, elementwise)") {
  TempDir dir;
  BeamCache cache(dir.db());
  Tensor a = randn({32, 48}, 1), b = randn({48, 64}, 2), c = randn({16, 512}, 3);
  a.realize(), b.realize(), c.realize();
  Kern mm = last_kernel(a.matmul(b)), rs = last_kernel(c.sum(1)), ew = last_kernel(Tensor((c * 2 + 1).exp()));
  for (const Kern* k : {&mm, &rs, &ew}) {
    auto before = contents(*k);
    BeamResult r = beam_search(k->ast, k->raw(), "CPU", opts_with(&cache));
    CAPTURE(opts_to_text(r.opts));
    CHECK_FALSE(r.cached);
    CHECK(r.compiled >= 1);
    CHECK(r.rounds >= 1);
    CHECK(r.us > 0);
    CHECK(contents(*k) == before);  // the search ran on scratch copies
    CHECK_FALSE(k->bufs[0]->allocated());  // not even the output was touched
    if (k == &ew) CHECK(run_with(*k, r.opts) == run_with(*k, {}));  // elementwise: bit-identical
    else check_close(run_with(*k, r.opts), run_with(*k, {}), 1e-5f);
  }
  CHECK(cache.rows() == 3);
}

TEST_CASE("BEAM on a kernel that writes in place leaves the user's data alone") {
  TempDir dir;
  BeamCache cache(dir.db());
  Tensor a = randn({64, 64}, 4);
  a.realize();
  std::vector<float> orig = a.to_vector<float>();
  a.assign(Tensor(a * 2 + 1));
  Kern k = last_kernel(a);
  auto before = contents(k);
  BeamResult r = beam_search(k.ast, k.raw(), "CPU", opts_with(&cache, 2, 10));
  CHECK(contents(k) == before);
  // the assign itself still computes from the untouched values
  std::vector<float> now = a.to_vector<float>();
  for (size_t i = 0; i < orig.size(); i++) REQUIRE(now[i] == orig[i] * 2 + 1);
  CHECK(run_with(k, r.opts) == run_with(k, {}));
}

TEST_CASE("a second search of the same kernel compiles nothing: the result comes from the cache") {
  TempDir dir;
  Tensor a = randn({24, 40}, 5), b = randn({40, 32}, 6);
  a.realize(), b.realize();
  Kern mm = last_kernel(a.matmul(b));
  BeamResult first, second, third;
  {
    BeamCache cache(dir.db());
    first = beam_search(mm.ast, mm.raw(), "CPU", opts_with(&cache));
    REQUIRE_FALSE(first.cached);
    REQUIRE(first.compiled > 0);
    size_t compiled = beam_candidates_compiled();
    second = beam_search(mm.ast, mm.raw(), "CPU", opts_with(&cache));
    CHECK(second.cached);
    CHECK(second.compiled == 0);
    CHECK(beam_candidates_compiled() == compiled);
    CHECK(second.opts == first.opts);
    CHECK(second.us == first.us);
  }
  // a new connection (as a second process would open) finds it too; another width is another key
  BeamCache again(dir.db());
  size_t compiled = beam_candidates_compiled();
  third = beam_search(mm.ast, mm.raw(), "CPU", opts_with(&again));
  CHECK(third.cached);
  CHECK(third.opts == first.opts);
  CHECK(beam_candidates_compiled() == compiled);
  CHECK_FALSE(again.get(BeamKey{mm.ast->key(), "CPU", get_device("CPU").compiler().id(), 3}).has_value());
}

TEST_CASE("BEAM=N through realize: the searched kernel is right and its result is stored") {
  TempDir dir;
  ScopedEnv cd("TG_CACHE_DIR", dir.p.string().c_str()), beam("BEAM", "1"), budget("BEAM_BUDGET", "20");
  Tensor a = randn({20, 36}, 7), b = randn({36, 44}, 8);
  auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  std::vector<float> cv = a.matmul(b).to_vector<float>();
  for (int i = 0; i < 20; i++)
    for (int j = 0; j < 44; j++) {
      double s = 0;
      for (int x = 0; x < 36; x++) s += double(av[size_t(i * 36 + x)]) * double(bv[size_t(x * 44 + j)]);
      REQUIRE(std::abs(s - cv[size_t(i * 44 + j)]) <= 1e-5 * (1 + std::abs(s)));
    }
  BeamCache* g = BeamCache::global();
  REQUIRE(g != nullptr);
  CHECK(g->path() == dir.db());
  CHECK(g->rows() >= 1);
}

TEST_CASE("BEAM and BEAM_BUDGET values that are not numbers are errors naming the variable and the value") {
  auto msg = [](const char* var, const char* val) {
    ScopedEnv e(var, val);
    try {
      beam_options_from_env();
    } catch (const EnvError& ex) {
      return std::string(ex.what());
    }
    return std::string("no error");
  };
  CHECK(msg("BEAM", "abc").find("BEAM='abc'") != std::string::npos);
  CHECK(msg("BEAM", "2x").find("BEAM='2x'") != std::string::npos);
  CHECK(msg("BEAM", "-1").find("BEAM=-1") != std::string::npos);
  CHECK(msg("BEAM", "65").find("0..64") != std::string::npos);
  CHECK(msg("BEAM_BUDGET", "fast").find("BEAM_BUDGET='fast'") != std::string::npos);
  CHECK(msg("BEAM_BUDGET", "0").find("BEAM_BUDGET=0") != std::string::npos);
  CHECK(msg("BEAM_BUDGET", "-3").find("positive") != std::string::npos);
  CHECK(msg("BEAM_BUDGET", "nan").find("positive") != std::string::npos);
  {
    ScopedEnv w("BEAM", "3"), b("BEAM_BUDGET", "2.5");
    BeamOptions o = beam_options_from_env();
    CHECK(o.width == 3);
    CHECK(o.budget_s == 2.5);
  }
  {
    ScopedEnv w("BEAM", "zwei");  // through realize: the error reaches the caller, nothing is computed
    Tensor a = randn({3, 5}, 9);
    CHECK_THROWS_AS(Tensor(a * 3 + 7).realize(), EnvError);
  }
  CHECK_THROWS_AS(beam_search(randn({4}, 1).uop(), {}, "CPU", opts_with(nullptr, 0)), Error);
}

TEST_CASE("a corrupt cache file is rebuilt with one warning, and the result is still right") {
  TempDir dir;
  {
    std::ofstream f(dir.db(), std::ios::binary);
    for (int i = 0; i < 200; i++) f << "this is not an SQLite database ";
  }
  Tensor c = randn({8, 256}, 10);
  c.realize();
  Kern rs = last_kernel(c.sum(1));
  BeamCache cache(dir.db());
  BeamResult r = beam_search(rs.ast, rs.raw(), "CPU", opts_with(&cache, 1, 10));
  CHECK(cache.warnings() == 1);
  CHECK_FALSE(r.cached);
  check_close(run_with(rs, r.opts), run_with(rs, {}), 1e-5f);
  BeamResult again = beam_search(rs.ast, rs.raw(), "CPU", opts_with(&cache, 1, 10));
  CHECK(again.cached);  // the rebuilt database works
  CHECK(cache.warnings() == 1);
}

TEST_CASE("unreadable or inapplicable cached rows are misses, replaced by a new search") {
  TempDir dir;
  Tensor a = randn({16, 32}, 11), b = randn({32, 16}, 12);
  a.realize(), b.realize();
  Kern mm = last_kernel(a.matmul(b));
  BeamKey key{mm.ast->key(), "CPU", get_device("CPU").compiler().id(), 1};
  for (const char* bad : {"UPCAST banana", "UPCAST 9 2", "FROBNICATE 0 2", "UPCAST 0 3"}) {
    CAPTURE(bad);
    {
      BeamCache writer(dir.db());
      REQUIRE(writer.rows() == 0);  // creates the table
    }
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(dir.db().c_str(), &db) == SQLITE_OK);
    std::string sql = "INSERT OR REPLACE INTO beam_v1 VALUES ('" + key.ast + "', 'CPU', '" + key.compiler + "', 1, '" +
                      bad + "', 1.0, 1)";
    REQUIRE(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
    BeamCache cache(dir.db());
    BeamResult r = beam_search(mm.ast, mm.raw(), "CPU", opts_with(&cache, 1, 10));
    CHECK_FALSE(r.cached);
    check_close(run_with(mm, r.opts), run_with(mm, {}), 1e-5f);
    auto e = cache.get(key);
    REQUIRE(e.has_value());
    CHECK(e->opts == r.opts);
    fs::remove_all(dir.p);
    fs::create_directories(dir.p);
  }
}

TEST_CASE("a locked cache is bypassed with a warning; the search result is still used") {
  TempDir dir;
  Tensor c = randn({8, 128}, 13);
  c.realize();
  Kern rs = last_kernel(Tensor(c * 3 - 1));
  BeamCache cache(dir.db(), 8192, 50);
  REQUIRE(cache.rows() == 0);
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(dir.db().c_str(), &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) == SQLITE_OK);  // another process writing
  BeamResult r = beam_search(rs.ast, rs.raw(), "CPU", opts_with(&cache, 1, 10));
  CHECK(cache.warnings() == 1);
  CHECK(run_with(rs, r.opts) == run_with(rs, {}));
  REQUIRE(sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(db);
  CHECK(cache.rows() == 0);  // nothing was stored while locked
  CHECK(cache.put(BeamKey{"k", "CPU", "c", 1}, {r.opts, r.us}));  // and the cache works again afterwards
  CHECK(cache.rows() == 1);
}

TEST_CASE("an unwritable cache location is bypassed with a warning") {
  TempDir dir;
  fs::create_directories(dir.p / "beam.db");  // a folder where the file should be
  BeamCache cache(dir.db());
  CHECK_FALSE(cache.put(BeamKey{"k", "CPU", "c", 1}, {{}, 1.0}));
  CHECK_FALSE(cache.get(BeamKey{"k", "CPU", "c", 1}).has_value());
  CHECK(cache.warnings() == 1);
}

TEST_CASE("a candidate that fails to compile is skipped and the search goes on") {
  TempDir dir;
  BeamCache cache(dir.db());
  Tensor a = randn({32, 64}, 14), b = randn({64, 8}, 15);  // a small register tile: UNROLL candidates fit the limits
  a.realize(), b.realize();
  Kern mm = last_kernel(a.matmul(b));
  BeamOptions o = opts_with(&cache, 2, 20);
  std::atomic<int> refused{0};
  o.before_compile = [&](const std::vector<Opt>& opts) {
    if (has_op(opts, OptOp::UNROLL)) {
      refused++;
      throw Error("[test] refusing to compile a candidate with UNROLL");
    }
  };
  BeamResult r = beam_search(mm.ast, mm.raw(), "CPU", o);
  CHECK(refused.load() > 0);
  CHECK(r.failed == refused.load());
  CHECK(r.compiled > 0);
  CHECK_FALSE(has_op(r.opts, OptOp::UNROLL));
  check_close(run_with(mm, r.opts), run_with(mm, {}), 1e-5f);
  // every candidate failing: the default opts, and nothing stored
  TempDir dir2;
  BeamCache empty(dir2.db());
  o.cache = &empty;
  o.before_compile = [](const std::vector<Opt>&) { throw Error("[test] no compiler today"); };
  BeamResult none = beam_search(mm.ast, mm.raw(), "CPU", o);
  CHECK(none.compiled == 0);
  CHECK(none.opts == hand_coded_optimizations(graph_rewrite(mm.ast, symbolic(), nullptr, false, "s"),
                                              opt_config(get_device("CPU"))));
  CHECK(empty.rows() == 0);
}

TEST_CASE("BEAM starts from the heuristic's best register tiles, not only its first choice") {
  TempDir dir;
  BeamCache cache(dir.db());
  Tensor a = randn({64, 48}, 21), b = randn({48, 96}, 22);
  a.realize(), b.realize();
  Kern mm = last_kernel(a.matmul(b));
  UOpRef base = split_ranges(graph_rewrite(mm.ast, symbolic(), nullptr, false, "s"));
  auto alts = hand_coded_alternatives(base, opt_config(get_device("CPU")), 4);
  REQUIRE(alts.size() >= 2);  // the first tile already fills the copy budget; the others are other shapes
  std::mutex mu;
  std::vector<std::vector<Opt>> compiled;
  BeamOptions o = opts_with(&cache, 2, 20);
  o.before_compile = [&](const std::vector<Opt>& opts) {
    std::lock_guard lk(mu);
    compiled.push_back(opts);
  };
  BeamResult r = beam_search(mm.ast, mm.raw(), "CPU", o);
  for (const auto& alt : alts) CHECK(std::find(compiled.begin(), compiled.end(), alt) != compiled.end());
  check_close(run_with(mm, r.opts), run_with(mm, {}), 1e-5f);
}

TEST_CASE("a candidate that crashes is skipped and reported; the search goes on and the process lives") {
  TempDir dir;
  BeamCache cache(dir.db());
  Tensor a = randn({32, 64}, 16), b = randn({64, 8}, 17);
  a.realize(), b.realize();
  Kern mm = last_kernel(a.matmul(b));
  BeamOptions o = opts_with(&cache, 2, 20);
  std::atomic<int> poisoned{0};
  // Candidates with an UNROLL write through a wild pointer before they return: SIGSEGV when they run.
  o.edit_source = [&](const std::vector<Opt>& opts, std::string& src) {
    if (!has_op(opts, OptOp::UNROLL)) return;
    size_t at = src.find("  ret void\n");
    REQUIRE(at != std::string::npos);
    src.insert(at, "  store volatile i32 1, ptr inttoptr (i64 8 to ptr)\n");
    poisoned++;
  };
  BeamResult r = beam_search(mm.ast, mm.raw(), "CPU", o);
  CHECK(poisoned.load() > 0);
  CHECK(r.failed == poisoned.load());  // every poisoned one refused, no other
  CHECK(r.compiled > r.failed);
  CHECK_FALSE(has_op(r.opts, OptOp::UNROLL));
  check_close(run_with(mm, r.opts), run_with(mm, {}), 1e-5f);
}

TEST_CASE("the cache keeps only the newest rows, and concurrent writers lose nothing") {
  TempDir dir;
  {
    BeamCache small(dir.db(), 3);
    for (int i = 0; i < 5; i++) REQUIRE(small.put(BeamKey{"k" + std::to_string(i), "CPU", "c", 1}, {{}, double(i)}));
    CHECK(small.rows() == 3);
    CHECK_FALSE(small.get(BeamKey{"k1", "CPU", "c", 1}).has_value());
    REQUIRE(small.get(BeamKey{"k4", "CPU", "c", 1}).has_value());
    CHECK(small.get(BeamKey{"k4", "CPU", "c", 1})->us == 4.0);
  }
  TempDir dir2;
  BeamCache c1(dir2.db(), 1000, 5000), c2(dir2.db(), 1000, 5000);
  REQUIRE(c1.rows() == 0);
  auto writer = [](BeamCache* c, int base) {
    for (int i = 0; i < 40; i++)
      c->put(BeamKey{"w" + std::to_string(base + i), "CPU", "c", 1}, {{Opt{OptOp::UPCAST, 0, 4}}, 1.0});
  };
  std::thread t1(writer, &c1, 0), t2(writer, &c2, 1000);
  t1.join(), t2.join();
  CHECK(c1.rows() == 80);
  CHECK(c1.warnings() + c2.warnings() == 0);
}

TEST_CASE("BEAM actions are legal and within the upcast limit; opt lists round-trip through text") {
  Tensor a = randn({64, 48}, 16), b = randn({48, 96}, 17);
  a.realize(), b.realize();
  Kern mm = last_kernel(a.matmul(b));
  UOpRef base = graph_rewrite(mm.ast, symbolic(), nullptr, false, "s");
  OptConfig cfg{2, 16};
  auto acts = beam_actions(base, {}, cfg);
  REQUIRE(!acts.empty());
  bool thread = false, whole = false;
  for (auto& [opts, k] : acts) {
    REQUIRE(opts.size() == 1);
    CHECK(upcast_size(k) <= 256);
    CHECK(expanded_size(k) <= 8192);
    CHECK(apply_opt(base, opts[0]).get() == k.get());
    thread |= opts[0].op == OptOp::THREAD && opts[0].amt == 2;
    whole |= opts[0].op == OptOp::UNROLL && opts[0].amt == 48;  // amount 0: the whole reduce axis
    auto back = opts_from_text(opts_to_text(opts));
    REQUIRE(back.has_value());
    CHECK(*back == opts);
  }
  CHECK(thread);
  CHECK(whole);
  // expanded size: every node once without upcasts; an UPCAST of 4 copies what depends on it four times
  CHECK(expanded_size(base) == int64_t(toposort(base.get()).size()));
  UOpRef up = apply_opt(base, Opt{OptOp::UPCAST, 1, 4});
  CHECK(upcast_size(up) == 4);
  CHECK(expanded_size(up) > int64_t(toposort(up.get()).size()));
  CHECK(expanded_size(up) < 4 * int64_t(toposort(up.get()).size()));  // the A loads do not depend on it
  CHECK(beam_actions(base, {}, OptConfig{1, 16}).size() < acts.size());  // one thread: no THREAD actions
  // AVX2 (16 registers of 8 floats): no action makes more copies than 15 registers hold; from the heuristic's 2x8
  // rows-by-vector tile, doubling the rows (32 floats) is an action, multiplying them by 8 (128) is not
  OptConfig avx2{1, 8};
  avx2.vector_registers = 16;
  CHECK(beam_upcast_limit(avx2) == 120);
  CHECK(beam_upcast_limit(cfg) == 256);
  std::vector<Opt> tile{{OptOp::UPCAST, 1, 8}, {OptOp::UPCAST, 0, 2}};
  UOpRef tiled = base;
  for (const Opt& o : tile) tiled = apply_opt(tiled, o);
  bool rows2 = false, rows8 = false;
  for (auto& [opts, k] : beam_actions(tiled, tile, avx2)) {
    CHECK(upcast_size(k) <= 120);
    rows2 |= opts.back() == Opt{OptOp::UPCAST, 0, 2};
    rows8 |= opts.back() == Opt{OptOp::UPCAST, 0, 8};
  }
  CHECK(rows2);
  CHECK_FALSE(rows8);
  bool rows8_avx512 = false;
  for (auto& [opts, k] : beam_actions(tiled, tile, cfg)) rows8_avx512 |= opts.back() == Opt{OptOp::UPCAST, 0, 8};
  CHECK(rows8_avx512);
  CHECK(opts_to_text({Opt{OptOp::UPCAST, 1, 16}, Opt{OptOp::THREAD, 0, 2}}) == "UPCAST 1 16; THREAD 0 2");
  CHECK(opts_from_text("")->empty());
  for (const char* bad : {"UPCAST", "UPCAST 1", "UPCAST 1 16 7", "upcast 1 16", "UPCAST -1 2", "UPCAST 1 2;", "UPCAST 1 2;UNROLL 0 2"})
    CHECK_FALSE(opts_from_text(bad).has_value());
}
