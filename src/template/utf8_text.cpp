#include "template/utf8_text.h"

#include <utf8proc.h>

#include "tokenizer/utf8.h"

namespace hsx::tmpl {

char32_t DecodeAt(std::string_view text, size_t at) {
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

namespace {

template <class Map>
std::string MapEach(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  size_t index = 0;
  bool previous_cased = false;
  for (size_t i = 0; i < text.size(); i += Utf8CharLength(text[i]), ++index) {
    const char32_t c = DecodeAt(text, i);
    AppendUtf8(out, map(c, index, previous_cased));
    const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    previous_cased = category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL || category == UTF8PROC_CATEGORY_LT;
  }
  return out;
}

char32_t ToUpper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t ToLower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }

}  // namespace

std::string Upper(std::string_view text) {
  return MapEach(text, [](char32_t c, size_t, bool) { return ToUpper(c); });
}

std::string Lower(std::string_view text) {
  return MapEach(text, [](char32_t c, size_t, bool) { return ToLower(c); });
}

std::string Capitalize(std::string_view text) {
  return MapEach(text, [](char32_t c, size_t index, bool) { return index == 0 ? ToUpper(c) : ToLower(c); });
}

std::string Title(std::string_view text) {
  return MapEach(text, [](char32_t c, size_t, bool previous_cased) { return previous_cased ? ToLower(c) : ToUpper(c); });
}

}  // namespace hsx::tmpl
