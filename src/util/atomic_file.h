// Files that appear whole or not at all: write a temp file beside the target, fsync,
// then rename over it. A crash or error leaves no partial file under the final name.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace hsx {

// Writes the concatenation of `parts` to `path` atomically, through the temp file
// "<path>.tmp.<host>.<pid>.<n>" (the writer's host and pid, so a later run on the same
// host can tell a dead writer's leftover from a live one's file in progress, even in a
// directory that other hosts share).
Status WriteFileAtomic(const std::string& path, const std::vector<std::string_view>& parts);

// A fresh temp file name beside `path`, "<path>.tmp.<host>.<pid>.<n>", as WriteFileAtomic
// uses; a writer that places its file some other way names its temp file with it too, so
// RemoveStaleTempFiles knows a dead writer's leftover.
std::string TempFileName(const std::string& path);

// This host's name as temp file names carry it: gethostname with every character but
// letters, digits, '_' and '-' made '-' (a '.' would split the name's fields).
const std::string& TempFileHost();

// Removes the temp files in `dir` (not below it) that WriteFileAtomic left when its
// process died between write and rename: only names of that exact pattern written on
// this host whose pid is no live process here (other hosts' pids mean nothing here),
// and, given `owned`, whose target file name it accepts. Returns how many it removed.
Result<int> RemoveStaleTempFiles(const std::string& dir, const std::function<bool(const std::string&)>& owned = {});

// Appends one line (a '\n' is added) with a single write(2) on an O_APPEND file and
// fsyncs it, so concurrent appenders never interleave within a line. A failed append
// (a full disk) truncates the file back to its length before, so it leaves no partial
// line; callers in one process serialize their appends for that rollback to be safe.
Status AppendLine(const std::string& path, std::string_view line);

// Whether a write error from this file's functions means the disk (or the quota, or the
// file size limit) is full: later writes will fail too until space is freed.
bool IsOutOfSpace(const Status& status);

}  // namespace hsx
