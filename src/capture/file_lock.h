// vLLM's hidden-state file protocol: the writer holds an exclusive flock on
// "<file>.lock" from before the response names the file until the file is complete.
// Readers either take a shared lock (vLLM's load_hidden_states) or poll a non-blocking
// exclusive lock and then delete the lock file (speculators' wait_for_lock).
#pragma once

#include <memory>
#include <string>

#include "util/status.h"

namespace hsx {

class FileLock {
 public:
  // Creates (or opens) `path` and takes an exclusive flock on it, waiting if needed.
  static Result<std::unique_ptr<FileLock>> Acquire(const std::string& path);
  ~FileLock();  // releases the lock; the lock file stays for the reader to remove
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace hsx
