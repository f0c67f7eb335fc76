// Text preparation before the BPE model, as tokenizer.json configures it: the normalizer
// rewrites text, the pre-tokenizer cuts it into pieces that BPE encodes independently.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "util/status.h"

namespace hsx {

struct Span {
  size_t begin;
  size_t end;
};

// A compiled PCRE2 pattern with Unicode semantics (\p{L}, \s, case folding), JIT-compiled when
// available. Immutable after compilation, so one instance serves concurrent callers.
class Regex {
 public:
  // `literal` matches `pattern` as plain text: tokenizer.json's {"String": ...} patterns.
  static Result<Regex> Compile(const std::string& pattern, bool literal);

  // Non-overlapping matches from left to right. An empty match right where the previous match
  // ended is skipped, as HF's Oniguruma find_iter does. `text` must be valid UTF-8.
  Result<std::vector<Span>> FindAll(std::string_view text) const;
  // The same matches, each handed to `match` as it is found (no list of them is built).
  Status ForEachMatch(std::string_view text, const std::function<void(Span)>& match) const;

 private:
  explicit Regex(std::shared_ptr<pcre2_code> code) : code_(std::move(code)) {}
  std::shared_ptr<pcre2_code> code_;
};

// GPT-2's byte-level alphabet maps every byte to a printable character, so that any text
// becomes vocabulary symbols with no spaces or control characters in them; this is its inverse.
std::optional<uint8_t> ByteLevelByteOfChar(char32_t c);

// HF's tokenizer.json "normalizer": NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents, Replace,
// Prepend, Sequence or null.
class TextNormalizer {
 public:
  // `where` is the field path used in errors, e.g. "normalizer".
  static Result<TextNormalizer> FromJson(const nlohmann::json& config, const std::string& where);
  // `text` must be valid UTF-8; the result is too.
  Result<std::string> Apply(std::string text) const;

 private:
  struct UnicodeForm {
    int utf8proc_options;
  };
  struct Replace {
    Regex pattern;
    std::string content;
  };
  struct Prepend {
    std::string prefix;
  };
  struct Lowercase {};
  struct Strip {
    bool left;
    bool right;
  };
  struct StripAccents {};
  using Step = std::variant<UnicodeForm, Replace, Prepend, Lowercase, Strip, StripAccents>;
  static Status AddSteps(const nlohmann::json& config, const std::string& where,
                         std::vector<Step>* steps);
  std::vector<Step> steps_;
};

// How a split keeps the matched delimiters (HF's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// HF's tokenizer.json "pre_tokenizer": Split, ByteLevel, Metaspace, Digits, Whitespace,
// WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit, Sequence or null.
class PreTokenizer {
 public:
  static Result<PreTokenizer> FromJson(const nlohmann::json& config, const std::string& where);
  // Receives each piece (never empty) in order; the view lasts only for the call.
  using PieceSink = std::function<void(std::string_view piece)>;
  // Cuts one normalized, non-empty stretch of text into the pieces BPE encodes on its own,
  // handing each to `emit` as it is cut, so memory follows the longest piece rather than
  // the number of pieces. `starts_text`: it begins where the input text begins, which
  // Metaspace's prepend_scheme "first" asks about.
  Status Apply(std::string_view text, bool starts_text, const PieceSink& emit) const;

 private:
  struct Split {
    Regex pattern;
    SplitBehavior behavior;
    bool invert;
  };
  struct ByteLevel {
    bool add_prefix_space;
    std::optional<Regex> gpt2_pattern;  // set when use_regex is true
  };
  enum class PrependScheme { kAlways, kFirst, kNever };
  struct Metaspace {
    std::string replacement;
    PrependScheme prepend_scheme;
    bool split;
  };
  // A split at every character of a class, each character its own match (HF's split on a
  // char predicate).
  enum class CharClass { kWhitespace, kPunctuation, kNumeric, kDelimiter };
  struct CharSplit {
    CharClass char_class;
    char32_t delimiter;  // for kDelimiter
    SplitBehavior behavior;
  };
  using Step = std::variant<Split, ByteLevel, Metaspace, CharSplit>;
  static Status AddSteps(const nlohmann::json& config, const std::string& where,
                         std::vector<Step>* steps);
  Status ApplyFrom(size_t step, std::string_view text, bool starts_text, const PieceSink& emit) const;
  std::vector<Step> steps_;
};

}  // namespace hsx
