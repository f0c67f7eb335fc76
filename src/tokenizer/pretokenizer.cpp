#include "tokenizer/pretokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

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

std::string ReplaceSpans(const std::string& text, const std::vector<Span>& spans,
                         const std::string& content) {
  std::string replaced;
  replaced.reserve(text.size());
  size_t copied = 0;
  for (const Span& span : spans) {
    replaced.append(text, copied, span.begin - copied);
    replaced += content;
    copied = span.end;
  }
  replaced.append(text, copied, std::string::npos);
  return replaced;
}

std::vector<Span> FindLiteral(std::string_view text, std::string_view literal) {
  std::vector<Span> spans;
  for (size_t at = text.find(literal); at != std::string_view::npos;
       at = text.find(literal, at + literal.size())) {
    spans.push_back({at, at + literal.size()});
  }
  return spans;
}

// The kept parts of `size` bytes cut at `matches`, like HF's NormalizedString::split: gaps and
// matches alternate, `behavior` decides what becomes of the matches, empty parts are dropped.
std::vector<Span> CutAtMatches(size_t size, const std::vector<Span>& matches, bool invert,
                               SplitBehavior behavior) {
  struct Part {
    Span span;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t previous_end = 0;
  for (const Span& match : matches) {
    if (previous_end != match.begin) parts.push_back({{previous_end, match.begin}, invert});
    parts.push_back({match, !invert});
    previous_end = match.end;
  }
  if (previous_end != size) parts.push_back({{previous_end, size}, invert});

  std::vector<Span> kept;
  kept.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& part : parts) kept.push_back(part.span);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& part : parts) {
        if (!part.is_match) kept.push_back(part.span);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Part& part : parts) {
        if (part.is_match == previous_match && !kept.empty()) {
          kept.back().end = part.span.end;
        } else {
          kept.push_back(part.span);
        }
        previous_match = part.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& part : parts) {
        if (part.is_match && !previous_match && !kept.empty()) {
          kept.back().end = part.span.end;
        } else {
          kept.push_back(part.span);
        }
        previous_match = part.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto part = parts.rbegin(); part != parts.rend(); ++part) {
        if (part->is_match && !previous_match && !kept.empty()) {
          kept.back().begin = part->span.begin;
        } else {
          kept.push_back(part->span);
        }
        previous_match = part->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  std::erase_if(kept, [](const Span& span) { return span.begin == span.end; });
  return kept;
}

void EmitParts(const Piece& piece, const std::vector<Span>& spans, std::vector<Piece>* out) {
  for (const Span& span : spans) {
    out->push_back({piece.text.substr(span.begin, span.end - span.begin),
                    piece.starts_text && span.begin == 0});
  }
}

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

Result<std::vector<Span>> Regex::FindAll(std::string_view text) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match_data(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
  if (match_data == nullptr) return Error("regex: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::vector<Span> matches;
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
    Span match{ovector[0], ovector[1]};
    if (match.begin == match.end && previous_end == match.end) {
      if (search_from == text.size()) break;
      search_from += Utf8CharLength(text[search_from]);
      continue;
    }
    matches.push_back(match);
    search_from = match.end;
    previous_end = match.end;
  }
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
      HSX_ASSIGN_OR_RETURN(std::vector<Span> matches, replace->pattern.FindAll(text));
      if (!matches.empty()) text = ReplaceSpans(text, matches, replace->content);
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

Status PreTokenizer::ApplyStep(const Step& step, Piece piece, std::vector<Piece>* out) {
  if (const auto* char_split = std::get_if<CharSplit>(&step)) {
    std::vector<Span> matches;
    for (size_t at = 0; at < piece.text.size();) {
      const char32_t c = CharAt(piece.text, at);
      const size_t length = Utf8CharLength(piece.text[at]);
      bool match = false;
      switch (char_split->char_class) {
        case CharClass::kWhitespace: match = IsWhitespace(c); break;
        case CharClass::kPunctuation: match = IsPunctuation(c); break;
        case CharClass::kNumeric: match = IsNumeric(c); break;
        case CharClass::kDelimiter: match = c == char_split->delimiter; break;
      }
      if (match) matches.push_back({at, at + length});
      at += length;
    }
    EmitParts(piece, CutAtMatches(piece.text.size(), matches, false, char_split->behavior), out);
  } else if (const auto* split = std::get_if<Split>(&step)) {
    HSX_ASSIGN_OR_RETURN(std::vector<Span> matches, split->pattern.FindAll(piece.text));
    EmitParts(piece, CutAtMatches(piece.text.size(), matches, split->invert, split->behavior), out);
  } else if (const auto* byte_level = std::get_if<ByteLevel>(&step)) {
    if (byte_level->add_prefix_space && piece.text.front() != ' ') piece.text.insert(0, 1, ' ');
    std::vector<Span> parts = {{0, piece.text.size()}};
    if (byte_level->gpt2_pattern) {
      HSX_ASSIGN_OR_RETURN(std::vector<Span> matches,
                           byte_level->gpt2_pattern->FindAll(piece.text));
      parts = CutAtMatches(piece.text.size(), matches, false, SplitBehavior::kIsolated);
    }
    for (const Span& part : parts) {
      out->push_back({MapBytesToAlphabet(
                          std::string_view(piece.text).substr(part.begin, part.end - part.begin)),
                      piece.starts_text && part.begin == 0});
    }
  } else if (const auto* metaspace = std::get_if<Metaspace>(&step)) {
    const std::string& replacement = metaspace->replacement;
    std::string text = ReplaceSpans(piece.text, FindLiteral(piece.text, " "), replacement);
    bool prepend = metaspace->prepend_scheme == PrependScheme::kAlways ||
                   (metaspace->prepend_scheme == PrependScheme::kFirst && piece.starts_text);
    if (prepend && !text.starts_with(replacement)) text.insert(0, replacement);
    Piece replaced{std::move(text), piece.starts_text};
    if (!metaspace->split) {
      out->push_back(std::move(replaced));
    } else {
      std::vector<Span> matches = FindLiteral(replaced.text, replacement);
      EmitParts(replaced,
                CutAtMatches(replaced.text.size(), matches, false, SplitBehavior::kMergedWithNext),
                out);
    }
  }
  return Status();
}

Result<std::vector<Piece>> PreTokenizer::Apply(std::string text, bool starts_text) const {
  std::vector<Piece> pieces;
  pieces.push_back({std::move(text), starts_text});
  for (const Step& step : steps_) {
    std::vector<Piece> next;
    next.reserve(pieces.size());
    for (Piece& piece : pieces) HSX_RETURN_IF_ERROR(ApplyStep(step, std::move(piece), &next));
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace hsx
