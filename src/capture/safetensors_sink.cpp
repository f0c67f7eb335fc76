#include "capture/safetensors_sink.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "capture/file_lock.h"
#include "util/atomic_file.h"

namespace hsx {
namespace {

// Writes to a temp file named as WriteFileAtomic's are (so a dead writer's leftover is
// removed as stale), then link(2)s it into place: unlike rename(2), link fails with EEXIST
// rather than replace a file another writer made after the name was checked.
Status WriteNewSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  const std::string tmp = TempFileName(path);
  HSX_RETURN_IF_ERROR(WriteSafetensors(tmp, tensors, metadata));
  const int linked = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (linked != 0) return Error(path + ": " + (err == EEXIST ? "another writer created this file first" : std::strerror(err)));
  return {};
}

}  // namespace

Result<CaptureReceipt> SafetensorsSink::Put(const CaptureRecord& record) {
  const std::string context = "request '" + record.id + "'";
  if (record.name.empty()) HSX_RETURN_IF_ERROR(ValidateRequestId(record.id));
  const std::string path = options_.dir + "/" + (record.name.empty() ? record.id + ".safetensors" : record.name);
  std::unique_ptr<FileLock> lock;
  if (options_.lock) {
    auto acquired = FileLock::Acquire(path + ".lock");
    if (!acquired.ok()) return acquired.status().with_context(context);
    lock = std::move(acquired).value();
  }
  const std::vector<NamedTensor> tensors = HiddenStatesFileTensors(record, options_.format);
  Status written = options_.exclusive ? WriteNewSafetensors(path, tensors, record.metadata)
                                      : WriteSafetensors(path, tensors, record.metadata);
  if (!written.ok()) return written.with_context(context);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  return CaptureReceipt{path, {{"hidden_states_path", path}}, ec ? 0 : size};  // the lock goes: readers may go ahead
}

std::string SafetensorsSink::Describe() const {
  return std::string(options_.format == StatesFormat::kFp8 ? "FP8 " : "") + "safetensors files in " + options_.dir;
}

}  // namespace hsx
