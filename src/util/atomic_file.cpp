#include "util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace hsx {
namespace {

Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(path + ": write failed: " + std::strerror(errno));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

}  // namespace

Status WriteFileAtomic(const std::string& path, const std::vector<std::string_view>& parts) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Error(path + ": cannot create: " + std::strerror(errno));
  Status status;
  for (std::string_view part : parts) {
    status = WriteAll(fd, part, path);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) status = Error(path + ": fsync failed: " + std::strerror(errno));
  if (::close(fd) != 0 && status.ok()) status = Error(path + ": close failed: " + std::strerror(errno));
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = Error(path + ": rename failed: " + std::strerror(errno));
  }
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

Status AppendLine(const std::string& path, std::string_view line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Error(path + ": cannot open for append: " + std::strerror(errno));
  std::string buf(line);
  buf += '\n';
  Status status = WriteAll(fd, buf, path);
  if (status.ok() && ::fsync(fd) != 0) status = Error(path + ": fsync failed: " + std::strerror(errno));
  ::close(fd);
  return status;
}

}  // namespace hsx
