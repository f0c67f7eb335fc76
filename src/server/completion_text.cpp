#include "server/completion_text.h"

#include <algorithm>

namespace hsx {
namespace {

// Prompt tokens kept as decode context (vLLM keeps 5 too).
constexpr size_t kContextTokens = 5;

bool EndsWithReplacementCharacter(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

// Moves `pos` back to the start of the UTF-8 character it falls in.
size_t CharacterStart(const std::string& s, size_t pos) {
  while (pos > 0 && pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

}  // namespace

CompletionText::CompletionText(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt, Options options)
    : tokenizer_(tokenizer), options_(std::move(options)) {
  for (const std::string& s : options_.stop) longest_stop_ = std::max(longest_stop_, s.size());
  ids_.assign(prompt.end() - static_cast<std::ptrdiff_t>(std::min(prompt.size(), kContextTokens)), prompt.end());
  read_ = ids_.size();
}

bool CompletionText::Add(int32_t token) {
  ++generated_;
  if (stopped_ || tokenizer_ == nullptr) return stopped_;
  const auto& stops = options_.stop_token_ids;
  if (!options_.include_stop_str && std::find(stops.begin(), stops.end(), token) != stops.end()) return false;
  ids_.push_back(token);
  auto window = [&](size_t end) {
    return tokenizer_->Decode(std::vector<int32_t>(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_),
                                                   ids_.begin() + static_cast<std::ptrdiff_t>(end)),
                             options_.skip_special_tokens);
  };
  auto before = window(read_);
  auto now = window(ids_.size());
  if (!before.ok() || !now.ok()) {  // an id without a token: it adds no text
    ids_.pop_back();
    return false;
  }
  if (now->size() > before->size() && !EndsWithReplacementCharacter(*now)) {
    Append(now->substr(before->size()));
    prefix_ = read_;
    read_ = ids_.size();
  }
  return stopped_;
}

void CompletionText::Finish() {
  if (!stopped_ && tokenizer_ != nullptr && read_ < ids_.size()) {
    auto before = tokenizer_->Decode(std::vector<int32_t>(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_),
                                                          ids_.begin() + static_cast<std::ptrdiff_t>(read_)),
                                          options_.skip_special_tokens);
    auto now = tokenizer_->Decode(
        std::vector<int32_t>(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_), ids_.end()), options_.skip_special_tokens);
    if (before.ok() && now.ok() && now->size() > before->size()) Append(now->substr(before->size()));
    read_ = ids_.size();
  }
  ready_ = text_.size();
}

void CompletionText::Append(const std::string& delta) {
  const size_t old_size = text_.size();
  text_ += delta;
  // vLLM's rule: stop strings count once more than min_tokens tokens are out, and only
  // in text this token could have completed.
  if (longest_stop_ > 0 && generated_ > options_.min_tokens) {
    const size_t from = old_size - std::min(old_size, longest_stop_ - 1);
    size_t first = std::string::npos, length = 0;
    for (const std::string& s : options_.stop) {
      const size_t at = text_.find(s, from);
      if (at < first) first = at, length = s.size();
    }
    if (first != std::string::npos) {
      text_.resize(first + (options_.include_stop_str ? length : 0));
      ready_ = text_.size();
      stopped_ = true;
      return;
    }
  }
  // Hold back what could still be the start of a stop string.
  const size_t held = longest_stop_ > 0 ? std::min(text_.size(), longest_stop_ - 1) : 0;
  ready_ = std::max(ready_, CharacterStart(text_, text_.size() - held));
}

}  // namespace hsx
