#include "template/lexer.h"

#include <algorithm>
#include <cstdint>

#include "template/value.h"
#include "util/utf8.h"

namespace hsx::tmpl {

bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

// \r\n and \r become \n; one final \n goes (Jinja's lexer does both before anything else).
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int CountNewlines(std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// A string literal's body decoded as Jinja does (Python's unicode-escape): known escapes
// become their characters, unknown ones stay as written.
std::string DecodeStringLiteral(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    auto hex = [&](size_t digits) {
      if (i + digits >= body.size()) throw TemplateError("truncated \\x, \\u or \\U escape in a string", line);
      uint32_t v = 0;
      for (size_t k = 1; k <= digits; ++k) {
        const char c = body[i + k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
        else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
        else throw TemplateError("bad \\x, \\u or \\U escape in a string", line);
      }
      i += digits;
      if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) throw TemplateError("escape names no Unicode character", line);
      AppendUtf8(out, static_cast<char32_t>(v));
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'a': out += '\a'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;  // a line continuation
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            v = v * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          AppendUtf8(out, static_cast<char32_t>(v));
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  std::vector<Token> Run() {
    bool line_starting = true;  // the text so far ends a line (lstrip_blocks needs it)
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t open = FindTagOpen(pos);
      std::string text = src_.substr(pos, open - pos);
      if (open == src_.size()) {
        Emit(Token::Kind::kText, text);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      size_t after = open + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      if (sign == '-') {
        text = RightStripped(text);
      } else if (sign != '+' && kind != '{') {
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((line_start > 0 || line_starting) && line_start < text.size() && AllSpace(text, line_start)) {
          text.resize(line_start);
        }
      }
      Emit(Token::Kind::kText, text);
      line_ += CountNewlines(src_.substr(pos, open - pos));
      pos = after;
      size_t end = 0;
      if (kind == '#') {
        end = LexComment(pos);
      } else {
        const int open_line = line_;
        Emit(kind == '{' ? Token::Kind::kVariableBegin : Token::Kind::kBlockBegin, "");
        end = LexExpression(pos, kind == '{' ? '}' : '%', open_line);
      }
      line_starting = end > 0 && src_[end - 1] == '\n';
      pos = end;
    }
    tokens_.push_back({Token::Kind::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t FindTagOpen(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  static bool AllSpace(const std::string& text, size_t from) {
    for (size_t i = from; i < text.size(); i += Utf8CharLength(text[i])) {
      if (!IsPythonSpace(DecodeUtf8At(text, i))) return false;
    }
    return true;
  }

  static std::string RightStripped(const std::string& text) {
    size_t end = text.size();
    while (end > 0) {
      size_t start = end - 1;
      while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      if (!IsPythonSpace(DecodeUtf8At(text, start))) break;
      end = start;
    }
    return text.substr(0, end);
  }

  // Past the closing tag and whatever whitespace control removes after it.
  size_t AfterClose(size_t close_end, char sign, bool trims) {
    size_t pos = close_end;
    if (sign == '-') {
      while (pos < src_.size() && IsPythonSpace(DecodeUtf8At(src_, pos))) {
        if (src_[pos] == '\n') ++line_;
        pos += Utf8CharLength(src_[pos]);
      }
    } else if (sign != '+' && trims && pos < src_.size() && src_[pos] == '\n') {
      ++line_;
      ++pos;
    }
    return pos;
  }

  size_t LexComment(size_t pos) {
    const int open_line = line_;
    const size_t close = src_.find("#}", pos);
    if (close == std::string::npos) throw TemplateError("comment opened here is never closed ('#}')", open_line);
    line_ += CountNewlines(src_.substr(pos, close - pos));
    const char sign = close > pos && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
    return AfterClose(close + 2, sign, true);
  }

  // Tokens of a {{ }} or {% %} body up to its closing tag; returns the position after it.
  size_t LexExpression(size_t pos, char closer, int open_line) {
    while (true) {
      while (pos < src_.size() && IsPythonSpace(DecodeUtf8At(src_, pos))) {
        if (src_[pos] == '\n') ++line_;
        pos += Utf8CharLength(src_[pos]);
      }
      if (pos >= src_.size()) {
        throw TemplateError(std::string("tag opened here is never closed ('") + closer + "}')", open_line);
      }
      for (char sign : {'-', '+', '\0'}) {
        const size_t at = pos + (sign ? 1 : 0);
        if (sign && (src_[pos] != sign)) continue;
        if (sign == '+' && closer == '}') continue;
        if (at + 1 < src_.size() && src_[at] == closer && src_[at + 1] == '}') {
          Emit(closer == '}' ? Token::Kind::kVariableEnd : Token::Kind::kBlockEnd, "");
          return AfterClose(at + 2, sign, closer == '%');
        }
      }
      pos = LexToken(pos);
    }
  }

  size_t LexToken(size_t pos) {
    const char c = src_[pos];
    auto is_digit = [](char ch) { return ch >= '0' && ch <= '9'; };
    auto is_name = [&](char ch) { return ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || is_digit(ch); };
    if (is_name(c) && !is_digit(c)) {
      size_t end = pos;
      while (end < src_.size() && is_name(src_[end])) ++end;
      Emit(Token::Kind::kName, src_.substr(pos, end - pos));
      return end;
    }
    if (is_digit(c)) {
      size_t end = pos;
      auto digits = [&] {
        while (end < src_.size() && (is_digit(src_[end]) || (src_[end] == '_' && end + 1 < src_.size() && is_digit(src_[end + 1])))) ++end;
      };
      digits();
      bool is_float = false;
      // `x.0` after a dot is an attribute: no float there (Jinja's (?<!\.) look-behind).
      const bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::kOperator && tokens_.back().text == ".";
      if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
        ++end;
        digits();
        is_float = true;
      }
      if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
        size_t e = end + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < src_.size() && is_digit(src_[e])) {
          end = e;
          digits();
          is_float = true;
        }
      }
      std::string number;
      for (size_t i = pos; i < end; ++i) {
        if (src_[i] != '_') number += src_[i];
      }
      Emit(is_float ? Token::Kind::kFloat : Token::Kind::kInt, number);
      return end;
    }
    if (c == '\'' || c == '"') {
      size_t end = pos + 1;
      while (end < src_.size() && src_[end] != c) end += src_[end] == '\\' ? 2 : 1;
      if (end >= src_.size()) throw TemplateError("string literal is never closed", line_);
      const std::string body = src_.substr(pos + 1, end - pos - 1);
      Emit(Token::Kind::kString, DecodeStringLiteral(body, line_));
      line_ += CountNewlines(body);
      return end + 1;
    }
    static const char* kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                       "=", ".", ":", "|", ",", "(", ")", "[", "]", "{", "}", ";"};
    for (const char* op : kOperators) {
      if (src_.compare(pos, std::char_traits<char>::length(op), op) == 0) {
        Emit(Token::Kind::kOperator, op);
        return pos + std::char_traits<char>::length(op);
      }
    }
    throw TemplateError("unexpected character '" + src_.substr(pos, Utf8CharLength(c)) + "' in a tag", line_);
  }

  void Emit(Token::Kind kind, std::string text) {
    if (kind == Token::Kind::kText && text.empty()) return;
    tokens_.push_back({kind, std::move(text), line_});
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source) {
  if (FindInvalidUtf8(source) != std::string_view::npos) throw TemplateError("template is not valid UTF-8");
  return Lexer(NormalizeNewlines(source)).Run();
}

}  // namespace hsx::tmpl
