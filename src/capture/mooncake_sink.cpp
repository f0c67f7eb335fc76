#include "capture/mooncake_sink.h"

#include <cstdio>

#include "capture/mooncake_client.h"
#include "capture/mooncake_object.h"

namespace hsx {

Result<CaptureReceipt> MooncakeSink::Put(const CaptureRecord& record) {
  auto object = PlanMooncakeObject(record);
  Status why = object.ok() ? store_->PutWith(object->key, object->total_bytes,
                                             [&](std::span<std::byte> out) { PackMooncakeObject(*object, out); })
                                 .with_context("request '" + record.id + "'")
                           : object.status();
  if (!why.ok()) {
    Status marker = PutFailure(record, why);
    return marker.ok() ? why : Error(why.message() + "; " + marker.message());
  }
  return CaptureReceipt{object->key, std::move(object->manifest), object->total_bytes};
}

Status MooncakeSink::PutFailure(const CaptureRecord& record, const Status& why) {
  const std::string key = SanitizeMooncakeKey(record.name.empty() ? record.id : record.name) + ":error";
  Status put = store_->Put(key, MooncakeErrorMarker(why.message()));
  if (put.ok()) return {};
  std::fprintf(stderr, "hsx: request '%s': could not publish its Mooncake error marker: %s\n", record.id.c_str(),
               put.message().c_str());
  return Error("its error marker '" + key + "' could not be written either (" + put.message() +
               "), so a reader waiting for it times out");
}

nlohmann::json MooncakeSink::FailureTransferParams(const CaptureRecord& record) const {
  if (auto object = PlanMooncakeObject(record); object.ok()) return std::move(object->manifest);
  auto it = record.metadata.find("extract_mode");
  return {{"handle", SanitizeMooncakeKey(record.name.empty() ? record.id : record.name)},
          {"version", kMooncakeManifestVersion},
          {"tensors", nlohmann::json::object()},
          {"metadata",
           {{"num_tokens", record.token_ids.size()},
            {"total_aligned_bytes", 0},
            {"extract_mode", it == record.metadata.end() ? "prompt_only" : it->second}}}};
}

Result<std::unique_ptr<CaptureSink>> MakeMooncakeSink(const nlohmann::json& mooncake_config) {
  HSX_ASSIGN_OR_RETURN(MooncakeConfig config, ParseMooncakeConfig(mooncake_config));
  HSX_ASSIGN_OR_RETURN(std::unique_ptr<MooncakeClient> client, MooncakeClient::Connect(config));
  return std::unique_ptr<CaptureSink>(std::make_unique<MooncakeSink>(std::move(client)));
}

}  // namespace hsx
