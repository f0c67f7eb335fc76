// The `mooncake` object of `--kv-transfer-config`'s kv_connector_extra_config, as
// hs_connectors' MooncakeBackend.build_kv_transfer_config writes it (the fields of its
// MooncakeStoreConfig, passed to MooncakeDistributedStore.setup).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "util/status.h"

namespace hsx {

struct MooncakeConfig {
  // Defaults are MooncakeStoreConfig's, so a config vLLM's connector accepts means the same here.
  std::string local_hostname = "localhost";
  std::string metadata_server = "P2PHANDSHAKE";
  std::string master_server_address = "127.0.0.1:50051";
  int64_t global_segment_size = int64_t{4} << 30;  // this process's share of the store, bytes
  int64_t local_buffer_size = int64_t{2} << 30;
  std::string protocol = "tcp";
  std::string device_name;
  int num_writer_threads = 4;  // concurrent puts, each with its own staging buffer
};

// Every field is optional (MooncakeStoreConfig's default); a field of the wrong type or
// value, or an unknown one (a misspelling would otherwise fall back to a default silently),
// is an error naming `kv_connector_extra_config.mooncake.<field>`.
Result<MooncakeConfig> ParseMooncakeConfig(const nlohmann::json& mooncake);

// "host:port" of master_server_address, checked.
struct HostPort {
  std::string host;
  int port = 0;
};
Result<HostPort> ParseHostPort(const std::string& address);

}  // namespace hsx
