#include "model/quantization_config.h"

#include <regex>
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

Status CheckMxfp4QuantizationConfig(const json& q, int num_layers, const std::string& source) {
  const std::string where = source + ": quantization_config";
  if (!q.is_object()) return Error(where + ": expected an object");
  for (const auto& [key, value] : q.items()) {
    if (key == "quant_method") continue;
    if (key == "dequantize") {  // how transformers runs the same weights (bf16 or its kernels)
      if (!value.is_boolean()) return Error(where + ": field 'dequantize': expected true or false");
      continue;
    }
    if (key == "modules_to_not_convert") {
      if (value.is_null()) continue;
      if (!value.is_array()) return Error(where + ": field 'modules_to_not_convert': expected a list of module names");
      for (const json& pattern : value) {
        if (!pattern.is_string()) return Error(where + ": field 'modules_to_not_convert': entries must be strings");
        // transformers keeps a module when re.match(pattern, name) does (a prefix match).
        std::regex re;
        try {
          re = std::regex(pattern.get<std::string>(), std::regex::ECMAScript);
        } catch (const std::regex_error&) {
          return Error(where + ": field 'modules_to_not_convert': '" + pattern.get<std::string>() + "' is not a regular expression");
        }
        for (int i = 0; i < num_layers; ++i) {
          const std::string experts = "model.layers." + std::to_string(i) + ".mlp.experts";
          if (std::regex_search(experts, re, std::regex_constants::match_continuous)) {
            return Error(where + ": field 'modules_to_not_convert': '" + pattern.get<std::string>() + "' keeps '" +
                         experts + "' unquantized; hsx reads MXFP4 checkpoints with every layer's experts quantized");
          }
        }
      }
      continue;
    }
    return Error(where + ": field '" + key + "' is not supported for MXFP4 checkpoints (expected only quant_method, " +
                 "modules_to_not_convert, dequantize)");
  }
  return {};
}

}  // namespace hsx
