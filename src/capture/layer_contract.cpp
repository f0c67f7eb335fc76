#include "capture/layer_contract.h"

#include "util/json.h"

namespace hsx {
namespace {

constexpr const char* kFormat = "hsx.contract";  // the contract's own version
constexpr const char* kLayerIds = "hsx.layer_ids";
constexpr const char* kModel = "hsx.model_config_hash";
constexpr const char* kTokenizer = "hsx.tokenizer_hash";
constexpr const char* kDType = "hsx.dtype";
constexpr const char* kVersion = "hsx.version";

}  // namespace

std::map<std::string, std::string> LayerContract::ToMetadata() const {
  return {{kFormat, "1"},
          {kLayerIds, nlohmann::json(layer_ids).dump()},
          {kModel, model_config_hash},
          {kTokenizer, tokenizer_hash},
          {kDType, dtype},
          {kVersion, hsx_version}};
}

Result<LayerContract> LayerContract::FromMetadata(const std::map<std::string, std::string>& metadata,
                                                  const std::string& where) {
  auto get = [&](const char* key) -> Result<std::string> {
    auto it = metadata.find(key);
    if (it == metadata.end()) return Error(where + ": __metadata__ has no '" + key + "' (not written by hsx, or by one older than its layer contract)");
    return it->second;
  };
  HSX_ASSIGN_OR_RETURN(const std::string format, get(kFormat));
  if (format != "1") return Error(where + ": __metadata__ '" + kFormat + "' is '" + format + "'; this hsx reads version 1");
  LayerContract c;
  HSX_ASSIGN_OR_RETURN(const std::string ids, get(kLayerIds));
  auto parsed = ParseJson(ids, where + ": __metadata__ '" + kLayerIds + "'");
  if (!parsed.ok()) return parsed.status();
  if (!parsed->is_array() || parsed->empty()) return Error(where + ": __metadata__ '" + kLayerIds + "' is not a list of layer ids");
  for (const auto& id : *parsed) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > 1 << 20) {
      return Error(where + ": __metadata__ '" + kLayerIds + "' holds '" + id.dump() + "', not a layer id");
    }
    c.layer_ids.push_back(id.get<int>());
  }
  HSX_ASSIGN_OR_RETURN(c.model_config_hash, get(kModel));
  HSX_ASSIGN_OR_RETURN(c.tokenizer_hash, get(kTokenizer));
  HSX_ASSIGN_OR_RETURN(c.dtype, get(kDType));
  HSX_ASSIGN_OR_RETURN(c.hsx_version, get(kVersion));
  return c;
}

}  // namespace hsx
