// The safetensors format: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and [begin, end) byte range, then the raw data.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace hsx {

// A memory-mapped safetensors file whose header has been fully validated: known dtypes,
// sizes that match the shapes (overflow-checked), tensors that tile the data section exactly
// as the reference reader requires. Data may be unaligned: read it with memcpy.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor or an error naming this file and the missing name.
  Result<Tensor> Get(const std::string& name) const;

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

using NamedTensor = std::pair<std::string, Tensor>;

// Serializes host tensors in the given order (8-byte aligned header, as the reference
// writer pads it) into one buffer-free list of parts and writes it atomically.
Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace hsx
