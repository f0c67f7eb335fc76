#include "tensor/safetensors.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <nlohmann/json.hpp>

#include "util/atomic_file.h"
#include "util/json.h"

namespace hsx {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

// One header entry, checked on its own: dtype, shape, offsets, and a byte count that
// matches the shape (overflow-safe: the header may claim any 64-bit numbers).
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

Result<Entry> ParseEntry(const std::string& path, const std::string& name, const nlohmann::json& entry) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!entry.is_object()) return Error(where + ": header entry is not an object");
  if (!entry.contains("dtype") || !entry["dtype"].is_string()) return Error(where + ": missing string field 'dtype'");
  const auto dtype = ParseSafetensorsDType(entry["dtype"].get<std::string>());
  if (!dtype) return Error(where + ": unsupported dtype '" + entry["dtype"].get<std::string>() + "' (expected F32, F16, BF16, I64, I32, BOOL, F8_E4M3 or U8)");
  if (!entry.contains("shape") || !entry["shape"].is_array()) return Error(where + ": missing array field 'shape'");
  Shape shape;
  for (const auto& d : entry["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(where + ": shape entries must be non-negative 64-bit integers");
    }
    shape.push_back(d.get<int64_t>());
  }
  const auto& off = entry.contains("data_offsets") ? entry["data_offsets"] : nlohmann::json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    return Error(where + ": 'data_offsets' must be [begin, end] non-negative integers");
  }
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (begin > end) return Error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] end before they begin");
  const std::optional<int64_t> numel = CheckedShapeNumel(shape);
  uint64_t expected = 0;
  if (!numel || __builtin_mul_overflow(static_cast<uint64_t>(*numel), DTypeSize(*dtype), &expected)) {
    return Error(where + ": shape " + ShapeToString(shape) + " overflows 64-bit sizes");
  }
  if (end - begin != expected) {
    return Error(where + ": " + std::to_string(end - begin) + " bytes for shape " + ShapeToString(shape) + " " +
                 std::string(DTypeName(*dtype)) + " (expected " + std::to_string(expected) + ")");
  }
  return Entry{name, *dtype, std::move(shape), begin, end};
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  HSX_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  if (file->size() < 8) return Error(path + ": too small to be a safetensors file (" + std::to_string(file->size()) + " bytes)");
  uint64_t header_len;
  std::memcpy(&header_len, file->data(), 8);
  if (header_len > kMaxHeaderBytes) {
    return Error(path + ": header length " + std::to_string(header_len) + " exceeds the format's limit of " +
                 std::to_string(kMaxHeaderBytes) + " bytes: corrupt or not safetensors");
  }
  if (header_len > file->size() - 8) {
    return Error(path + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                 std::to_string(file->size()) + " bytes): truncated or not safetensors");
  }
  HSX_ASSIGN_OR_RETURN(const nlohmann::json header,
                       ParseJson(std::string_view(file->data() + 8, header_len), path + ": header"));
  if (!header.is_object()) return Error(path + ": header is not a JSON object");

  SafetensorsFile st;
  st.file_ = file;
  std::vector<Entry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Error(path + ": __metadata__ must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return Error(path + ": __metadata__ value '" + k + "' is not a string");
        st.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    HSX_ASSIGN_OR_RETURN(Entry e, ParseEntry(path, name, entry));
    entries.push_back(std::move(e));
  }
  // As the reference reader requires: sorted by offsets, the tensors tile the data
  // section exactly (each begins where the previous ends, the last ends at the end of
  // the file). A header length off by a byte shifts every tensor and fails here.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file->size() - data_start;
  uint64_t covered = 0;
  for (Entry& e : entries) {
    if (e.begin != covered) {
      return Error(path + ": tensor '" + e.name + "': data_offsets begin at " + std::to_string(e.begin) + ", expected " +
                   std::to_string(covered) + " (tensors must tile the data section without gaps or overlaps)");
    }
    if (e.end > data_size) {
      return Error(path + ": tensor '" + e.name + "': data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                   "] out of range: the data section after the " + std::to_string(header_len) +
                   "-byte header holds " + std::to_string(data_size) + " bytes (file truncated?)");
    }
    covered = e.end;
    auto* p = const_cast<char*>(file->data() + data_start + e.begin);
    st.tensors_.emplace(e.name, Tensor(p, e.dtype, std::move(e.shape), Device::kCPU, file));
  }
  if (covered != data_size) {
    return Error(path + ": the tensors end at byte " + std::to_string(covered) + " of a " + std::to_string(data_size) +
                 "-byte data section (header length " + std::to_string(header_len) + " wrong, or file corrupt)");
  }
  return st;
}

Result<Tensor> SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return Error(path() + ": missing tensor '" + name + "'");
  return it->second;
}

Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<std::string_view> parts(2);
  for (const auto& [name, t] : tensors) {
    if (t.device() != Device::kCPU) return Error(path + ": tensor '" + name + "' is not in host memory");
    header[name] = {{"dtype", DTypeName(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
    parts.emplace_back(static_cast<const char*>(t.raw()), t.nbytes());
  }
  std::string json = header.dump();
  json.append((8 - (8 + json.size()) % 8) % 8, ' ');
  const uint64_t len = json.size();
  std::string prefix(8, '\0');
  std::memcpy(prefix.data(), &len, 8);
  parts[0] = prefix;
  parts[1] = json;
  return WriteFileAtomic(path, parts);
}

}  // namespace hsx
