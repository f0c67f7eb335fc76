// Jinja2's lexer with the settings Hugging Face renders chat templates under: trim_blocks
// and lstrip_blocks on, `-`/`+` whitespace control, newlines normalized to \n and one trailing
// newline dropped (keep_trailing_newline off). Text between tags becomes kText tokens with
// that whitespace already removed, so the parser never sees it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace hsx::tmpl {

struct Token {
  enum class Kind { kText, kVariableBegin, kVariableEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOperator, kEnd };
  Kind kind;
  std::string text;  // text, name, operator, or a string literal's decoded value
  int line = 1;
};

// The tokens of `source`; throws TemplateError naming the line on a tag left open, an
// unterminated string or a character no token starts with.
std::vector<Token> Tokenize(std::string_view source);

// Python's str.isspace for one code point.
bool IsPythonSpace(char32_t c);

}  // namespace hsx::tmpl
