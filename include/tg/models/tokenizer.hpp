#pragma once
// Tokenizers from GGUF metadata (tokenizer.ggml.*). "llama":
// SentencePiece-style, as llama.cpp's SPM tokenizer: spaces become U+2581
// ("▁"), a space is prefixed (tokenizer.ggml.add_space_prefix, default true),
// UTF-8 characters are merged pairwise, highest score first (ties: leftmost),
// and a character that is no token falls back to its byte tokens ("<0x0A>"),
// else to the unknown token. Text is plain text: special tokens in it are not
// parsed. Thread-safety: a Tokenizer is immutable after construction.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tg/config.hpp"
#include "tg/nn/state.hpp"

namespace tg::models {

class Tokenizer {
 public:
  /** GGUF token types (tokenizer.ggml.token_type). */
  enum class TokenType : int32_t { UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };
  /** From a GGUF file's tokenizer.ggml.* keys; a model other than "llama", or
   * missing or inconsistent arrays, is a tg::Error naming `file` and the key.
   */
  static Tokenizer from_gguf(const nn::GGUFFile& f, const std::string& file);
  /** A SentencePiece-style vocabulary from its arrays (types empty: all
   * NORMAL). */
  Tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<int32_t> types, int32_t bos, int32_t eos, int32_t unk,
            bool add_bos = true, bool add_space_prefix = true);

  /** Token ids of `text` (BOS first when the vocabulary adds it and `add_bos`).
   */
  std::vector<int32_t> encode(const std::string& text, bool add_bos = true) const;
  /** One token's bytes: "▁" as a space, a byte token as its byte, a control
   * token as nothing. */
  std::string piece(int32_t id) const;
  /** The text of a sequence (BOS/EOS dropped; the space prefix after BOS
   * removed). */
  std::string decode(const std::vector<int32_t>& ids) const;

  size_t vocab_size() const { return tokens_.size(); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool adds_space_prefix() const { return add_space_prefix_; }

 private:
  int32_t find(const std::string& s) const;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> ids_;
  int32_t bos_, eos_, unk_;
  bool add_bos_, add_space_prefix_;
};

}  // namespace tg::models
