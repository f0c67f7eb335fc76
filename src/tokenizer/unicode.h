// Character properties as Hugging Face tokenizers' Rust code tests them (char::is_whitespace,
// char::is_numeric, ...), on top of utf8proc's Unicode tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hsx {

// The code point starting at byte `at` of valid UTF-8 `text`.
char32_t CharAt(std::string_view text, size_t at);
// Byte offset where the last character of non-empty valid UTF-8 `text` starts.
size_t StartOfLastChar(std::string_view text);

// Unicode White_Space: Rust's char::is_whitespace, regex \s.
bool IsWhitespace(char32_t c);
// General category N (Nd, Nl, No): Rust's char::is_numeric.
bool IsNumeric(char32_t c);
// ASCII punctuation (which counts $+<=>^`|~) or general category P: HF's is_punc.
bool IsPunctuation(char32_t c);
// The Rust regex crate's \w, which HF's single_word tests: letters, marks, decimal and letter
// numbers, connector punctuation, joiners.
bool IsWordCharacter(char32_t c);
// General category M: what HF's StripAccents removes.
bool IsMark(char32_t c);

// Rust's str::to_lowercase applied one character at a time, as HF's Lowercase normalizer does
// (no final-sigma rule).
std::string Lowercase(std::string_view text);

}  // namespace hsx
