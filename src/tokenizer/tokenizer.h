// Text <-> token ids with a Hugging Face tokenizer.json (BPE models: Qwen, Llama 3, Gemma, ...),
// producing exactly what HF tokenizers produces.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace hsx {

// Immutable once loaded: copies share the loaded tables, and every method may be called from
// several threads at once.
class Tokenizer {
 public:
  // Reads a tokenizer.json. Every error names the file and the field. As in transformers 5,
  // tokenizer_config.json's add_bos_token/add_eos_token do not apply: the file's
  // post_processor says which special tokens a text gets.
  static Result<Tokenizer> Load(const std::string& path);
  // The same from a parsed tokenizer.json document (one built from GGUF metadata, say);
  // errors start with `where`.
  static Result<Tokenizer> FromJson(const nlohmann::json& document, const std::string& where);

  // HF's and vLLM's encode(text, add_special_tokens): added tokens written in the text (such as
  // "<|im_start|>") become their ids; with add_special_tokens the post-processor's tokens (a
  // BOS such as <|begin_of_text|> or <bos>) are added, as HF and vLLM do for a text prompt by
  // default. Text the chat template already rendered with its BOS wants false. Errors on
  // invalid UTF-8.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens = true) const;
  // HF's decode(ids, skip_special_tokens): with it, added tokens marked "special" (<|im_end|>,
  // <|endoftext|>, ...) are left out, as tokenizers' Rust decode leaves them out. Errors on an
  // id without a token.
  Result<std::string> Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // Whether `id` is an added token marked "special" (what skip_special_tokens leaves out).
  bool IsSpecial(int32_t id) const;

  // One past the largest id of the vocabulary and the added tokens: the embedding rows needed.
  int vocab_size() const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's vocabulary string ("Ġworld"), or "" for an id without a token.
  std::string IdToToken(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace hsx
