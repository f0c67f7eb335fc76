#include "capture/mooncake_sink.h"

#include <cstdio>

#include "capture/mooncake_client.h"
#include "capture/mooncake_object.h"

namespace hsx {

Result<CaptureReceipt> MooncakeSink::Put(const CaptureRecord& record) {
  auto object = PlanMooncakeObject(record);
  if (!object.ok()) {
    PutFailure(record, object.status());
    return object.status();
  }
  Status put = store_->PutWith(object->key, object->total_bytes,
                               [&](std::span<std::byte> out) { PackMooncakeObject(*object, out); });
  if (!put.ok()) {
    Status why = put.with_context("request '" + record.id + "'");
    PutFailure(record, why);
    return why;
  }
  return CaptureReceipt{object->key, std::move(object->manifest)};
}

void MooncakeSink::PutFailure(const CaptureRecord& record, const Status& why) {
  const std::string key = SanitizeMooncakeKey(record.name.empty() ? record.id : record.name) + ":error";
  Status put = store_->Put(key, MooncakeErrorMarker(why.message()));
  if (!put.ok()) {
    std::fprintf(stderr, "hsx: request '%s': could not publish its Mooncake error marker: %s\n", record.id.c_str(),
                 put.message().c_str());
  }
}

Result<std::unique_ptr<CaptureSink>> MakeMooncakeSink(const nlohmann::json& mooncake_config) {
  HSX_ASSIGN_OR_RETURN(MooncakeConfig config, ParseMooncakeConfig(mooncake_config));
  HSX_ASSIGN_OR_RETURN(std::unique_ptr<MooncakeClient> client, MooncakeClient::Connect(config));
  return std::unique_ptr<CaptureSink>(std::make_unique<MooncakeSink>(std::move(client)));
}

}  // namespace hsx
