#include "util/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace hsx {
namespace {

constexpr std::string_view kTempInfix = ".tmp.";

// The errors that mean "no space": ENOSPC (disk), EDQUOT (quota), EFBIG (file size limit).
constexpr int kOutOfSpaceErrors[] = {ENOSPC, EDQUOT, EFBIG};

std::string OsError(const std::string& path, const char* what, int err) {
  return path + ": " + what + ": " + std::strerror(err);
}

Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(OsError(path, "write failed", errno));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

bool AllDigits(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// The writer pid of a WriteFileAtomic temp name "<target>.tmp.<host>.<pid>.<n>" if its
// host is this one, else -1 (another host's, or not such a name).
long TempFileOwner(std::string_view name) {
  const size_t infix = name.rfind(kTempInfix);
  if (infix == std::string_view::npos || infix == 0) return -1;
  std::string_view rest = name.substr(infix + kTempInfix.size());
  const size_t last = rest.rfind('.');
  if (last == std::string_view::npos || last == 0 || !AllDigits(rest.substr(last + 1))) return -1;
  const size_t pid_start = rest.rfind('.', last - 1);
  if (pid_start == std::string_view::npos) return -1;
  const std::string_view host = rest.substr(0, pid_start), pid = rest.substr(pid_start + 1, last - pid_start - 1);
  if (host != TempFileHost() || !AllDigits(pid) || pid.size() > 9) return -1;
  return std::stol(std::string(pid));
}

}  // namespace

const std::string& TempFileHost() {
  static const std::string host = [] {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return std::string("unknown-host");
    std::string safe(name);
    for (char& c : safe) {
      const bool keep =
          (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
      if (!keep) c = '-';
    }
    safe.resize(std::min<size_t>(safe.size(), 64));  // a file name has 255 bytes at most
    return safe;
  }();
  return host;
}

std::string TempFileName(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + std::string(kTempInfix) + TempFileHost() + "." + std::to_string(::getpid()) + "." +
         std::to_string(counter++);
}

Status WriteFileAtomic(const std::string& path, const std::vector<std::string_view>& parts) {
  const std::string tmp = TempFileName(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Error(OsError(path, "cannot create", errno));
  Status status;
  for (std::string_view part : parts) {
    status = WriteAll(fd, part, path);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) status = Error(OsError(path, "fsync failed", errno));
  if (::close(fd) != 0 && status.ok()) status = Error(OsError(path, "close failed", errno));
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) status = Error(OsError(path, "rename failed", errno));
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

Result<int> RemoveStaleTempFiles(const std::string& dir, const std::function<bool(const std::string&)>& owned) {
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const long pid = TempFileOwner(name);
    if (pid <= 0 || !entry.is_regular_file(ec)) continue;
    if (owned && !owned(name.substr(0, name.rfind(kTempInfix)))) continue;
    // kill(pid, 0) fails with ESRCH only when no such process exists; EPERM means one does.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (std::filesystem::remove(entry.path(), ec)) ++removed;
    if (ec) return Error(entry.path().string() + ": cannot remove stale temp file: " + ec.message());
  }
  if (ec) return Error(dir + ": cannot list: " + ec.message());
  return removed;
}

Status AppendLine(const std::string& path, std::string_view line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Error(OsError(path, "cannot open for append", errno));
  struct stat before {};
  if (::fstat(fd, &before) != 0) {
    const int err = errno;
    ::close(fd);
    return Error(OsError(path, "cannot stat", err));
  }
  std::string buf(line);
  buf += '\n';
  Status status = WriteAll(fd, buf, path);
  if (status.ok() && ::fsync(fd) != 0) status = Error(OsError(path, "fsync failed", errno));
  // A partial line would glue itself to the next run's first append.
  if (!status.ok() && ::ftruncate(fd, before.st_size) != 0) {
    status = status.with_context(OsError(path, "cannot roll back a failed append", errno));
  }
  ::close(fd);
  return status;
}

bool IsOutOfSpace(const Status& status) {
  for (int err : kOutOfSpaceErrors) {
    if (status.message().find(std::strerror(err)) != std::string::npos) return true;
  }
  return false;
}

}  // namespace hsx
