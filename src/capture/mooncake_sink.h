// hs_connectors' Mooncake backend as a capture sink: each finished request becomes one
// packed object in a Mooncake store (mooncake_object.h), and its receipt's transfer_params
// are the manifest MooncakeHiddenStatesStore.get_sample reads it with. A request that fails
// leaves the "<key>:error" marker, so a reader waiting for it stops. Nothing touches disk.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "capture/capture_sink.h"
#include "capture/object_store.h"

namespace hsx {

class MooncakeSink final : public CaptureSink {
 public:
  explicit MooncakeSink(std::unique_ptr<ObjectStore> store) : store_(std::move(store)) {}
  // Puts the object; on failure also puts the error marker (as hs_connectors' writer does),
  // so callers need not call PutFailure after a failed Put. The error says when the marker
  // could not be written either.
  Result<CaptureReceipt> Put(const CaptureRecord& record) override;
  Status PutFailure(const CaptureRecord& record, const Status& why) override;
  // The manifest Put would have answered with; for a record without states to plan (a
  // request that failed before its states were captured), the handle with no tensors, which
  // is all a reader needs to find the marker.
  nlohmann::json FailureTransferParams(const CaptureRecord& record) const override;
  std::string Describe() const override { return store_->Describe(); }

 private:
  std::unique_ptr<ObjectStore> store_;
};

// The sink for `kv_connector: "MooncakeHiddenStatesConnector"`: `mooncake_config` is
// kv_connector_extra_config.mooncake. Connects at once, so a bad config, a missing Mooncake
// or an unreachable master is an error at start-up.
Result<std::unique_ptr<CaptureSink>> MakeMooncakeSink(const nlohmann::json& mooncake_config);

}  // namespace hsx
