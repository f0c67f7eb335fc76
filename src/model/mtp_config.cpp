#include "model/mtp_config.h"

#include <filesystem>

#include "model/config_fields.h"
#include "util/json.h"
#include "util/text_file.h"

namespace hsx {
namespace {

using config::Fields;
using config::json;

// Gemma4AssistantConfig's defaults (transformers 5.17, configuration_gemma4_assistant.py).
const json& AssistantDefaults() {
  static const json kDefaults = json::parse(R"({"backbone_hidden_size": 1536, "use_ordered_embeddings": false,
      "num_centroids": 2048, "centroid_intermediate_top_k": 32, "tie_word_embeddings": true})");
  return kDefaults;
}

// Limits of the CUDA centroid head (one block's shared memory holds a row's centroid scores).
constexpr int kMaxCentroids = 8192;
constexpr int kMaxCentroidTopK = 256;

const char* TypeName(const LayerSpec& l) { return l.sliding ? "sliding_attention" : "full_attention"; }

}  // namespace

Result<MtpConfig> ParseMtpConfig(const std::string& json_text, const std::string& source_name) {
  HSX_ASSIGN_OR_RETURN(const json root, ParseJson(json_text, source_name));
  if (!root.is_object()) return Error(source_name + ": not a JSON object");
  Fields f(root, AssistantDefaults(), source_name);
  const json* arch = f.Get("architectures");
  if (arch == nullptr || !arch->is_array() || arch->size() != 1 || *arch->begin() != "Gemma4AssistantForCausalLM") {
    return f.Fail("architectures", "expected [\"Gemma4AssistantForCausalLM\"] (a Gemma 4 MTP assistant checkpoint)");
  }
  if (f.Has("model_type") && *f.Get("model_type") != "gemma4_assistant") {
    return f.Fail("model_type", "is " + f.Get("model_type")->dump() + ", expected \"gemma4_assistant\"");
  }
  f.Given("dtype");  // the weights carry their own dtype
  f.Given("torch_dtype");

  MtpConfig c;
  HSX_ASSIGN_OR_RETURN(c.backbone_hidden_size, f.Int("backbone_hidden_size"));
  HSX_ASSIGN_OR_RETURN(c.centroid_head, f.Bool("use_ordered_embeddings"));
  HSX_ASSIGN_OR_RETURN(c.num_centroids, f.Int("num_centroids"));
  HSX_ASSIGN_OR_RETURN(c.centroid_top_k, f.Int("centroid_intermediate_top_k"));
  HSX_ASSIGN_OR_RETURN(const bool tied, f.Bool("tie_word_embeddings", true));

  if (!f.Given("text_config") || !root["text_config"].is_object()) {
    return f.Fail("text_config", "missing (expected the drafter's gemma4_text decoder config object)");
  }
  // The decoder is parsed as a Gemma 4 text model. transformers forces every assistant
  // layer to be KV-shared (num_kv_shared_layers = num_hidden_layers); its K/V come from
  // the target, so hsx parses the layers as owning none and marks them afterwards.
  json text = root["text_config"];
  const std::string text_source = source_name + ": text_config";
  for (const char* key : {"hidden_size_per_layer_input", "vocab_size_per_layer_input"}) {
    if (!text.contains(key) || text[key] != 0) {
      return Error(text_source + ": field '" + key + "': must be 0 (an assistant has no per-layer inputs; got " +
                   (text.contains(key) ? text[key].dump() : std::string("none")) + ")");
    }
  }
  // transformers turns 0 or null into num_hidden_layers and refuses any other value.
  if (text.contains("num_kv_shared_layers") && !text["num_kv_shared_layers"].is_null() &&
      text["num_kv_shared_layers"] != 0 && text["num_kv_shared_layers"] != text.value("num_hidden_layers", json())) {
    return Error(text_source + ": field 'num_kv_shared_layers': every assistant layer reads the target's KV, so it must be "
                 "num_hidden_layers (or 0); got " + text["num_kv_shared_layers"].dump());
  }
  text["architectures"] = json::array({"Gemma4ForCausalLM"});
  text["num_kv_shared_layers"] = 0;
  HSX_ASSIGN_OR_RETURN(c.text, ParseModelConfig(text.dump(), text_source));
  for (LayerSpec& l : c.text.layers) l.kv_source = -1;
  c.text.tie_word_embeddings = tied;
  HSX_RETURN_IF_ERROR(f.CheckAllRead());

  if (c.centroid_head) {
    if (c.num_centroids > kMaxCentroids || c.text.vocab_size % c.num_centroids != 0) {
      return f.Fail("num_centroids", std::to_string(c.num_centroids) + " must divide text_config.vocab_size (" +
                                         std::to_string(c.text.vocab_size) + ") and be at most " +
                                         std::to_string(kMaxCentroids));
    }
    if (c.centroid_top_k > c.num_centroids || c.centroid_top_k > kMaxCentroidTopK) {
      return f.Fail("centroid_intermediate_top_k", std::to_string(c.centroid_top_k) +
                                                       " must be at most num_centroids and at most " +
                                                       std::to_string(kMaxCentroidTopK));
    }
  }
  return c;
}

Result<MtpConfig> LoadMtpConfig(const std::string& drafter_dir) {
  const std::string path = drafter_dir + "/config.json";
  if (!std::filesystem::exists(path)) return Error(path + ": cannot open (expected a Gemma 4 assistant checkpoint directory)");
  HSX_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  return ParseMtpConfig(text, path);
}

Result<std::vector<int>> MtpTargetKvLayers(const MtpConfig& drafter, const ModelConfig& target,
                                           const std::string& source_name) {
  const auto fail = [&](const std::string& where, const std::string& what) {
    return Error(source_name + ": " + where + ": " + what);
  };
  if (target.arch != Arch::kGemma4) {
    return Error(source_name + ": a Gemma 4 assistant drafts for Gemma 4 targets; the target is " + target.architecture);
  }
  if (drafter.backbone_hidden_size != target.hidden_size) {
    return fail("field 'backbone_hidden_size'", std::to_string(drafter.backbone_hidden_size) +
                                                    ", but the target's hidden_size is " + std::to_string(target.hidden_size));
  }
  if (drafter.text.vocab_size != target.vocab_size) {
    return fail("text_config: field 'vocab_size'", std::to_string(drafter.text.vocab_size) +
                                                       ", but the target's vocab_size is " + std::to_string(target.vocab_size));
  }
  std::vector<int> sources;
  for (int i = 0; i < drafter.text.num_layers; ++i) {
    const LayerSpec& l = drafter.text.layers[i];
    const std::string layer = "drafter layer " + std::to_string(i);
    int src = -1;
    for (int j = 0; j < target.num_layers; ++j) {
      if (target.layers[j].kv_source == j && target.layers[j].sliding == l.sliding) src = j;
    }
    if (src < 0) {
      return fail("text_config: field 'layer_types'", layer + " is " + TypeName(l) + ", but the target has no " +
                                                          TypeName(l) + " layer with its own KV cache to read");
    }
    const LayerSpec& t = target.layers[src];
    if (l.head_dim != t.head_dim) {
      return fail("text_config: field 'head_dim'", layer + " (" + TypeName(l) + ") has head_dim " +
                                                       std::to_string(l.head_dim) + ", but the target layer " +
                                                       std::to_string(src) + " whose KV it reads has " + std::to_string(t.head_dim));
    }
    if (l.num_kv_heads != t.num_kv_heads) {
      return fail("text_config: field 'num_key_value_heads'",
                  layer + " has " + std::to_string(l.num_kv_heads) + " KV heads, but the target layer " +
                      std::to_string(src) + " whose KV it reads has " + std::to_string(t.num_kv_heads));
    }
    sources.push_back(src);
  }
  return sources;
}

}  // namespace hsx
