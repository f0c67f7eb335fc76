// Text <-> token ids with a Hugging Face tokenizer.json (BPE models: Qwen, Llama 3, Gemma, ...),
// producing exactly what HF tokenizers produces.
#pragma once

#include <cstdint>
#include <memory>
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
  static Result<Tokenizer> Load(const std::string& path);

  // HF's encode(text, add_special_tokens=False): added tokens written in the text (such as
  // "<|im_start|>") become their ids; no BOS/EOS is added. Errors on invalid UTF-8.
  Result<std::vector<int32_t>> Encode(std::string_view text) const;
  // HF's decode(ids, skip_special_tokens=False). Errors on an id without a token.
  Result<std::string> Decode(const std::vector<int32_t>& ids) const;

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
