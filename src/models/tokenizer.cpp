// SentencePiece-style tokenizer from GGUF metadata: llama.cpp's
// llm_tokenizer_spm (bigram merges by score).
#include "tg/models/tokenizer.hpp"

#include <cstdio>
#include <queue>

#include "tg/error.hpp"

namespace tg::models {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("[tokenizer] " + what); }

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

size_t utf8_len(uint8_t c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;  // a stray continuation byte: a character of its own (it falls back
             // to its byte token)
}

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<int32_t> types, int32_t bos, int32_t eos,
                     int32_t unk, bool add_bos, bool add_space_prefix)
    : tokens_(std::move(tokens)),
      scores_(std::move(scores)),
      types_(std::move(types)),
      bos_(bos),
      eos_(eos),
      unk_(unk),
      add_bos_(add_bos),
      add_space_prefix_(add_space_prefix) {
  int32_t n = int32_t(tokens_.size());
  if (n == 0) fail("the vocabulary is empty");
  if (scores_.empty()) scores_.assign(tokens_.size(), 0.f);
  if (types_.empty()) types_.assign(tokens_.size(), int32_t(TokenType::NORMAL));
  if (scores_.size() != tokens_.size() || types_.size() != tokens_.size())
    fail(std::to_string(tokens_.size()) + " tokens but " + std::to_string(scores_.size()) + " scores and " + std::to_string(types_.size()) +
         " token types");
  for (auto [what, id] : std::initializer_list<std::pair<const char*, int32_t>>{{"BOS", bos}, {"EOS", eos}, {"unknown", unk}})
    if (id < -1 || id >= n)
      fail(std::string(what) + " token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(n));
  for (int32_t i = 0; i < n; i++) ids_.emplace(tokens_[size_t(i)], i);  // the first of duplicates wins
}

Tokenizer Tokenizer::from_gguf(const nn::GGUFFile& f, const std::string& file) {
  auto get = [&](const std::string& k) -> const nn::GGUFValue* {
    auto it = f.metadata.find("tokenizer.ggml." + k);
    return it == f.metadata.end() ? nullptr : &it->second;
  };
  const nn::GGUFValue* model = get("model");
  if (!model) fail(file + ": tokenizer.ggml.model is missing");
  if (model->as_string() != "llama") fail(file + ": tokenizer model '" + model->as_string() + "' is not supported yet (\"llama\" is)");
  const nn::GGUFValue* toks = get("tokens");
  if (!toks) fail(file + ": tokenizer.ggml.tokens is missing");
  std::vector<std::string> tokens;
  for (const auto& v : toks->as_array()) tokens.push_back(v.as_string());
  std::vector<float> scores;
  if (const nn::GGUFValue* s = get("scores"))
    for (const auto& v : s->as_array()) scores.push_back(float(v.as_double()));
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
    return Tokenizer(std::move(tokens), std::move(scores), std::move(types), id("bos_token_id", 1), id("eos_token_id", 2),
                     id("unknown_token_id", 0), flag("add_bos_token", true), flag("add_space_prefix", true));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + file + ")");
  }
}

int32_t Tokenizer::find(const std::string& s) const {
  auto it = ids_.find(s);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos && add_bos_ && bos_ >= 0) out.push_back(bos_);
  if (text.empty()) return out;
  std::string s;
  for (char ch : (add_space_prefix_ ? " " : "") + text) s += ch == ' ' ? kSpace : std::string(1, ch);
  // symbols: UTF-8 characters in a linked list; merged ones grow, their right
  // neighbour empties
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
  sy.back().next = -1;
  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  auto worse = [](const Bigram& a, const Bigram& b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> q(worse);
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    std::string t = s.substr(sy[size_t(l)].off, sy[size_t(l)].n + sy[size_t(r)].n);
    int32_t id = find(t);
    if (id >= 0) q.push({l, r, scores_[size_t(id)], t.size()});
  };
  for (size_t i = 1; i < sy.size(); i++) try_add(int(i) - 1, int(i));
  while (!q.empty()) {
    Bigram b = q.top();
    q.pop();
    Sym &l = sy[size_t(b.left)], &r = sy[size_t(b.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // outdated: one side merged since
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sy[size_t(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = 0; i != -1; i = sy[size_t(i)].next) {
    std::string t = s.substr(sy[size_t(i)].off, sy[size_t(i)].n);
    if (int32_t id = find(t); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : t) {  // byte fallback
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", c);
      int32_t id = find(buf);
      if (id < 0) id = unk_;
      if (id < 0)
        fail("'" + t +
             "' is not in the vocabulary, which has neither byte tokens nor an "
             "unknown token");
      out.push_back(id);
    }
  }
  return out;
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
    default: {
      std::string out;
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, kSpace.size(), kSpace) == 0)
          out += ' ', i += kSpace.size();
        else
          out += t[i++];
      }
      return out;
    }
  }
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    if (id == bos_ || id == eos_) continue;
    std::string p = piece(id);
    if (first && add_space_prefix_ && !p.empty() && p[0] == ' ') p.erase(0, 1);
    first = false;
    out += p;
  }
  return out;
}

}  // namespace tg::models
