// UTF-8 structure: lengths, validity, code points in and out (character properties come
// from utf8proc).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace hsx {

// Byte length of the character that starts with `lead`, in text known to be valid UTF-8.
inline size_t Utf8CharLength(char lead) {
  auto byte = static_cast<unsigned char>(lead);
  if (byte < 0x80) return 1;
  if ((byte >> 5) == 0x6) return 2;
  if ((byte >> 4) == 0xE) return 3;
  return 4;
}

// Offset of the first byte that is not part of a well-formed character, or npos.
size_t FindInvalidUtf8(std::string_view bytes);

// Rust's String::from_utf8_lossy, which HF applies to decoded bytes: each maximal invalid
// subsequence (a stray byte, or a character cut short) becomes one U+FFFD.
std::string FromUtf8Lossy(std::string_view bytes);

// The code point at byte `at` of valid UTF-8 (U+FFFD where it is not).
char32_t DecodeUtf8At(std::string_view text, size_t at);
void AppendUtf8(std::string& out, char32_t c);
// Byte offsets where each code point starts, plus text.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view text);
size_t CodePointCount(std::string_view text);

}  // namespace hsx
