#include "capture/mooncake_object.h"

#include <cstring>

namespace hsx {
namespace {

size_t Align(size_t offset) { return (offset + kMooncakeTensorAlign - 1) / kMooncakeTensorAlign * kMooncakeTensorAlign; }

bool IsContinuationByte(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

std::string SanitizeMooncakeKey(std::string_view id) {
  std::string out;
  out.reserve(id.size() + 1);
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else if (!IsContinuationByte(c)) {
      out.push_back('_');  // Python's re.sub replaces a code point, not a byte
    }
  }
  if (!out.empty() && out[0] >= '0' && out[0] <= '9') out.insert(out.begin(), 'k');
  return out;
}

std::string TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "torch.float32";
    case DType::kF16: return "torch.float16";
    case DType::kBF16: return "torch.bfloat16";
    case DType::kI64: return "torch.int64";
    case DType::kI32: return "torch.int32";
    case DType::kBool: return "torch.bool";
    case DType::kF8E4M3: return "torch.float8_e4m3fn";
    case DType::kU8: return "torch.uint8";
  }
  return "torch.unknown";
}

Result<MooncakeObject> PlanMooncakeObject(const CaptureRecord& record) {
  const std::string who = "request '" + record.id + "'";
  const Tensor& hs = record.hidden_states;
  if (!hs.defined() || hs.dim() != 3) return Error(who + ": hidden_states must be a [T, L, H] tensor");
  if (hs.device() != Device::kCPU) return Error(who + ": hidden_states must be on the host");
  const int64_t t = hs.size(0);
  if (static_cast<int64_t>(record.token_ids.size()) != t) {
    return Error(who + ": " + std::to_string(record.token_ids.size()) + " token ids for " + std::to_string(t) +
                 " rows of hidden states");
  }
  MooncakeObject obj;
  obj.key = SanitizeMooncakeKey(record.name.empty() ? record.id : record.name);
  if (obj.key.empty()) return Error(who + ": the request id makes an empty Mooncake key");
  obj.token_ids.assign(record.token_ids.begin(), record.token_ids.end());

  nlohmann::json tensors = nlohmann::json::object();
  size_t offset = 0;
  auto add = [&](const std::string& name, const void* data, DType dtype, const std::vector<int64_t>& shape,
                 size_t nbytes) -> Status {
    if (tensors.contains(name)) return Error(who + ": two tensors named '" + name + "'");
    tensors[name] = {{"shape", shape}, {"dtype", TorchDTypeName(dtype)}, {"nbytes", nbytes}, {"offset", offset}};
    obj.parts.push_back({data, nbytes, offset});
    offset = Align(offset + nbytes);
    return {};
  };
  HSX_RETURN_IF_ERROR(add("hidden_states", hs.raw(), hs.dtype(), hs.shape(), hs.nbytes()));
  HSX_RETURN_IF_ERROR(add("token_ids", obj.token_ids.data(), DType::kI64, {t}, t * sizeof(int64_t)));
  for (const auto& [name, tensor] : record.extras) {
    if (!tensor.defined() || tensor.device() != Device::kCPU) return Error(who + ": extra tensor '" + name + "' is not on the host");
    HSX_RETURN_IF_ERROR(add(name, tensor.raw(), tensor.dtype(), tensor.shape(), tensor.nbytes()));
  }
  obj.total_bytes = offset;

  nlohmann::json metadata = nlohmann::json::object();
  for (const auto& [k, v] : record.metadata) metadata[k] = v;  // the layer contract rides along
  metadata["num_tokens"] = t;
  metadata["total_aligned_bytes"] = obj.total_bytes;
  if (!metadata.contains("extract_mode")) metadata["extract_mode"] = "prompt_only";
  obj.manifest = {{"handle", obj.key}, {"version", kMooncakeManifestVersion}, {"tensors", std::move(tensors)},
                  {"metadata", std::move(metadata)}};
  return obj;
}

void PackMooncakeObject(const MooncakeObject& object, std::span<std::byte> out) {
  size_t written = 0;
  for (const auto& part : object.parts) {
    std::memset(out.data() + written, 0, part.offset - written);
    if (part.nbytes) std::memcpy(out.data() + part.offset, part.data, part.nbytes);
    written = part.offset + part.nbytes;
  }
  std::memset(out.data() + written, 0, object.total_bytes - written);
}

std::string MooncakeErrorMarker(std::string_view why) {
  size_t end = 0;
  for (size_t points = 0; end < why.size() && points < 4096; ++points) {
    ++end;
    while (end < why.size() && IsContinuationByte(static_cast<unsigned char>(why[end]))) ++end;
  }
  nlohmann::json marker = {{"error", std::string(why.substr(0, end))}};
  return marker.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace hsx
