// Jinja2's grammar, the subset chat templates use: {{ }}, if/elif/else, for (with else and a
// filter condition), set (names, tuples, namespace attributes, blocks), macro, break and
// continue, and HF's {% generation %}; expressions with Jinja's precedence, filters, tests,
// calls, subscripts and slices. Anything else fails naming its line.
#pragma once

#include <string_view>

#include "template/ast.h"

namespace hsx::tmpl {

// Nesting deeper than this (blocks inside blocks, parentheses, unary chains) is refused, so
// the recursive parser and renderer never exhaust the stack.
inline constexpr int kMaxParseDepth = 128;

// Throws TemplateError naming the line.
Body Parse(std::string_view source);

}  // namespace hsx::tmpl
