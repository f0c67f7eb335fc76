#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include "util/utf8.h"

namespace hsx {

char32_t CharAt(std::string_view text, size_t at) {
  utf8proc_int32_t c = 0;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                   static_cast<utf8proc_ssize_t>(text.size() - at), &c);
  return static_cast<char32_t>(c);
}

size_t StartOfLastChar(std::string_view text) {
  size_t at = text.size() - 1;
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
  return at;
}

namespace {
utf8proc_category_t Category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}
}  // namespace

bool IsWhitespace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || c == 0x85) return true;
  utf8proc_category_t category = Category(c);
  return category == UTF8PROC_CATEGORY_ZS || category == UTF8PROC_CATEGORY_ZL ||
         category == UTF8PROC_CATEGORY_ZP;
}

bool IsNumeric(char32_t c) {
  utf8proc_category_t category = Category(c);
  return category == UTF8PROC_CATEGORY_ND || category == UTF8PROC_CATEGORY_NL ||
         category == UTF8PROC_CATEGORY_NO;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80) return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') ||
                       (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

bool IsMark(char32_t c) {
  utf8proc_category_t category = Category(c);
  return category == UTF8PROC_CATEGORY_MN || category == UTF8PROC_CATEGORY_MC ||
         category == UTF8PROC_CATEGORY_ME;
}

bool IsWordCharacter(char32_t c) {
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return c == 0x200C || c == 0x200D;
  }
}

std::string Lowercase(std::string_view text) {
  std::string lowered;
  lowered.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    char32_t c = CharAt(text, at);
    at += Utf8CharLength(text[at]);
    // The one unconditional multi-character lowercase mapping (SpecialCasing.txt).
    if (c == 0x130) {
      lowered += "i\xCC\x87";
      continue;
    }
    utf8proc_uint8_t buffer[4];
    utf8proc_ssize_t length =
        utf8proc_encode_char(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)), buffer);
    lowered.append(reinterpret_cast<const char*>(buffer), static_cast<size_t>(length));
  }
  return lowered;
}

}  // namespace hsx
