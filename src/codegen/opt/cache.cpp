// The BEAM results database (SQLite, Debian's libsqlite3): one table keyed by (kernel key, device, compiler id,
// beam width). Concurrent processes: WAL journal, a busy timeout, one IMMEDIATE transaction per write. Bounded:
// every row gets a larger stamp than all before it, and a write deletes rows more than max_rows stamps old.
// Failures never reach the caller: a corrupt file is deleted and recreated once, anything else (locked, read-only,
// out of space, a second corruption) bypasses the database; each with one warning.
#include <sqlite3.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

#include "tg/env.hpp"
#include "tg/search.hpp"

namespace tg {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS beam_v1(ast TEXT NOT NULL, device TEXT NOT NULL, compiler TEXT NOT NULL,"
    " width INTEGER NOT NULL, opts TEXT NOT NULL, us REAL NOT NULL, stamp INTEGER NOT NULL,"
    " PRIMARY KEY(ast, device, compiler, width));"
    "CREATE INDEX IF NOT EXISTS beam_v1_stamp ON beam_v1(stamp);";

bool is_corrupt(int rc) { return (rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB; }
bool is_busy(int rc) { return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED; }

// The op's name as to_string(Opt) spells it ("Opt(UPCAST, axis=..." -> "UPCAST").
std::string op_text(OptOp op) {
  std::string s = to_string(Opt{op, 0, 0});
  size_t b = s.find('('), e = s.find(',');
  return b == std::string::npos || e == std::string::npos ? s : s.substr(b + 1, e - b - 1);
}

}  // namespace

std::string opts_to_text(const std::vector<Opt>& opts) {
  std::string s;
  for (const Opt& o : opts)
    s += (s.empty() ? "" : "; ") + op_text(o.op) + " " + std::to_string(o.axis) + " " + std::to_string(o.amt);
  return s;
}

std::optional<std::vector<Opt>> opts_from_text(const std::string& s) {
  std::vector<Opt> out;
  std::stringstream all(s);
  std::string item;
  while (std::getline(all, item, ';')) {
    std::istringstream is(item);
    std::string name, rest;
    long long axis = -1, amt = 0;
    if (!(is >> name >> axis >> amt) || (is >> rest)) return std::nullopt;
    if (axis < 0 || axis > 1024 || amt < 0 || amt > (int64_t(1) << 40)) return std::nullopt;
    std::optional<OptOp> op;
    for (int v = 0; v < 256 && !op; v++)
      if (beam_amounts(OptOp(v), OptConfig{}) && op_text(OptOp(v)) == name) op = OptOp(v);
    if (!op) return std::nullopt;
    out.push_back(Opt{*op, int(axis), int64_t(amt)});
  }
  if (opts_to_text(out) != s) return std::nullopt;  // only the exact form opts_to_text writes
  return out;
}

struct BeamCache::Impl {
  std::string path;
  size_t max_rows;
  int busy_ms;
  std::mutex mu;
  sqlite3* db = nullptr;
  bool bypass = false, rebuilt = false, warned_busy = false;
  int warnings = 0;

  void warn(const std::string& what) {
    warnings++;
    std::fprintf(stderr, "tg: warning: [beam cache] %s: %s\n", path.c_str(), what.c_str());
  }
  std::string msg() const { return db ? sqlite3_errmsg(db) : "cannot allocate a connection"; }
  void close() {
    if (db) sqlite3_close_v2(db);
    db = nullptr;
  }
  int exec(const char* sql) { return sqlite3_exec(db, sql, nullptr, nullptr, nullptr); }

  // Open and create the table; the result code of the first failing step.
  int open() {
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) return rc;
    sqlite3_busy_timeout(db, busy_ms);
    sqlite3_extended_result_codes(db, 0);
    if ((rc = exec("PRAGMA journal_mode=WAL")) != SQLITE_OK) return rc;
    return exec(kSchema);
  }

  // A connection, or null when bypassed. A corrupt file is replaced once per process.
  sqlite3* conn() {
    if (bypass) return nullptr;
    if (db) return db;
    int rc = open();
    if (rc == SQLITE_OK) return db;
    if (is_busy(rc)) {  // locked while opening: no cache for this access, try again next time
      fail(rc, "opening");
      close();
      return nullptr;
    }
    fail(rc, "opening");
    return bypass ? nullptr : db;
  }

  // Handle a failed statement: rebuild a corrupt database (once), bypass for anything else.
  void fail(int rc, const std::string& during) {
    std::string m = msg();
    if (is_corrupt(rc) && !rebuilt) {
      rebuilt = true;
      close();
      std::error_code ec;
      for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path + suffix, ec);
      int rc2 = open();
      if (rc2 == SQLITE_OK) {
        warn("the database is corrupt (" + m + " during " + during + "); rebuilt it empty");
        return;
      }
      warn("the database is corrupt (" + m + ") and could not be rebuilt (" + msg() + "); BEAM results are not cached");
      close();
      bypass = true;
      return;
    }
    if (is_busy(rc)) {  // another process holds the lock longer than busy_ms: skip this access only
      if (!warned_busy) warn("the database is locked (" + m + " during " + during + "); this result is not cached");
      warned_busy = true;
      return;
    }
    warn(m + " during " + during + "; BEAM results are not cached in this process");
    close();
    bypass = true;
  }
};

namespace {
// A prepared statement freed at scope exit.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  int rc = SQLITE_OK;
  Stmt(sqlite3* db, const char* sql) { rc = sqlite3_prepare_v2(db, sql, -1, &s, nullptr); }
  ~Stmt() { sqlite3_finalize(s); }
  void bind(int i, const std::string& v) { sqlite3_bind_text(s, i, v.data(), int(v.size()), SQLITE_TRANSIENT); }
  void bind(int i, int64_t v) { sqlite3_bind_int64(s, i, v); }
  void bind(int i, double v) { sqlite3_bind_double(s, i, v); }
  void bind_key(const BeamKey& k) {
    bind(1, k.ast);
    bind(2, k.device);
    bind(3, k.compiler);
    bind(4, int64_t(k.width));
  }
};
}  // namespace

BeamCache::BeamCache(std::string path, size_t max_rows, int busy_ms) : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->max_rows = std::max<size_t>(1, max_rows);
  impl_->busy_ms = busy_ms;
}

BeamCache::~BeamCache() { impl_->close(); }

const std::string& BeamCache::path() const { return impl_->path; }

int BeamCache::warnings() const {
  std::lock_guard lk(impl_->mu);
  return impl_->warnings;
}

std::optional<BeamCache::Entry> BeamCache::get(const BeamKey& key) {
  Impl& I = *impl_;
  std::lock_guard lk(I.mu);
  for (int attempt = 0; attempt < 2; attempt++) {  // a second attempt after a rebuild
    sqlite3* db = I.conn();
    if (!db) return std::nullopt;
    Stmt st(db, "SELECT opts, us FROM beam_v1 WHERE ast=?1 AND device=?2 AND compiler=?3 AND width=?4");
    int rc = st.rc;
    if (rc == SQLITE_OK) {
      st.bind_key(key);
      rc = sqlite3_step(st.s);
      if (rc == SQLITE_DONE) return std::nullopt;
      if (rc == SQLITE_ROW) {
        const unsigned char* t = sqlite3_column_text(st.s, 0);
        std::optional<std::vector<Opt>> opts = t ? opts_from_text(reinterpret_cast<const char*>(t)) : std::nullopt;
        if (!opts) return std::nullopt;  // unreadable row: a miss (the next put replaces it)
        return Entry{*opts, sqlite3_column_double(st.s, 1)};
      }
    }
    bool was_rebuilt = I.rebuilt;
    I.fail(rc, "a lookup");
    if (!is_corrupt(rc) || was_rebuilt) return std::nullopt;
  }
  return std::nullopt;
}

bool BeamCache::put(const BeamKey& key, const Entry& e) {
  Impl& I = *impl_;
  std::lock_guard lk(I.mu);
  for (int attempt = 0; attempt < 2; attempt++) {
    sqlite3* db = I.conn();
    if (!db) return false;
    int rc = I.exec("BEGIN IMMEDIATE");
    if (rc == SQLITE_OK) {
      {
        Stmt ins(db,
                 "INSERT OR REPLACE INTO beam_v1(ast, device, compiler, width, opts, us, stamp) VALUES"
                 " (?1, ?2, ?3, ?4, ?5, ?6, (SELECT COALESCE(MAX(stamp), 0) + 1 FROM beam_v1))");
        rc = ins.rc;
        if (rc == SQLITE_OK) {
          ins.bind_key(key);
          ins.bind(5, opts_to_text(e.opts));
          ins.bind(6, e.us);
          rc = sqlite3_step(ins.s);
          if (rc == SQLITE_DONE) rc = SQLITE_OK;
        }
      }
      if (rc == SQLITE_OK) {
        Stmt del(db, "DELETE FROM beam_v1 WHERE stamp <= (SELECT MAX(stamp) FROM beam_v1) - ?1");
        rc = del.rc;
        if (rc == SQLITE_OK) {
          del.bind(1, int64_t(I.max_rows));
          rc = sqlite3_step(del.s);
          if (rc == SQLITE_DONE) rc = SQLITE_OK;
        }
      }
      if (rc == SQLITE_OK) rc = I.exec("COMMIT");
      if (rc == SQLITE_OK) return true;
      I.exec("ROLLBACK");
    }
    bool was_rebuilt = I.rebuilt;
    I.fail(rc, "a write");
    if (!is_corrupt(rc) || was_rebuilt) return false;
  }
  return false;
}

size_t BeamCache::rows() {
  Impl& I = *impl_;
  std::lock_guard lk(I.mu);
  sqlite3* db = I.conn();
  if (!db) return 0;
  Stmt st(db, "SELECT COUNT(*) FROM beam_v1");
  if (st.rc != SQLITE_OK || sqlite3_step(st.s) != SQLITE_ROW) return 0;
  return size_t(sqlite3_column_int64(st.s, 0));
}

BeamCache* BeamCache::global() {
  if (getenv_int("CACHELEVEL", 1) <= 0) return nullptr;
  // One per cache folder (tests point TG_CACHE_DIR elsewhere); never destroyed: used until exit.
  static std::mutex mu;
  static auto* caches = new std::map<std::string, std::unique_ptr<BeamCache>>();
  std::string p = cache_dir() + "/beam.db";
  std::lock_guard lk(mu);
  auto& c = (*caches)[p];
  if (!c) c = std::make_unique<BeamCache>(p);
  return c.get();
}

}  // namespace tg
