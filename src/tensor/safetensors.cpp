#include "tensor/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/atomic_file.h"

namespace hsx {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

Result<Tensor> ParseEntry(const std::string& path, const std::string& name, const nlohmann::json& entry,
                          const std::shared_ptr<MappedFile>& file, uint64_t data_start) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!entry.is_object()) return Error(where + ": header entry is not an object");
  if (!entry.contains("dtype") || !entry["dtype"].is_string()) return Error(where + ": missing string field 'dtype'");
  const auto dtype = ParseSafetensorsDType(entry["dtype"].get<std::string>());
  if (!dtype) return Error(where + ": unsupported dtype '" + entry["dtype"].get<std::string>() + "' (expected F32, F16, BF16, I64 or I32)");
  if (!entry.contains("shape") || !entry["shape"].is_array()) return Error(where + ": missing array field 'shape'");
  Shape shape;
  for (const auto& d : entry["shape"]) {
    if (!d.is_number_unsigned()) return Error(where + ": shape entries must be non-negative integers");
    shape.push_back(d.get<int64_t>());
  }
  const auto& off = entry.contains("data_offsets") ? entry["data_offsets"] : nlohmann::json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    return Error(where + ": 'data_offsets' must be [begin, end] non-negative integers");
  }
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  const uint64_t data_size = file->size() - data_start;
  if (begin > end || end > data_size) {
    return Error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 "] out of range: the data section holds " + std::to_string(data_size) + " bytes (file truncated?)");
  }
  const uint64_t expected = static_cast<uint64_t>(ShapeNumel(shape)) * DTypeSize(*dtype);
  if (end - begin != expected) {
    return Error(where + ": " + std::to_string(end - begin) + " bytes for shape " + ShapeToString(shape) + " " +
                 std::string(DTypeName(*dtype)) + " (expected " + std::to_string(expected) + ")");
  }
  auto* p = const_cast<char*>(file->data() + data_start + begin);
  return Tensor(p, *dtype, std::move(shape), Device::kCPU, file);
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  HSX_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  if (file->size() < 8) return Error(path + ": too small to be a safetensors file (" + std::to_string(file->size()) + " bytes)");
  uint64_t header_len;
  std::memcpy(&header_len, file->data(), 8);
  if (header_len > kMaxHeaderBytes || header_len > file->size() - 8) {
    return Error(path + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                 std::to_string(file->size()) + " bytes): truncated or not safetensors");
  }
  const auto header = nlohmann::json::parse(file->data() + 8, file->data() + 8 + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return Error(path + ": header is not a JSON object");

  SafetensorsFile st;
  st.file_ = file;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Error(path + ": __metadata__ must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return Error(path + ": __metadata__ value '" + k + "' is not a string");
        st.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    HSX_ASSIGN_OR_RETURN(Tensor t, ParseEntry(path, name, entry, file, 8 + header_len));
    if (t.nbytes() > 0) ranges.push_back({{entry["data_offsets"][0].get<uint64_t>(), entry["data_offsets"][1].get<uint64_t>()}, name});
    st.tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first.first < ranges[i - 1].first.second) {
      return Error(path + ": tensors '" + ranges[i - 1].second + "' and '" + ranges[i].second + "' overlap in the data section");
    }
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
