#include "model/gguf_file.h"

#include <cstring>

namespace hsx {
namespace {

constexpr uint64_t kDefaultAlignment = 32;

// Bytes one value of a scalar type takes; 0 for strings and arrays, whose size is read.
uint64_t ScalarSize(GgufType type) {
  switch (type) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

// The fewest bytes a value of the type can take, to bound a count before reserving for it.
uint64_t MinimumSize(GgufType type) {
  if (type == GgufType::kString) return 8;   // its length
  if (type == GgufType::kArray) return 12;   // element type and count
  return ScalarSize(type);
}

const char* TypeName(GgufType type) {
  static const char* kNames[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                 "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
  const auto t = static_cast<uint32_t>(type);
  return t < 13 ? kNames[t] : "unknown";
}

// A bounds-checked little-endian reader over the mapped file; every error names the file,
// what was being read and where.
class Cursor {
 public:
  Cursor(const std::string& path, const char* data, uint64_t size) : path_(path), data_(data), size_(size) {}
  uint64_t at() const { return at_; }
  uint64_t left() const { return size_ - at_; }

  Status Need(uint64_t n, const std::string& what) const {
    if (n > left()) {
      return Error(path_ + ": " + what + " at byte " + std::to_string(at_) + " needs " + std::to_string(n) +
                   " bytes, but the file has " + std::to_string(left()) + " left (truncated or not GGUF)");
    }
    return {};
  }
  template <class T>
  Result<T> Read(const std::string& what) {
    HSX_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  Result<std::string> ReadString(const std::string& what) {
    HSX_ASSIGN_OR_RETURN(const uint64_t n, Read<uint64_t>(what + " length"));
    HSX_RETURN_IF_ERROR(Need(n, what + " of " + std::to_string(n) + " bytes"));
    std::string s(data_ + at_, n);
    at_ += n;
    return s;
  }
  Status Fail(const std::string& message) const { return Error(path_ + ": " + message); }

 private:
  const std::string& path_;
  const char* data_;
  uint64_t size_;
  uint64_t at_ = 0;
};

Result<GgufType> ReadType(Cursor& c, const std::string& what) {
  HSX_ASSIGN_OR_RETURN(const uint32_t t, c.Read<uint32_t>(what + " type"));
  if (t > static_cast<uint32_t>(GgufType::kF64)) return c.Fail(what + ": unknown value type " + std::to_string(t));
  return static_cast<GgufType>(t);
}

Result<GgufValue> ReadValue(Cursor& c, GgufType type, const std::string& what, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::kU8: { HSX_ASSIGN_OR_RETURN(const uint8_t x, c.Read<uint8_t>(what)); v.u = x; break; }
    case GgufType::kU16: { HSX_ASSIGN_OR_RETURN(const uint16_t x, c.Read<uint16_t>(what)); v.u = x; break; }
    case GgufType::kU32: { HSX_ASSIGN_OR_RETURN(const uint32_t x, c.Read<uint32_t>(what)); v.u = x; break; }
    case GgufType::kU64: { HSX_ASSIGN_OR_RETURN(v.u, c.Read<uint64_t>(what)); break; }
    case GgufType::kI8: { HSX_ASSIGN_OR_RETURN(const int8_t x, c.Read<int8_t>(what)); v.i = x; break; }
    case GgufType::kI16: { HSX_ASSIGN_OR_RETURN(const int16_t x, c.Read<int16_t>(what)); v.i = x; break; }
    case GgufType::kI32: { HSX_ASSIGN_OR_RETURN(const int32_t x, c.Read<int32_t>(what)); v.i = x; break; }
    case GgufType::kI64: { HSX_ASSIGN_OR_RETURN(v.i, c.Read<int64_t>(what)); break; }
    case GgufType::kF32: { HSX_ASSIGN_OR_RETURN(const float x, c.Read<float>(what)); v.f = x; break; }
    case GgufType::kF64: { HSX_ASSIGN_OR_RETURN(v.f, c.Read<double>(what)); break; }
    case GgufType::kBool: {
      HSX_ASSIGN_OR_RETURN(const uint8_t x, c.Read<uint8_t>(what));
      if (x > 1) return c.Fail(what + ": BOOL value " + std::to_string(x) + " is neither 0 nor 1");
      v.b = x == 1;
      break;
    }
    case GgufType::kString: { HSX_ASSIGN_OR_RETURN(v.s, c.ReadString(what)); break; }
    case GgufType::kArray: {
      if (depth >= GgufFile::kMaxArrayNesting) {
        return c.Fail(what + ": arrays nested deeper than " + std::to_string(GgufFile::kMaxArrayNesting));
      }
      HSX_ASSIGN_OR_RETURN(v.element_type, ReadType(c, what + " element"));
      HSX_ASSIGN_OR_RETURN(const uint64_t n, c.Read<uint64_t>(what + " count"));
      // Each element takes at least MinimumSize bytes: a count the file cannot hold fails
      // before anything is reserved for it.
      if (n > c.left() / MinimumSize(v.element_type)) {
        return c.Fail(what + ": " + std::to_string(n) + " " + TypeName(v.element_type) +
                      " elements cannot fit in the " + std::to_string(c.left()) + " bytes left");
      }
      v.array.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        HSX_ASSIGN_OR_RETURN(GgufValue e, ReadValue(c, v.element_type, what + "[" + std::to_string(k) + "]", depth + 1));
        v.array.push_back(std::move(e));
      }
      break;
    }
  }
  return v;
}

bool IsUnsignedType(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kU16 || t == GgufType::kU32 || t == GgufType::kU64;
}
bool IsSignedType(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

}  // namespace

std::string GgmlTypeName(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kBF16: return "BF16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ4_1: return "Q4_1";
    case GgmlType::kQ5_0: return "Q5_0";
    case GgmlType::kQ5_1: return "Q5_1";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ2_K: return "Q2_K";
    case GgmlType::kQ3_K: return "Q3_K";
    case GgmlType::kQ4_K: return "Q4_K";
    case GgmlType::kQ5_K: return "Q5_K";
    case GgmlType::kQ6_K: return "Q6_K";
  }
  return "type " + std::to_string(type);
}

std::optional<GgmlBlock> GgmlBlockOf(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: return GgmlBlock{1, 4};
    case GgmlType::kF16: return GgmlBlock{1, 2};
    case GgmlType::kBF16: return GgmlBlock{1, 2};
    case GgmlType::kQ4_0: return GgmlBlock{32, 18};
    case GgmlType::kQ4_1: return GgmlBlock{32, 20};
    case GgmlType::kQ5_0: return GgmlBlock{32, 22};
    case GgmlType::kQ5_1: return GgmlBlock{32, 24};
    case GgmlType::kQ8_0: return GgmlBlock{32, 34};
    case GgmlType::kQ2_K: return GgmlBlock{256, 84};
    case GgmlType::kQ3_K: return GgmlBlock{256, 110};
    case GgmlType::kQ4_K: return GgmlBlock{256, 144};
    case GgmlType::kQ5_K: return GgmlBlock{256, 176};
    case GgmlType::kQ6_K: return GgmlBlock{256, 210};
  }
  return std::nullopt;
}

Result<GgufFile> GgufFile::Open(const std::string& path) {
  HSX_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  GgufFile g;
  g.file_ = mapped;
  Cursor c(path, mapped->data(), mapped->size());
  HSX_ASSIGN_OR_RETURN(const uint32_t magic, c.Read<uint32_t>("magic"));
  if (std::memcmp(&magic, "GGUF", 4) != 0) return c.Fail("not a GGUF file (the first 4 bytes are not 'GGUF')");
  HSX_ASSIGN_OR_RETURN(g.version_, c.Read<uint32_t>("version"));
  if (g.version_ != 2 && g.version_ != 3) {
    return c.Fail("GGUF version " + std::to_string(g.version_) + " is not supported (expected 2 or 3)");
  }
  HSX_ASSIGN_OR_RETURN(const uint64_t tensor_count, c.Read<uint64_t>("tensor count"));
  HSX_ASSIGN_OR_RETURN(const uint64_t kv_count, c.Read<uint64_t>("metadata count"));
  // A key/value takes at least 13 bytes, a tensor info at least 24: counts the file cannot
  // hold fail before anything is reserved.
  if (kv_count > c.left() / 13) return c.Fail("metadata count " + std::to_string(kv_count) + " exceeds what the file can hold");
  if (tensor_count > c.left() / 24) return c.Fail("tensor count " + std::to_string(tensor_count) + " exceeds what the file can hold");

  for (uint64_t k = 0; k < kv_count; ++k) {
    HSX_ASSIGN_OR_RETURN(std::string key, c.ReadString("metadata key " + std::to_string(k)));
    const std::string what = "metadata '" + key + "'";
    HSX_ASSIGN_OR_RETURN(const GgufType type, ReadType(c, what));
    HSX_ASSIGN_OR_RETURN(GgufValue value, ReadValue(c, type, what, 0));
    if (!g.metadata_.emplace(key, std::move(value)).second) return c.Fail(what + " appears twice");
  }

  uint64_t alignment = kDefaultAlignment;
  if (const GgufValue* a = g.Find("general.alignment")) {
    if (a->type != GgufType::kU32 || a->u == 0 || (a->u & (a->u - 1)) != 0) {
      return c.Fail("metadata 'general.alignment' must be a UINT32 power of two");
    }
    alignment = a->u;
  }

  std::vector<uint64_t> offsets;
  g.tensors_.reserve(tensor_count);
  for (uint64_t k = 0; k < tensor_count; ++k) {
    GgufTensorInfo t;
    HSX_ASSIGN_OR_RETURN(t.name, c.ReadString("tensor " + std::to_string(k) + " name"));
    const std::string what = "tensor '" + t.name + "'";
    HSX_ASSIGN_OR_RETURN(const uint32_t n_dims, c.Read<uint32_t>(what + " dimension count"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return c.Fail(what + ": " + std::to_string(n_dims) + " dimensions (expected 1 to " + std::to_string(kMaxDims) + ")");
    }
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      HSX_ASSIGN_OR_RETURN(const uint64_t dim, c.Read<uint64_t>(what + " dimension"));
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel)) {
        return c.Fail(what + ": dimensions overflow 64-bit sizes");
      }
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    HSX_ASSIGN_OR_RETURN(const uint32_t type, c.Read<uint32_t>(what + " type"));
    const std::optional<GgmlBlock> block = GgmlBlockOf(type);
    if (!block) {
      return c.Fail(what + ": tensor type " + GgmlTypeName(type) +
                    " is not supported (expected F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K)");
    }
    t.type = static_cast<GgmlType>(type);
    if (t.dims[0] % block->elements != 0) {
      return c.Fail(what + ": its first dimension " + std::to_string(t.dims[0]) + " is not a multiple of " +
                    GgmlTypeName(type) + "'s block of " + std::to_string(block->elements));
    }
    // numel / elements blocks of `bytes` each: numel fits int64, so only the product can overflow.
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel / block->elements), static_cast<uint64_t>(block->bytes),
                               &t.nbytes)) {
      return c.Fail(what + ": its byte size overflows 64 bits");
    }
    HSX_ASSIGN_OR_RETURN(const uint64_t offset, c.Read<uint64_t>(what + " offset"));
    if (!g.tensor_index_.emplace(t.name, g.tensors_.size()).second) return c.Fail(what + " appears twice");
    offsets.push_back(offset);
    g.tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment; as llama.cpp requires,
  // tensors follow each other in order, each at the aligned end of the one before.
  const uint64_t data_start = (c.at() + alignment - 1) / alignment * alignment;
  if (data_start > mapped->size()) {
    return c.Fail("the data section would start at byte " + std::to_string(data_start) + ", past the end of the " +
                  std::to_string(mapped->size()) + "-byte file");
  }
  const uint64_t data_size = mapped->size() - data_start;
  uint64_t expected = 0;
  for (size_t k = 0; k < g.tensors_.size(); ++k) {
    GgufTensorInfo& t = g.tensors_[k];
    if (offsets[k] != expected) {
      return c.Fail("tensor '" + t.name + "': data offset " + std::to_string(offsets[k]) + ", expected " +
                    std::to_string(expected) + " (tensors must follow each other, each aligned to " +
                    std::to_string(alignment) + " bytes)");
    }
    if (t.nbytes > data_size - expected) {
      return c.Fail("tensor '" + t.name + "': its " + std::to_string(t.nbytes) + " bytes at data offset " +
                    std::to_string(expected) + " run past the end of the " + std::to_string(data_size) +
                    "-byte data section (file truncated?)");
    }
    t.data = mapped->data() + data_start + expected;
    // expected + nbytes <= data_size, so padding it cannot overflow.
    expected = (expected + t.nbytes + alignment - 1) / alignment * alignment;
  }
  return g;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
Status Missing(const std::string& path, const std::string& key) { return Error(path + ": missing metadata '" + key + "'"); }
Status WrongType(const std::string& path, const std::string& key, const GgufValue& v, const char* expected) {
  return Error(path + ": metadata '" + key + "' is " + TypeName(v.type) + ", expected " + expected);
}
}  // namespace

Result<std::string> GgufFile::String(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type != GgufType::kString) return WrongType(path(), key, *v, "STRING");
  return v->s;
}

Result<uint64_t> GgufFile::Unsigned(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (IsUnsignedType(v->type)) return v->u;
  if (IsSignedType(v->type)) {
    if (v->i < 0) return Error(path() + ": metadata '" + key + "' is " + std::to_string(v->i) + ", expected a non-negative integer");
    return static_cast<uint64_t>(v->i);
  }
  return WrongType(path(), key, *v, "an integer");
}

Result<double> GgufFile::Float(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type == GgufType::kF32 || v->type == GgufType::kF64) return v->f;
  if (IsUnsignedType(v->type)) return static_cast<double>(v->u);
  if (IsSignedType(v->type)) return static_cast<double>(v->i);
  return WrongType(path(), key, *v, "a number");
}

Result<bool> GgufFile::Bool(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type != GgufType::kBool) return WrongType(path(), key, *v, "BOOL");
  return v->b;
}

Result<const std::vector<GgufValue>*> GgufFile::Array(const std::string& key, GgufType element_type) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(path(), key);
  if (v->type != GgufType::kArray) return WrongType(path(), key, *v, "ARRAY");
  if (v->element_type != element_type) {
    return Error(path() + ": metadata '" + key + "' is an ARRAY of " + TypeName(v->element_type) + ", expected " +
                 TypeName(element_type));
  }
  return &v->array;
}

}  // namespace hsx
