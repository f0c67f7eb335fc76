#include "capture/mooncake_config.h"

#include <charconv>

namespace hsx {
namespace {

const std::string kPrefix = "kv_connector_extra_config.mooncake.";

Status ReadString(const nlohmann::json& obj, const char* field, std::string* out) {
  auto it = obj.find(field);
  if (it == obj.end()) return {};
  if (!it->is_string()) return Error(kPrefix + field + " must be a string, got " + it->dump());
  *out = it->get<std::string>();
  return {};
}

Status ReadInteger(const nlohmann::json& obj, const char* field, int64_t min, int64_t max, int64_t* out) {
  auto it = obj.find(field);
  if (it == obj.end()) return {};
  // Python's round() gives an int; 4.0 * 2**30 written by hand is accepted when whole.
  int64_t v = 0;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max)) {
      return Error(kPrefix + field + " must be at most " + std::to_string(max) + ", got " + it->dump());
    }
    v = it->get<int64_t>();
  } else if (it->is_number_float() && it->get<double>() == static_cast<double>(static_cast<int64_t>(it->get<double>()))) {
    v = static_cast<int64_t>(it->get<double>());
  } else {
    return Error(kPrefix + field + " must be an integer, got " + it->dump());
  }
  if (v < min || v > max) {
    return Error(kPrefix + field + " must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + it->dump());
  }
  *out = v;
  return {};
}

}  // namespace

Result<HostPort> ParseHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  HostPort hp;
  if (colon == std::string::npos || colon == 0) return Error("'" + address + "' is not host:port");
  hp.host = address.substr(0, colon);
  if (hp.host.size() > 2 && hp.host.front() == '[' && hp.host.back() == ']') hp.host = hp.host.substr(1, hp.host.size() - 2);
  const char* b = address.data() + colon + 1;
  const char* e = address.data() + address.size();
  auto [p, ec] = std::from_chars(b, e, hp.port);
  if (ec != std::errc() || p != e || hp.port <= 0 || hp.port > 65535) return Error("'" + address + "' has no port in 1..65535");
  return hp;
}

Result<MooncakeConfig> ParseMooncakeConfig(const nlohmann::json& mooncake) {
  if (!mooncake.is_object()) {
    return Error("kv_connector_extra_config.mooncake must be an object (hs_connectors' MooncakeStoreConfig fields), got " +
                 mooncake.dump());
  }
  static const char* kKnown[] = {"local_hostname", "metadata_server", "master_server_address", "global_segment_size",
                                 "local_buffer_size", "protocol", "device_name", "num_writer_threads"};
  for (const auto& [key, value] : mooncake.items()) {
    bool known = false;
    for (const char* k : kKnown) known = known || key == k;
    if (!known) {
      return Error(kPrefix + key +
                   " is not a Mooncake setting (known: local_hostname, metadata_server, master_server_address, "
                   "global_segment_size, local_buffer_size, protocol, device_name, num_writer_threads)");
    }
  }
  MooncakeConfig c;
  HSX_RETURN_IF_ERROR(ReadString(mooncake, "local_hostname", &c.local_hostname));
  HSX_RETURN_IF_ERROR(ReadString(mooncake, "metadata_server", &c.metadata_server));
  HSX_RETURN_IF_ERROR(ReadString(mooncake, "master_server_address", &c.master_server_address));
  HSX_RETURN_IF_ERROR(ReadString(mooncake, "protocol", &c.protocol));
  HSX_RETURN_IF_ERROR(ReadString(mooncake, "device_name", &c.device_name));
  constexpr int64_t kMaxBytes = int64_t{1} << 50;
  // A segment of 0 bytes is allowed: the objects then live in other clients' segments.
  HSX_RETURN_IF_ERROR(ReadInteger(mooncake, "global_segment_size", 0, kMaxBytes, &c.global_segment_size));
  HSX_RETURN_IF_ERROR(ReadInteger(mooncake, "local_buffer_size", 0, kMaxBytes, &c.local_buffer_size));
  int64_t threads = c.num_writer_threads;
  HSX_RETURN_IF_ERROR(ReadInteger(mooncake, "num_writer_threads", 1, 64, &threads));
  c.num_writer_threads = static_cast<int>(threads);
  if (c.local_hostname.empty()) return Error(kPrefix + "local_hostname must not be empty");
  if (c.metadata_server.empty()) return Error(kPrefix + "metadata_server must not be empty (P2PHANDSHAKE without one)");
  if (c.protocol != "tcp" && c.protocol != "rdma") {
    return Error(kPrefix + "protocol must be \"tcp\" or \"rdma\", got \"" + c.protocol + "\"");
  }
  auto hp = ParseHostPort(c.master_server_address);
  if (!hp.ok()) return hp.status().with_context(kPrefix + "master_server_address");
  return c;
}

}  // namespace hsx
