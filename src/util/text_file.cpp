#include "util/text_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace hsx {

Result<std::string> ReadTextFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Error(path + ": cannot open (" + std::strerror(errno) + ")");
  const std::streamoff size = in.tellg();
  if (size < 0) return Error(path + ": cannot read (not a regular file?)");
  if (static_cast<uint64_t>(size) > max_bytes) {
    return Error(path + ": " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) +
                 " a text file hsx reads may hold");
  }
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size)) return Error(path + ": read failed");
  return text;
}

}  // namespace hsx
