#include "tokenizer/pretokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "tokenizer/json_fields.h"
#include "tokenizer/unicode.h"
#include "util/utf8.h"

namespace hsx {
namespace {

using nlohmann::json;

struct ByteLevelAlphabet {
  std::array<std::string, 256> char_of_byte;
  std::array<int16_t, 512> byte_of_char;  // -1 for characters outside the alphabet
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    a.byte_of_char.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the others take U+0100 onwards, in order.
    char32_t next_substitute = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      bool printable =
          (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      char32_t c = printable ? static_cast<char32_t>(byte) : next_substitute++;
      AppendUtf8(a.char_of_byte[byte], c);
      a.byte_of_char[c] = static_cast<int16_t>(byte);
    }
    return a;
  }();
  return alphabet;
}

std::string MapBytesToAlphabet(std::string_view text) {
  const auto& char_of_byte = Alphabet().char_of_byte;
  std::string mapped;
  mapped.reserve(text.size() * 2);
  for (char byte : text) mapped += char_of_byte[static_cast<unsigned char>(byte)];
  return mapped;
}

// Calls `match` with each occurrence of `literal` in `text`, left to right, without overlaps.
template <typename F>
void ForEachLiteral(std::string_view text, std::string_view literal, F&& match) {
  for (size_t at = text.find(literal); at != std::string_view::npos; at = text.find(literal, at + literal.size())) {
    match(Span{at, at + literal.size()});
  }
}

// Cuts `size` bytes at matches given one at a time, left to right, like HF's
// NormalizedString::split: gaps and matches alternate, `behavior` decides what becomes of
// the matches, empty parts are dropped. Each kept part goes to `emit` as soon as no later
// match can change it, so no list of matches or parts is ever built: a text's pieces cost
// memory one at a time, not all at once (a list of them cost ~40x the text).
class PartCutter {
 public:
  PartCutter(size_t size, bool invert, SplitBehavior behavior, std::function<Status(Span)> emit)
      : size_(size), invert_(invert), behavior_(behavior), emit_(std::move(emit)) {}

  void Match(Span match) {
    if (previous_end_ != match.begin) Part({previous_end_, match.begin}, invert_);
    Part(match, !invert_);
    previous_end_ = match.end;
  }
  // The part after the last match and any part still held; the first error of `emit`.
  Status Finish() {
    if (previous_end_ != size_) Part({previous_end_, size_}, invert_);
    Flush();
    return std::move(status_);
  }

 private:
  void Part(Span span, bool is_match) {
    switch (behavior_) {
      case SplitBehavior::kIsolated:
        Emit(span);
        break;
      case SplitBehavior::kRemoved:
        if (!is_match) Emit(span);
        break;
      case SplitBehavior::kContiguous:  // runs of matches, and of gaps, become one part
        if (held_ && is_match == previous_match_) {
          pending_.end = span.end;
        } else {
          Hold(span);
        }
        break;
      case SplitBehavior::kMergedWithPrevious:  // a match joins the gap before it
        if (held_ && is_match && !previous_match_) {
          pending_.end = span.end;
        } else {
          Hold(span);
        }
        break;
      case SplitBehavior::kMergedWithNext:  // a match joins the gap after it
        if (is_match) {
          Hold(span);
        } else if (held_ && previous_match_) {
          pending_.end = span.end;
          Flush();
        } else {
          Emit(span);
        }
        break;
    }
    previous_match_ = is_match;
  }
  void Hold(Span span) {
    Flush();
    pending_ = span;
    held_ = true;
  }
  void Flush() {
    if (held_) Emit(pending_);
    held_ = false;
  }
  void Emit(Span span) {
    if (span.begin != span.end && status_.ok()) status_ = emit_(span);
  }

  size_t size_;
  bool invert_;
  SplitBehavior behavior_;
  std::function<Status(Span)> emit_;
  size_t previous_end_ = 0;
  bool previous_match_ = false;
  bool held_ = false;
  Span pending_{0, 0};
  Status status_;
};

// tokenizer.json patterns: {"String": "literal"} or {"Regex": "pattern"}.
Result<Regex> ParsePattern(const json& config, const std::string& where) {
  HSX_ASSIGN_OR_RETURN(const json* pattern, json_fields::Required(config, "pattern", where));
  const std::string path = where + ".pattern";
  if (pattern->is_object() && pattern->size() == 1) {
    for (bool literal : {true, false}) {
      const char* key = literal ? "String" : "Regex";
      auto it = pattern->find(key);
      if (it == pattern->end() || !it->is_string()) continue;
      Result<Regex> regex = Regex::Compile(it->get<std::string>(), literal);
      if (!regex.ok()) return regex.status().with_context(path + "." + key);
      return regex;
    }
  }
  return Error(path + ": expected {\"String\": ...} or {\"Regex\": ...}");
}

Result<const json*> ArrayField(const json& config, const std::string& key,
                               const std::string& where) {
  HSX_ASSIGN_OR_RETURN(const json* list, json_fields::Required(config, key, where));
  if (!list->is_array()) return Error(json_fields::Path(where, key) + ": expected an array");
  return list;
}

Result<SplitBehavior> ParseBehavior(const json& config, const std::string& where) {
  HSX_ASSIGN_OR_RETURN(std::string name, json_fields::String(config, "behavior", where));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return Error(where + ".behavior '" + name +
               "' is not supported; expected Removed, Isolated, MergedWithPrevious, "
               "MergedWithNext or Contiguous");
}

// HF's Whitespace pre-tokenizer keeps the matches of this.
constexpr const char* kWordsPattern = R"(\w+|[^\w\s]+)";

// HF compiles patterns with Oniguruma, whose \s is Unicode White_Space and whose \w is
// Unicode's word class (Alphabetic, marks, decimal digits, connector punctuation, joiners).
// PCRE2 10.42's differ (its \s takes U+180E, its \w no marks), so they are spelled out. Escapes whose meaning differs in ways that cannot be spelled out are refused.
constexpr std::string_view kSpaceClass = R"(\x{9}-\x{D}\x{85}\p{Z})";
constexpr std::string_view kWordClass = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";

Result<std::string> TranslateOnigurumaPattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escaped = pattern[++i];
      const bool space = escaped == 's' || escaped == 'S';
      const bool word = escaped == 'w' || escaped == 'W';
      const bool negated = escaped == 'S' || escaped == 'W';
      if (space || word) {
        const std::string_view body = space ? kSpaceClass : kWordClass;
        if (!in_class) {
          out += negated ? "[^" : "[";
          out += body;
          out += "]";
        } else if (!negated) {
          out += body;
        } else {
          return Error(std::string("\\") + escaped +
                       " inside a character class is not supported (pattern '" + pattern + "')");
        }
      } else if (escaped == 'b' || escaped == 'B' || escaped == 'h' || escaped == 'H') {
        return Error(std::string("\\") + escaped +
                     " means something else in Oniguruma and PCRE2; not supported (pattern '" +
                     pattern + "')");
      } else {
        out += c;
        out += escaped;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (end != std::string::npos) {
        out.append(pattern, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// GPT-2's pre-tokenization, which ByteLevel applies when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

Result<Regex> Regex::Compile(const std::string& pattern, bool literal) {
  // PCRE2 refuses UCP together with LITERAL; a literal needs no character classes anyway.
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  std::string translated = pattern;
  if (!literal) {
    HSX_ASSIGN_OR_RETURN(translated, TranslateOnigurumaPattern(pattern));
  }
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    const std::string rewritten =
        translated == pattern ? "" : " (rewritten as '" + translated + "')";
    return Error("invalid regex '" + pattern + "'" + rewritten + ": " +
                 reinterpret_cast<const char*>(message) + " at offset " +
                 std::to_string(error_offset));
  }
  // JIT only speeds matching up; where it is unavailable the interpreter finds the same matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return Regex(std::shared_ptr<pcre2_code>(code, pcre2_code_free));
}

Status Regex::ForEachMatch(std::string_view text, const std::function<void(Span)>& match) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match_data(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
  if (match_data == nullptr) return Error("regex: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  std::optional<size_t> previous_end;
  while (search_from <= text.size()) {
    int rc = pcre2_match(code_.get(), subject, text.size(), search_from, PCRE2_NO_UTF_CHECK,
                         match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return Error(std::string("regex match failed: ") + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    Span found{ovector[0], ovector[1]};
    if (found.begin == found.end && previous_end == found.end) {
      if (search_from == text.size()) break;
      search_from += Utf8CharLength(text[search_from]);
      continue;
    }
    match(found);
    search_from = found.end;
    previous_end = found.end;
  }
  return Status();
}

Result<std::vector<Span>> Regex::FindAll(std::string_view text) const {
  std::vector<Span> matches;
  HSX_RETURN_IF_ERROR(ForEachMatch(text, [&](Span m) { matches.push_back(m); }));
  return matches;
}

std::optional<uint8_t> ByteLevelByteOfChar(char32_t c) {
  const auto& byte_of_char = Alphabet().byte_of_char;
  if (c >= byte_of_char.size() || byte_of_char[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(byte_of_char[c]);
}

Result<TextNormalizer> TextNormalizer::FromJson(const json& config, const std::string& where) {
  TextNormalizer normalizer;
  if (!config.is_null()) HSX_RETURN_IF_ERROR(AddSteps(config, where, &normalizer.steps_));
  return normalizer;
}

Status TextNormalizer::AddSteps(const json& config, const std::string& where,
                                std::vector<Step>* steps) {
  HSX_ASSIGN_OR_RETURN(std::string type, json_fields::String(config, "type", where));
  if (type == "Sequence") {
    HSX_ASSIGN_OR_RETURN(const json* list, ArrayField(config, "normalizers", where));
    for (size_t i = 0; i < list->size(); ++i) {
      HSX_RETURN_IF_ERROR(
          AddSteps((*list)[i], where + ".normalizers[" + std::to_string(i) + "]", steps));
    }
  } else if (type == "NFC") {
    steps->push_back(UnicodeForm{UTF8PROC_COMPOSE});
  } else if (type == "NFD") {
    steps->push_back(UnicodeForm{UTF8PROC_DECOMPOSE});
  } else if (type == "NFKC") {
    steps->push_back(UnicodeForm{UTF8PROC_COMPOSE | UTF8PROC_COMPAT});
  } else if (type == "NFKD") {
    steps->push_back(UnicodeForm{UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT});
  } else if (type == "Replace") {
    HSX_ASSIGN_OR_RETURN(Regex pattern, ParsePattern(config, where));
    HSX_ASSIGN_OR_RETURN(std::string content, json_fields::String(config, "content", where));
    steps->push_back(Replace{std::move(pattern), std::move(content)});
  } else if (type == "Prepend") {
    HSX_ASSIGN_OR_RETURN(std::string prefix, json_fields::String(config, "prepend", where));
    steps->push_back(Prepend{std::move(prefix)});
  } else if (type == "Lowercase") {
    steps->push_back(Lowercase{});
  } else if (type == "Strip") {
    HSX_ASSIGN_OR_RETURN(bool left, json_fields::Bool(config, "strip_left", where, false));
    HSX_ASSIGN_OR_RETURN(bool right, json_fields::Bool(config, "strip_right", where, false));
    steps->push_back(Strip{left, right});
  } else if (type == "StripAccents") {
    steps->push_back(StripAccents{});
  } else {
    return Error(where + ".type '" + type +
                 "' is not supported; expected NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                 "StripAccents, Replace, Prepend or Sequence");
  }
  return Status();
}

Result<std::string> TextNormalizer::Apply(std::string text) const {
  for (const Step& step : steps_) {
    if (const auto* form = std::get_if<UnicodeForm>(&step)) {
      // Every normalization form leaves ASCII as it is.
      if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) continue;
      utf8proc_uint8_t* normalized = nullptr;
      utf8proc_ssize_t length =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                       static_cast<utf8proc_ssize_t>(text.size()), &normalized,
                       static_cast<utf8proc_option_t>(UTF8PROC_STABLE | form->utf8proc_options));
      if (length < 0)
        return Error(std::string("Unicode normalization: ") + utf8proc_errmsg(length));
      text.assign(reinterpret_cast<const char*>(normalized), static_cast<size_t>(length));
      std::free(normalized);
    } else if (const auto* replace = std::get_if<Replace>(&step)) {
      std::string replaced;
      size_t copied = 0;
      HSX_RETURN_IF_ERROR(replace->pattern.ForEachMatch(text, [&](Span m) {
        if (copied == 0 && replaced.empty()) replaced.reserve(text.size());
        replaced.append(text, copied, m.begin - copied);
        replaced += replace->content;
        copied = m.end;
      }));
      if (copied > 0 || !replaced.empty()) {
        replaced.append(text, copied, std::string::npos);
        text = std::move(replaced);
      }
    } else if (const auto* prepend = std::get_if<Prepend>(&step)) {
      if (!text.empty()) text.insert(0, prepend->prefix);
    } else if (std::holds_alternative<Lowercase>(step)) {
      text = hsx::Lowercase(text);
    } else if (const auto* strip = std::get_if<Strip>(&step)) {
      size_t begin = 0, end = text.size();
      while (strip->left && begin < end && IsWhitespace(CharAt(text, begin)))
        begin += Utf8CharLength(text[begin]);
      while (strip->right && begin < end) {
        size_t last = begin + StartOfLastChar(std::string_view(text).substr(begin, end - begin));
        if (!IsWhitespace(CharAt(text, last))) break;
        end = last;
      }
      text = text.substr(begin, end - begin);
    } else if (std::holds_alternative<StripAccents>(step)) {
      std::string kept;
      kept.reserve(text.size());
      for (size_t at = 0; at < text.size();) {
        size_t length = Utf8CharLength(text[at]);
        if (!IsMark(CharAt(text, at))) kept.append(text, at, length);
        at += length;
      }
      text = std::move(kept);
    }
  }
  return text;
}

Result<PreTokenizer> PreTokenizer::FromJson(const json& config, const std::string& where) {
  PreTokenizer pre_tokenizer;
  if (!config.is_null()) HSX_RETURN_IF_ERROR(AddSteps(config, where, &pre_tokenizer.steps_));
  return pre_tokenizer;
}

Status PreTokenizer::AddSteps(const json& config, const std::string& where,
                              std::vector<Step>* steps) {
  HSX_ASSIGN_OR_RETURN(std::string type, json_fields::String(config, "type", where));
  if (type == "Sequence") {
    HSX_ASSIGN_OR_RETURN(const json* list, ArrayField(config, "pretokenizers", where));
    for (size_t i = 0; i < list->size(); ++i) {
      HSX_RETURN_IF_ERROR(
          AddSteps((*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]", steps));
    }
  } else if (type == "Split") {
    HSX_ASSIGN_OR_RETURN(Regex pattern, ParsePattern(config, where));
    HSX_ASSIGN_OR_RETURN(SplitBehavior behavior, ParseBehavior(config, where));
    HSX_ASSIGN_OR_RETURN(bool invert, json_fields::Bool(config, "invert", where, false));
    steps->push_back(Split{std::move(pattern), behavior, invert});
  } else if (type == "ByteLevel") {
    // Defaults are HF's ByteLevel::default().
    HSX_ASSIGN_OR_RETURN(bool add_prefix_space,
                         json_fields::Bool(config, "add_prefix_space", where, true));
    HSX_ASSIGN_OR_RETURN(bool use_regex, json_fields::Bool(config, "use_regex", where, true));
    ByteLevel byte_level{add_prefix_space, std::nullopt};
    if (use_regex) {
      HSX_ASSIGN_OR_RETURN(byte_level.gpt2_pattern, Regex::Compile(kGpt2Pattern, false));
    }
    steps->push_back(std::move(byte_level));
  } else if (type == "Metaspace") {
    HSX_ASSIGN_OR_RETURN(std::string replacement,
                         json_fields::String(config, "replacement", where));
    HSX_ASSIGN_OR_RETURN(std::optional<std::string> scheme_name,
                         json_fields::OptionalString(config, "prepend_scheme", where));
    HSX_ASSIGN_OR_RETURN(bool add_prefix_space,
                         json_fields::Bool(config, "add_prefix_space", where, true));
    HSX_ASSIGN_OR_RETURN(bool split, json_fields::Bool(config, "split", where, true));
    PrependScheme scheme = PrependScheme::kAlways;
    if (scheme_name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (scheme_name == "never") {
      scheme = PrependScheme::kNever;
    } else if (scheme_name.has_value() && scheme_name != "always") {
      return Error(where + ".prepend_scheme '" + *scheme_name +
                   "' is not supported; expected always, first or never");
    }
    // Files from before prepend_scheme existed say add_prefix_space: false instead.
    if (!add_prefix_space) scheme = PrependScheme::kNever;
    steps->push_back(Metaspace{std::move(replacement), scheme, split});
  } else if (type == "Digits") {
    HSX_ASSIGN_OR_RETURN(bool individual,
                         json_fields::Bool(config, "individual_digits", where, false));
    steps->push_back(CharSplit{CharClass::kNumeric, 0,
                               individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous});
  } else if (type == "Whitespace") {
    HSX_ASSIGN_OR_RETURN(Regex words, Regex::Compile(kWordsPattern, false));
    steps->push_back(Split{std::move(words), SplitBehavior::kRemoved, true});
  } else if (type == "WhitespaceSplit") {
    steps->push_back(CharSplit{CharClass::kWhitespace, 0, SplitBehavior::kRemoved});
  } else if (type == "Punctuation") {
    SplitBehavior behavior = SplitBehavior::kIsolated;
    if (config.contains("behavior")) {
      HSX_ASSIGN_OR_RETURN(behavior, ParseBehavior(config, where));
    }
    steps->push_back(CharSplit{CharClass::kPunctuation, 0, behavior});
  } else if (type == "BertPreTokenizer") {
    steps->push_back(CharSplit{CharClass::kWhitespace, 0, SplitBehavior::kRemoved});
    steps->push_back(CharSplit{CharClass::kPunctuation, 0, SplitBehavior::kIsolated});
  } else if (type == "CharDelimiterSplit") {
    HSX_ASSIGN_OR_RETURN(std::string delimiter, json_fields::String(config, "delimiter", where));
    if (delimiter.empty() || FindInvalidUtf8(delimiter) != std::string::npos ||
        Utf8CharLength(delimiter[0]) != delimiter.size()) {
      return Error(where + ".delimiter: expected one character");
    }
    steps->push_back(CharSplit{CharClass::kDelimiter, CharAt(delimiter, 0), SplitBehavior::kRemoved});
  } else {
    return Error(where + ".type '" + type +
                 "' is not supported; expected Split, ByteLevel, Metaspace, Digits, Whitespace, "
                 "WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit or Sequence");
  }
  return Status();
}

Status PreTokenizer::Apply(std::string_view text, bool starts_text, const PieceSink& emit) const {
  return ApplyFrom(0, text, starts_text, emit);
}

// Step `step` cuts `text`, and each part goes through the steps after it before the next
// part is cut: depth first, so what is held at once is one part per step.
Status PreTokenizer::ApplyFrom(size_t step, std::string_view text, bool starts_text, const PieceSink& emit) const {
  if (step == steps_.size()) {
    emit(text);
    return Status();
  }
  const Step& s = steps_[step];
  // The parts of `whole` (text, or text as this step rewrote it) at `behavior`, each on to the next step.
  auto cutter = [&](std::string_view whole, bool invert, SplitBehavior behavior) {
    return PartCutter(whole.size(), invert, behavior, [this, step, whole, starts_text, &emit](Span part) {
      return ApplyFrom(step + 1, whole.substr(part.begin, part.end - part.begin), starts_text && part.begin == 0, emit);
    });
  };
  if (const auto* char_split = std::get_if<CharSplit>(&s)) {
    PartCutter parts = cutter(text, false, char_split->behavior);
    for (size_t at = 0; at < text.size();) {
      const char32_t c = CharAt(text, at);
      const size_t length = Utf8CharLength(text[at]);
      bool match = false;
      switch (char_split->char_class) {
        case CharClass::kWhitespace: match = IsWhitespace(c); break;
        case CharClass::kPunctuation: match = IsPunctuation(c); break;
        case CharClass::kNumeric: match = IsNumeric(c); break;
        case CharClass::kDelimiter: match = c == char_split->delimiter; break;
      }
      if (match) parts.Match({at, at + length});
      at += length;
    }
    return parts.Finish();
  }
  if (const auto* split = std::get_if<Split>(&s)) {
    PartCutter parts = cutter(text, split->invert, split->behavior);
    HSX_RETURN_IF_ERROR(split->pattern.ForEachMatch(text, [&](Span m) { parts.Match(m); }));
    return parts.Finish();
  }
  if (const auto* byte_level = std::get_if<ByteLevel>(&s)) {
    std::string prefixed;
    if (byte_level->add_prefix_space && text.front() != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    auto mapped = [&](Span part) {
      return ApplyFrom(step + 1, MapBytesToAlphabet(text.substr(part.begin, part.end - part.begin)),
                       starts_text && part.begin == 0, emit);
    };
    if (!byte_level->gpt2_pattern) return mapped({0, text.size()});
    PartCutter parts(text.size(), false, SplitBehavior::kIsolated, mapped);
    HSX_RETURN_IF_ERROR(byte_level->gpt2_pattern->ForEachMatch(text, [&](Span m) { parts.Match(m); }));
    return parts.Finish();
  }
  const auto& metaspace = std::get<Metaspace>(s);
  const std::string& replacement = metaspace.replacement;
  std::string replaced;
  replaced.reserve(text.size());
  for (char c : text) {
    if (c == ' ') {
      replaced += replacement;
    } else {
      replaced += c;
    }
  }
  const bool prepend = metaspace.prepend_scheme == PrependScheme::kAlways ||
                       (metaspace.prepend_scheme == PrependScheme::kFirst && starts_text);
  if (prepend && !replaced.starts_with(replacement)) replaced.insert(0, replacement);
  if (!metaspace.split) return ApplyFrom(step + 1, replaced, starts_text, emit);
  PartCutter parts = cutter(replaced, false, SplitBehavior::kMergedWithNext);
  ForEachLiteral(replaced, replacement, [&](Span m) { parts.Match(m); });
  return parts.Finish();
}

}  // namespace hsx
