#include "engine/speculative_config.h"

#include <algorithm>
#include <set>

#include "util/json.h"

namespace hsx {
namespace {

constexpr const char* kWhere = "--speculative-config: ";

Status RefuseOtherFields(const nlohmann::json& j, const std::set<std::string>& known, const std::string& method) {
  for (const auto& [key, value] : j.items()) {
    if (!known.count(key)) return Error(std::string(kWhere) + "field \"" + key + "\" is not taken by method \"" + method + "\"");
  }
  return {};
}

Result<int> PositiveInt(const nlohmann::json& j, const std::string& field) {
  if (!j.contains(field)) return Error(std::string(kWhere) + "\"" + field + "\" is required");
  const auto& v = j[field];
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 64) {
    return Error(std::string(kWhere) + "\"" + field + "\" must be an integer in [1, 64], got " + v.dump());
  }
  return static_cast<int>(v.get<int64_t>());
}

Result<std::vector<int>> AuxLayerIds(const nlohmann::json& j, int num_layers) {
  const nlohmann::json* ids = nullptr;
  if (j.contains("draft_model_config") && j["draft_model_config"].is_object() &&
      j["draft_model_config"].contains("hf_config") && j["draft_model_config"]["hf_config"].is_object() &&
      j["draft_model_config"]["hf_config"].contains("eagle_aux_hidden_state_layer_ids")) {
    ids = &j["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"];
  }
  if (ids == nullptr || !ids->is_array() || ids->empty()) {
    return Error(std::string(kWhere) +
                 "expected draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids, a list of layer ids");
  }
  std::vector<int> layers;
  for (const auto& v : *ids) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > num_layers) {
      return Error(std::string(kWhere) + "layer id " + v.dump() + " is out of range [0, " + std::to_string(num_layers) + "]");
    }
    if (std::find(layers.begin(), layers.end(), v.get<int>()) != layers.end()) {
      return Error(std::string(kWhere) + "layer id " + v.dump() + " is given twice");
    }
    layers.push_back(v.get<int>());
  }
  std::sort(layers.begin(), layers.end());
  return layers;
}

// "draft_length": "adaptive" | "fixed" (absent: fixed).
Result<bool> AdaptiveDraftLength(const nlohmann::json& j) {
  if (!j.contains("draft_length")) return false;
  const nlohmann::json& v = j["draft_length"];
  if (v.is_string() && (v == "adaptive" || v == "fixed")) return v == "adaptive";
  return Error(std::string(kWhere) + "\"draft_length\" must be \"adaptive\" or \"fixed\" (got " + v.dump() + ")");
}

// vLLM's "speculative_token_tree": a string holding a Python list of paths. vLLM verifies
// num_speculative_tokens drafts a request, one per node, so a given K must be the node count.
Status ParseTree(const nlohmann::json& j, SpeculativeConfig& config) {
  const std::string field = std::string(kWhere) + "\"speculative_token_tree\"";
  const nlohmann::json& v = j["speculative_token_tree"];
  if (!v.is_string()) {
    return Error(field + " must be a string holding a Python list of paths, e.g. \"[(0,), (1,), (0, 0)]\" (got " +
                 v.dump() + ")");
  }
  HSX_ASSIGN_OR_RETURN(TokenTree tree, TokenTree::Parse(v.get<std::string>(), field));
  if (config.num_speculative_tokens > 0 && config.num_speculative_tokens != tree.size()) {
    return Error(std::string(kWhere) + "\"num_speculative_tokens\" (" + std::to_string(config.num_speculative_tokens) +
                 ") must equal the number of nodes of \"speculative_token_tree\" (" + std::to_string(tree.size()) +
                 "), as in vLLM; leave it out to take the tree's");
  }
  if (config.adaptive_draft_length) {
    return Error(std::string(kWhere) + "\"speculative_token_tree\" does not go with \"draft_length\": \"adaptive\" yet");
  }
  config.num_speculative_tokens = tree.size();
  if (!tree.is_chain()) config.token_tree = std::move(tree);
  return {};
}

// SGLang's "speculative_eagle_topk" and "speculative_num_steps": EAGLE-2's dynamic trees,
// num_speculative_tokens candidates verified (SGLang's num_draft_tokens less the root).
Status ParseDynamicTree(const nlohmann::json& j, SpeculativeConfig& config) {
  const std::string where = std::string(kWhere) + "dynamic trees (\"speculative_eagle_topk\", \"speculative_num_steps\"): ";
  if (!j.contains("speculative_eagle_topk") || !j.contains("speculative_num_steps")) {
    return Error(where + "give both");
  }
  if (j.contains("speculative_token_tree")) return Error(where + "not with \"speculative_token_tree\" (a static tree)");
  if (config.adaptive_draft_length) return Error(where + "not with \"draft_length\": \"adaptive\" yet");
  if (config.num_speculative_tokens == 0) {
    return Error(where + "\"num_speculative_tokens\" (the candidates verified a step) is required");
  }
  DynamicTreeConfig tree;
  HSX_ASSIGN_OR_RETURN(tree.topk, PositiveInt(j, "speculative_eagle_topk"));
  HSX_ASSIGN_OR_RETURN(tree.depth, PositiveInt(j, "speculative_num_steps"));
  if (tree.topk > DynamicTreeConfig::kMaxTopk) {
    return Error(where + "\"speculative_eagle_topk\" must be at most " + std::to_string(DynamicTreeConfig::kMaxTopk) +
                 ", got " + std::to_string(tree.topk));
  }
  // One 64-bit ancestor mask a row: the expanded nodes' scratch slots, and the verified nodes.
  if (tree.expanded_nodes() > TokenTree::kMaxNodes) {
    return Error(where + "(speculative_num_steps - 1) x speculative_eagle_topk = " + std::to_string(tree.expanded_nodes()) +
                 " nodes expanded, at most " + std::to_string(TokenTree::kMaxNodes) + " are supported");
  }
  const int most = std::min(TokenTree::kMaxNodes, tree.candidates(tree.depth));
  if (config.num_speculative_tokens > most) {
    return Error(where + "\"num_speculative_tokens\" (" + std::to_string(config.num_speculative_tokens) +
                 ") must be at most " + std::to_string(most) + " (the candidates a round scores, " +
                 std::to_string(tree.candidates(tree.depth)) + ", and at most " + std::to_string(TokenTree::kMaxNodes) +
                 " verification rows)");
  }
  config.dynamic_tree = tree;
  return {};
}

}  // namespace

Result<SpeculativeConfig> ParseSpeculativeConfig(const std::string& text, int num_layers) {
  auto parsed = ParseJson(text, "--speculative-config");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return Error(std::string(kWhere) + "not a JSON object");
  if (!j.contains("method") || !j["method"].is_string()) return Error(std::string(kWhere) + "\"method\" (a string) is required");
  const std::string method = j["method"].get<std::string>();
  SpeculativeConfig config;
  if (method == "extract_hidden_states") {
    HSX_RETURN_IF_ERROR(RefuseOtherFields(j, {"method", "num_speculative_tokens", "draft_model_config"}, method));
    config.method = SpeculativeConfig::Method::kExtractHiddenStates;
    HSX_ASSIGN_OR_RETURN(config.capture_layers, AuxLayerIds(j, num_layers));
    return config;
  }
  if (method == "ngram") {
    HSX_RETURN_IF_ERROR(RefuseOtherFields(
        j, {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "draft_length"}, method));
    HSX_ASSIGN_OR_RETURN(config.adaptive_draft_length, AdaptiveDraftLength(j));
    config.method = SpeculativeConfig::Method::kNgram;
    HSX_ASSIGN_OR_RETURN(config.ngram.num_speculative_tokens, PositiveInt(j, "num_speculative_tokens"));
    // vLLM's defaults: both 5 when neither is given, else the one given for both.
    const bool has_min = j.contains("prompt_lookup_min"), has_max = j.contains("prompt_lookup_max");
    int lookup_min = 5, lookup_max = 5;
    if (has_min) {
      HSX_ASSIGN_OR_RETURN(lookup_min, PositiveInt(j, "prompt_lookup_min"));
    }
    if (has_max) {
      HSX_ASSIGN_OR_RETURN(lookup_max, PositiveInt(j, "prompt_lookup_max"));
    }
    if (has_min && !has_max) lookup_max = lookup_min;
    if (has_max && !has_min) lookup_min = lookup_max;
    if (lookup_min > lookup_max) {
      return Error(std::string(kWhere) + "prompt_lookup_min (" + std::to_string(lookup_min) +
                   ") must be <= prompt_lookup_max (" + std::to_string(lookup_max) + ")");
    }
    config.ngram.prompt_lookup_min = lookup_min;
    config.ngram.prompt_lookup_max = lookup_max;
    return config;
  }
  if (method == "eagle3" || method == "mtp") {
    std::set<std::string> fields = {"method", "model", "num_speculative_tokens", "draft_length"};
    if (method == "eagle3") fields.insert({"speculative_token_tree", "speculative_eagle_topk", "speculative_num_steps"});
    HSX_RETURN_IF_ERROR(RefuseOtherFields(j, fields, method));
    HSX_ASSIGN_OR_RETURN(config.adaptive_draft_length, AdaptiveDraftLength(j));
    config.method = method == "eagle3" ? SpeculativeConfig::Method::kEagle3 : SpeculativeConfig::Method::kMtp;
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty()) {
      return Error(std::string(kWhere) + "\"model\" (the draft's directory) is required");
    }
    config.model = j["model"].get<std::string>();
    if (j.contains("num_speculative_tokens") || method == "mtp") {
      HSX_ASSIGN_OR_RETURN(config.num_speculative_tokens, PositiveInt(j, "num_speculative_tokens"));
    }
    if (j.contains("speculative_eagle_topk") || j.contains("speculative_num_steps")) {
      HSX_RETURN_IF_ERROR(ParseDynamicTree(j, config));
    } else if (j.contains("speculative_token_tree")) {
      HSX_RETURN_IF_ERROR(ParseTree(j, config));
    }
    return config;
  }
  return Error(std::string(kWhere) + "unknown method \"" + method + "\" (expected extract_hidden_states, ngram, eagle3 or mtp)");
}

}  // namespace hsx
