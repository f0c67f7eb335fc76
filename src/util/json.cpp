#include "util/json.h"

namespace hsx {
namespace {

// The deepest nesting of arrays and objects in `text`, counting only brackets outside
// strings; stops counting once past `limit`.
int NestingDepth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

template <class Json>
Result<Json> Parse(std::string_view text, const std::string& what, int max_depth) {
  if (NestingDepth(text, max_depth) > max_depth) {
    return Error(what + ": JSON nested deeper than " + std::to_string(max_depth) + " levels");
  }
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 3: ...".
    return Error(what + ": invalid JSON: " + e.what());
  }
}

}  // namespace

Result<nlohmann::json> ParseJson(std::string_view text, const std::string& what, int max_depth) {
  return Parse<nlohmann::json>(text, what, max_depth);
}

Result<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, const std::string& what, int max_depth) {
  return Parse<nlohmann::ordered_json>(text, what, max_depth);
}

}  // namespace hsx
