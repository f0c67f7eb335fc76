// One finished request as hs_connectors' Mooncake backend lays it out (mooncake_store.py,
// manifest version 1): the tensors packed into one raw object at 64-byte-aligned offsets,
// and the transfer manifest (handle, tensors' shape/dtype/nbytes/offset,
// metadata.total_aligned_bytes) that travels in the response's kv_transfer_params and that
// MooncakeHiddenStatesStore.get_sample reads the object with.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "capture/capture_sink.h"
#include "util/status.h"

namespace hsx {

inline constexpr int kMooncakeManifestVersion = 1;
inline constexpr size_t kMooncakeTensorAlign = 64;

// hs_connectors' sanitize_key: every code point outside [a-zA-Z0-9_-] becomes '_', and a
// key starting with a digit gets a 'k' in front.
std::string SanitizeMooncakeKey(std::string_view request_id);

// torch's name of a dtype ("torch.bfloat16"), which the reader parses back.
std::string TorchDTypeName(DType dtype);

struct MooncakeObject {
  std::string key;          // the handle; its error marker is key + ":error"
  nlohmann::json manifest;  // kv_transfer_params
  size_t total_bytes = 0;   // metadata.total_aligned_bytes
  struct Part {
    const void* data;
    size_t nbytes;
    size_t offset;
  };
  std::vector<Part> parts;  // host bytes to copy; borrowed from the record
  std::vector<int64_t> token_ids;  // the int64 token_ids tensor (the record holds int32)
};

// The object for `record`: hidden_states [T, L, H], token_ids [T] int64 (as vLLM's
// connector makes them from Python ints), then the record's extras, in that order. Its key
// is the sanitized name, or id when the name is empty. Errors name the request.
Result<MooncakeObject> PlanMooncakeObject(const CaptureRecord& record);

// Writes the packed bytes (padding zeroed) into `out`, which holds total_bytes.
void PackMooncakeObject(const MooncakeObject& object, std::span<std::byte> out);

// The ":error" marker's bytes, as put_error writes them: {"error": why} as JSON, the text
// cut to 4096 code points.
std::string MooncakeErrorMarker(std::string_view why);

}  // namespace hsx
