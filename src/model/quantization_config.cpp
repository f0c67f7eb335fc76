#include "model/quantization_config.h"

#include <set>

namespace hsx {
namespace {

using json = nlohmann::json;

// `want` must equal the field's value (absent counts as null).
Status Expect(const json& object, const std::string& key, const json& want, const std::string& where) {
  const json got = object.contains(key) ? object[key] : json();
  if (got == want) return {};
  return Error(where + ": field '" + key + "': " + got.dump() + " (hsx runs FP8 checkpoints in compressed-tensors' " +
               "dynamic scheme only: expected " + want.dump() + ")");
}

// weights: 8-bit float, symmetric, one static scale per output channel.
// input_activations: 8-bit float, symmetric, one scale per token computed at run time.
Status CheckArgs(const json& args, bool activations, const std::string& where) {
  if (!args.is_object()) {
    return Error(where + ": expected an object (hsx runs FP8 weights with FP8 activations quantized per token)");
  }
  HSX_RETURN_IF_ERROR(Expect(args, "num_bits", 8, where));
  HSX_RETURN_IF_ERROR(Expect(args, "type", "float", where));
  HSX_RETURN_IF_ERROR(Expect(args, "symmetric", true, where));
  HSX_RETURN_IF_ERROR(Expect(args, "strategy", activations ? "token" : "channel", where));
  HSX_RETURN_IF_ERROR(Expect(args, "dynamic", activations, where));
  for (const char* key : {"group_size", "block_structure"}) HSX_RETURN_IF_ERROR(Expect(args, key, json(), where));
  return {};
}

}  // namespace

Status CheckFp8DynamicQuantizationConfig(const json& q, const std::string& source) {
  const std::string where = source + ": quantization_config";
  if (!q.is_object()) return Error(where + ": expected an object");
  HSX_RETURN_IF_ERROR(Expect(q, "quant_method", "compressed-tensors", where));
  HSX_RETURN_IF_ERROR(Expect(q, "format", "float-quantized", where));
  HSX_RETURN_IF_ERROR(Expect(q, "kv_cache_scheme", json(), where));  // the KV cache stays bf16
  if (q.contains("sparsity_config") && !q["sparsity_config"].is_null() && !q["sparsity_config"].empty()) {
    return Error(where + ": field 'sparsity_config': sparse checkpoints are not supported");
  }
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty()) {
    return Error(where + ": field 'config_groups': expected an object of quantization groups");
  }
  for (const auto& [name, group] : q["config_groups"].items()) {
    const std::string at = where + ".config_groups." + name;
    if (!group.is_object()) return Error(at + ": expected an object");
    if (!group.contains("targets") || group["targets"] != json::array({"Linear"})) {
      return Error(at + ": field 'targets': expected [\"Linear\"]");
    }
    HSX_RETURN_IF_ERROR(CheckArgs(group.contains("weights") ? group["weights"] : json(), false, at + ".weights"));
    HSX_RETURN_IF_ERROR(CheckArgs(group.contains("input_activations") ? group["input_activations"] : json(), true,
                                  at + ".input_activations"));
    HSX_RETURN_IF_ERROR(Expect(group, "output_activations", json(), at));
  }
  return {};
}

}  // namespace hsx
