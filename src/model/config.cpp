#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "model/config_fields.h"
#include "model/gguf_config.h"
#include "model/quantization_config.h"
#include "util/json.h"
#include "util/text_file.h"

namespace hsx {
namespace {

using json = nlohmann::json;

using config::Fields;
using config::IntInRange;
using config::kMaxLayers;
using config::kMaxPositions;
using config::kMaxSize;

// What transformers 5.x's config class for an architecture fills in when config.json
// omits a field (the dataclass defaults of configuration_<model>.py). null is Python's
// None: the field's absence has a meaning the parser resolves (e.g. head_dim = hidden /
// heads). tests/data/config_layouts.json checks these against transformers itself.
const char* HfDefaults(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return R"({"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": null, "head_dim": null, "hidden_act": "silu",
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "eos_token_id": 2, "tie_word_embeddings": false,
        "attention_bias": false, "mlp_bias": false})";
    case Arch::kMistral:  // MistralConfig: Llama's modules without biases, a sliding window by default
      return R"({"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": null, "hidden_act": "silu",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "eos_token_id": 2, "tie_word_embeddings": false,
        "sliding_window": 4096})";
    case Arch::kQwen2:
      return R"({"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": null, "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "eos_token_id": null, "tie_word_embeddings": false,
        "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 28})";
    case Arch::kQwen3:
      return R"({"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "eos_token_id": null, "tie_word_embeddings": false,
        "attention_bias": false, "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 28})";
    case Arch::kQwen3Moe:
      return R"({"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": null, "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "eos_token_id": null, "tie_word_embeddings": false,
        "attention_bias": false, "use_sliding_window": false, "sliding_window": 4096, "decoder_sparse_step": 1,
        "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128, "norm_topk_prob": false,
        "mlp_only_layers": null})";
    case Arch::kGemma3:
      return R"({"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "eos_token_id": 1, "tie_word_embeddings": true,
        "attention_bias": false, "query_pre_attn_scalar": 256, "sliding_window": 4096,
        "final_logit_softcapping": null, "use_bidirectional_attention": false})";
    case Arch::kGemma4:
      return R"({"vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "eos_token_id": 1, "tie_word_embeddings": true,
        "attention_bias": false, "sliding_window": 512, "final_logit_softcapping": null,
        "use_bidirectional_attention": null, "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256,
        "attention_k_eq_v": false, "num_kv_shared_layers": 0, "enable_moe_block": false, "use_double_wide_mlp": false,
        "global_head_dim": 512, "num_global_key_value_heads": null,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
          "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}})";
    case Arch::kGptOss:  // GptOssConfig; rope_parameters' default (yarn) is filled in ResolveRope
      return R"({"vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "silu",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "eos_token_id": null, "tie_word_embeddings": false,
        "attention_bias": true, "sliding_window": 128, "num_local_experts": 128, "num_experts_per_tok": 4,
        "swiglu_limit": 7.0, "swiglu_alpha": 1.702, "layer_types": null,
        "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
          "truncate": false, "original_max_position_embeddings": 4096}})";
  }
  return "{}";
}

const json& HfDefaultsJson(Arch arch) {
  static const std::map<Arch, json> kParsed = [] {
    std::map<Arch, json> m;
    for (Arch a : {Arch::kLlama, Arch::kMistral, Arch::kQwen2, Arch::kQwen3, Arch::kQwen3Moe, Arch::kGemma3, Arch::kGemma4,
                   Arch::kGptOss})
      m[a] = json::parse(HfDefaults(a));
    return m;
  }();
  return kParsed.at(arch);
}

}  // namespace

const std::set<std::string>& config::IgnoredFields() {
  static const std::set<std::string> kIgnored = {
      // Bookkeeping and training-only settings (PreTrainedConfig and the hub's files).
      "_name_or_path", "transformers_version", "_commit_hash", "model_type", "use_cache", "initializer_range",
      "attention_dropout", "bos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      "unk_token_id",  // transformers' GGUF conversion copies it from the tokenizer
      "output_hidden_states", "output_attentions", "return_dict", "use_return_dict", "torchscript", "id2label",
      "label2id", "num_labels", "problem_type", "finetuning_task", "chunk_size_feed_forward", "is_encoder_decoder",
      "is_decoder", "add_cross_attention", "cross_attention_hidden_size", "tie_encoder_decoder", "pruned_heads",
      "tf_legacy_loss", "use_bfloat16", "tokenizer_class", "prefix", "task_specific_params",
      "_attn_implementation_autoset", "attn_implementation", "output_router_logits", "router_aux_loss_coef",
      // Generation defaults: transformers pops them from the model config; hsx's sampling
      // comes from the request, stop tokens from eos_token_id and generation_config.json.
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
      "encoder_repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
      "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
      "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
      "begin_suppress_tokens", "epsilon_cutoff", "eta_cutoff", "cache_implementation",
      // Llama: transformers 5 never reads it; 4.x split the same matmuls tp ways (same result).
      "pretraining_tp",
      // Gemma 3: a copy transformers 5 writes next to an explicit layer_types.
      "_sliding_window_pattern",
  };
  return kIgnored;
}

namespace {
std::set<std::string>& AllowedUnknown() {
  static std::set<std::string> names;
  return names;
}
}  // namespace

void config::AllowUnknownConfigField(const std::string& name) { AllowedUnknown().insert(name); }

const std::set<std::string>& config::AllowedUnknownConfigFields() { return AllowedUnknown(); }

void config::WarnAllowedUnknownField(const std::string& source, const std::string& key) {
  std::fprintf(stderr,
               "hsx: warning: %s: field '%s' is not implemented by hsx and may change the model's computation; "
               "proceeding as --allow-unknown-config-field asks\n",
               source.c_str(), key.c_str());
}

namespace {

// Keys of a multimodal config's top level that only concern the vision or audio towers.
const std::set<std::string>& MultimodalTopLevelFields() {
  static const std::set<std::string> kFields = {
      "vision_config", "audio_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index",
      "image_token_index", "image_token_id", "boi_token_id", "eoi_token_id", "audio_token_id", "video_token_id",
      "boa_token_id", "eoa_token_id", "vision_soft_tokens_per_image", "audio_soft_tokens_per_image",
      "initializer_range", "eoa_token_index", "boa_token_index", "audio_token_index",
  };
  return kFields;
}


struct ArchName {
  const char* name;
  Arch arch;
  bool multimodal;  // the language model's config sits in text_config
  const char* model_types[2];
};

constexpr ArchName kArchs[] = {
    {"LlamaForCausalLM", Arch::kLlama, false, {"llama", nullptr}},
    {"MistralForCausalLM", Arch::kMistral, false, {"mistral", nullptr}},
    {"Qwen2ForCausalLM", Arch::kQwen2, false, {"qwen2", nullptr}},
    {"Qwen3ForCausalLM", Arch::kQwen3, false, {"qwen3", nullptr}},
    {"Qwen3MoeForCausalLM", Arch::kQwen3Moe, false, {"qwen3_moe", nullptr}},
    {"Gemma3ForCausalLM", Arch::kGemma3, false, {"gemma3_text", nullptr}},
    {"Gemma3ForConditionalGeneration", Arch::kGemma3, true, {"gemma3", "gemma3_text"}},
    {"Gemma4ForCausalLM", Arch::kGemma4, false, {"gemma4_text", nullptr}},
    {"Gemma4ForConditionalGeneration", Arch::kGemma4, true, {"gemma4", "gemma4_text"}},
    {"GptOssForCausalLM", Arch::kGptOss, false, {"gpt_oss", nullptr}},
};

Result<const ArchName*> ParseArch(const json& root, const std::string& source) {
  const auto fail = [&](const std::string& what) { return Error(source + ": field 'architectures': " + what); };
  if (!root.contains("architectures") || !root["architectures"].is_array() || root["architectures"].empty() ||
      !root["architectures"][0].is_string()) {
    return fail("missing (expected a list naming the model class)");
  }
  const std::string name = root["architectures"][0].get<std::string>();
  for (const ArchName& a : kArchs) {
    if (name == a.name) return &a;
  }
  std::string supported;
  for (const ArchName& a : kArchs) supported += std::string(supported.empty() ? "" : ", ") + a.name;
  return fail("unsupported architecture '" + name + "' (supported: " + supported + ")");
}

// transformers picks the config class (and so the defaults) by model_type; hsx by the
// architecture. Refuse a file where the two disagree rather than guess.
Status CheckModelType(const json& j, const std::string& expected, const std::string& source) {
  if (!j.contains("model_type") || j["model_type"].is_null()) return {};
  if (!j["model_type"].is_string() || j["model_type"].get<std::string>() != expected) {
    return Error(source + ": field 'model_type': is " + j["model_type"].dump() + ", expected \"" + expected +
                 "\" for this architecture");
  }
  return {};
}

// ---- RoPE ----------------------------------------------------------------------------

// 1 / theta^(k / dims) in f32 arithmetic, as torch computes it (bit-exact frequencies).
float TorchInvFreq(double theta, int k, int dims) {
  return 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(k) / static_cast<float>(dims));
}


// yarn (_compute_yarn_parameters): factor is required; the attention factor is the
// dict's, else from mscale/mscale_all_dim when both are non-zero, else 0.1 ln(factor) + 1.
Status ParseYarn(const Fields& p, RopeSpec& rope, std::optional<double> attention_factor) {
  rope.type = RopeSpec::Type::kYarn;
  HSX_ASSIGN_OR_RETURN(rope.factor, p.Positive("factor"));
  // transformers takes `get(...) or default`: absent, null and 0 all mean the default.
  for (auto [key, value] : {std::pair{"beta_fast", &rope.beta_fast}, std::pair{"beta_slow", &rope.beta_slow}}) {
    HSX_ASSIGN_OR_RETURN(const auto given, p.OptionalNumber(key));
    if (given && !std::isfinite(*given)) return p.Fail(key, "must be a finite number");
    if (given && *given != 0) *value = *given;
  }
  if (rope.beta_fast <= 0 || rope.beta_slow <= 0) {
    return p.Fail("beta_fast", "beta_fast and beta_slow must be > 0 (the ramp takes their logarithms)");
  }
  HSX_ASSIGN_OR_RETURN(rope.truncate, p.Bool("truncate", true));
  HSX_ASSIGN_OR_RETURN(const auto mscale, p.OptionalNumber("mscale"));
  HSX_ASSIGN_OR_RETURN(const auto mscale_all_dim, p.OptionalNumber("mscale_all_dim"));
  for (const auto& [key, v] : {std::pair{"mscale", mscale}, std::pair{"mscale_all_dim", mscale_all_dim}}) {
    if (v && !std::isfinite(*v)) return p.Fail(key, "must be a finite number");
  }
  const auto get_mscale = [&](double m) { return rope.factor <= 1 ? 1.0 : 0.1 * m * std::log(rope.factor) + 1.0; };
  if (attention_factor) {
    rope.attention_factor = *attention_factor;
  } else if (mscale.value_or(0) != 0 && mscale_all_dim.value_or(0) != 0) {
    rope.attention_factor = get_mscale(*mscale) / get_mscale(*mscale_all_dim);
  } else {
    rope.attention_factor = get_mscale(1.0);
  }
  if (!(std::isfinite(rope.attention_factor) && rope.attention_factor > 0)) {
    return p.Fail("mscale", "the attention factor it gives is not a finite number > 0");
  }
  return {};
}

// A list of finite numbers > 0 (longrope's per-frequency divisors).
Result<std::vector<double>> PositiveList(const Fields& p, const std::string& key) {
  const json* v = p.Get(key);
  if (v == nullptr || v->is_null()) return p.Fail(key, "missing (expected a list of numbers)");
  if (!v->is_array()) return p.Fail(key, "is " + std::string(v->type_name()) + ", expected a list of numbers");
  std::vector<double> out;
  for (const json& e : *v) {
    if (!e.is_number() || !(std::isfinite(e.get<double>()) && e.get<double>() > 0)) {
      return p.Fail(key, "entries must be finite numbers > 0");
    }
    out.push_back(e.get<double>());
  }
  return out;
}

// longrope (_compute_longrope_parameters): frequencies divided by short_factor for
// sequences up to original_max_position_embeddings tokens, by long_factor beyond (a
// per-call switch on the batch's longest sequence, which hsx does not run: it limits
// sequences to original_max_position_embeddings). Attention factor: the dict's, else
// sqrt(1 + ln(factor) / ln(original)), factor defaulting to max_pos / original.
Status ParseLongrope(const Fields& p, RopeSpec& rope, std::optional<double> attention_factor, int max_pos) {
  rope.type = RopeSpec::Type::kLongrope;
  HSX_ASSIGN_OR_RETURN(rope.short_factor, PositiveList(p, "short_factor"));
  HSX_ASSIGN_OR_RETURN(rope.long_factor, PositiveList(p, "long_factor"));
  const double orig = rope.original_max_position_embeddings;
  if (orig < 1) return p.Fail("original_max_position_embeddings", "must be at least 1 for longrope");
  rope.factor = max_pos / orig;
  if (p.Has("factor")) {
    HSX_ASSIGN_OR_RETURN(rope.factor, p.Positive("factor"));
  }
  if (attention_factor) {
    rope.attention_factor = *attention_factor;
  } else {
    rope.attention_factor = rope.factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(rope.factor) / std::log(orig));
  }
  if (!(std::isfinite(rope.attention_factor) && rope.attention_factor > 0)) {
    return p.Fail("original_max_position_embeddings", "the attention factor it gives is not a finite number > 0");
  }
  rope.position_limit = static_cast<int64_t>(std::min(std::floor(orig), static_cast<double>(kMaxPositions)));
  return {};
}

// One rope parameter dict after transformers' standardization, checked and typed.
// `inherited_theta` is the base the dict falls back to (a 4.x top-level rope_theta or the
// architecture's default); nullopt means the dict must carry its own.
Result<RopeSpec> ParseRopeDict(const json& d, const std::string& where, std::optional<double> inherited_theta,
                               std::optional<double> inherited_partial, int max_position_embeddings) {
  if (!d.is_object()) return Error(where + ": expected an object");
  static const json kNone = json::object();
  Fields p(d, kNone, where);
  RopeSpec rope;
  std::string type = "default";
  if (p.Has("rope_type")) {
    HSX_ASSIGN_OR_RETURN(type, p.String("rope_type"));
  } else if (p.Has("type")) {  // rope_scaling's 4.x spelling
    HSX_ASSIGN_OR_RETURN(type, p.String("type"));
  }
  if (p.Has("rope_type") && p.Has("type")) {
    HSX_ASSIGN_OR_RETURN(std::string legacy, p.String("type"));
    if (legacy != type) return p.Fail("type", "'" + legacy + "' disagrees with rope_type '" + type + "'");
  }
  if (p.Has("rope_theta")) {
    HSX_ASSIGN_OR_RETURN(rope.theta, p.Positive("rope_theta"));
  } else if (inherited_theta) {
    rope.theta = *inherited_theta;
  } else {
    return p.Fail("rope_theta", "missing (expected a number)");
  }
  if (!std::isfinite(rope.theta) || rope.theta <= 0) {
    return p.Fail("rope_theta", "must be a finite number > 0 (got " + std::to_string(rope.theta) + ")");
  }
  if (p.Has("partial_rotary_factor")) {
    HSX_ASSIGN_OR_RETURN(rope.partial_rotary_factor, p.Positive("partial_rotary_factor"));
  } else if (inherited_partial) {
    rope.partial_rotary_factor = *inherited_partial;
  }
  if (!(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1)) {
    return p.Fail("partial_rotary_factor", "must be in (0, 1]");
  }
  if (type == "default") {
    rope.type = RopeSpec::Type::kDefault;
  } else if (type == "linear") {
    rope.type = RopeSpec::Type::kLinear;
    HSX_ASSIGN_OR_RETURN(rope.factor, p.Positive("factor"));
  } else if (type == "llama3") {
    rope.type = RopeSpec::Type::kLlama3;
    HSX_ASSIGN_OR_RETURN(rope.factor, p.Positive("factor"));
    HSX_ASSIGN_OR_RETURN(rope.low_freq_factor, p.Positive("low_freq_factor"));
    HSX_ASSIGN_OR_RETURN(rope.high_freq_factor, p.Positive("high_freq_factor"));
    if (rope.high_freq_factor == rope.low_freq_factor) {
      return p.Fail("high_freq_factor", "must differ from low_freq_factor (the smoothing divides by their difference)");
    }
    // transformers fills it from max_position_embeddings when the dict lacks it.
    if (p.Has("original_max_position_embeddings")) {
      HSX_ASSIGN_OR_RETURN(rope.original_max_position_embeddings, p.Positive("original_max_position_embeddings"));
    } else {
      rope.original_max_position_embeddings = max_position_embeddings;
    }
  } else if (type == "proportional") {
    rope.type = RopeSpec::Type::kProportional;
    if (p.Has("factor")) {
      HSX_ASSIGN_OR_RETURN(rope.factor, p.Positive("factor"));
    }
  } else if (type == "yarn" || type == "longrope") {
    // transformers' standardize_rope_params fills original_max_position_embeddings from
    // max_position_embeddings when the dict lacks it.
    rope.original_max_position_embeddings = max_position_embeddings;
    if (p.Has("original_max_position_embeddings")) {
      HSX_ASSIGN_OR_RETURN(rope.original_max_position_embeddings, p.Positive("original_max_position_embeddings"));
    }
    HSX_ASSIGN_OR_RETURN(const auto attention_factor, p.OptionalNumber("attention_factor"));
    if (attention_factor && !(std::isfinite(*attention_factor) && *attention_factor > 0)) {
      return p.Fail("attention_factor", "must be null or a finite number > 0");
    }
    if (type == "yarn") {
      HSX_RETURN_IF_ERROR(ParseYarn(p, rope, attention_factor));
    } else {
      HSX_RETURN_IF_ERROR(ParseLongrope(p, rope, attention_factor, max_position_embeddings));
    }
  } else if (type == "dynamic") {
    // Dynamic NTK: transformers computes the frequencies for max_position_embeddings
    // tokens and recomputes them, per forward call, from the longest sequence of the
    // batch once that is longer (keys already cached keep their old rotation). That is a
    // function of the batch and its history, not of a token's position, so hsx runs
    // sequences up to max_position_embeddings only, where the table is fixed.
    rope.type = RopeSpec::Type::kDynamic;
    HSX_ASSIGN_OR_RETURN(rope.factor, p.Positive("factor"));
    rope.dynamic_seq_len = max_position_embeddings;
    rope.position_limit = max_position_embeddings;
  } else {
    return p.Fail(p.Has("rope_type") ? "rope_type" : "type",
                  "RoPE type '" + type + "' is not supported (supported: default, linear, llama3, proportional, yarn, "
                  "dynamic, longrope)");
  }
  HSX_RETURN_IF_ERROR(p.CheckAllRead());
  return rope;
}

constexpr const char* kLayerTypeNames[] = {"full_attention", "sliding_attention"};

// yarn, dynamic and longrope only in one dict for every layer: in a dict per layer type
// transformers' yarn reads `truncate` from the outer dict, and its runtime updates keep
// per-type state hsx has not checked against it.
Status SingleDictOnly(const Fields& f, const std::map<std::string, RopeSpec>& ropes) {
  for (const auto& [t, r] : ropes) {
    using T = RopeSpec::Type;
    if (r.type == T::kYarn || r.type == T::kDynamic || r.type == T::kLongrope) {
      return f.Fail("rope_parameters", "layer type '" + t + "': yarn, dynamic and longrope RoPE are supported only "
                                       "in one dict for all layers, not keyed by layer type");
    }
  }
  return {};
}

// The rope parameter dict per layer type, resolved as transformers 5.x's
// convert_rope_params_to_dict and standardize_rope_params do for this architecture.
Result<std::map<std::string, RopeSpec>> ResolveRope(const Fields& f, Arch arch, int max_pos,
                                                    const std::set<std::string>& layer_types) {
  std::map<std::string, RopeSpec> out;
  const std::string src = f.source() + ": ";
  if (arch == Arch::kGemma4) {
    // Gemma 4 has only the 5.x layout; transformers drops 4.x keys without reading them.
    for (const char* legacy : {"rope_theta", "rope_scaling", "rope_local_base_freq", "partial_rotary_factor"}) {
      if (f.Given(legacy)) return f.Fail(legacy, "transformers ignores it for Gemma 4; give rope_parameters instead");
    }
    const json* rp = f.Get("rope_parameters");
    if (rp->is_null()) rp = &HfDefaultsJson(Arch::kGemma4)["rope_parameters"];
    if (!rp->is_object()) return f.Fail("rope_parameters", "expected an object keyed by layer type");
    for (const std::string& t : layer_types) {
      if (!rp->contains(t) || (*rp)[t].is_null()) return f.Fail("rope_parameters", "no entry for layer type '" + t + "'");
      HSX_ASSIGN_OR_RETURN(out[t], ParseRopeDict((*rp)[t], src + "rope_parameters." + t, std::nullopt, std::nullopt, max_pos));
    }
    HSX_RETURN_IF_ERROR(SingleDictOnly(f, out));
    return out;
  }

  std::optional<double> top_theta;
  if (f.Has("rope_theta")) {
    HSX_ASSIGN_OR_RETURN(top_theta, f.Positive("rope_theta"));
  }
  const json* scaling = f.Has("rope_scaling") ? f.Get("rope_scaling") : nullptr;
  const json* params = f.Has("rope_parameters") ? f.Get("rope_parameters") : nullptr;
  if (scaling && !scaling->is_object()) return f.Fail("rope_scaling", "expected an object");
  if (params && !params->is_object()) return f.Fail("rope_parameters", "expected an object");

  if (arch == Arch::kGemma3) {
    // Gemma 3: rope_parameters keyed by layer type (default: both "default"); a 4.x
    // rope_scaling updates the full-attention entry; a dict without rope_theta takes
    // rope_theta (full, default 1e6) or rope_local_base_freq (sliding, default 1e4).
    json rp = params ? *params : json::object();
    for (const auto& [k, v] : rp.items()) {
      if (k != "full_attention" && k != "sliding_attention") {
        return f.Fail("rope_parameters", "Gemma 3 needs rope_parameters keyed by layer type, found key '" + k + "'");
      }
    }
    for (const char* t : kLayerTypeNames) {
      if (!rp.contains(t) || rp[t].is_null()) rp[t] = {{"rope_type", "default"}};
      if (!rp[t].is_object()) return f.Fail("rope_parameters", std::string("entry '") + t + "' must be an object");
    }
    if (scaling) rp["full_attention"].update(*scaling);
    double local_base = 10000.0;
    if (f.Has("rope_local_base_freq")) {
      HSX_ASSIGN_OR_RETURN(local_base, f.Positive("rope_local_base_freq"));
    }
    const std::string full_where = src + (scaling ? "rope_parameters.full_attention (with rope_scaling)" : "rope_parameters.full_attention");
    HSX_ASSIGN_OR_RETURN(out["full_attention"], ParseRopeDict(rp["full_attention"], full_where, top_theta.value_or(1e6), std::nullopt, max_pos));
    HSX_ASSIGN_OR_RETURN(out["sliding_attention"], ParseRopeDict(rp["sliding_attention"], src + "rope_parameters.sliding_attention", local_base, std::nullopt, max_pos));
    HSX_RETURN_IF_ERROR(SingleDictOnly(f, out));
    return out;
  }

  // Llama and Qwen: rope_scaling (4.x) wins over rope_parameters (5.x); one dict for all
  // layers, or (Qwen2/3, which have layer types) one per layer type.
  std::optional<double> top_partial;
  if (f.Has("partial_rotary_factor")) {
    HSX_ASSIGN_OR_RETURN(top_partial, f.Positive("partial_rotary_factor"));
  }
  static const json kEmpty = json::object();
  // gpt-oss: without either dict, GptOssConfig's yarn default; its base defaults to 150000.
  const json& fallback = arch == Arch::kGptOss ? HfDefaultsJson(Arch::kGptOss)["rope_parameters"] : kEmpty;
  const double default_theta = arch == Arch::kGptOss ? 150000.0 : 10000.0;
  const json& rp = scaling ? *scaling : params ? *params : fallback;
  const bool nested = (arch == Arch::kQwen2 || arch == Arch::kQwen3) && !rp.empty() && std::all_of(rp.items().begin(), rp.items().end(), [&](const auto& kv) {
    return layer_types.count(kv.key()) > 0;
  });
  for (const std::string& t : layer_types) {
    const json& d = nested ? (rp.contains(t) ? rp[t] : json()) : rp;
    if (d.is_null()) return f.Fail("rope_parameters", "no entry for layer type '" + t + "'");
    const std::string where = src + (scaling ? "rope_scaling" : "rope_parameters") + (nested ? "." + t : "");
    HSX_ASSIGN_OR_RETURN(out[t], ParseRopeDict(d, where, top_theta.value_or(default_theta), top_partial, max_pos));
  }
  if (nested) HSX_RETURN_IF_ERROR(SingleDictOnly(f, out));
  return out;
}

// ---- gpt-oss's MoE ---------------------------------------------------------------------

// Every layer is a MoE layer of num_local_experts experts (num_experts is the same field,
// GptOssConfig's attribute_map) of intermediate_size, with top-k routing. Its softmax over
// the top-k logits equals Qwen3-MoE's softmax over all experts renormalized over the top k,
// so the routing is that one with norm_topk_prob. experts_per_token, which OpenAI's files
// carry beside num_experts_per_tok and transformers never reads, must agree with it;
// initial_context_length (also OpenAI's, also unread) changes nothing.
Status ParseGptOssMoe(const Fields& f, const json& j, ModelConfig& c) {
  const char* key = f.Given("num_experts") && !f.Given("num_local_experts") ? "num_experts" : "num_local_experts";
  if (f.Given("num_local_experts") && f.Given("num_experts") && j["num_experts"] != j["num_local_experts"]) {
    return f.Fail("num_experts", "disagrees with num_local_experts");
  }
  HSX_ASSIGN_OR_RETURN(c.num_experts, f.Int(key));
  HSX_ASSIGN_OR_RETURN(c.experts_per_token, f.Int("num_experts_per_tok"));
  if (c.experts_per_token > c.num_experts) return f.Fail("num_experts_per_tok", "must not exceed num_local_experts");
  if (f.Given("experts_per_token")) {
    HSX_ASSIGN_OR_RETURN(const int alias, f.Int("experts_per_token"));
    if (alias != c.experts_per_token) {
      return f.Fail("experts_per_token", "is " + std::to_string(alias) + ", but num_experts_per_tok (which " +
                                             "transformers routes by) is " + std::to_string(c.experts_per_token));
    }
  }
  if (f.Given("initial_context_length")) {
    HSX_ASSIGN_OR_RETURN(auto unused, f.OptionalInt("initial_context_length", 1, kMaxPositions));
    (void)unused;
  }
  c.moe_intermediate_size = c.intermediate_size;
  c.norm_topk_prob = true;
  c.moe_biases = true;
  HSX_ASSIGN_OR_RETURN(const double limit, f.Positive("swiglu_limit"));
  HSX_ASSIGN_OR_RETURN(const double alpha, f.Positive("swiglu_alpha"));
  if (!std::isfinite(limit) || !std::isfinite(alpha)) return f.Fail("swiglu_limit", "swiglu_limit and swiglu_alpha must be finite");
  c.swiglu_limit = static_cast<float>(limit);
  c.swiglu_alpha = static_cast<float>(alpha);
  return {};
}

// ---- Layers --------------------------------------------------------------------------

Result<std::vector<std::string>> LayerTypes(const Fields& f, const ModelConfig& c, bool qwen_sliding) {
  const int n = c.num_layers;
  std::vector<std::string> types;
  const json* lt = f.Get("layer_types");
  if (lt && !lt->is_null()) {
    if (!lt->is_array() || static_cast<int>(lt->size()) != n) {
      return f.Fail("layer_types", "expected a list of " + std::to_string(n) + " layer types");
    }
    for (const auto& t : *lt) {
      if (!t.is_string() || (t != "sliding_attention" && t != "full_attention")) {
        return f.Fail("layer_types", "entries must be \"sliding_attention\" or \"full_attention\"");
      }
      types.push_back(t.get<std::string>());
    }
  }
  if (c.arch == Arch::kGemma3 || c.arch == Arch::kGemma4) {
    // Gemma 3 reads sliding_window_pattern (default 6); Gemma 4 always uses 6.
    int pattern = 6;
    if (c.arch == Arch::kGemma3) {
      HSX_ASSIGN_OR_RETURN(auto given, f.OptionalInt("sliding_window_pattern", 1, kMaxSize));
      pattern = static_cast<int>(given.value_or(6));
    } else if (f.Given("sliding_window_pattern")) {
      HSX_ASSIGN_OR_RETURN(auto given, f.OptionalInt("sliding_window_pattern", 1, kMaxSize));
      if (given && *given != 6 && types.empty()) {
        return f.Fail("sliding_window_pattern", "transformers ignores it for Gemma 4 (always 6); give layer_types");
      }
    }
    if (types.empty()) {
      for (int i = 0; i < n; ++i) types.push_back((i + 1) % pattern ? "sliding_attention" : "full_attention");
    }
    // Gemma 4 always ends on a full-attention layer (transformers forces it).
    if (c.arch == Arch::kGemma4) types.back() = "full_attention";
    return types;
  }
  if (c.arch == Arch::kQwen2 || c.arch == Arch::kQwen3) {
    HSX_ASSIGN_OR_RETURN(int max_window_layers, f.Int("max_window_layers", 0, kMaxSize));
    if (types.empty()) {
      for (int i = 0; i < n; ++i) types.push_back(qwen_sliding && i >= max_window_layers ? "sliding_attention" : "full_attention");
    }
    return types;
  }
  if (c.arch == Arch::kGptOss) {
    // GptOssConfig: sliding, full, sliding, ... when layer_types is absent.
    if (types.empty()) {
      for (int i = 0; i < n; ++i) types.push_back((i + 1) % 2 ? "sliding_attention" : "full_attention");
    }
    return types;
  }
  // Llama, Mistral and Qwen3-MoE have no layer types: transformers gives every layer full
  // attention (Mistral, Qwen3-MoE: the sliding window, when enabled, applies to all of them).
  const std::string all = (c.arch == Arch::kQwen3Moe || c.arch == Arch::kMistral) && qwen_sliding ? "sliding_attention" : "full_attention";
  if (!types.empty() && std::any_of(types.begin(), types.end(), [&](const std::string& t) { return t != all; })) {
    return f.Fail("layer_types", "transformers ignores it for this architecture (every layer is " + all + ")");
  }
  return std::vector<std::string>(n, all);
}

Status ParseLayers(const Fields& f, ModelConfig& c, bool qwen_sliding) {
  HSX_ASSIGN_OR_RETURN(const std::vector<std::string> types, LayerTypes(f, c, qwen_sliding));
  const std::set<std::string> type_set(types.begin(), types.end());
  HSX_ASSIGN_OR_RETURN(const auto ropes, ResolveRope(f, c.arch, c.max_position_embeddings, type_set));

  // head_dim: null or absent means hidden_size / num_attention_heads.
  HSX_ASSIGN_OR_RETURN(auto given_head_dim, f.OptionalInt("head_dim", 1, kMaxSize));
  const int head_dim = given_head_dim ? static_cast<int>(*given_head_dim) : c.hidden_size / c.num_heads;
  HSX_ASSIGN_OR_RETURN(auto given_kv, f.OptionalInt("num_key_value_heads", 1, kMaxSize));
  const int kv_heads = given_kv ? static_cast<int>(*given_kv) : c.num_heads;
  bool k_eq_v = false;
  int shared = 0;
  const json* per_layer = nullptr;
  std::map<int, const json*> overrides;  // per_layer_config by layer index
  int global_head_dim = 0;
  std::optional<int64_t> global_kv_heads;
  if (c.arch == Arch::kGemma4) {
    HSX_ASSIGN_OR_RETURN(k_eq_v, f.Bool("attention_k_eq_v"));
    HSX_ASSIGN_OR_RETURN(shared, f.Int("num_kv_shared_layers", 0, c.num_layers - 1));
    HSX_ASSIGN_OR_RETURN(global_head_dim, f.Int("global_head_dim"));
    HSX_ASSIGN_OR_RETURN(global_kv_heads, f.OptionalInt("num_global_key_value_heads", 1, kMaxSize));
    per_layer = f.Has("per_layer_config") ? f.Get("per_layer_config") : nullptr;
    if (per_layer && !per_layer->is_object()) return f.Fail("per_layer_config", "expected an object keyed by layer index");
    if (per_layer) {
      // Keys are layer indices, possibly zero-padded (transformers parses them with int()).
      for (const auto& [k, v] : per_layer->items()) {
        const bool index = !k.empty() && k.size() < 9 && std::all_of(k.begin(), k.end(), ::isdigit) && std::stoi(k) < c.num_layers;
        if (!index) return f.Fail("per_layer_config", "key '" + k + "' is not a layer index below num_hidden_layers");
        if (!overrides.emplace(std::stoi(k), &v).second) return f.Fail("per_layer_config", "layer " + k + " given twice");
      }
    }
  }

  std::vector<int> mlp_only;
  int sparse_step = 1;
  if (c.arch == Arch::kQwen3Moe) {
    f.Given("max_window_layers");  // Qwen3-MoE's config has none; hub files carry it unread
    HSX_ASSIGN_OR_RETURN(mlp_only, f.IntList("mlp_only_layers", 0, c.num_layers - 1));
    HSX_ASSIGN_OR_RETURN(sparse_step, f.Int("decoder_sparse_step"));
  }

  c.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    LayerSpec& l = c.layers[i];
    l.sliding = types[i] == "sliding_attention";
    l.head_dim = head_dim;
    l.num_kv_heads = kv_heads;
    const std::string key = std::to_string(i);
    if (overrides.count(i)) {
      static const json kNone = json::object();
      const json& o = *overrides[i];
      Fields pl(o, kNone, f.source() + ": per_layer_config." + key);
      if (!o.is_object()) return f.Fail("per_layer_config", "entry for layer " + key + " must be an object");
      HSX_ASSIGN_OR_RETURN(auto hd, pl.OptionalInt("head_dim", 1, kMaxSize));
      HSX_ASSIGN_OR_RETURN(auto kv, pl.OptionalInt("num_key_value_heads", 1, kMaxSize));
      HSX_RETURN_IF_ERROR(pl.CheckAllRead());
      if (hd) l.head_dim = static_cast<int>(*hd);
      if (kv) l.num_kv_heads = static_cast<int>(*kv);
    } else if (!per_layer && c.arch == Arch::kGemma4 && !l.sliding) {
      // Without per_layer_config, full-attention layers take global_head_dim (and, with
      // k=v, num_global_key_value_heads), as transformers builds the overrides.
      l.head_dim = global_head_dim;
      if (k_eq_v && global_kv_heads) l.num_kv_heads = static_cast<int>(*global_kv_heads);
    }
    if (c.num_heads % l.num_kv_heads != 0) {
      return f.Fail("num_key_value_heads", "layer " + key + ": num_attention_heads (" + std::to_string(c.num_heads) +
                                               ") is not divisible by num_key_value_heads (" +
                                               std::to_string(l.num_kv_heads) + ")");
    }
    if (l.head_dim <= 0 || l.head_dim % 2 != 0) {
      return f.Fail("head_dim", "layer " + key + ": head dimension " + std::to_string(l.head_dim) + " must be positive and even (RoPE rotates pairs)");
    }
    l.k_eq_v = k_eq_v && !l.sliding;
    l.rope = ropes.at(types[i]);
    const int rotary = static_cast<int>(l.head_dim * l.rope.partial_rotary_factor);
    if (l.rope.type != RopeSpec::Type::kProportional && (rotary <= 0 || rotary % 2 != 0)) {
      return f.Fail("partial_rotary_factor", "layer " + key + ": " + std::to_string(rotary) + " rotary dimensions of a " +
                                                 std::to_string(l.head_dim) + "-wide head (need a positive even number)");
    }
    using RT = RopeSpec::Type;
    if ((l.rope.type == RT::kYarn || l.rope.type == RT::kDynamic || l.rope.type == RT::kLongrope) && rotary != l.head_dim) {
      // transformers' Llama-family attention multiplies the whole head by cos/sin: a
      // shorter table does not broadcast there.
      return f.Fail("partial_rotary_factor", "layer " + key + ": yarn, dynamic and longrope RoPE rotate the whole head here "
                                                             "(transformers cannot run a partial table for this architecture)");
    }
    if (l.rope.type == RT::kDynamic && rotary <= 2) {
      return f.Fail("head_dim", "layer " + key + ": dynamic RoPE needs more than 2 rotary dimensions (its exponent divides by dim - 2)");
    }
    if (l.rope.type == RT::kLongrope) {
      for (const auto& [name, list] : {std::pair{"short_factor", &l.rope.short_factor}, std::pair{"long_factor", &l.rope.long_factor}}) {
        if (static_cast<int>(list->size()) != rotary / 2) {
          return f.Fail("rope_parameters", "layer " + key + ": longrope " + name + " has " + std::to_string(list->size()) +
                                               " entries, expected one per frequency (" + std::to_string(rotary / 2) + ")");
        }
      }
    }
    int rotary_dims = 0;
    for (float inv : RopeInverseFrequencies(l.rope, l.head_dim, &rotary_dims)) {
      if (!std::isfinite(inv)) {
        return f.Fail("rope_parameters", "layer " + key + ": the RoPE parameters give non-finite frequencies");
      }
    }
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

// eos_token_id: an integer or a list of integers, each a token of the vocabulary.
Status AppendEos(const json& v, const std::string& source, int vocab_size, std::vector<int32_t>& ids) {
  const auto fail = [&] {
    return Error(source + ": field 'eos_token_id': expected an integer or a list of integers in [0, " +
                 std::to_string(vocab_size) + ")");
  };
  if (v.is_null()) return {};
  const json list = v.is_array() ? v : json::array({v});
  for (const json& e : list) {
    if (!e.is_number_integer() || !IntInRange(e, 0, vocab_size - 1)) return fail();
    const int32_t id = static_cast<int32_t>(e.get<int64_t>());
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return {};
}

}  // namespace

std::vector<float> RopeInverseFrequencies(const RopeSpec& rope, int head_dim, int* rotary_dims) {
  std::vector<float> inv_freq;
  if (rope.type == RopeSpec::Type::kProportional) {
    // Frequencies as for the whole head, but only the first partial_rotary_factor of
    // each rotate-half pair set turns; the rest get frequency 0 (identity).
    const int half = head_dim / 2;
    const int rotated = static_cast<int>(rope.partial_rotary_factor * head_dim) / 2;
    for (int i = 0; i < half; ++i) {
      inv_freq.push_back(i < rotated ? TorchInvFreq(rope.theta, 2 * i, head_dim) / static_cast<float>(rope.factor) : 0.0f);
    }
    *rotary_dims = head_dim;
    return inv_freq;
  }
  const int dims = static_cast<int>(head_dim * rope.partial_rotary_factor);
  // Scaled variants in f32, operation by operation as transformers' torch code runs them.
  const float factor = static_cast<float>(rope.factor);
  double theta = rope.theta;
  if (rope.type == RopeSpec::Type::kDynamic) {
    // base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2)), in Python
    // doubles, for seq_len = max_pos: 1 up to rounding.
    const double len = rope.dynamic_seq_len;
    theta = rope.theta * std::pow(rope.factor * len / len - (rope.factor - 1), static_cast<double>(dims) / (dims - 2));
  }
  // yarn's ramp: the correction range in Python doubles, the ramp itself in f32.
  double ramp_low = 0, ramp_high = 0;
  if (rope.type == RopeSpec::Type::kYarn) {
    const auto correction_dim = [&](double rotations) {
      return dims * std::log(rope.original_max_position_embeddings / (rotations * 2 * M_PI)) / (2 * std::log(rope.theta));
    };
    ramp_low = correction_dim(rope.beta_fast);
    ramp_high = correction_dim(rope.beta_slow);
    if (rope.truncate) {
      ramp_low = std::floor(ramp_low);
      ramp_high = std::ceil(ramp_high);
    }
    ramp_low = std::max(ramp_low, 0.0);
    ramp_high = std::min(ramp_high, static_cast<double>(dims - 1));
    if (ramp_low == ramp_high) ramp_high += 0.001;  // transformers' guard against a zero-width ramp
  }
  for (int i = 0; i < dims / 2; ++i) {
    float f = TorchInvFreq(theta, 2 * i, dims);
    if (rope.type == RopeSpec::Type::kYarn) {
      const float pos_freq = std::pow(static_cast<float>(rope.theta), static_cast<float>(2 * i) / static_cast<float>(dims));
      const float extrapolation = 1.0f / pos_freq;
      const float interpolation = 1.0f / (factor * pos_freq);
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(ramp_low)) /
                                        static_cast<float>(ramp_high - ramp_low), 0.0f, 1.0f);
      const float extrapolation_factor = 1.0f - ramp;
      f = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    } else if (rope.type == RopeSpec::Type::kLongrope) {
      // 1 / (ext_factors * base ** (2i / dim)), the factors as f32.
      const float pos_freq = std::pow(static_cast<float>(rope.theta), static_cast<float>(2 * i) / static_cast<float>(dims));
      f = 1.0f / (static_cast<float>(rope.short_factor[i]) * pos_freq);
    } else if (rope.type == RopeSpec::Type::kLinear) {
      f /= factor;
    } else if (rope.type == RopeSpec::Type::kLlama3) {
      const double old_len = rope.original_max_position_embeddings;
      const float low_wavelen = static_cast<float>(old_len / rope.low_freq_factor);
      const float high_wavelen = static_cast<float>(old_len / rope.high_freq_factor);
      const float wavelen = static_cast<float>(2 * M_PI) / f;
      if (wavelen > low_wavelen) {
        f /= factor;
      } else if (!(wavelen < high_wavelen)) {
        const float smooth = (static_cast<float>(old_len) / wavelen - static_cast<float>(rope.low_freq_factor)) /
                             static_cast<float>(rope.high_freq_factor - rope.low_freq_factor);
        f = (1.0f - smooth) * f / factor + smooth * f;
      }
    }
    inv_freq.push_back(f);
  }
  *rotary_dims = dims;
  return inv_freq;
}

float ModelConfig::attention_scale(int layer) const {
  const float scale = attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(layers[layer].head_dim));
  // transformers multiplies cos and sin by the RoPE attention factor, so both q and k:
  // their dot product, and nothing else the layer computes, scales by its square.
  const float factor = static_cast<float>(layers[layer].rope.attention_factor);
  return factor == 1.0f ? scale : scale * (factor * factor);
}

int ModelConfig::max_model_len() const {
  int64_t limit = max_position_embeddings;
  for (const LayerSpec& l : layers) {
    if (l.rope.position_limit > 0) limit = std::min(limit, l.rope.position_limit);
  }
  return static_cast<int>(limit);
}

Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source_name) {
  HSX_ASSIGN_OR_RETURN(const json root, ParseJson(json_text, source_name));
  if (!root.is_object()) return Error(source_name + ": not a JSON object");
  HSX_ASSIGN_OR_RETURN(const ArchName* arch, ParseArch(root, source_name));
  ModelConfig c;
  c.arch = arch->arch;
  c.architecture = arch->name;
  const json& defaults = HfDefaultsJson(c.arch);
  static const json kNone = json::object();

  // Multimodal checkpoints nest the language model's config in text_config; the top level
  // then holds only the towers' settings, dtype, tie_word_embeddings and eos_token_id.
  if (arch->multimodal && (!root.contains("text_config") || !root["text_config"].is_object())) {
    return Error(source_name + ": field 'text_config': missing (expected the language model's config object)");
  }
  const json& j = arch->multimodal ? root["text_config"] : root;
  Fields f(j, defaults, arch->multimodal ? source_name + ": text_config" : source_name);
  Fields top(root, kNone, source_name);
  HSX_RETURN_IF_ERROR(CheckModelType(root, arch->model_types[0], source_name));
  if (arch->multimodal) HSX_RETURN_IF_ERROR(CheckModelType(j, arch->model_types[1], f.source()));

  // dtype (5.x) or torch_dtype (4.x), in text_config or at the top level; dtype wins.
  for (const Fields* src : {&f, &top}) {
    const char* key = src->Has("dtype") ? "dtype" : src->Has("torch_dtype") ? "torch_dtype" : nullptr;
    if (!key) continue;
    HSX_ASSIGN_OR_RETURN(std::string name, src->String(key));
    auto dt = ParseFloatDTypeName(name);
    if (!dt) return src->Fail(key, "unsupported dtype '" + name + "' (expected bfloat16, float16 or float32)");
    c.dtype = *dt;
    break;
  }
  for (const Fields* src : {&f, &top}) {  // the other spelling is read too (the first one found wins)
    src->Given("dtype");
    src->Given("torch_dtype");
  }

  HSX_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size"));
  HSX_ASSIGN_OR_RETURN(c.num_layers, f.Int("num_hidden_layers", 1, kMaxLayers));
  HSX_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
  HSX_ASSIGN_OR_RETURN(c.num_heads, f.Int("num_attention_heads"));
  HSX_ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings", 1, kMaxPositions));
  HSX_ASSIGN_OR_RETURN(const double eps, f.Positive("rms_norm_eps"));
  c.rms_norm_eps = static_cast<float>(eps);

  // Gemma ties by default; the flag may sit at the top level or in text_config.
  HSX_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings"));
  if (arch->multimodal) {
    HSX_ASSIGN_OR_RETURN(c.tie_word_embeddings, top.Bool("tie_word_embeddings", c.tie_word_embeddings));
    if (j.contains("tie_word_embeddings")) {
      HSX_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings"));
    }
  }

  // Stop tokens: the language model's eos_token_id (or the default), then the top level's.
  HSX_RETURN_IF_ERROR(AppendEos(f.Has("eos_token_id") ? *f.Get("eos_token_id") : json(), f.source(), c.vocab_size, c.eos_token_ids));
  if (arch->multimodal && top.Has("eos_token_id")) {
    HSX_RETURN_IF_ERROR(AppendEos(*top.Get("eos_token_id"), source_name, c.vocab_size, c.eos_token_ids));
  }

  const bool gemma = c.arch == Arch::kGemma3 || c.arch == Arch::kGemma4;
  {
    // Gemma's modules read hidden_activation only; a hidden_act beside it must agree.
    const char* key = gemma ? "hidden_activation" : "hidden_act";
    HSX_ASSIGN_OR_RETURN(std::string act, f.String(key));
    // gpt-oss's experts apply their clamped SwiGLU whatever hidden_act says (transformers
    // never reads it there).
    if (c.arch == Arch::kGptOss) act = "silu";
    if (act == "silu" || act == "swish") c.activation = Activation::kSilu;
    else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh") c.activation = Activation::kGeluTanh;
    else return f.Fail(key, "unsupported activation '" + act + "' (supported: silu, gelu_pytorch_tanh)");
    if (gemma && f.Given("hidden_act") && !j["hidden_act"].is_null() && j["hidden_act"] != act) {
      return f.Fail("hidden_act", "disagrees with hidden_activation '" + act + "' (transformers uses hidden_activation)");
    }
  }

  HSX_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size"));
  if (c.arch == Arch::kGptOss) HSX_RETURN_IF_ERROR(ParseGptOssMoe(f, j, c));
  if (c.arch == Arch::kQwen3Moe) {
    // num_local_experts is the same field under its Mixtral-style name.
    const char* key = f.Given("num_local_experts") ? "num_local_experts" : "num_experts";
    if (f.Given("num_local_experts") && f.Given("num_experts") && j["num_experts"] != j["num_local_experts"]) {
      return f.Fail("num_experts", "disagrees with num_local_experts");
    }
    HSX_ASSIGN_OR_RETURN(c.num_experts, f.Int(key));
    HSX_ASSIGN_OR_RETURN(c.experts_per_token, f.Int("num_experts_per_tok"));
    HSX_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("moe_intermediate_size"));
    HSX_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob"));
    if (c.experts_per_token > c.num_experts) return f.Fail("num_experts_per_tok", "must not exceed num_experts");
  }

  // Biases: Qwen2 always has q/k/v biases (its attention ignores attention_bias); the
  // others put attention_bias on o_proj too, and mlp_bias on the MLP, which hsx lacks.
  if (c.arch == Arch::kQwen2) {
    c.qkv_bias = true;
    f.Given("attention_bias");
  } else if (c.arch == Arch::kGptOss) {
    HSX_ASSIGN_OR_RETURN(bool attention_bias, f.Bool("attention_bias"));
    c.qkv_bias = c.o_bias = attention_bias;
    c.attention_sinks = true;
  } else {
    HSX_ASSIGN_OR_RETURN(bool attention_bias, f.Bool("attention_bias"));
    if (attention_bias) return f.Fail("attention_bias", "projection biases are not supported for this architecture");
  }
  if (c.arch == Arch::kLlama || c.arch == Arch::kMistral) {  // Mistral's MLP has no bias whatever the flag
    HSX_ASSIGN_OR_RETURN(bool mlp_bias, f.Bool("mlp_bias"));
    if (mlp_bias) return f.Fail("mlp_bias", "MLP biases are not supported");
  }

  c.qk_norm = c.arch == Arch::kQwen3 || c.arch == Arch::kQwen3Moe || gemma;
  c.sandwich_norms = gemma;
  c.norm_one_plus_weight = c.arch == Arch::kGemma3;
  c.embed_scale = gemma ? std::sqrt(static_cast<float>(c.hidden_size)) : 1.0f;
  c.v_norm = c.arch == Arch::kGemma4;
  c.layer_scalar = c.arch == Arch::kGemma4;

  bool qwen_sliding = false;
  if (gemma) {
    HSX_ASSIGN_OR_RETURN(auto window, f.OptionalInt("sliding_window", 1, kMaxPositions));
    c.sliding_window = static_cast<int>(window.value_or(0));  // null: sliding layers see everything
    HSX_ASSIGN_OR_RETURN(auto softcap, f.OptionalNumber("final_logit_softcapping"));
    if (softcap && !(std::isfinite(*softcap) && *softcap > 0)) {
      return f.Fail("final_logit_softcapping", "must be null or a finite number > 0");
    }
    c.final_softcap = static_cast<float>(softcap.value_or(0.0));
  }
  if (c.arch == Arch::kGemma3) {
    HSX_ASSIGN_OR_RETURN(const double qpas, f.Positive("query_pre_attn_scalar"));
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
    HSX_ASSIGN_OR_RETURN(bool bidirectional, f.Bool("use_bidirectional_attention"));
    if (bidirectional) return f.Fail("use_bidirectional_attention", "bidirectional attention is not supported");
    // transformers 5 parses attn_logit_softcapping for Gemma 3 but never applies it.
    HSX_ASSIGN_OR_RETURN(auto unused_softcap, f.OptionalNumber("attn_logit_softcapping"));
    (void)unused_softcap;
  } else if (c.arch == Arch::kGemma4) {
    c.attn_scale = 1.0f;
    const json* bidi = f.Get("use_bidirectional_attention");
    if (bidi && !bidi->is_null() && *bidi != "vision") {
      // "vision" only changes attention among image tokens; "all" makes text bidirectional.
      return f.Fail("use_bidirectional_attention", "only null or \"vision\" is supported (text attention stays causal)");
    }
    HSX_ASSIGN_OR_RETURN(bool moe_block, f.Bool("enable_moe_block"));
    if (moe_block) return f.Fail("enable_moe_block", "Gemma 4 MoE blocks are not supported yet");
    for (const char* moe_key : {"num_experts", "top_k_experts", "moe_intermediate_size"}) {
      if (f.Has(moe_key)) return f.Fail(moe_key, "Gemma 4 MoE blocks are not supported yet");
    }
    HSX_ASSIGN_OR_RETURN(bool double_wide, f.Bool("use_double_wide_mlp"));
    if (double_wide) return f.Fail("use_double_wide_mlp", "double-wide MLPs are not supported yet");
    HSX_ASSIGN_OR_RETURN(c.per_layer_input_size, f.Int("hidden_size_per_layer_input", 0, kMaxSize));
    // Without per-layer inputs the table may be empty (Gemma 4 assistants set both to 0).
    HSX_ASSIGN_OR_RETURN(c.per_layer_vocab_size, f.Int("vocab_size_per_layer_input", c.per_layer_input_size > 0 ? 1 : 0));
  } else if (c.arch == Arch::kGptOss) {
    // gpt-oss: layer_types says which layers slide; a null window lets them see everything.
    HSX_ASSIGN_OR_RETURN(auto window, f.OptionalInt("sliding_window", 1, kMaxPositions));
    c.sliding_window = static_cast<int>(window.value_or(0));
  } else if (c.arch == Arch::kMistral) {
    // Mistral: every layer slides when sliding_window is set (not null; 4096 if omitted).
    HSX_ASSIGN_OR_RETURN(auto window, f.OptionalInt("sliding_window", 1, kMaxPositions));
    qwen_sliding = window.has_value();
    c.sliding_window = static_cast<int>(window.value_or(0));
  } else {
    // Qwen: the window exists only with use_sliding_window (transformers sets it to None
    // otherwise). Llama has no sliding window.
    if (c.arch != Arch::kLlama) {
      HSX_ASSIGN_OR_RETURN(qwen_sliding, f.Bool("use_sliding_window"));
      HSX_ASSIGN_OR_RETURN(auto window, f.OptionalInt("sliding_window", 1, kMaxPositions));
      if (!window) qwen_sliding = false;
      if (qwen_sliding) c.sliding_window = static_cast<int>(*window);
    }
  }
  HSX_RETURN_IF_ERROR(ParseLayers(f, c, qwen_sliding));
  if (c.sliding_window == 0) {
    for (auto& l : c.layers) l.sliding = false;
  }

  // quantization_config sits at the top level (multimodal checkpoints too).
  const Fields& quantization = arch->multimodal ? top : f;
  if (quantization.Given("quantization_config")) {
    const json& q = root["quantization_config"];
    if (c.arch == Arch::kGptOss && q.is_object() && q.value("quant_method", json()) == "mxfp4") {
      HSX_RETURN_IF_ERROR(CheckMxfp4QuantizationConfig(q, c.num_layers, source_name));
      c.mxfp4_experts = true;
    } else {
      HSX_RETURN_IF_ERROR(CheckFp8DynamicQuantizationConfig(q, source_name));
      c.fp8_checkpoint = true;
    }
  }

  f.Given("architectures");
  HSX_RETURN_IF_ERROR(f.CheckAllRead());
  if (arch->multimodal) {
    top.Given("text_config");
    top.Given("architectures");
    HSX_RETURN_IF_ERROR(top.CheckAllRead(MultimodalTopLevelFields()));
  }
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  if (IsGgufPath(model_dir)) {
    HSX_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::Open(model_dir));
    return GgufModelConfig(file);
  }
  const std::string path = model_dir + "/config.json";
  if (!std::filesystem::exists(path)) return Error(path + ": cannot open (is --model a Hugging Face model directory?)");
  HSX_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  HSX_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(text, path));
  // generation_config.json's eos_token_id (an integer or a list) stops generation too, as
  // in transformers' generate and vLLM.
  const std::string gen_path = model_dir + "/generation_config.json";
  if (std::filesystem::exists(gen_path)) {
    HSX_ASSIGN_OR_RETURN(const std::string gen_text, ReadTextFile(gen_path));
    HSX_ASSIGN_OR_RETURN(const json gen, ParseJson(gen_text, gen_path));
    if (!gen.is_object()) return Error(gen_path + ": not a JSON object");
    if (gen.contains("eos_token_id")) HSX_RETURN_IF_ERROR(AppendEos(gen["eos_token_id"], gen_path, c.vocab_size, c.eos_token_ids));
  }
  return c;
}

}  // namespace hsx
