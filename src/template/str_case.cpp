#include "template/str_case.h"

#include <utf8proc.h>

#include "util/utf8.h"

namespace hsx::tmpl {

namespace {

template <class Map>
std::string MapEach(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  size_t index = 0;
  bool previous_cased = false;
  for (size_t i = 0; i < text.size(); i += Utf8CharLength(text[i]), ++index) {
    const char32_t c = DecodeUtf8At(text, i);
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
