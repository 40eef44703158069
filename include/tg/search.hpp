#pragma once
// BEAM search over kernel optimisations (tinygrad: codegen/opt/search.py) and its persistent cache.
//
// BEAM=N: for each new kernel, the engine times candidate opt lists on the device and uses the fastest. A round
// applies every action (each OptOp on each axis with the amounts of beam_amounts) to each of the N best lists so
// far, drops those apply_opt refuses or that exceed the upcast limit, compiles the rest in parallel and times
// each on scratch copies of the kernel's buffers (the user's buffers are only read); the N fastest seed the next
// round. The search stops when a round brings no improvement or BEAM_BUDGET seconds (default 60) are spent.
// It starts from the empty list, or on devices where the engine applies the hand-coded heuristic from the
// heuristic's opts, with and without their THREAD split (timing unoptimised loops of a big kernel costs minutes).
// A candidate that fails to lower or compile is skipped (reported with DEBUG>=1); DEBUG>=2 prints each round,
// DEBUG>=3 each candidate. NOOPT=1 wins over BEAM (no opts, no search). A kernel that faults at run time (rather
// than throwing) would take the process down: candidates are run in process, as the engine runs kernels.
//
// Results live in an SQLite database, cache_dir()/beam.db, keyed by the kernel's content key, the device, the
// compiler id and N, so a second run of the same program does no search. The database is shared by concurrent
// processes (WAL, busy timeout, one transaction per write) and bounded (the newest rows are kept). A corrupt
// database is rebuilt, a locked or unwritable one bypassed, each with one warning on stderr; a cached opt list
// that no longer applies is ignored. CACHELEVEL=0 disables the cache.
//
// Thread-safety: beam_search may be called from several threads (searches run one at a time, so that their
// timings do not disturb each other); BeamCache is internally locked.
#include "tg/config.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tg/device.hpp"
#include "tg/opt.hpp"

namespace tg {

/** What identifies a search result: the kernel's content key (UOp::key), device, compiler id and beam width. */
struct BeamKey {
  /// the kernel's content key, the device name and the compiler id (a compiler change invalidates results)
  ///@{
  std::string ast, device, compiler;
  ///@}
  /// the beam width searched with
  int width = 0;
};

/** The BEAM search results database (SQLite). */
class BeamCache {
 public:
  /// One stored search result.
  struct Entry {
    /// the winner's opts, in the order to apply them
    std::vector<Opt> opts;
    double us = 0;  ///< the winner's measured time
  };
  /** Opens (creating) the database at `path`; keeps at most `max_rows` rows; waits up to `busy_ms` for a lock. */
  explicit BeamCache(std::string path, size_t max_rows = 8192, int busy_ms = 2000);
  ~BeamCache();
  BeamCache(const BeamCache&) = delete;
  BeamCache& operator=(const BeamCache&) = delete;
  /** The stored result, or nullopt (a miss, an unreadable row, or a bypassed database). */
  std::optional<Entry> get(const BeamKey& key);
  /** Store (replacing) a result and prune the oldest rows; false when the database was bypassed. */
  bool put(const BeamKey& key, const Entry& e);
  /** Rows stored now (0 when bypassed). */
  size_t rows();
  /** Warnings printed so far (tests check that a bad database warns once and carries on). */
  int warnings() const;
  /// the database file
  const std::string& path() const;
  /** The process-wide cache at cache_dir()/beam.db; null with CACHELEVEL=0. */
  static BeamCache* global();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/** How to search. */
struct BeamOptions {
  int width = 2;          ///< N: candidates kept per round
  double budget_s = 60;   ///< stop starting new work after this many seconds
  BeamCache* cache = nullptr;  ///< null: no lookup, no store
  /** Called with each candidate's opts before it is compiled; a tg::Error it throws fails that candidate (tests
   *  use it to inject a compile failure). */
  std::function<void(const std::vector<Opt>&)> before_compile;
  /** Called with each candidate's opts and rendered source before it is compiled (tests use it to make a
   *  candidate crash: CPU candidates first run in a forked child, and one that dies there is skipped). */
  std::function<void(const std::vector<Opt>&, std::string& src)> edit_source;
};

/** BEAM and BEAM_BUDGET from the environment (0 width: no search). A value that is not a number, a negative width
 *  or one above 64, or a budget that is not positive, throws tg::EnvError naming the variable and the value. */
BeamOptions beam_options_from_env();

/** What a search found. */
struct BeamResult {
  std::vector<Opt> opts;  ///< the winner, in the order to apply them
  double us = 0;          ///< its measured time
  bool cached = false;    ///< found in the cache: nothing was compiled or timed
  /// search rounds run, candidate kernels compiled and timed, and candidates that failed to apply or compile
  ///@{
  int rounds = 0, compiled = 0, failed = 0;
  ///@}
  /// wall time the search took, in seconds
  double search_s = 0;
  /// the search stopped at its time budget (the winner is the best so far)
  bool out_of_budget = false;
};

/** Search opts for the kernel `ast` (a scheduler AST; PARAM i is bufs[i]) on `device`. `bufs` are read once (copied
 *  to scratch buffers), never written. */
BeamResult beam_search(const UOpRef& ast, std::span<Buffer* const> bufs, const std::string& device, const BeamOptions& o);

/** The amounts BEAM tries for an OptOp (0: the whole axis), given the device's opt config. Every OptOp has a line
 *  (no default: a new OptOp is a compile error here until it gets one); nullopt for a value that is no OptOp. */
std::optional<std::vector<int64_t>> beam_amounts(OptOp op, const OptConfig& cfg);

/** Every legal one-opt extension of `opts` on the simplified kernel `ast`: (opts + action, resulting AST). */
std::vector<std::pair<std::vector<Opt>, UOpRef>> beam_actions(const UOpRef& ast, const std::vector<Opt>& opts,
                                                              const OptConfig& cfg);

/** Upcast copies of a kernel with opts applied: the product of its UPCAST and UNROLL range sizes (BEAM: <= 256). */
int64_t upcast_size(const UOpRef& applied);

/** The most upcast copies a BEAM action may make: 256, and on a CPU fewer than its vector registers hold (all but
 *  one of them: AVX2's 16 x 8 floats give 120, AVX-512's 32 x 16 leave 256). */
int64_t beam_upcast_limit(const OptConfig& cfg);

/** Nodes the expander makes of a kernel with opts applied (each node once per combination of the UPCAST/UNROLL
 *  ranges it depends on): BEAM's bound on code size, which is what compile time grows with. */
int64_t expanded_size(const UOpRef& applied);

/** Opt lists as text ("UPCAST 1 16; THREAD 0 2"), and back (nullopt for anything malformed). */
std::string opts_to_text(const std::vector<Opt>& opts);
/// the opts written by opts_to_text, or nullopt when malformed
std::optional<std::vector<Opt>> opts_from_text(const std::string& s);

/** Candidates compiled by all searches in this process (tests check that a cached search compiles none). */
size_t beam_candidates_compiled();

}  // namespace tg
