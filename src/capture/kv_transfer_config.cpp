#include "capture/kv_transfer_config.h"

#include <filesystem>

#include "capture/mooncake_sink.h"
#include "capture/safetensors_sink.h"
#include "util/json.h"

namespace hsx {
namespace {

constexpr const char* kFp8ModulePath = "hs_connectors.fp8_hidden_states_connector";
constexpr const char* kMooncakeModulePath = "hs_connectors.mooncake_hidden_states_connector";

}  // namespace

Result<KvTransferConfig> ParseKvTransferConfig(std::string_view text, const std::string& flag,
                                               const std::string& default_storage_dir) {
  HSX_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, flag));
  const std::string where = flag + ": ";
  if (!j.is_object()) return Error(where + "not a JSON object");
  KvTransferConfig config;
  const auto field = [&](const nlohmann::json& object, const char* name) -> const nlohmann::json* {
    auto it = object.find(name);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  };
  const nlohmann::json* connector = field(j, "kv_connector");
  if (connector == nullptr || !connector->is_string()) return Error(where + "kv_connector (a string) is required");
  const std::string name = connector->get<std::string>();
  config.name = name;
  std::string module_path;
  if (const nlohmann::json* m = field(j, "kv_connector_module_path")) {
    if (!m->is_string()) return Error(where + "kv_connector_module_path must be a string");
    module_path = m->get<std::string>();
  }
  if (name == "ExampleHiddenStatesConnector") {
    config.connector = KvTransferConfig::Connector::kFiles;
  } else if (name == "FP8HiddenStatesConnector") {
    config.connector = KvTransferConfig::Connector::kFp8Files;
  } else if (name == "MooncakeHiddenStatesConnector") {
    config.connector = KvTransferConfig::Connector::kMooncake;
  } else {
    return Error(where + "kv_connector '" + name +
                 "' is not a hidden-state connector hsx knows: ExampleHiddenStatesConnector, "
                 "FP8HiddenStatesConnector or MooncakeHiddenStatesConnector");
  }
  // An out-of-tree connector is named with its module; hsx implements hs-connectors' own.
  const char* expected_module = config.connector == KvTransferConfig::Connector::kFp8Files   ? kFp8ModulePath
                                : config.connector == KvTransferConfig::Connector::kMooncake ? kMooncakeModulePath
                                                                                             : "";
  if (!module_path.empty() && module_path != expected_module) {
    return Error(where + "kv_connector_module_path '" + module_path + "' is not " +
                 (*expected_module ? "'" + std::string(expected_module) + "', the module hsx implements " + name + " as"
                                   : "expected for the built-in " + name));
  }
  if (const nlohmann::json* role = field(j, "kv_role"); role && (!role->is_string() || *role == "kv_consumer")) {
    return Error(where + "kv_role must be \"kv_producer\" or \"kv_both\": hsx produces hidden states");
  }
  nlohmann::json extra = nlohmann::json::object();
  if (const nlohmann::json* e = field(j, "kv_connector_extra_config")) {
    if (!e->is_object()) return Error(where + "kv_connector_extra_config must be an object");
    extra = *e;
  }
  const std::string ex = where + "kv_connector_extra_config.";
  if (config.connector == KvTransferConfig::Connector::kMooncake) {
    const nlohmann::json* mooncake = field(extra, "mooncake");
    if (mooncake == nullptr || !mooncake->is_object()) return Error(ex + "mooncake (an object) is required");
    config.mooncake = *mooncake;
    // The writer pool runs as many puts at once as the sink has channels; MakeMooncakeSink checks the value.
    if (auto n = mooncake->find("num_writer_threads"); n != mooncake->end() && n->is_number_integer() && *n >= 1 && *n <= 64) {
      config.writer_threads = n->get<int>();
    } else if (n == mooncake->end()) {
      config.writer_threads = 4;  // MooncakeStoreConfig's default
    }
    return config;
  }
  const nlohmann::json* dir = field(extra, "shared_storage_path");
  if (dir == nullptr && !default_storage_dir.empty()) {
    config.storage_dir = default_storage_dir;
  } else if (dir == nullptr || !dir->is_string() || dir->get<std::string>().empty()) {
    return Error(ex + "shared_storage_path (a directory) is required");
  } else {
    config.storage_dir = dir->get<std::string>();
  }
  config.storage_dir = std::filesystem::absolute(config.storage_dir).lexically_normal().string();
  while (config.storage_dir.size() > 1 && config.storage_dir.back() == '/') config.storage_dir.pop_back();
  if (const nlohmann::json* n = field(extra, "num_writer_threads")) {
    if (!n->is_number_integer() || *n < 1 || *n > 256) return Error(ex + "num_writer_threads must be an integer in [1, 256]");
    config.writer_threads = n->get<int>();
  }
  if (const nlohmann::json* lock = field(extra, "use_synchronization_lock")) {
    if (!lock->is_boolean()) return Error(ex + "use_synchronization_lock must be true or false");
    config.use_lock = lock->get<bool>();
  }
  return config;
}

Result<std::unique_ptr<CaptureSink>> MakeCaptureSink(const KvTransferConfig& config, bool exclusive_names) {
  if (config.connector == KvTransferConfig::Connector::kMooncake) {
    return MakeMooncakeSink(config.mooncake);
  }
  std::error_code ec;
  std::filesystem::create_directories(config.storage_dir, ec);
  if (!std::filesystem::is_directory(config.storage_dir)) {
    return Error("shared_storage_path " + config.storage_dir + " cannot be created" + (ec ? ": " + ec.message() : ""));
  }
  SafetensorsSink::Options options;
  options.dir = config.storage_dir;
  options.format = config.connector == KvTransferConfig::Connector::kFp8Files ? StatesFormat::kFp8 : StatesFormat::kAsCaptured;
  options.lock = config.use_lock;
  options.exclusive = exclusive_names;
  return std::unique_ptr<CaptureSink>(std::make_unique<SafetensorsSink>(std::move(options)));
}

}  // namespace hsx
