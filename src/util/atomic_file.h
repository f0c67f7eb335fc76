// Files that appear whole or not at all: write a temp file beside the target, fsync,
// then rename over it. A crash or error leaves no partial file under the final name.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace hsx {

// Writes the concatenation of `parts` to `path` atomically.
Status WriteFileAtomic(const std::string& path, const std::vector<std::string_view>& parts);

// Appends one line (a '\n' is added) with a single write(2) on an O_APPEND file and
// fsyncs it, so concurrent appenders never interleave within a line.
Status AppendLine(const std::string& path, std::string_view line);

}  // namespace hsx
