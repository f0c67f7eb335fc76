#include "model/config_fingerprint.h"

#include <filesystem>

#include "model/gguf_config.h"
#include "model/gguf_file.h"
#include "util/json.h"
#include "util/stable_hash.h"
#include "util/text_file.h"

namespace hsx {

Result<std::string> ModelConfigFingerprint(const std::string& model) {
  if (IsGgufPath(model)) {
    HSX_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::Open(model));
    // Everything before the first tensor's data: the header, metadata and tensor infos.
    const char* begin = file.mapping()->data();
    size_t header = file.mapping()->size();
    for (const auto& t : file.tensors()) header = std::min(header, static_cast<size_t>(t.data - begin));
    return StableHashHex(std::string_view(begin, header));
  }
  if (!std::filesystem::is_directory(model)) return StableHashHex("named config: " + model);
  const std::string path = model + "/config.json";
  HSX_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  HSX_ASSIGN_OR_RETURN(nlohmann::json config, ParseJson(text, path));
  if (!config.is_object()) return Error(path + ": not a JSON object");
  // Bookkeeping that changes with the saving tool, not the model.
  for (auto it = config.begin(); it != config.end();) {
    if (it.key().starts_with("_") || it.key() == "transformers_version") it = config.erase(it);
    else ++it;
  }
  return StableHashHex(config.dump());  // nlohmann objects dump with sorted keys
}

}  // namespace hsx
