#include "tokenizer/decoder.h"

#include <utf8proc.h>

#include <charconv>

#include "tokenizer/json_fields.h"
#include "tokenizer/pretokenizer.h"
#include "util/utf8.h"

namespace hsx {
namespace {

using nlohmann::json;

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

std::string Join(const std::vector<std::string>& tokens, std::string_view separator) {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) text += separator;
    text += tokens[i];
  }
  return text;
}

std::string ReplaceAll(const std::string& text, const std::string& pattern,
                       const std::string& content) {
  std::string replaced;
  size_t copied = 0;
  for (size_t at = text.find(pattern); at != std::string::npos;
       at = text.find(pattern, at + pattern.size())) {
    replaced.append(text, copied, at - copied);
    replaced += content;
    copied = at + pattern.size();
  }
  replaced.append(text, copied, std::string::npos);
  return replaced;
}

// Bytes of a byte-level token, or the token's own UTF-8 when a character is outside the
// byte-level alphabet (as added tokens like "<|im_start|>" may be).
std::string ByteLevelBytes(const std::string& token) {
  std::string bytes;
  const auto* data = reinterpret_cast<const utf8proc_uint8_t*>(token.data());
  utf8proc_ssize_t at = 0, size = static_cast<utf8proc_ssize_t>(token.size());
  while (at < size) {
    utf8proc_int32_t c = 0;
    utf8proc_ssize_t length = utf8proc_iterate(data + at, size - at, &c);
    std::optional<uint8_t> byte =
        length > 0 ? ByteLevelByteOfChar(static_cast<char32_t>(c)) : std::nullopt;
    if (!byte) return token;
    bytes += static_cast<char>(*byte);
    at += length;
  }
  return bytes;
}

// "<0x41>" -> 0x41.
std::optional<uint8_t> ByteFallbackValue(const std::string& token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  unsigned value = 0;
  auto [end, error] = std::from_chars(token.data() + 3, token.data() + 5, value, 16);
  if (error != std::errc() || end != token.data() + 5) return std::nullopt;
  return static_cast<uint8_t>(value);
}

// HF's ByteFallback: a run of byte tokens becomes its text when valid UTF-8, else one U+FFFD
// per byte.
std::vector<std::string> FuseByteTokens(std::vector<std::string> tokens) {
  std::vector<std::string> fused;
  std::string pending_bytes;
  auto flush = [&] {
    if (pending_bytes.empty()) return;
    if (FindInvalidUtf8(pending_bytes) == std::string::npos) {
      fused.push_back(pending_bytes);
    } else {
      for (size_t i = 0; i < pending_bytes.size(); ++i) fused.emplace_back(kReplacementCharacter);
    }
    pending_bytes.clear();
  };
  for (std::string& token : tokens) {
    if (std::optional<uint8_t> byte = ByteFallbackValue(token)) {
      pending_bytes += static_cast<char>(*byte);
    } else {
      flush();
      fused.push_back(std::move(token));
    }
  }
  flush();
  return fused;
}

// Drops up to `start` leading and `stop` trailing copies of `content`.
std::string StripToken(const std::string& token, const std::string& content, size_t start,
                       size_t stop) {
  auto content_at = [&](size_t at) { return token.compare(at, content.size(), content) == 0; };
  size_t begin = 0, end = token.size();
  for (size_t i = 0; i < start && begin + content.size() <= end && content_at(begin); ++i) {
    begin += content.size();
  }
  for (size_t i = 0; i < stop && begin + content.size() <= end && content_at(end - content.size());
       ++i) {
    end -= content.size();
  }
  return token.substr(begin, end - begin);
}

}  // namespace

Result<TokenDecoder> TokenDecoder::FromJson(const json& config, const std::string& where) {
  TokenDecoder decoder;
  if (!config.is_null()) {
    decoder.configured_ = true;
    HSX_RETURN_IF_ERROR(AddSteps(config, where, &decoder.steps_));
  }
  return decoder;
}

Status TokenDecoder::AddSteps(const json& config, const std::string& where,
                              std::vector<Step>* steps) {
  HSX_ASSIGN_OR_RETURN(std::string type, json_fields::String(config, "type", where));
  if (type == "Sequence") {
    HSX_ASSIGN_OR_RETURN(const json* list, json_fields::Required(config, "decoders", where));
    if (!list->is_array()) return Error(where + ".decoders: expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      HSX_RETURN_IF_ERROR(
          AddSteps((*list)[i], where + ".decoders[" + std::to_string(i) + "]", steps));
    }
  } else if (type == "ByteLevel") {
    steps->push_back(ByteLevel{});
  } else if (type == "Replace") {
    HSX_ASSIGN_OR_RETURN(const json* pattern, json_fields::Required(config, "pattern", where));
    HSX_ASSIGN_OR_RETURN(std::string literal,
                         json_fields::String(*pattern, "String", where + ".pattern"));
    if (literal.empty()) return Error(where + ".pattern.String: must not be empty");
    HSX_ASSIGN_OR_RETURN(std::string content, json_fields::String(config, "content", where));
    steps->push_back(Replace{std::move(literal), std::move(content)});
  } else if (type == "ByteFallback") {
    steps->push_back(ByteFallback{});
  } else if (type == "Fuse") {
    steps->push_back(Fuse{});
  } else if (type == "Strip") {
    HSX_ASSIGN_OR_RETURN(std::string content, json_fields::String(config, "content", where));
    HSX_ASSIGN_OR_RETURN(int64_t start, json_fields::Integer(config, "start", where));
    HSX_ASSIGN_OR_RETURN(int64_t stop, json_fields::Integer(config, "stop", where));
    if (content.empty() || start < 0 || stop < 0) {
      return Error(where + ": expected a non-empty content and non-negative start and stop");
    }
    steps->push_back(
        Strip{std::move(content), static_cast<size_t>(start), static_cast<size_t>(stop)});
  } else if (type == "Metaspace") {
    HSX_ASSIGN_OR_RETURN(std::string replacement,
                         json_fields::String(config, "replacement", where));
    HSX_ASSIGN_OR_RETURN(std::optional<std::string> scheme,
                         json_fields::OptionalString(config, "prepend_scheme", where));
    HSX_ASSIGN_OR_RETURN(bool add_prefix_space,
                         json_fields::Bool(config, "add_prefix_space", where, true));
    steps->push_back(Metaspace{std::move(replacement), add_prefix_space && scheme != "never"});
  } else {
    return Error(where + ".type '" + type +
                 "' is not supported; expected ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                 "Metaspace or Sequence");
  }
  return Status();
}

std::string TokenDecoder::Decode(std::vector<std::string> tokens) const {
  if (!configured_) return Join(tokens, " ");
  for (const Step& step : steps_) {
    if (std::holds_alternative<ByteLevel>(step)) {
      std::string bytes;
      for (const std::string& token : tokens) bytes += ByteLevelBytes(token);
      tokens = {FromUtf8Lossy(bytes)};
    } else if (const auto* replace = std::get_if<Replace>(&step)) {
      for (std::string& token : tokens)
        token = ReplaceAll(token, replace->pattern, replace->content);
    } else if (std::holds_alternative<ByteFallback>(step)) {
      tokens = FuseByteTokens(std::move(tokens));
    } else if (std::holds_alternative<Fuse>(step)) {
      tokens = {Join(tokens, "")};
    } else if (const auto* strip = std::get_if<Strip>(&step)) {
      for (std::string& token : tokens) {
        token = StripToken(token, strip->content, strip->start, strip->stop);
      }
    } else if (const auto* metaspace = std::get_if<Metaspace>(&step)) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        bool drop = i == 0 && metaspace->drop_from_first_token;
        tokens[i] = ReplaceAll(tokens[i], metaspace->replacement, drop ? "" : " ");
      }
    }
  }
  return Join(tokens, "");
}

}  // namespace hsx
