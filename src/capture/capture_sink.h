// Where finished requests' captured hidden states go. A sink takes a plain record and
// owns its protocol (a safetensors file and its lock, an FP8 file, a distributed store);
// extract and serve hand records over and report what the sink says.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensor/safetensors.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace hsx {

struct CaptureRecord {
  std::string id;    // the request's id
  std::string name;  // its place in the sink (a file name in the directory, a store key); empty: the sink's rule for id
  Tensor hidden_states;             // host [T, L, H], layers in ascending id order
  std::vector<int32_t> token_ids;   // [T]: the tokens of those rows
  std::vector<NamedTensor> extras;  // further [T, ...] tensors, such as loss_mask
  // The layer contract (safetensors __metadata__): layer ids, config and tokenizer hashes,
  // dtype, hsx version. Never changes the tensors readers load.
  std::map<std::string, std::string> metadata;
};

// Where a record went: what extract's manifest lists and a response's kv_transfer_params say.
struct CaptureReceipt {
  std::string location;            // the file's path, or the store's key
  nlohmann::json transfer_params;  // kv_transfer_params, as the reader of this sink expects them
  uint64_t bytes = 0;              // what the record takes in the sink (a file's size)
};

class CaptureSink {
 public:
  virtual ~CaptureSink() = default;
  // Stores one record whole or not at all; an error names the request. Called from
  // several writer threads at once.
  virtual Result<CaptureReceipt> Put(const CaptureRecord& record) = 0;
  // A request that failed after admission, so that a reader waiting for it stops
  // waiting (Mooncake's ":error" marker). Sinks whose readers never wait do nothing. An
  // error: the marker could not be written either (a reader waiting for it times out).
  virtual Status PutFailure(const CaptureRecord& /*record*/, const Status& /*why*/) { return {}; }
  // The kv_transfer_params of a record whose put or request failed: what its reader waits
  // for the failure marker with. vLLM's Mooncake producer answers with the manifest before
  // its put runs, so a reader of a failed request holds one too. Null for sinks whose
  // readers never wait (files).
  virtual nlohmann::json FailureTransferParams(const CaptureRecord& /*record*/) const { return nullptr; }
  // What a log line calls this sink: "safetensors files in DIR", "Mooncake store at ...".
  virtual std::string Describe() const = 0;
};

}  // namespace hsx
