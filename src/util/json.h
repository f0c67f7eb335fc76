// JSON from untrusted text (requests, checkpoints, JSONL lines) as a Result: never throws,
// and refuses nesting deeper than a bound before parsing, because nlohmann's copy, dump
// and compare recurse and a deeply nested document would overflow the stack.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "util/status.h"

namespace hsx {

// Deeper than any config, tokenizer or request hsx reads (tokenizer.json nests ~6).
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; an error names `what` (a file, request or line) and the cause.
Result<nlohmann::json> ParseJson(std::string_view text, const std::string& what, int max_depth = kMaxJsonDepth);
// The same, keeping objects' keys in document order (chat messages and tools reach templates,
// whose tojson and dict printing show that order, as Python's json.loads keeps it).
Result<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, const std::string& what,
                                                int max_depth = kMaxJsonDepth);

}  // namespace hsx
