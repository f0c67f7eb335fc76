// vLLM's --kv-transfer-config for hidden-state extraction, as speculators' launcher and
// hs-connectors' backends write it, turned into the capture sink it names:
//   ExampleHiddenStatesConnector (vLLM)                   -> safetensors files
//   FP8HiddenStatesConnector (hs_connectors, out of tree) -> FP8 safetensors files
//   MooncakeHiddenStatesConnector (hs_connectors)         -> a Mooncake store
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "capture/capture_sink.h"
#include "util/status.h"

namespace hsx {

struct KvTransferConfig {
  enum class Connector { kFiles, kFp8Files, kMooncake };
  Connector connector = Connector::kFiles;
  std::string name;  // kv_connector as given
  // The file connectors' kv_connector_extra_config.
  std::string storage_dir;  // shared_storage_path, absolute
  int writer_threads = 8;   // num_writer_threads (Mooncake: mooncake.num_writer_threads)
  bool use_lock = true;     // use_synchronization_lock
  nlohmann::json mooncake;  // kv_connector_extra_config.mooncake, as MooncakeBackend builds it
  bool writes_files() const { return connector != Connector::kMooncake; }
};

// Parses and checks the JSON; an error names the field. `flag` names where it came from.
// default_storage_dir: a file connector's directory when shared_storage_path is absent
// (extract's --output); empty: the field is required (serve).
Result<KvTransferConfig> ParseKvTransferConfig(std::string_view text, const std::string& flag = "--kv-transfer-config",
                                               const std::string& default_storage_dir = "");

// The sink the config names. File sinks write into storage_dir (created if missing);
// exclusive_names: never replace an existing file (serve, where clients may name files).
Result<std::unique_ptr<CaptureSink>> MakeCaptureSink(const KvTransferConfig& config, bool exclusive_names);

}  // namespace hsx
