#include "util/utf8.h"

#include <utf8proc.h>

namespace hsx {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

struct CharCheck {
  size_t length;  // bytes consumed: the whole character, or its longest valid-looking start
  bool valid;
};

// Unicode's "maximal subpart" rule: the bytes at `at` that could begin a well-formed character.
CharCheck CheckChar(std::string_view bytes, size_t at) {
  auto lead = static_cast<unsigned char>(bytes[at]);
  if (lead < 0x80) return {1, true};
  // Continuation bytes needed after `lead`, and the range the first of them must fall in to
  // rule out overlong forms, surrogates and code points past U+10FFFF.
  size_t needed = 0;
  unsigned char low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    needed = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    needed = 2;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    needed = 3;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {1, false};
  }
  size_t length = 1;
  while (length <= needed && at + length < bytes.size()) {
    auto byte = static_cast<unsigned char>(bytes[at + length]);
    if (byte < (length == 1 ? low : 0x80) || byte > (length == 1 ? high : 0xBF)) break;
    ++length;
  }
  return {length, length == needed + 1};
}

}  // namespace

size_t FindInvalidUtf8(std::string_view bytes) {
  for (size_t at = 0; at < bytes.size();) {
    if (static_cast<unsigned char>(bytes[at]) < 0x80) {
      ++at;
      continue;
    }
    CharCheck check = CheckChar(bytes, at);
    if (!check.valid) return at;
    at += check.length;
  }
  return std::string_view::npos;
}

std::string FromUtf8Lossy(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size());
  for (size_t at = 0; at < bytes.size();) {
    CharCheck check = CheckChar(bytes, at);
    if (check.valid) {
      text.append(bytes.substr(at, check.length));
    } else {
      text += kReplacementCharacter;
    }
    at += check.length;
  }
  return text;
}

char32_t DecodeUtf8At(std::string_view text, size_t at) {
  utf8proc_int32_t c = 0;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                   static_cast<utf8proc_ssize_t>(text.size() - at), &c);
  return c < 0 ? U'\uFFFD' : static_cast<char32_t>(c);
}

void AppendUtf8(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::vector<size_t> CodePointOffsets(std::string_view text) {
  std::vector<size_t> offsets;
  for (size_t i = 0; i < text.size(); i += Utf8CharLength(text[i])) offsets.push_back(i);
  offsets.push_back(text.size());
  return offsets;
}

size_t CodePointCount(std::string_view text) {
  size_t n = 0;
  for (size_t i = 0; i < text.size(); i += Utf8CharLength(text[i])) ++n;
  return n;
}

}  // namespace hsx
