// VIZ and PROFILE: the rewrite recorder's output on a small graph (stages and rule locations exact); a kernel's
// lowering recorded with its source; PROFILE's Chrome-trace JSON against DEBUG=2's kernel times; the VIZ page of the
// README matmul in headless Chromium (tests/viz/viz_page.mjs through npm playwright-core and Debian's chromium).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "scoped_env.hpp"
#include "test_util.hpp"
#include "tg/env.hpp"
#include "tg/plot.hpp"
#include "tg/tensor.hpp"
#include "tg/viz.hpp"

extern char** environ;

using namespace tg;
using namespace tg::pat;
using json = nlohmann::json;

namespace {
UOpRef var(const char* n) { return UOp::variable(n, 0, 100); }
UOpRef ci(int64_t v) { return UOp::cnst_int(dtypes::index, v); }

constexpr unsigned kRulesLine = __LINE__ + 2;
constexpr auto pm_viz = table(
    rule(x + 0_c, x),   // x+0 -> x
    rule(x * 1_c, x));  // x*1 -> x

std::string loc(unsigned line) { return std::string(__FILE__) + ":" + std::to_string(line); }

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Turns VIZ recording (level 2: no server) on for one test case and off again.
struct Recording {
  Recording() {
    viz::set_level(2);
    viz::clear();
  }
  ~Recording() {
    viz::set_level(0);
    viz::clear();
  }
};

// The op names of a recorded graph's changed nodes.
std::vector<std::string> changed_ops(const json& g) {
  std::vector<std::string> out;
  for (auto& n : g["nodes"])
    if (n["changed"]) out.push_back(n["op"]);
  return out;
}
}  // namespace

TEST_CASE("VIZ records a graph_rewrite: its context, stage, each rule's file:line and the graph after each rule") {
  Recording rec;
  PatternMatcher pm(pm_viz);
  UOpRef a = var("a");
  UOpRef e = a->alu(Ops::ADD, ci(0))->alu(Ops::MUL, ci(1));
  {
    viz::Context c("test", "small graph");
    CHECK(graph_rewrite(e, pm, nullptr, false, "fold identities") == a);
    CHECK(graph_rewrite(a, pm, nullptr, false, "nothing to do") == a);  // no rule, no change: not recorded
  }
  json j = json::parse(viz::to_json());
  INFO(j.dump());
  REQUIRE(j["contexts"].size() == 1);
  const json& c = j["contexts"][0];
  CHECK(c["kind"] == "test");
  CHECK(c["name"] == "small graph");
  REQUIRE(c["rewrites"].size() == 1);
  CHECK(c["rewrites"][0]["stage"] == "fold identities");
  CHECK(c["rewrites"][0]["rules"] == json::array({loc(kRulesLine), loc(kRulesLine + 1)}));

  json r = json::parse(viz::rewrite_json(0, 0));
  REQUIRE(r["graphs"].size() == 3);  // before, after each of the two rules
  CHECK(r["rules"][0]["loc"] == loc(kRulesLine));
  CHECK(r["rules"][0]["code"] == "rule(x + 0_c, x),   // x+0 -> x");  // the declaring line, read from the source tree
  std::vector<std::string> ops0;
  for (auto& n : r["graphs"][0]["nodes"]) ops0.push_back(n["op"]);
  CHECK(ops0 == std::vector<std::string>{"DEFINE_VAR", "CONST", "ADD", "CONST", "MUL"});
  CHECK(changed_ops(r["graphs"][0]).empty());
  // after x+0 -> x: the rule's result (a) is marked, not a*1 above it (rebuilt because its source changed)
  CHECK(changed_ops(r["graphs"][1]) == std::vector<std::string>{"DEFINE_VAR"});
  CHECK(r["graphs"][1]["nodes"].size() == 3);  // a, 1, a*1
  CHECK(changed_ops(r["graphs"][2]) == std::vector<std::string>{"DEFINE_VAR"});
  CHECK(r["graphs"][2]["nodes"].size() == 1);
  CHECK(test::error_of([] { viz::rewrite_json(0, 5); }).find("[viz] no rewrite 0/5") == 0);
}

TEST_CASE("VIZ off records nothing, and a caller's own trace still gets every rule with VIZ on") {
  viz::set_level(0);
  viz::clear();
  PatternMatcher pm(pm_viz);
  UOpRef e = var("a")->alu(Ops::ADD, ci(0));
  CHECK(graph_rewrite(e, pm) == var("a"));
  CHECK(json::parse(viz::to_json())["contexts"].empty());
  Recording rec;
  std::vector<RewriteStep> trace;
  RewriteOptions o;
  o.trace = &trace;
  o.name = "traced";
  CHECK(graph_rewrite(e, pm, o) == var("a"));
  CHECK(trace.size() == 1);
  json j = json::parse(viz::to_json());
  REQUIRE(j["contexts"].size() == 1);
  CHECK(j["contexts"][0]["kind"] == "other");  // outside any Context
  CHECK(j["contexts"][0]["rewrites"][0]["stage"] == "traced");
  CHECK_THROWS_AS(viz::set_level(3), Error);
}

TEST_CASE("a bad VIZ or PROFILE value is an EnvError naming the variable") {
  for (const char* var : {"VIZ", "PROFILE"}) {
    std::string msg;
    {
      ScopedEnv e(var, "7");
      env_reset_cache();
      viz::detail::g_viz.store(-1);  // read the environment again
      viz::detail::g_profile.store(-1);
      msg = test::error_of([&] { std::string(var) == "VIZ" ? (void)viz::level() : (void)profile::enabled(); });
    }
    env_reset_cache();
    viz::set_level(0);
    profile::set_enabled(false);
    CHECK(msg.find(std::string("[getenv] ") + var + "=7 is out of range") == 0);
  }
}

TEST_CASE("VIZ records the schedule and each kernel's lowering stages with its rendered source") {
  Recording rec;
  Tensor t = (Tensor::arange(37).reshape({1, 37}) * 3 + 1).sum(1);  // a shape no other case compiles
  CHECK(t.to_vector<int64_t>() == std::vector<int64_t>{3 * 666 + 37});
  json j = json::parse(viz::to_json());
  bool schedule = false;
  const json* kernel = nullptr;
  for (auto& c : j["contexts"]) {
    if (c["kind"] == "schedule") schedule = true;
    if (c["kind"] == "kernel") kernel = &c;
  }
  CHECK(schedule);
  REQUIRE(kernel);
  CHECK((*kernel)["source"].get<std::string>().find((*kernel)["name"].get<std::string>()) != std::string::npos);
  std::vector<std::string> stages;
  for (auto& r : (*kernel)["rewrites"]) stages.push_back(r["stage"].get<std::string>() + (r["steps"] == 0 ? " (pass)" : ""));
  INFO(json(stages).dump());  // today: simplify, expand reduces (pass), lower index dtype
  // the reduce's lowering: rule-based stages and hand passes (recorded as a whole)
  CHECK(stages.front() == "simplify");
  CHECK(std::any_of(stages.begin(), stages.end(), [](const std::string& s) { return s.ends_with(" (pass)"); }));
}

namespace {
// A child process with its stdout and stderr in files; killed (SIGTERM) and reaped when it goes out of scope.
struct Child {
  pid_t pid = -1;
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& out, const std::string& err) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> envs = env;
    for (char** e = environ; *e; e++) {
      std::string s(*e);
      if (s.rfind("VIZ", 0) && s.rfind("PROFILE", 0) && s.rfind("DEBUG", 0) && s.rfind("CACHELEVEL", 0)) envs.push_back(s);
    }
    std::vector<char*> a, ev;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    for (auto& s : envs) ev.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ev.push_back(nullptr);
    if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), ev.data()) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  int wait() {
    int st = 0;
    waitpid(pid, &st, 0);
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~Child() {
    if (pid > 0) kill(pid, SIGTERM), wait();
  }
};

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  close(s);
  return ntohs(a.sin_port);
}
}  // namespace

TEST_CASE("PROFILE=1 writes Chrome-trace JSON whose kernel durations sum to DEBUG=2's total") {
  const std::string dir = TG_BUILD_ROOT, prof = dir + "/viz_test_profile.json", err = dir + "/viz_test_profile.err";
  std::filesystem::remove(prof);
  Child p({dir + "/examples/matmul", "256"}, {"PROFILE=1", "DEBUG=2", "PROFILE_FILE=" + prof, "CACHELEVEL=0"}, dir + "/viz_test_profile.out", err);
  REQUIRE(p.pid > 0);
  REQUIRE(p.wait() == 0);
  std::string log = slurp(err);
  INFO(log);
  // DEBUG=2: "*** CPU  1 r_...  arg 2 mem ... GB tm     123.45us ..."
  std::regex line(R"(\*\*\* +\S+ +\d+ +(\S+) .* tm +([0-9.]+)us)");
  double debug_us = 0;
  std::vector<std::string> debug_names;
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
    debug_names.push_back((*it)[1]);
    debug_us += std::stod((*it)[2]);
  }
  REQUIRE(debug_names.size() >= 2);  // rand's kernels, then the matmul
  CHECK(debug_names.back() == "r_256_256");
  json j = json::parse(slurp(prof));
  double prof_us = 0;
  std::vector<std::string> names;
  std::set<std::string> cats;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    cats.insert(e["cat"]);
    CHECK(e["dur"].get<double>() >= 0);
    if (e["cat"] != "kernel") continue;
    names.push_back(e["name"]);
    prof_us += e["dur"].get<double>();
    CHECK(e["args"]["device"] == "CPU");
    CHECK(e["args"]["GB/s"].get<double>() > 0);
    if (e["name"] == "r_256_256") CHECK(e["args"]["GFLOPS"].get<double>() > 0);
  }
  CHECK(names == debug_names);
  CHECK(cats == std::set<std::string>{"compile", "kernel", "lower", "schedule"});
  CHECK(prof_us == doctest::Approx(debug_us).epsilon(0.05));
  CHECK(log.find("PROFILE: ") != std::string::npos);
}

TEST_CASE("the VIZ page of the README matmul in headless Chromium: pick the kernel, step two rules, see highlights change") {
  const std::string modules = TG_SOURCE_ROOT "/data/node/node_modules", dir = TG_BUILD_ROOT;
  REQUIRE_MESSAGE(std::filesystem::exists("/usr/bin/chromium"), "Debian's chromium is missing: run scripts/setup");
  REQUIRE_MESSAGE(std::filesystem::exists(modules + "/playwright-core/package.json"), "npm playwright-core is missing: run scripts/setup");
  int port = free_port();
  std::string err = dir + "/viz_test_page.err";
  Child p({dir + "/examples/matmul", "64"},
          {"VIZ=1", "VIZ_PORT=" + std::to_string(port), "PROFILE=1", "PROFILE_FILE=" + dir + "/viz_test_page_profile.json"},
          dir + "/viz_test_page.out", err);
  REQUIRE(p.pid > 0);
  // the program finishes its work, then serves until it is stopped
  auto t0 = std::chrono::steady_clock::now();
  while (slurp(err).find("until interrupted") == std::string::npos && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE_MESSAGE(slurp(err).find("until interrupted") != std::string::npos, slurp(err));
  std::string shot = dir + "/viz_page.png", out = dir + "/viz_page.json", perr = dir + "/viz_page_node.err";
  std::filesystem::remove(shot);
  std::string cmd = "node " TG_SOURCE_ROOT "/tests/viz/viz_page.mjs '" + modules + "' 'http://127.0.0.1:" + std::to_string(port) +
                    "/' '" + shot + "' >'" + out + "' 2>'" + perr + "'";
  int rc = std::system(cmd.c_str());
  REQUIRE_MESSAGE(rc == 0, "the browser script failed: " << slurp(perr));
  json page = json::parse(slurp(out));
  INFO(page.dump());
  CHECK(page["errors"].empty());
  CHECK(page["kernel"].get<std::string>().rfind("r_", 0) == 0);  // the matmul's reduce kernel
  CHECK(page["steps"].get<int>() >= 2);
  CHECK(page["changed"][0].empty());  // before the first rule
  CHECK(!page["changed"][1].empty());
  CHECK(!page["changed"][2].empty());
  CHECK(page["changed"][1] != page["changed"][2]);
  CHECK(page["step_text"].get<std::string>().rfind("step 2 / ", 0) == 0);
  CHECK(std::regex_search(page["rule"].get<std::string>(), std::regex(R"(^\S+\.(cpp|hpp):\d+\n)")));  // file:line, then the rule's line
  CHECK(page["source"].get<std::string>().find(page["kernel"].get<std::string>()) != std::string::npos);
  // the Profile tab: a bar per kernel launch in the profile (written at exit, before serving)
  int launches = 0;
  json prof = json::parse(slurp(dir + "/viz_test_page_profile.json"));
  for (auto& e : prof["traceEvents"]) launches += e.value("cat", "") == "kernel";
  CHECK(launches >= 2);
  CHECK(page["timeline_kernels"].get<int>() == launches);
  CHECK(std::filesystem::file_size(shot) > 10000);
}

TEST_CASE("plot: tick values and an SVG chart with exact point coordinates") {
  CHECK(plot::nice_ticks(0, 10, 7) == std::vector<double>{0, 2, 4, 6, 8, 10});
  CHECK(plot::nice_ticks(0, 97.25, 5) == std::vector<double>{0, 20, 40, 60, 80, 100});
  CHECK(plot::nice_ticks(0.5, 2.3, 4) == std::vector<double>{0.5, 1.0, 1.5, 2.0, 2.5});
  plot::Chart c{"loss", "step", "loss", "", {plot::Series{"train", {{0, 0}, {10, 1}}, false, ""}}};
  std::string s = plot::svg(c);
  // 720x400: the plot area is x 64..700 and y 352..58 for ticks 0..10 and 0..1
  CHECK(s.find("points=\"64.00,352.00 700.00,58.00\"") != std::string::npos);
  CHECK(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(s.find("</svg>") != std::string::npos);
  c.series.push_back(plot::Series{"acc", {{0, 50}, {10, 100}}, true, ""});
  s = plot::svg(c);
  // a right axis: the plot area ends at 720-64; its ticks 0..100 scale the second line
  CHECK(s.find("points=\"64.00,352.00 656.00,58.00\"") != std::string::npos);
  CHECK(s.find("points=\"64.00,205.00 656.00,58.00\"") != std::string::npos);
  c.series[1].points.push_back({11, std::nan("")});
  CHECK(test::error_of([&] { plot::svg(c); }).find("[plot] series 'acc' has a point that is not finite") == 0);
  CHECK(test::error_of([] { plot::svg(plot::Chart{"empty", "", "", "", {}}); }) == "[plot] chart 'empty' has no points");
  CHECK(test::error_of([&] { plot::write_svg("/nonexistent/dir/x.svg", plot::Chart{"t", "", "", "", {plot::Series{"a", {{0, 1}}, false, ""}}}); })
            .find("[plot] cannot write /nonexistent/dir/x.svg") == 0);
}
