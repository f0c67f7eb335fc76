// Python's str.upper(), lower(), capitalize() and title(), one code point at a time over
// valid UTF-8 (utf8proc's simple case mappings), as templates call them.
#pragma once

#include <string>
#include <string_view>

namespace hsx::tmpl {

std::string Upper(std::string_view text);
std::string Lower(std::string_view text);
std::string Capitalize(std::string_view text);
std::string Title(std::string_view text);

}  // namespace hsx::tmpl
