#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace hsx {
namespace {

using json = nlohmann::json;

// Typed access to config fields with errors that name the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  bool Has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

  Result<int> Int(const std::string& key) const {
    if (!Has(key)) return Missing(key, "an integer");
    if (!j_[key].is_number_integer()) return Wrong(key, "an integer");
    return j_[key].get<int>();
  }
  Result<int> Int(const std::string& key, int fallback) const { return Has(key) ? Int(key) : Result<int>(fallback); }

  Result<double> Number(const std::string& key) const {
    if (!Has(key)) return Missing(key, "a number");
    if (!j_[key].is_number()) return Wrong(key, "a number");
    return j_[key].get<double>();
  }
  Result<double> Number(const std::string& key, double fallback) const {
    return Has(key) ? Number(key) : Result<double>(fallback);
  }

  Result<bool> Bool(const std::string& key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!j_[key].is_boolean()) return Wrong(key, "true or false");
    return j_[key].get<bool>();
  }

  Result<std::string> String(const std::string& key) const {
    if (!Has(key)) return Missing(key, "a string");
    if (!j_[key].is_string()) return Wrong(key, "a string");
    return j_[key].get<std::string>();
  }

  const json& raw() const { return j_; }
  const std::string& source() const { return source_; }
  Status Fail(const std::string& key, const std::string& what) const {
    return Error(source_ + ": field '" + key + "': " + what);
  }

 private:
  Status Missing(const std::string& key, const char* expected) const {
    return Fail(key, std::string("missing (expected ") + expected + ")");
  }
  Status Wrong(const std::string& key, const char* expected) const {
    return Fail(key, "is " + std::string(j_[key].type_name()) + ", expected " + expected);
  }
  const json& j_;
  std::string source_;
};

Result<Arch> ParseArch(const Fields& f) {
  if (!f.raw().contains("architectures") || !f.raw()["architectures"].is_array() ||
      f.raw()["architectures"].empty() || !f.raw()["architectures"][0].is_string()) {
    return f.Fail("architectures", "missing (expected a list naming the model class)");
  }
  const std::string name = f.raw()["architectures"][0].get<std::string>();
  static const std::map<std::string, Arch> kArchs = {
      {"LlamaForCausalLM", Arch::kLlama},     {"Qwen2ForCausalLM", Arch::kQwen2},
      {"Qwen3ForCausalLM", Arch::kQwen3},     {"Qwen3MoeForCausalLM", Arch::kQwen3Moe},
      {"Gemma3ForCausalLM", Arch::kGemma3},   {"Gemma4ForCausalLM", Arch::kGemma4},
      {"Gemma3ForConditionalGeneration", Arch::kGemma3}, {"Gemma4ForConditionalGeneration", Arch::kGemma4},
  };
  auto it = kArchs.find(name);
  if (it == kArchs.end()) {
    return f.Fail("architectures", "unsupported architecture '" + name +
                                       "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                                       "Qwen3MoeForCausalLM, Gemma3ForCausalLM, Gemma4ForCausalLM)");
  }
  return it->second;
}

Result<RopeSpec> ParseRope(const Fields& f, const json& params, const std::string& key) {
  if (!params.is_object()) return f.Fail(key, "expected an object");
  Fields p(params, f.source() + ": " + key);
  RopeSpec rope;
  HSX_ASSIGN_OR_RETURN(rope.theta, p.Number("rope_theta", f.Has("rope_theta") ? f.raw()["rope_theta"].get<double>() : 10000.0));
  HSX_ASSIGN_OR_RETURN(rope.partial_rotary_factor, p.Number("partial_rotary_factor", 1.0));
  const std::string type = p.Has("rope_type") && params["rope_type"].is_string() ? params["rope_type"].get<std::string>() : "default";
  if (type == "default") {
    rope.type = RopeSpec::Type::kDefault;
  } else if (type == "llama3") {
    rope.type = RopeSpec::Type::kLlama3;
    HSX_ASSIGN_OR_RETURN(rope.factor, p.Number("factor"));
    HSX_ASSIGN_OR_RETURN(rope.low_freq_factor, p.Number("low_freq_factor"));
    HSX_ASSIGN_OR_RETURN(rope.high_freq_factor, p.Number("high_freq_factor"));
    HSX_ASSIGN_OR_RETURN(rope.original_max_position_embeddings, p.Number("original_max_position_embeddings"));
  } else if (type == "proportional") {
    rope.type = RopeSpec::Type::kProportional;
  } else {
    return p.Fail("rope_type", "unsupported '" + type + "' (supported: default, llama3, proportional)");
  }
  return rope;
}

// rope_parameters is either one object or, for models that mix layer types, an object
// keyed by layer type ("sliding_attention", "full_attention").
Result<RopeSpec> RopeForLayerType(const Fields& f, const std::string& layer_type) {
  if (!f.Has("rope_parameters")) {
    RopeSpec rope;
    HSX_ASSIGN_OR_RETURN(rope.theta, f.Number("rope_theta", 10000.0));
    return rope;
  }
  const json& rp = f.raw()["rope_parameters"];
  if (rp.is_object() && rp.contains(layer_type)) return ParseRope(f, rp[layer_type], "rope_parameters." + layer_type);
  return ParseRope(f, rp, "rope_parameters");
}

Status ParseLayers(const Fields& f, ModelConfig& c) {
  std::vector<std::string> types;
  if (f.Has("layer_types")) {
    const json& lt = f.raw()["layer_types"];
    if (!lt.is_array() || static_cast<int>(lt.size()) != c.num_layers) {
      return f.Fail("layer_types", "expected a list of " + std::to_string(c.num_layers) + " layer types");
    }
    for (const auto& t : lt) {
      if (!t.is_string() || (t != "sliding_attention" && t != "full_attention")) {
        return f.Fail("layer_types", "entries must be \"sliding_attention\" or \"full_attention\"");
      }
      types.push_back(t.get<std::string>());
    }
  } else if (c.arch == Arch::kGemma3 || c.arch == Arch::kGemma4) {
    HSX_ASSIGN_OR_RETURN(int pattern, f.Int("sliding_window_pattern", 6));
    for (int i = 0; i < c.num_layers; ++i) types.push_back((i + 1) % pattern ? "sliding_attention" : "full_attention");
  } else {
    types.assign(c.num_layers, "full_attention");
  }

  // Gemma 4 always ends on a full-attention layer (HF forces it).
  if (c.arch == Arch::kGemma4) types.back() = "full_attention";
  // Qwen3 configs without head_dim mean 128, not hidden_size / heads.
  const bool qwen3 = c.arch == Arch::kQwen3 || c.arch == Arch::kQwen3Moe;
  HSX_ASSIGN_OR_RETURN(int head_dim, f.Int("head_dim", qwen3 ? 128 : c.hidden_size / c.num_heads));
  HSX_ASSIGN_OR_RETURN(int kv_heads, f.Int("num_key_value_heads", c.num_heads));
  HSX_ASSIGN_OR_RETURN(bool k_eq_v, f.Bool("attention_k_eq_v", false));
  HSX_ASSIGN_OR_RETURN(int shared, f.Int("num_kv_shared_layers", 0));
  if (shared < 0 || shared >= c.num_layers) return f.Fail("num_kv_shared_layers", "must be in [0, num_hidden_layers)");
  const json* per_layer = f.Has("per_layer_config") ? &f.raw()["per_layer_config"] : nullptr;
  if (per_layer && !per_layer->is_object()) return f.Fail("per_layer_config", "expected an object keyed by layer index");

  std::vector<int> mlp_only;
  if (f.Has("mlp_only_layers")) mlp_only = f.raw()["mlp_only_layers"].get<std::vector<int>>();
  HSX_ASSIGN_OR_RETURN(int sparse_step, f.Int("decoder_sparse_step", 1));

  c.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    LayerSpec& l = c.layers[i];
    l.sliding = types[i] == "sliding_attention";
    l.head_dim = head_dim;
    l.num_kv_heads = kv_heads;
    if (per_layer && per_layer->contains(std::to_string(i))) {
      Fields pl((*per_layer)[std::to_string(i)], f.source() + ": per_layer_config." + std::to_string(i));
      HSX_ASSIGN_OR_RETURN(l.head_dim, pl.Int("head_dim", head_dim));
      HSX_ASSIGN_OR_RETURN(l.num_kv_heads, pl.Int("num_key_value_heads", kv_heads));
    } else if (!per_layer && c.arch == Arch::kGemma4 && !l.sliding) {
      // Hub configs give full-attention layers their own head dim (and, with k=v, KV heads).
      HSX_ASSIGN_OR_RETURN(l.head_dim, f.Int("global_head_dim", 512));
      if (k_eq_v) {
        HSX_ASSIGN_OR_RETURN(l.num_kv_heads, f.Int("num_global_key_value_heads", kv_heads));
      }
    }
    if (l.head_dim <= 0 || l.num_kv_heads <= 0 || c.num_heads % l.num_kv_heads != 0) {
      return f.Fail("num_key_value_heads", "layer " + std::to_string(i) + ": need head_dim > 0 and num_attention_heads (" +
                                               std::to_string(c.num_heads) + ") divisible by num_key_value_heads (" +
                                               std::to_string(l.num_kv_heads) + ")");
    }
    l.k_eq_v = k_eq_v && !l.sliding;
    HSX_ASSIGN_OR_RETURN(l.rope, RopeForLayerType(f, types[i]));
    l.moe = c.num_experts > 0 && std::find(mlp_only.begin(), mlp_only.end(), i) == mlp_only.end() &&
            (i + 1) % sparse_step == 0;
    l.kv_source = i;
  }
  // The last `shared` layers reuse the KV of the last earlier layer of the same type.
  const int first_shared = c.num_layers - shared;
  for (int i = first_shared; i < c.num_layers; ++i) {
    int src = -1;
    for (int j = first_shared - 1; j >= 0; --j)
      if (c.layers[j].sliding == c.layers[i].sliding) { src = j; break; }
    if (src < 0) return f.Fail("num_kv_shared_layers", "layer " + std::to_string(i) + " has no earlier layer of its type to share KV with");
    c.layers[i].kv_source = src;
  }
  return {};
}

}  // namespace

int ModelConfig::num_kv_layers() const {
  int n = 0;
  for (int i = 0; i < num_layers; ++i) n += layers[i].kv_source == i;
  return n;
}

float ModelConfig::attention_scale(int layer) const {
  if (attn_scale > 0.0f) return attn_scale;
  return 1.0f / std::sqrt(static_cast<float>(layers[layer].head_dim));
}

Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source_name) {
  const json root = json::parse(json_text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) return Error(source_name + ": not a JSON object");
  ModelConfig c;
  {
    Fields top(root, source_name);
    HSX_ASSIGN_OR_RETURN(c.arch, ParseArch(top));
    c.architecture = root["architectures"][0].get<std::string>();
  }
  // Multimodal checkpoints nest the language model's config in text_config.
  const json& j = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  Fields f(j, root.contains("text_config") ? source_name + ": text_config" : source_name);

  for (const json* src : {&j, &root}) {
    const char* key = src->contains("dtype") ? "dtype" : "torch_dtype";
    if (!src->contains(key) || !(*src)[key].is_string()) continue;
    auto dt = ParseFloatDTypeName((*src)[key].get<std::string>());
    if (!dt) return f.Fail(key, "unsupported dtype '" + (*src)[key].get<std::string>() + "' (expected bfloat16, float16 or float32)");
    c.dtype = *dt;
    break;
  }

  HSX_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size"));
  HSX_ASSIGN_OR_RETURN(c.num_layers, f.Int("num_hidden_layers"));
  HSX_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
  HSX_ASSIGN_OR_RETURN(c.num_heads, f.Int("num_attention_heads"));
  HSX_ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings", 4096));
  HSX_ASSIGN_OR_RETURN(double eps, f.Number("rms_norm_eps", 1e-6));
  c.rms_norm_eps = static_cast<float>(eps);
  if (c.hidden_size <= 0 || c.num_layers <= 0 || c.vocab_size <= 0 || c.num_heads <= 0) {
    return Error(f.source() + ": hidden_size, num_hidden_layers, vocab_size and num_attention_heads must be positive");
  }
  {
    // Gemma ties by default; the flag may sit at the top level or in text_config.
    const bool fallback = c.arch == Arch::kGemma3 || c.arch == Arch::kGemma4;
    HSX_ASSIGN_OR_RETURN(c.tie_word_embeddings, Fields(root, source_name).Bool("tie_word_embeddings", fallback));
    HSX_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", c.tie_word_embeddings));
  }

  for (const json* src : {&j, &root}) {
    if (!src->contains("eos_token_id") || (*src)["eos_token_id"].is_null()) continue;
    const json& eos = (*src)["eos_token_id"];
    if (eos.is_number_integer()) c.eos_token_ids = {eos.get<int32_t>()};
    else if (eos.is_array() && std::all_of(eos.begin(), eos.end(), [](const json& e) { return e.is_number_integer(); }))
      c.eos_token_ids = eos.get<std::vector<int32_t>>();
    else return f.Fail("eos_token_id", "expected an integer or a list of integers");
    break;
  }

  const bool gemma = c.arch == Arch::kGemma3 || c.arch == Arch::kGemma4;
  HSX_ASSIGN_OR_RETURN(std::string act, f.String(f.Has("hidden_activation") ? "hidden_activation" : "hidden_act"));
  if (act == "silu" || act == "swish") c.activation = Activation::kSilu;
  else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh") c.activation = Activation::kGeluTanh;
  else return f.Fail("hidden_act", "unsupported activation '" + act + "' (supported: silu, gelu_pytorch_tanh)");

  HSX_ASSIGN_OR_RETURN(c.num_experts, f.Int(f.Has("num_experts") ? "num_experts" : "num_local_experts", 0));
  if (c.arch == Arch::kQwen3Moe) {
    HSX_ASSIGN_OR_RETURN(c.experts_per_token, f.Int("num_experts_per_tok"));
    HSX_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("moe_intermediate_size"));
    HSX_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", true));
    if (c.num_experts <= 0 || c.experts_per_token <= 0 || c.experts_per_token > c.num_experts) {
      return f.Fail("num_experts_per_tok", "need 0 < num_experts_per_tok <= num_experts");
    }
  } else {
    c.num_experts = 0;  // Gemma 4's MoE block is not supported yet; enable_moe_block is rejected below.
  }
  HSX_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", c.arch == Arch::kQwen3Moe ? 0 : -1));
  if (c.intermediate_size < 0) return f.Fail("intermediate_size", "missing (expected an integer)");

  HSX_ASSIGN_OR_RETURN(c.qkv_bias, f.Bool("attention_bias", c.arch == Arch::kQwen2));
  c.qk_norm = c.arch == Arch::kQwen3 || c.arch == Arch::kQwen3Moe || gemma;
  c.sandwich_norms = gemma;
  c.norm_one_plus_weight = c.arch == Arch::kGemma3;
  c.embed_scale = gemma ? std::sqrt(static_cast<float>(c.hidden_size)) : 1.0f;
  c.v_norm = c.arch == Arch::kGemma4;
  c.layer_scalar = c.arch == Arch::kGemma4;
  // HF 5.17's Gemma 3 parses attn_logit_softcapping but never applies it; match the reference.
  HSX_ASSIGN_OR_RETURN(double softcap, f.Number("attn_logit_softcapping", 0.0));
  c.attn_softcap = c.arch == Arch::kGemma3 ? 0.0f : static_cast<float>(softcap);
  HSX_ASSIGN_OR_RETURN(double final_softcap, f.Number("final_logit_softcapping", 0.0));
  c.final_softcap = static_cast<float>(final_softcap);
  HSX_ASSIGN_OR_RETURN(c.sliding_window, f.Int("sliding_window", c.arch == Arch::kGemma4 ? 512 : 0));
  if (c.arch == Arch::kGemma3) {
    HSX_ASSIGN_OR_RETURN(double qpas, f.Number("query_pre_attn_scalar"));
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
  } else if (c.arch == Arch::kGemma4) {
    c.attn_scale = 1.0f;
    HSX_ASSIGN_OR_RETURN(bool moe_block, f.Bool("enable_moe_block", false));
    if (moe_block) return f.Fail("enable_moe_block", "Gemma 4 MoE blocks are not supported yet");
    HSX_ASSIGN_OR_RETURN(bool double_wide, f.Bool("use_double_wide_mlp", false));
    if (double_wide) return f.Fail("use_double_wide_mlp", "double-wide MLPs are not supported yet");
    HSX_ASSIGN_OR_RETURN(c.per_layer_input_size, f.Int("hidden_size_per_layer_input", 256));
    HSX_ASSIGN_OR_RETURN(c.per_layer_vocab_size, f.Int("vocab_size_per_layer_input", c.vocab_size));
  }
  if (c.arch == Arch::kQwen2 || c.arch == Arch::kQwen3 || c.arch == Arch::kQwen3Moe) {
    HSX_ASSIGN_OR_RETURN(bool use_sliding, f.Bool("use_sliding_window", false));
    if (!use_sliding) c.sliding_window = 0;
  }
  HSX_RETURN_IF_ERROR(ParseLayers(f, c));
  if (c.arch == Arch::kQwen2 || c.arch == Arch::kQwen3 || c.arch == Arch::kQwen3Moe || c.arch == Arch::kLlama) {
    if (c.sliding_window == 0)
      for (auto& l : c.layers) l.sliding = false;
  }
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) return Error(path + ": cannot open (is --model a Hugging Face model directory?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfig(ss.str(), path);
}

}  // namespace hsx
