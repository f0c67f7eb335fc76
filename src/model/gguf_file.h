// llama.cpp's GGUF container (versions 2 and 3): a header, typed metadata key/values
// (arrays included), tensor infos, and the tensor data at aligned offsets after them.
// Parsing trusts nothing in the file: every count, size and offset is checked against the
// file's size and for overflow before it is used.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "util/mapped_file.h"
#include "util/status.h"

namespace hsx {

// Metadata value types, numbered as the format numbers them.
enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Tensor element types hsx reads, numbered as ggml numbers them.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30,
};

// ggml's name of a type ("Q4_K"); types hsx does not read are named by number.
std::string GgmlTypeName(uint32_t type);
// Elements per block and bytes per block; nullopt for a type hsx does not read.
struct GgmlBlock {
  int64_t elements;
  int64_t bytes;
};
std::optional<GgmlBlock> GgmlBlockOf(uint32_t type);

// One metadata value. Integers keep their sign in `i` or `u` (whichever the type has),
// floats in `f`; arrays hold their elements, all of `element_type`.
struct GgufValue {
  GgufType type = GgufType::kU8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  GgufType element_type = GgufType::kU8;
  std::vector<GgufValue> array;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml's order: dims[0] varies fastest (the reverse of a row-major shape)
  GgmlType type;
  const char* data;           // inside the mapped file
  uint64_t nbytes;
};

class GgufFile {
 public:
  static constexpr int kMaxArrayNesting = 4;
  static constexpr int kMaxDims = 4;  // GGML_MAX_DIMS

  static Result<GgufFile> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(const std::string& name) const;
  // The mapping that tensor data points into (tensors keep it alive).
  const std::shared_ptr<MappedFile>& mapping() const { return file_; }

  // Typed metadata reads; errors name the file and the key.
  const GgufValue* Find(const std::string& key) const;
  Result<std::string> String(const std::string& key) const;
  Result<uint64_t> Unsigned(const std::string& key) const;  // any non-negative integer type
  Result<double> Float(const std::string& key) const;       // F32 or F64 (or an integer)
  Result<bool> Bool(const std::string& key) const;
  // An array whose elements are all `element_type`.
  Result<const std::vector<GgufValue>*> Array(const std::string& key, GgufType element_type) const;

 private:
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace hsx
