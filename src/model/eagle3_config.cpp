#include "model/eagle3_config.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "model/config_fields.h"
#include "util/json.h"
#include "util/text_file.h"

namespace hsx {
namespace {

using json = nlohmann::json;

// speculators' keys that cannot change the draft's computation: provenance, loading
// hints for trust_remote_code, training switches, the weights' dtype (hsx reads each
// tensor's own), HF's tensor/pipeline/expert-parallel plans and init flag (older
// speculators versions write them). architectures is HF's class name, which vLLM
// overwrites too.
const std::set<std::string>& IgnoredTopLevelFields() {
  static const std::set<std::string> kFields = {
      "architectures", "auto_map", "speculators_version", "embed_requires_grad", "dtype", "torch_dtype",
      "has_no_defaults_at_init", "base_model_tp_plan", "base_model_pp_plan", "base_model_ep_plan"};
  return kFields;
}

// transformer_layer_config is an HF config of the draft decoder; vLLM builds llama and
// qwen3 drafts (Eagle3LlamaForCausalLM, Eagle3Qwen3ForCausalLM) and refuses others.
// hsx resolves it with the same parser as a target's, under the matching class name.
// Llama has no layer types in transformers, but vLLM's Llama layers (the draft's) honour
// layer_types and sliding_window, as speculators writes them for sliding drafts; those
// are read here and applied after the parse.
Result<ModelConfig> ParseDecoder(const json& root, const std::string& source) {
  const std::string where = source + ": transformer_layer_config";
  if (!root.contains("transformer_layer_config") || !root["transformer_layer_config"].is_object()) {
    return Error(source + ": field 'transformer_layer_config': missing (expected the draft decoder's config object)");
  }
  json layer = root["transformer_layer_config"];
  if (!layer.contains("model_type") || !layer["model_type"].is_string()) {
    return Error(where + ": field 'model_type': missing (expected \"llama\" or \"qwen3\")");
  }
  const std::string model_type = layer["model_type"].get<std::string>();
  if (model_type != "llama" && model_type != "qwen3") {
    return Error(where + ": field 'model_type': '" + model_type + "' is not supported for EAGLE-3 drafts (supported: llama, qwen3)");
  }
  // The decoder is chosen by model_type; an architectures list (older HF versions write
  // one, or null) must agree with it.
  const std::string class_name = model_type == "llama" ? "LlamaForCausalLM" : "Qwen3ForCausalLM";
  if (layer.contains("architectures") && !layer["architectures"].is_null() &&
      layer["architectures"] != json::array({class_name})) {
    return Error(where + ": field 'architectures': " + layer["architectures"].dump() + " disagrees with model_type '" +
                 model_type + "' (expected null or [\"" + class_name + "\"])");
  }
  layer["architectures"] = json::array({class_name});

  std::vector<bool> sliding;
  int window = 0;
  if (model_type == "llama") {
    static const json kNone = json::object();
    const json sliding_keys = {{"layer_types", layer.value("layer_types", json())},
                               {"sliding_window", layer.value("sliding_window", json())},
                               {"use_sliding_window", layer.value("use_sliding_window", json())}};
    for (const char* key : {"layer_types", "sliding_window", "use_sliding_window"}) layer.erase(key);
    config::Fields f(sliding_keys, kNone, where);
    const json* types = f.Get("layer_types");
    HSX_ASSIGN_OR_RETURN(const bool use_sliding, f.Bool("use_sliding_window", true));
    if (!types->is_null()) {
      if (!types->is_array()) return f.Fail("layer_types", "expected a list of layer types");
      for (const json& t : *types) {
        if (t != "sliding_attention" && t != "full_attention") {
          return f.Fail("layer_types", "entries must be \"sliding_attention\" or \"full_attention\"");
        }
        sliding.push_back(t == "sliding_attention");
      }
    } else if (!sliding_keys["use_sliding_window"].is_null() && use_sliding) {
      return f.Fail("use_sliding_window", "true without layer_types: give layer_types to say which layers slide");
    }
    if (std::find(sliding.begin(), sliding.end(), true) != sliding.end()) {
      if (!use_sliding) return f.Fail("use_sliding_window", "false, but layer_types lists sliding_attention layers");
      HSX_ASSIGN_OR_RETURN(window, f.Int("sliding_window", 1, int64_t{1} << 30));
    }
  }

  HSX_ASSIGN_OR_RETURN(ModelConfig decoder, ParseModelConfig(layer.dump(), where));
  if (!sliding.empty()) {
    if (static_cast<int>(sliding.size()) != decoder.num_layers) {
      return Error(where + ": field 'layer_types': expected a list of " + std::to_string(decoder.num_layers) +
                   " layer types (num_hidden_layers)");
    }
    decoder.sliding_window = window;
    for (int i = 0; i < decoder.num_layers; ++i) decoder.layers[i].sliding = sliding[i] && window > 0;
  }
  return decoder;
}

// speculators_config: only the default proposal length matters to an engine (vLLM takes
// num_speculative_tokens from it when the user gives none); the rest is provenance.
Result<int> DefaultProposalLength(const config::Fields& top) {
  const json* sc = top.Get("speculators_config");
  if (sc == nullptr || sc->is_null()) return top.Fail("speculators_config", "missing (expected an object)");
  if (!sc->is_object()) return top.Fail("speculators_config", "expected an object");
  if (sc->contains("algorithm") && (*sc)["algorithm"] != "eagle3") {
    return top.Fail("speculators_config", "algorithm is " + (*sc)["algorithm"].dump() + ", expected \"eagle3\"");
  }
  if (!sc->contains("proposal_methods") || (*sc)["proposal_methods"].is_null()) return 0;
  const json& methods = (*sc)["proposal_methods"];
  if (!methods.is_array()) return top.Fail("speculators_config", "proposal_methods: expected a list");
  if (methods.empty() || !methods[0].is_object() || !methods[0].contains("speculative_tokens")) return 0;
  const json& k = methods[0]["speculative_tokens"];
  if (!k.is_number_integer() || !config::IntInRange(k, 1, 1024)) {
    return top.Fail("speculators_config", "proposal_methods[0].speculative_tokens: expected an integer in [1, 1024]");
  }
  return k.get<int>();
}

}  // namespace

Result<Eagle3Config> ParseEagle3Config(const std::string& json_text, const std::string& source_name,
                                       const ModelConfig& target) {
  HSX_ASSIGN_OR_RETURN(const json root, ParseJson(json_text, source_name));
  if (!root.is_object()) return Error(source_name + ": not a JSON object");
  static const json kNone = json::object();
  config::Fields f(root, kNone, source_name);
  Eagle3Config c;

  HSX_ASSIGN_OR_RETURN(const std::string type, f.String("speculators_model_type"));
  if (type != "eagle3") {
    return f.Fail("speculators_model_type", "'" + type + "' is not supported (hsx reads EAGLE-3 drafts: \"eagle3\")");
  }
  f.Given("transformer_layer_config");
  HSX_ASSIGN_OR_RETURN(c.decoder, ParseDecoder(root, source_name));
  const std::string layer_source = source_name + ": transformer_layer_config";
  if (c.decoder.hidden_size != target.hidden_size) {
    return Error(layer_source + ": field 'hidden_size': " + std::to_string(c.decoder.hidden_size) +
                 ", but the target's hidden size is " + std::to_string(target.hidden_size));
  }
  if (c.decoder.vocab_size != target.vocab_size) {
    return Error(layer_source + ": field 'vocab_size': " + std::to_string(c.decoder.vocab_size) +
                 ", but the target's vocabulary has " + std::to_string(target.vocab_size) + " tokens");
  }
  HSX_ASSIGN_OR_RETURN(auto target_hidden, f.OptionalInt("target_hidden_size", 1, config::kMaxSize));
  if (target_hidden && *target_hidden != target.hidden_size) {
    return f.Fail("target_hidden_size", std::to_string(*target_hidden) + ", but the target's hidden size is " +
                                            std::to_string(target.hidden_size));
  }

  HSX_ASSIGN_OR_RETURN(c.draft_vocab_size, f.Int("draft_vocab_size", 1, target.vocab_size));
  // speculators always writes it; vLLM defaults an absent one to true, speculators' class
  // to false, so a file without it is ambiguous.
  if (!f.Has("norm_before_residual")) {
    return f.Fail("norm_before_residual", "missing (expected true or false; vLLM and speculators default it differently)");
  }
  HSX_ASSIGN_OR_RETURN(c.norm_before_residual, f.Bool("norm_before_residual"));
  HSX_ASSIGN_OR_RETURN(c.norm_before_fc, f.Bool("norm_before_fc"));
  HSX_ASSIGN_OR_RETURN(c.fc_norm, f.Bool("fc_norm"));
  HSX_ASSIGN_OR_RETURN(c.norm_output, f.Bool("norm_output"));
  if (c.norm_before_fc && c.fc_norm) {
    return f.Fail("fc_norm", "true together with norm_before_fc (speculators allows one of the two)");
  }
  HSX_ASSIGN_OR_RETURN(const bool tied, f.Bool("tie_word_embeddings"));
  if (tied) return f.Fail("tie_word_embeddings", "true is not supported (a draft's LM head is its own tensor)");

  // Aux layer ids in vLLM's convention (id i < N: input of target layer i; id N: the last
  // layer's output before the final norm); null means vLLM's default (2, N/2, N-3). The
  // concat fed to fc is in ascending id order, as vLLM stores them.
  const int n = target.num_layers;
  const json* ids = f.Get("eagle_aux_hidden_state_layer_ids");
  if (ids == nullptr || ids->is_null()) {
    const std::set<int> defaults = {2, n / 2, n - 3};
    for (int id : defaults) {
      if (id < 0 || id > n) {
        return f.Fail("eagle_aux_hidden_state_layer_ids", "null, and the default ids (2, N/2, N-3) do not fit a target of " +
                                                              std::to_string(n) + " layers; give the ids");
      }
    }
    c.aux_layer_ids.assign(defaults.begin(), defaults.end());
  } else {
    HSX_ASSIGN_OR_RETURN(c.aux_layer_ids, f.IntList("eagle_aux_hidden_state_layer_ids", 0, n));
    if (c.aux_layer_ids.empty()) return f.Fail("eagle_aux_hidden_state_layer_ids", "empty (expected target layer ids)");
    std::sort(c.aux_layer_ids.begin(), c.aux_layer_ids.end());
    if (std::adjacent_find(c.aux_layer_ids.begin(), c.aux_layer_ids.end()) != c.aux_layer_ids.end()) {
      return f.Fail("eagle_aux_hidden_state_layer_ids", "lists a layer id twice");
    }
  }

  HSX_ASSIGN_OR_RETURN(c.num_speculative_tokens, DefaultProposalLength(f));
  HSX_RETURN_IF_ERROR(f.CheckAllRead(IgnoredTopLevelFields()));
  return c;
}

Result<Eagle3Config> LoadEagle3Config(const std::string& draft_dir, const ModelConfig& target) {
  const std::string path = draft_dir + "/config.json";
  if (!std::filesystem::exists(path)) return Error(path + ": cannot open (is it a speculators EAGLE-3 checkpoint directory?)");
  HSX_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  return ParseEagle3Config(text, path, target);
}

}  // namespace hsx
