// Python's str works in code points; templates index, slice, measure and case-map strings
// that way, so these helpers do the same over valid UTF-8.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace hsx::tmpl {

// The code point at byte `at` of valid UTF-8.
char32_t DecodeAt(std::string_view text, size_t at);
void AppendUtf8(std::string& out, char32_t c);
// Byte offsets where each code point starts, plus text.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view text);
size_t CodePointCount(std::string_view text);
// str.upper(), str.lower() one code point at a time (utf8proc's simple case mappings).
std::string Upper(std::string_view text);
std::string Lower(std::string_view text);
// str.capitalize() and str.title().
std::string Capitalize(std::string_view text);
std::string Title(std::string_view text);

}  // namespace hsx::tmpl
