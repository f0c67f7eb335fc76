// A small text file (config.json, an index, generation_config.json) read whole, with a size
// bound so a mistaken path to a multi-GB file fails fast instead of filling memory.
#pragma once

#include <cstddef>
#include <string>

#include "util/status.h"

namespace hsx {

inline constexpr size_t kMaxTextFileBytes = 64u << 20;

// The file's bytes, or an error naming the path and the cause.
Result<std::string> ReadTextFile(const std::string& path, size_t max_bytes = kMaxTextFileBytes);

}  // namespace hsx
