// torch_load: the files torch.save writes. The zip format (torch >= 1.6, and libtorch's pickle_save): PREFIX/data.pkl
// (a pickle) and PREFIX/data/KEY (the raw little-endian bytes of each storage); the legacy format: five pickles in a
// row (magic number, protocol version, system info, the object, the storage keys), then each storage as an int64
// element count and its bytes. The pickle reader is a small stack machine over the opcodes of protocols 0-5 that
// torch and Python's pickle emit for dicts, lists, tuples, numbers, strings and tensors; it builds objects in an
// arena (no recursion; shared and cyclic references are plain pointers). Tensors are torch._utils._rebuild_tensor(_v2)
// of a storage (persistent id ('storage', torch.XStorage, key, location, numel)), an offset, sizes and strides;
// each is gathered from its storage on the host with every index checked, so views, non-contiguous strides and
// storages shared between tensors read what torch reads. Onto DISK, a tensor is a view of its storage's bytes in the
// file (one DISK buffer per storage, the tensor's offset and strides as movement ops over it), as safe_load's.
// The zip container is read here: its central directory (zip64 too) and the local headers; torch stores entries
// uncompressed, and a deflated entry (a re-zipped file) is inflated with zlib.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <unordered_map>

#include "mapped.hpp"
#include "tg/device.hpp"
#include "tg/nn/state.hpp"
#include "tg/schedule.hpp"

namespace tg::nn {

namespace {

[[noreturn]] void fail(const std::string& name, const std::string& why) { throw Error("[torch_load] " + name + ": " + why); }

// ---- zip

struct ZipEntry {
  uint64_t off, csize, size;  // local header offset, compressed and uncompressed sizes
  uint16_t method;
  uint32_t crc;
};

template <class T>
T le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::map<std::string, ZipEntry> zip_directory(const uint8_t* p, size_t n, const std::string& name) {
  auto need = [&](uint64_t off, uint64_t len, const char* what) {
    if (off > n || len > n - off) fail(name, std::string("truncated zip: ") + what + " lies past the end of the file");
  };
  if (n < 22) fail(name, "truncated zip: no end of central directory record");
  size_t eocd = SIZE_MAX;
  for (size_t i = n - 22 + 1, stop = n > 22 + 65535 ? n - 22 - 65535 : 0; i-- > stop;)
    if (le<uint32_t>(p + i) == 0x06054b50) {
      eocd = i;
      break;
    }
  if (eocd == SIZE_MAX) fail(name, "not a zip file: no end of central directory record");
  uint64_t count = le<uint16_t>(p + eocd + 10), cd_size = le<uint32_t>(p + eocd + 12), cd_off = le<uint32_t>(p + eocd + 16);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {  // zip64: the locator sits before the record
    if (eocd < 20 || le<uint32_t>(p + eocd - 20) != 0x07064b50) fail(name, "zip64 sizes without a zip64 locator");
    uint64_t z = le<uint64_t>(p + eocd - 12);
    need(z, 56, "the zip64 end of central directory");
    if (le<uint32_t>(p + z) != 0x06064b50) fail(name, "bad zip64 end of central directory signature");
    count = le<uint64_t>(p + z + 32), cd_size = le<uint64_t>(p + z + 40), cd_off = le<uint64_t>(p + z + 48);
  }
  need(cd_off, cd_size, "the central directory");
  if (count > cd_size / 46) fail(name, "the zip directory claims " + std::to_string(count) + " entries, more than it can hold");
  std::map<std::string, ZipEntry> out;
  const uint8_t* q = p + cd_off;
  const uint8_t* end = q + cd_size;
  for (uint64_t i = 0; i < count; i++) {
    if (end - q < 46 || le<uint32_t>(q) != 0x02014b50) fail(name, "corrupt zip central directory (entry " + std::to_string(i) + ")");
    ZipEntry e{le<uint32_t>(q + 42), le<uint32_t>(q + 20), le<uint32_t>(q + 24), le<uint16_t>(q + 10), le<uint32_t>(q + 16)};
    size_t nl = le<uint16_t>(q + 28), xl = le<uint16_t>(q + 30), cl = le<uint16_t>(q + 32);
    if (size_t(end - q) - 46 < nl + xl + cl) fail(name, "corrupt zip central directory (entry " + std::to_string(i) + ")");
    std::string fn(reinterpret_cast<const char*>(q + 46), nl);
    for (const uint8_t *x = q + 46 + nl, *xe = x + xl; xe - x >= 4;) {  // the zip64 extra field: the sizes that overflowed
      uint16_t id = le<uint16_t>(x), len = le<uint16_t>(x + 2);
      if (size_t(xe - x) - 4 < len) break;
      if (id == 1) {
        const uint8_t *f = x + 4, *fe = f + len;
        for (uint64_t* v : {&e.size, &e.csize, &e.off})
          if (*v == 0xFFFFFFFF) {
            if (fe - f < 8) fail(name, "corrupt zip64 field of '" + fn + "'");
            *v = le<uint64_t>(f), f += 8;
          }
      }
      x += 4 + len;
    }
    out[fn] = e;
    q += 46 + nl + xl + cl;
  }
  return out;
}

// The entry's CRC-32 as the directory records it (zlib's crc32, in chunks below 4 GiB).
void check_crc(const uint8_t* b, uint64_t k, const std::string& fn, const ZipEntry& e, const std::string& name) {
  uLong c = crc32(0L, Z_NULL, 0);
  for (uint64_t at = 0; at < k;) {
    uInt step = uInt(std::min<uint64_t>(k - at, uint64_t(1) << 30));
    c = crc32(c, b + at, step);
    at += step;
  }
  if (uint32_t(c) != e.crc) fail(name, "zip entry '" + fn + "' is corrupt (CRC-32 mismatch)");
}

// The bytes of one entry: a view of the file (stored) or an inflated copy kept in `keep` (deflated); CRC checked.
std::pair<const uint8_t*, uint64_t> zip_read(const uint8_t* p, size_t n, const std::string& fn, const ZipEntry& e,
                                             std::deque<std::vector<uint8_t>>& keep, const std::string& name) {
  if (e.off > n || n - e.off < 30 || le<uint32_t>(p + e.off) != 0x04034b50) fail(name, "corrupt zip local header of '" + fn + "'");
  uint64_t data = e.off + 30 + le<uint16_t>(p + e.off + 26) + le<uint16_t>(p + e.off + 28);
  if (data > n || e.csize > n - data) fail(name, "zip entry '" + fn + "' (" + std::to_string(e.csize) + " bytes) lies past the end of the file");
  if (e.method == 0) {
    if (e.size != e.csize) fail(name, "stored zip entry '" + fn + "' has different sizes");
    check_crc(p + data, e.size, fn, e, name);
    return {p + data, e.size};
  }
  if (e.method != 8) fail(name, "zip entry '" + fn + "' uses compression method " + std::to_string(e.method) + " (stored and deflate are read)");
  if (e.size > (uint64_t(1) << 40) || e.size / 1032 > e.csize + 1) fail(name, "zip entry '" + fn + "' claims an impossible size");
  std::vector<uint8_t>& out = keep.emplace_back(size_t(e.size));
  z_stream z{};
  if (inflateInit2(&z, -15) != Z_OK) fail(name, "zlib inflateInit failed");
  z.next_in = const_cast<uint8_t*>(p + data);
  z.avail_in = uInt(std::min<uint64_t>(e.csize, UINT32_MAX));
  z.next_out = out.data();
  z.avail_out = uInt(std::min<uint64_t>(e.size, UINT32_MAX));
  int r = inflate(&z, Z_FINISH);
  uint64_t got = z.total_out;
  inflateEnd(&z);
  if (r != Z_STREAM_END || got != e.size) fail(name, "zip entry '" + fn + "' does not inflate to its " + std::to_string(e.size) + " bytes");
  check_crc(out.data(), e.size, fn, e, name);
  return {out.data(), e.size};
}

// ---- pickle

struct Obj;
using P = Obj*;
struct Obj {
  enum Kind { Mark, None, Bool, Int, Float, Str, ByteStr, Tuple, List, Dict, Global, Storage, TensorRef, Opaque } kind = None;
  int64_t i = 0;
  double f = 0;
  std::string s;                          // Str, ByteStr, Global ("module.name"), Storage (its key)
  std::vector<P> items;                   // Tuple, List; TensorRef: storage
  std::vector<std::pair<P, P>> entries;   // Dict
  DType dtype = dtypes::uint8;            // Storage
  int64_t numel = 0;                      // Storage; TensorRef: the storage offset
  std::vector<int64_t> sizes, strides;    // TensorRef
};

struct StorageType {
  const char* name;
  DType dtype;
};
constexpr StorageType kStorages[] = {
    {"FloatStorage", dtypes::float32}, {"HalfStorage", dtypes::float16}, {"BFloat16Storage", dtypes::bfloat16},
    {"DoubleStorage", dtypes::float64}, {"LongStorage", dtypes::int64},  {"IntStorage", dtypes::int32},
    {"ShortStorage", dtypes::int16},    {"CharStorage", dtypes::int8},   {"ByteStorage", dtypes::uint8},
    {"BoolStorage", dtypes::bool_}};

class Unpickler {
 public:
  Unpickler(const uint8_t* p, size_t n, const std::string& name, std::deque<Obj>& arena) : p_(p), n_(n), name_(name), arena_(arena) {}
  size_t pos() const { return pos_; }
  // One pickle from the current position to its STOP.
  P load();

 private:
  const uint8_t* p_;
  size_t n_, pos_ = 0;
  const std::string& name_;
  std::deque<Obj>& arena_;
  std::vector<P> stack_;
  std::unordered_map<uint64_t, P> memo_;

  [[noreturn]] void bad(const std::string& why) const { fail(name_, "pickle at byte " + std::to_string(pos_) + ": " + why); }
  P make(Obj::Kind k) {
    if (arena_.size() >= (size_t(1) << 26)) bad("more than 2^26 objects");
    arena_.emplace_back();
    arena_.back().kind = k;
    return &arena_.back();
  }
  const uint8_t* take(uint64_t k, const char* what) {
    if (k > n_ - pos_) bad(std::string("truncated (") + what + ")");
    const uint8_t* r = p_ + pos_;
    pos_ += size_t(k);
    return r;
  }
  template <class T>
  T get(const char* what) {
    return le<T>(take(sizeof(T), what));
  }
  std::string line(const char* what) {
    const uint8_t* s = p_ + pos_;
    const void* nl = std::memchr(s, '\n', n_ - pos_);
    if (!nl) bad(std::string("truncated (") + what + ")");
    size_t len = size_t(static_cast<const uint8_t*>(nl) - s);
    pos_ += len + 1;
    return std::string(reinterpret_cast<const char*>(s), len);
  }
  P pop() {
    if (stack_.empty() || stack_.back()->kind == Obj::Mark) bad("pop from an empty stack");
    P v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<P> pop_mark() {  // the items above the topmost MARK, which is removed
    size_t m = stack_.size();
    while (m > 0 && stack_[m - 1]->kind != Obj::Mark) m--;
    if (m == 0) bad("no MARK on the stack");
    std::vector<P> items(stack_.begin() + int64_t(m), stack_.end());
    stack_.resize(m - 1);
    return items;
  }
  P top() {
    if (stack_.empty() || stack_.back()->kind == Obj::Mark) bad("empty stack");
    return stack_.back();
  }
  P str(Obj::Kind k, uint64_t len) {
    P o = make(k);
    const uint8_t* s = take(len, "a string");
    o->s.assign(reinterpret_cast<const char*>(s), size_t(len));
    return o;
  }
  P integer(int64_t v) {
    P o = make(Obj::Int);
    o->i = v;
    return o;
  }
  P tuple(std::vector<P> items) {
    P o = make(Obj::Tuple);
    o->items = std::move(items);
    return o;
  }
  void set_items(P d, const std::vector<P>& kv) {
    if (d->kind == Obj::Opaque) return;
    if (d->kind != Obj::Dict || kv.size() % 2) bad("SETITEMS on a " + std::string(d->kind == Obj::Dict ? "odd item count" : "non-dict"));
    for (size_t i = 0; i < kv.size(); i += 2) d->entries.emplace_back(kv[i], kv[i + 1]);
  }
  void append(P l, const std::vector<P>& v) {
    if (l->kind == Obj::Opaque) return;
    if (l->kind != Obj::List) bad("APPEND to a non-list");
    l->items.insert(l->items.end(), v.begin(), v.end());
  }
  P global(const std::string& module, const std::string& name);
  P reduce(P f, P args);
  P persistent(P pid);
  int64_t as_int(P o, const char* what) {
    if (o->kind != Obj::Int && o->kind != Obj::Bool) bad(std::string(what) + " is not an integer");
    return o->i;
  }
  std::vector<int64_t> ints(P o, const char* what) {
    if (o->kind != Obj::Tuple && o->kind != Obj::List) bad(std::string(what) + " is not a tuple");
    std::vector<int64_t> v;
    for (P x : o->items) v.push_back(as_int(x, what));
    return v;
  }
};

P Unpickler::global(const std::string& module, const std::string& name) {
  P g = make(Obj::Global);
  g->s = module + "." + name;
  if (module == "torch" && name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0) {
    for (const auto& st : kStorages)
      if (name == st.name) {
        g->dtype = st.dtype;
        return g;
      }
    bad("storage type torch." + name + " is not supported (Float, Half, BFloat16, Double, Long, Int, Short, Char, Byte, Bool)");
  }
  static const std::set<std::string> known = {"torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
                                              "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
                                              "torch.nn.parameter.Parameter", "collections.OrderedDict", "builtins.set",
                                              "_codecs.encode", "torch.device", "torch.Size",
                                              "torch.jit._pickle.restore_type_tag", "torch.jit._pickle.build_tensorlist",
                                              "torch.jit._pickle.build_intlist", "torch.jit._pickle.build_doublelist",
                                              "torch.jit._pickle.build_boollist"};
  // another torch object (quantised or sparse tensors, torch.dtype, ...) would silently lose data: refuse it; objects
  // of other modules (numpy scalars, argparse namespaces in a checkpoint) become opaque values that are skipped
  if (!known.count(g->s) && (module == "torch" || module.rfind("torch.", 0) == 0))
    bad(g->s + " is not supported (tensors of the dense storage types, parameters, dicts, lists and numbers are)");
  return g;
}

P Unpickler::reduce(P f, P args) {
  if (f->kind != Obj::Global) return make(Obj::Opaque);
  if (args->kind != Obj::Tuple) bad("REDUCE arguments are not a tuple");
  const auto& a = args->items;
  const std::string& g = f->s;
  if (g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_tensor") {
    if (a.size() < 4 || a[0]->kind != Obj::Storage) bad(g + " expects (storage, offset, size, stride, ...)");
    P t = make(Obj::TensorRef);
    t->items = {a[0]};
    t->numel = as_int(a[1], "the storage offset");
    t->sizes = ints(a[2], "the size");
    t->strides = ints(a[3], "the stride");
    return t;
  }
  if (g == "torch._utils._rebuild_parameter" || g == "torch._utils._rebuild_parameter_with_state" ||
      g == "torch.nn.parameter.Parameter") {
    if (a.empty() || a[0]->kind != Obj::TensorRef) bad(g + " expects a tensor");
    return a[0];
  }
  // libtorch's pickler: a typed dict or list is restore_type_tag(obj, "Dict[str, Tensor]"), a typed list
  // build_tensorlist(list) and the like; both are the object itself
  if (g.rfind("torch.jit._pickle.", 0) == 0) {
    if (a.empty()) bad(g + " without arguments");
    return a[0];
  }
  if (g == "collections.OrderedDict") {
    P d = make(Obj::Dict);
    if (!a.empty() && a[0]->kind == Obj::List)  // OrderedDict([(k, v), ...])
      for (P kv : a[0]->items) {
        if (kv->kind != Obj::Tuple || kv->items.size() != 2) bad("OrderedDict item is not a pair");
        d->entries.emplace_back(kv->items[0], kv->items[1]);
      }
    return d;
  }
  if (g == "_codecs.encode") {  // protocol 2's bytes: _codecs.encode(str, 'latin1')
    if (a.empty() || a[0]->kind != Obj::Str) bad("_codecs.encode expects a string");
    P b = make(Obj::ByteStr);
    for (size_t i = 0; i < a[0]->s.size();) {  // UTF-8 code points < 256 back to bytes
      auto c = uint8_t(a[0]->s[i]);
      if (c < 0x80) b->s += char(c), i += 1;
      else if ((c & 0xE0) == 0xC0 && i + 1 < a[0]->s.size()) b->s += char(((c & 0x1F) << 6) | (uint8_t(a[0]->s[i + 1]) & 0x3F)), i += 2;
      else bad("_codecs.encode of a character above U+00FF");
    }
    return b;
  }
  return make(Obj::Opaque);  // torch.device, torch.Size, set, and other modules' objects: not tensors
}

P Unpickler::persistent(P pid) {
  // ('storage', torch.XStorage, key, location, numel[, view metadata])
  if (pid->kind != Obj::Tuple || pid->items.size() < 5 || pid->items[0]->kind != Obj::Str || pid->items[0]->s != "storage")
    bad("persistent id is not ('storage', type, key, location, numel)");
  const auto& a = pid->items;
  if (a[1]->kind != Obj::Global || a[1]->s.rfind("torch.", 0) != 0 || a[1]->s.size() < 13 ||
      a[1]->s.compare(a[1]->s.size() - 7, 7, "Storage") != 0)
    bad("persistent id's storage type is not a torch storage class");
  if (a[2]->kind != Obj::Str && a[2]->kind != Obj::Int) bad("persistent id's key is not a string");
  P s = make(Obj::Storage);
  s->dtype = a[1]->dtype;
  s->s = a[2]->kind == Obj::Str ? a[2]->s : std::to_string(a[2]->i);
  s->numel = as_int(a[4], "the storage's element count");
  if (s->numel < 0) bad("negative storage size");
  return s;
}

P Unpickler::load() {
  stack_.clear();
  for (;;) {
    uint8_t op = get<uint8_t>("an opcode");
    switch (op) {
      case 0x80: take(1, "PROTO"); break;               // PROTO
      case 0x95: take(8, "FRAME"); break;               // FRAME: framing only
      case '.': {                                        // STOP
        P v = pop();
        if (!stack_.empty()) bad("STOP with more than one value on the stack");
        return v;
      }
      case '(': stack_.push_back(make(Obj::Mark)); break;  // MARK
      case ')': stack_.push_back(tuple({})); break;        // EMPTY_TUPLE
      case 't': stack_.push_back(tuple(pop_mark())); break;  // TUPLE
      case 0x85: case 0x86: case 0x87: {                  // TUPLE1..3
        size_t k = size_t(op - 0x84);
        std::vector<P> v(k);
        for (size_t i = k; i-- > 0;) v[i] = pop();
        stack_.push_back(tuple(std::move(v)));
        break;
      }
      case ']': stack_.push_back(make(Obj::List)); break;  // EMPTY_LIST
      case 'l': {                                          // LIST
        P l = make(Obj::List);
        l->items = pop_mark();
        stack_.push_back(l);
        break;
      }
      case 'a': { P v = pop(); append(top(), {v}); break; }  // APPEND
      case 'e': { auto v = pop_mark(); append(top(), v); break; }  // APPENDS
      case '}': stack_.push_back(make(Obj::Dict)); break;  // EMPTY_DICT
      case 'd': { P d = make(Obj::Dict); set_items(d, pop_mark()); stack_.push_back(d); break; }  // DICT
      case 's': { P v = pop(), k = pop(); set_items(top(), {k, v}); break; }  // SETITEM
      case 'u': { auto kv = pop_mark(); set_items(top(), kv); break; }  // SETITEMS
      case 0x8f: stack_.push_back(make(Obj::Opaque)); break;  // EMPTY_SET
      case 0x90: { pop_mark(); break; }                       // ADDITEMS (sets are opaque)
      case 0x91: { pop_mark(); stack_.push_back(make(Obj::Opaque)); break; }  // FROZENSET
      case 'N': stack_.push_back(make(Obj::None)); break;
      case 0x88: case 0x89: { P b = make(Obj::Bool); b->i = op == 0x88; stack_.push_back(b); break; }  // NEWTRUE/NEWFALSE
      case 'J': stack_.push_back(integer(get<int32_t>("BININT"))); break;
      case 'K': stack_.push_back(integer(get<uint8_t>("BININT1"))); break;
      case 'M': stack_.push_back(integer(get<uint16_t>("BININT2"))); break;
      case 0x8a: case 0x8b: {  // LONG1, LONG4: little-endian two's complement
        uint64_t k = op == 0x8a ? get<uint8_t>("LONG1") : get<uint32_t>("LONG4");
        const uint8_t* b = take(k, "a long");
        if (k > 8) {  // wider than 64 bits (the legacy format's magic number): kept as its bytes, not a number
          stack_.push_back(str(Obj::Opaque, 0));
          stack_.back()->s.assign(reinterpret_cast<const char*>(b), size_t(k));
          break;
        }
        uint64_t u = 0;
        for (uint64_t i = 0; i < k; i++) u |= uint64_t(b[i]) << (8 * i);
        if (k > 0 && k < 8 && (b[k - 1] & 0x80)) u |= ~uint64_t(0) << (8 * k);
        stack_.push_back(integer(int64_t(u)));
        break;
      }
      case 'I': case 'L': {  // INT, LONG (protocol 0): decimal text; INT 00/01 are False/True
        std::string t = line("INT");
        if (!t.empty() && t.back() == 'L') t.pop_back();
        char* e = nullptr;
        errno = 0;
        long long v = std::strtoll(t.c_str(), &e, 10);
        if (t.empty() || *e || errno) bad("bad integer text '" + t.substr(0, 32) + "'");
        stack_.push_back(integer(v));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        const uint8_t* b = take(8, "BINFLOAT");
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u = u << 8 | b[i];
        P o = make(Obj::Float);
        std::memcpy(&o->f, &u, 8);
        stack_.push_back(o);
        break;
      }
      case 'X': stack_.push_back(str(Obj::Str, get<uint32_t>("BINUNICODE"))); break;
      case 0x8c: stack_.push_back(str(Obj::Str, get<uint8_t>("SHORT_BINUNICODE"))); break;
      case 0x8d: stack_.push_back(str(Obj::Str, get<uint64_t>("BINUNICODE8"))); break;
      case 'T': stack_.push_back(str(Obj::Str, get<uint32_t>("BINSTRING"))); break;
      case 'U': stack_.push_back(str(Obj::Str, get<uint8_t>("SHORT_BINSTRING"))); break;
      case 'B': stack_.push_back(str(Obj::ByteStr, get<uint32_t>("BINBYTES"))); break;
      case 'C': stack_.push_back(str(Obj::ByteStr, get<uint8_t>("SHORT_BINBYTES"))); break;
      case 0x8e: stack_.push_back(str(Obj::ByteStr, get<uint64_t>("BINBYTES8"))); break;
      case 'c': {  // GLOBAL module\nname\n
        std::string m = line("GLOBAL");
        std::string n = line("GLOBAL");
        stack_.push_back(global(m, n));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        P n = pop(), m = pop();
        if (m->kind != Obj::Str || n->kind != Obj::Str) bad("STACK_GLOBAL of non-strings");
        stack_.push_back(global(m->s, n->s));
        break;
      }
      case 'R': { P args = pop(), f = pop(); stack_.push_back(reduce(f, args)); break; }  // REDUCE
      case 0x81: { P args = pop(), cls = pop(); stack_.push_back(reduce(cls, args)); break; }  // NEWOBJ
      case 'b': { pop(); top(); break; }  // BUILD: the state (an OrderedDict's _metadata, ...) is not needed
      case 'Q': { P pid = pop(); stack_.push_back(persistent(pid)); break; }  // BINPERSID
      case 'q': memo_[get<uint8_t>("BINPUT")] = top(); break;
      case 'r': memo_[get<uint32_t>("LONG_BINPUT")] = top(); break;
      case 0x94: { size_t k = memo_.size(); memo_[k] = top(); break; }  // MEMOIZE
      case 'p': { std::string t = line("PUT"); memo_[std::strtoull(t.c_str(), nullptr, 10)] = top(); break; }
      case 'h': case 'j': case 'g': {  // BINGET, LONG_BINGET, GET
        uint64_t k = op == 'h' ? get<uint8_t>("BINGET") : op == 'j' ? get<uint32_t>("LONG_BINGET") : std::strtoull(line("GET").c_str(), nullptr, 10);
        auto it = memo_.find(k);
        if (it == memo_.end()) bad("memo key " + std::to_string(k) + " was never stored");
        stack_.push_back(it->second);
        break;
      }
      case '0': pop(); break;        // POP
      case '1': pop_mark(); break;   // POP_MARK
      case '2': stack_.push_back(top()); break;  // DUP
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        pos_--;
        bad(std::string("opcode ") + hex + " is not supported (torch.save writes protocol 2)");
      }
    }
    if (stack_.size() > (size_t(1) << 24)) bad("the stack grew past 2^24 entries");
  }
}

// ---- tensors

struct StorageBytes {
  const uint8_t* p;
  uint64_t n;
};

// Where the tensors go: a device that runs kernels gets a copy of each; a DISK device gets views of the storages'
// bytes (what `owner` keeps alive: the file's mapping and any inflated entries), one DISK buffer per storage.
struct Target {
  std::string device;
  bool disk = false;
  std::shared_ptr<const void> owner;
  std::map<std::string, Tensor> flat;  // storage key -> its DISK buffer, flat
};

// A view (offset, sizes, strides) of a flat storage as movement ops: the dims of size > 1 and stride > 0, outermost
// stride first, must nest (each stride a multiple of the next, at least the next dim's extent: no overlap); then the
// storage's range [offset, offset + size0 * stride0) reshaped to (size0, stride0 / stride1, ..., strideN) holds the
// view as a shrink of that grid, permuted back to the dims' order; stride-0 dims are expands. Null when the strides
// overlap or the grid would reach past the storage's end.
std::optional<Tensor> strided_view(const Tensor& flat, int64_t offset, const std::vector<int64_t>& sizes,
                                   const std::vector<int64_t>& strides) {
  std::vector<size_t> dims;
  for (size_t d = 0; d < sizes.size(); d++)
    if (sizes[d] > 1 && strides[d] > 0) dims.push_back(d);
  std::stable_sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return strides[a] > strides[b]; });
  for (size_t k = 1; k < dims.size(); k++)
    if (strides[dims[k - 1]] % strides[dims[k]] != 0 || strides[dims[k - 1]] < sizes[dims[k]] * strides[dims[k]]) return std::nullopt;
  Shape compact(sizes.begin(), sizes.end());
  bool expanded = false;
  for (size_t d = 0; d < sizes.size(); d++)
    if (strides[d] == 0 && sizes[d] > 1) compact[d] = 1, expanded = true;
  Tensor v;
  if (dims.empty()) {
    if (offset >= flat.shape()[0]) return std::nullopt;
    v = flat.shrink({{offset, offset + 1}});
  } else {
    int64_t len = sizes[dims[0]] * strides[dims[0]];
    if (offset + len > flat.shape()[0]) return std::nullopt;
    Shape grid{sizes[dims[0]]}, sized{sizes[dims[0]]};
    std::vector<std::pair<int64_t, int64_t>> keep{{0, sizes[dims[0]]}};
    for (size_t k = 1; k < dims.size(); k++) {
      grid.push_back(strides[dims[k - 1]] / strides[dims[k]]);
      keep.push_back({0, sizes[dims[k]]});
      sized.push_back(sizes[dims[k]]);
    }
    grid.push_back(strides[dims.back()]);
    keep.push_back({0, 1});
    v = flat.shrink({{offset, offset + len}}).reshape(grid).shrink(keep).reshape(sized);
    std::vector<int64_t> perm(dims.size());  // the dims in their own order: position of each in the sorted list
    std::vector<size_t> by_index(dims);
    std::sort(by_index.begin(), by_index.end());
    bool identity = true;
    for (size_t j = 0; j < by_index.size(); j++) {
      perm[j] = int64_t(std::find(dims.begin(), dims.end(), by_index[j]) - dims.begin());
      identity &= perm[j] == int64_t(j);
    }
    if (!identity) v = v.permute(perm);
  }
  v = v.reshape(compact);
  return expanded ? v.expand(Shape(sizes.begin(), sizes.end())) : v;
}

// A DISK tensor over `n` bytes at p, kept alive by owner.
Tensor disk_tensor(const uint8_t* p, const Shape& shape, int64_t numel, DType dtype, const std::string& dev,
                   std::shared_ptr<const void> owner) {
  auto buf = std::make_shared<Buffer>(dev, dtype, size_t(numel), const_cast<uint8_t*>(p), std::move(owner));
  return Tensor(UOp::make(Ops::RESHAPE, dtype, {buffer_uop(std::move(buf))}, std::vector<int64_t>(shape)), shape, dev);
}

Tensor build_tensor(const Obj& t, const std::map<std::string, StorageBytes>& storages, const std::string& name,
                    const std::string& key, Target& to) {
  const std::string& device = to.device;
  const Obj& s = *t.items[0];
  auto it = storages.find(s.s);
  if (it == storages.end()) fail(name, "tensor '" + key + "': storage '" + s.s + "' is not in the file");
  uint64_t item = uint64_t(s.dtype.itemsize());
  if (uint64_t(s.numel) > it->second.n / item)
    fail(name, "tensor '" + key + "': storage '" + s.s + "' holds " + std::to_string(it->second.n) + " bytes, fewer than its " +
               std::to_string(s.numel) + " " + s.dtype.name() + " elements");
  if (t.sizes.size() != t.strides.size())
    fail(name, "tensor '" + key + "' has " + std::to_string(t.sizes.size()) + " sizes and " + std::to_string(t.strides.size()) + " strides");
  // the largest storage index any element reads: offset + sum (size-1)*stride, every term checked
  uint64_t numel = 1, last = uint64_t(t.numel);
  bool empty = false;
  if (t.numel < 0) fail(name, "tensor '" + key + "' has a negative storage offset");
  for (size_t d = 0; d < t.sizes.size(); d++) {
    if (t.sizes[d] < 0 || t.strides[d] < 0)
      fail(name, "tensor '" + key + "' has a negative size or stride (dimension " + std::to_string(d) + ")");
    if (t.sizes[d] == 0) empty = true;
    uint64_t span;
    if (__builtin_mul_overflow(uint64_t(std::max<int64_t>(t.sizes[d] - 1, 0)), uint64_t(t.strides[d]), &span) ||
        __builtin_add_overflow(last, span, &last) || __builtin_mul_overflow(numel, uint64_t(t.sizes[d]), &numel) ||
        numel > (uint64_t(1) << 40))
      fail(name, "tensor '" + key + "' is too large");
  }
  if (!empty && last >= uint64_t(s.numel))
    fail(name, "tensor '" + key + "' (offset " + std::to_string(t.numel) + ", sizes " + shape_str(Shape(t.sizes)) +
               ") reads element " + std::to_string(last) + " of storage '" + s.s + "', which has " + std::to_string(s.numel));
  if (!empty && uint64_t(t.numel) > uint64_t(s.numel)) fail(name, "tensor '" + key + "': storage offset past the storage");
  if (to.disk) {  // a view of the storage's bytes where the strides allow it (no copy)
    auto f = to.flat.find(s.s);
    if (f == to.flat.end())
      f = to.flat.emplace(s.s, disk_tensor(it->second.p, {s.numel}, s.numel, s.dtype, device, to.owner)).first;
    if (empty) return f->second.shrink({{0, 0}}).reshape(Shape(t.sizes));
    if (auto v = strided_view(f->second, t.numel, t.sizes, t.strides)) return *v;
  }
  // A stride-0 dim (an expanded tensor) is gathered once and expanded lazily. What is left reads distinct elements
  // unless its strides overlap (an unfold-like view): such a view may hold more elements than its storage, up to
  // the storage's count plus 2^24 (a small file cannot ask for a huge copy), and what the device can hold.
  Shape compact(t.sizes);
  uint64_t cnum = 1;
  bool expanded = false;
  for (size_t d = 0; d < compact.size(); d++) {
    if (t.strides[d] == 0 && compact[d] > 1) compact[d] = 1, expanded = true;
    cnum *= uint64_t(compact[d]);  // <= numel: no overflow
  }
  if (!empty && cnum > uint64_t(s.numel) + (uint64_t(1) << 24))
    fail(name, "tensor '" + key + "' is a view of " + std::to_string(cnum) + " elements with overlapping strides over a storage of " +
               std::to_string(s.numel) + " (at most the storage's count plus 2^24 are read; save a contiguous copy)");
  try {
    checked_nbytes("torch_load", compact, s.dtype, device.empty() ? default_device() : device);
  } catch (const Error& e) {
    fail(name, "tensor '" + key + "': " + e.what());
  }
  std::vector<uint8_t> out(size_t(empty ? 0 : cnum * item));
  if (!empty) {
    std::vector<int64_t> idx(compact.size(), 0);
    const uint8_t* base = it->second.p;
    for (uint64_t e = 0; e < cnum; e++) {
      uint64_t at = uint64_t(t.numel);
      for (size_t d = 0; d < idx.size(); d++) at += uint64_t(idx[d]) * uint64_t(t.strides[d]);
      std::memcpy(out.data() + e * item, base + at * item, size_t(item));
      for (size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < compact[d]) break;
        idx[d] = 0;
      }
    }
  }
  Tensor r;
  if (to.disk) {  // overlapping strides on DISK: the gathered copy, as a DISK buffer of its own
    Bytes c = copy_bytes(out.data(), out.size());
    r = disk_tensor(c.p, compact, int64_t(cnum), s.dtype, device, c.owner);
  } else {
    r = Tensor::from_blob(out.data(), empty ? Shape(t.sizes) : compact, s.dtype, device);
  }
  return expanded && !empty ? r.expand(Shape(t.sizes)) : r;
}

// The tensors of the object tree under `root`, by dotted path (dict keys, list indices); other values are skipped.
std::map<std::string, Tensor> collect(P root, const std::map<std::string, StorageBytes>& storages, const std::string& name,
                                      Target& to) {
  std::map<std::string, Tensor> out;
  std::vector<std::pair<P, std::string>> todo = {{root, ""}};
  std::set<P> seen;  // containers already walked: a cycle through the memo ends here
  auto join = [](const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; };
  while (!todo.empty()) {
    auto [o, path] = todo.back();
    todo.pop_back();
    if (o->kind == Obj::TensorRef) {
      if (!out.emplace(path, build_tensor(*o, storages, name, path, to)).second)
        fail(name, "two tensors are named '" + path + "'");
      continue;
    }
    if (o->kind != Obj::Dict && o->kind != Obj::List && o->kind != Obj::Tuple) continue;
    if (!seen.insert(o).second) continue;
    if (o->kind == Obj::Dict) {
      for (auto e = o->entries.rbegin(); e != o->entries.rend(); ++e) {
        P k = e->first;
        if (k->kind != Obj::Str && k->kind != Obj::Int) continue;  // keys of other kinds cannot name a tensor
        todo.emplace_back(e->second, join(path, k->kind == Obj::Str ? k->s : std::to_string(k->i)));
      }
    } else {
      for (size_t i = o->items.size(); i-- > 0;) todo.emplace_back(o->items[i], join(path, std::to_string(i)));
    }
  }
  return out;
}

std::map<std::string, Tensor> load(const uint8_t* p, size_t n, const std::string& name, const std::string& device,
                                   std::shared_ptr<const void> owner) {
  std::deque<Obj> arena;
  Target to;
  to.disk = !device.empty() && !get_device(device).runs_kernels();
  to.device = to.disk ? get_device(device).name() : device;
  if (n >= 4 && le<uint32_t>(p) == 0x04034b50) {
    std::map<std::string, ZipEntry> dir = zip_directory(p, n, name);
    std::string prefix;
    for (const auto& [fn, e] : dir) {
      size_t slash = fn.find('/');
      if (slash != std::string::npos && fn.compare(slash, std::string::npos, "/data.pkl") == 0) {
        prefix = fn.substr(0, slash + 1);
        break;
      }
    }
    if (prefix.empty()) fail(name, "zip file without an ARCHIVE/data.pkl entry (not written by torch.save)");
    auto kept = std::make_shared<std::deque<std::vector<uint8_t>>>();  // inflated entries: DISK tensors may view them
    std::deque<std::vector<uint8_t>>& keep = *kept;
    to.owner = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<const void>>>(owner, kept);
    if (auto bo = dir.find(prefix + "byteorder"); bo != dir.end()) {
      auto [b, k] = zip_read(p, n, bo->first, bo->second, keep, name);
      if (std::string(reinterpret_cast<const char*>(b), size_t(k)) != "little") fail(name, "storages are not little-endian");
    }
    std::map<std::string, StorageBytes> storages;
    std::string data_dir = prefix + "data/";
    for (const auto& [fn, e] : dir)
      if (fn.compare(0, data_dir.size(), data_dir) == 0 && fn.size() > data_dir.size()) {
        auto [b, k] = zip_read(p, n, fn, e, keep, name);
        storages[fn.substr(data_dir.size())] = {b, k};
      }
    auto pk = dir.find(prefix + "data.pkl");
    auto [b, k] = zip_read(p, n, pk->first, pk->second, keep, name);
    Unpickler u(b, size_t(k), name, arena);
    return collect(u.load(), storages, name, to);
  }
  // legacy: magic number, protocol version, system info, the object, the storage keys; then the storages in that order
  if (n < 2 || p[0] != 0x80) fail(name, "neither a zip file nor a legacy torch.save file (no pickle at the start)");
  Unpickler u(p, n, name, arena);
  P magic = u.load();  // 0x1950a86a20f9469cfc6c, 80 bits: LONG1 of 10 bytes
  if (magic->kind != Obj::Opaque || magic->s != std::string("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10))
    fail(name, "neither a zip file nor a legacy torch.save file (wrong magic number)");
  P version = u.load();
  if (version->kind != Obj::Int || version->i != 1001) fail(name, "legacy torch file with protocol version other than 1001");
  u.load();  // system info: endianness, type sizes
  P root = u.load();
  P keys = u.load();
  if (keys->kind != Obj::List) fail(name, "legacy torch file: the storage keys are not a list");
  // storage element types come from the persistent ids met in the object
  std::map<std::string, const Obj*> by_key;
  for (const Obj& o : arena)
    if (o.kind == Obj::Storage) by_key.emplace(o.s, &o);
  std::map<std::string, StorageBytes> storages;
  size_t at = u.pos();
  for (P k : keys->items) {
    if (k->kind != Obj::Str) fail(name, "legacy torch file: a storage key is not a string");
    auto it = by_key.find(k->s);
    if (it == by_key.end()) fail(name, "legacy torch file: storage '" + k->s + "' is listed but no tensor uses it");
    if (n - at < 8) fail(name, "truncated: storage '" + k->s + "' lies past the end of the file");
    uint64_t cnt = le<uint64_t>(p + at), item = uint64_t(it->second->dtype.itemsize());
    at += 8;
    if (cnt > (n - at) / item) fail(name, "truncated: storage '" + k->s + "' (" + std::to_string(cnt) + " elements) lies past the end of the file");
    storages[k->s] = {p + at, cnt * item};
    at += size_t(cnt * item);
  }
  to.owner = owner;
  return collect(root, storages, name, to);
}

}  // namespace

std::map<std::string, Tensor> torch_load(const std::string& path, const std::string& device) {
  Bytes f = map_file(path, "torch_load");
  return load(f.p, f.n, path, device, f.owner);
}

std::map<std::string, Tensor> torch_load_bytes(const uint8_t* data, size_t size, const std::string& name, const std::string& device) {
  if (!device.empty() && !get_device(device).runs_kernels()) {  // DISK tensors view a copy of the bytes
    Bytes c = copy_bytes(data, size);
    return load(c.p, c.n, name, device, c.owner);
  }
  return load(data, size, name, device, nullptr);
}

}  // namespace tg::nn
