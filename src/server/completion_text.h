// The text of one completion choice as its tokens arrive. Detokenizes incrementally as
// vLLM does (decode a short window of recent tokens, keep what follows the window's
// earlier text, wait while the text ends in an incomplete character), and applies stop
// strings: the text ends before the first one (or after it, with
// include_stop_str_in_output), and ready() never reaches a tail that a later token could
// still turn into one, so a stream never sends text that a stop string cuts off.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace hsx {

class CompletionText {
 public:
  struct Options {
    std::vector<std::string> stop;
    bool include_stop_str = false;
    int min_tokens = 0;                   // stop strings count only after this many tokens
    std::vector<int32_t> stop_token_ids;  // their text is left out, as vLLM leaves it out
    bool skip_special_tokens = false;     // decode(skip_special_tokens): special tokens add no text
  };
  // `tokenizer` null: the text stays empty. The prompt's last tokens give the first
  // generated ones their context (a leading space survives).
  CompletionText(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt, Options options);

  // Adds a generated token; true once a stop string has ended the text.
  bool Add(int32_t token);
  // The sequence ended: the rest (an incomplete character included) becomes ready.
  void Finish();

  const std::string& text() const { return text_; }
  // Bytes of text() that are final: whole characters that no later token can cut.
  size_t ready() const { return ready_; }
  bool stopped() const { return stopped_; }

 private:
  void Append(const std::string& delta);

  const Tokenizer* tokenizer_;
  Options options_;
  size_t longest_stop_ = 0;
  std::vector<int32_t> ids_;  // context tokens, then generated ones
  size_t prefix_ = 0, read_ = 0;  // the decode window: ids_[prefix_, read_) is decoded text already
  int generated_ = 0;
  std::string text_;
  size_t ready_ = 0;
  bool stopped_ = false;
};

}  // namespace hsx
