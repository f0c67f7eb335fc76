#include "model/gguf_config.h"

#include <algorithm>
#include <filesystem>
#include <set>

namespace hsx {
namespace {

using nlohmann::json;

struct GgufArch {
  const char* gguf_name;
  const char* hf_class;
  const char* model_type;
};

constexpr GgufArch kArchs[] = {
    {"llama", "LlamaForCausalLM", "llama"},
    {"qwen2", "Qwen2ForCausalLM", "qwen2"},
    {"qwen3", "Qwen3ForCausalLM", "qwen3"},
    {"qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe"},
    {"gemma3", "Gemma3ForCausalLM", "gemma3_text"},
};

}  // namespace

bool IsGgufPath(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0 && !std::filesystem::is_directory(path);
}

Result<json> GgufHfConfig(const GgufFile& g) {
  HSX_ASSIGN_OR_RETURN(const std::string arch_name, g.String("general.architecture"));
  const GgufArch* arch = nullptr;
  for (const GgufArch& a : kArchs) {
    if (arch_name == a.gguf_name) arch = &a;
  }
  if (!arch) {
    return Error(g.path() + ": metadata 'general.architecture' is '" + arch_name +
                 "', which hsx does not run from GGUF (expected llama, qwen2, qwen3, qwen3moe or gemma3)");
  }
  const std::string p = arch_name + ".";
  std::set<std::string> read;
  auto key = [&](const std::string& k) {
    read.insert(p + k);
    return p + k;
  };
  auto has = [&](const std::string& k) { return g.Find(p + k) != nullptr; };

  json c;
  c["architectures"] = {arch->hf_class};
  c["model_type"] = arch->model_type;
  HSX_ASSIGN_OR_RETURN(const uint64_t layers, g.Unsigned(key("block_count")));
  HSX_ASSIGN_OR_RETURN(const uint64_t hidden, g.Unsigned(key("embedding_length")));
  HSX_ASSIGN_OR_RETURN(const uint64_t heads, g.Unsigned(key("attention.head_count")));
  c["num_hidden_layers"] = layers;
  c["hidden_size"] = hidden;
  c["num_attention_heads"] = heads;
  uint64_t kv_heads = heads;
  if (has("attention.head_count_kv")) {
    HSX_ASSIGN_OR_RETURN(kv_heads, g.Unsigned(key("attention.head_count_kv")));
  }
  c["num_key_value_heads"] = kv_heads;
  HSX_ASSIGN_OR_RETURN(c["rms_norm_eps"], g.Float(key("attention.layer_norm_rms_epsilon")));
  HSX_ASSIGN_OR_RETURN(c["max_position_embeddings"], g.Unsigned(key("context_length")));
  const bool gemma3 = arch_name == "gemma3";
  if (has("rope.freq_base")) {
    HSX_ASSIGN_OR_RETURN(c["rope_theta"], g.Float(key("rope.freq_base")));
  } else if (!gemma3) {  // without one Gemma 3 keeps its config's default (1e6, full attention)
    c["rope_theta"] = 10000.0;
  }

  // Head dims: key and value lengths must agree (hsx has one head_dim), and RoPE must turn
  // all of it.
  if (heads == 0) return Error(g.path() + ": metadata '" + p + "attention.head_count' is 0");
  uint64_t head_dim = hidden / heads;
  if (has("attention.key_length")) {
    HSX_ASSIGN_OR_RETURN(head_dim, g.Unsigned(key("attention.key_length")));
  }
  if (has("attention.value_length")) {
    HSX_ASSIGN_OR_RETURN(const uint64_t v, g.Unsigned(key("attention.value_length")));
    if (v != head_dim) {
      return Error(g.path() + ": metadata '" + p + "attention.value_length' is " + std::to_string(v) +
                   ", but the key length is " + std::to_string(head_dim) + " (hsx needs them equal)");
    }
  }
  c["head_dim"] = head_dim;
  if (has("rope.dimension_count")) {
    HSX_ASSIGN_OR_RETURN(const uint64_t rot, g.Unsigned(key("rope.dimension_count")));
    if (rot != head_dim) {
      return Error(g.path() + ": metadata '" + p + "rope.dimension_count' is " + std::to_string(rot) +
                   ", expected the head dim " + std::to_string(head_dim) + " (partial RoPE is not supported from GGUF)");
    }
  }
  if (has("rope.scaling.type") && gemma3) {
    // llama.cpp scales the full-attention layers; transformers' GGUF conversion drops the key.
    return Error(g.path() + ": metadata '" + p + "rope.scaling.type' is not supported for gemma3 (llama.cpp applies it, "
                 "transformers' GGUF conversion ignores it)");
  }
  if (has("rope.scaling.type")) {
    HSX_ASSIGN_OR_RETURN(const std::string type, g.String(key("rope.scaling.type")));
    if (type == "linear") {
      HSX_ASSIGN_OR_RETURN(const double factor, g.Float(key("rope.scaling.factor")));
      c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
    } else if (type != "none") {
      return Error(g.path() + ": metadata '" + p + "rope.scaling.type' is '" + type + "' (expected none or linear)");
    }
  }

  // The vocabulary: the architecture's count, else the tokenizer's.
  if (has("vocab_size")) {
    HSX_ASSIGN_OR_RETURN(c["vocab_size"], g.Unsigned(key("vocab_size")));
  } else {
    HSX_ASSIGN_OR_RETURN(const auto* tokens, g.Array("tokenizer.ggml.tokens", GgufType::kString));
    c["vocab_size"] = tokens->size();
  }
  // Stop tokens: EOS, and EOT where the file names one (llama.cpp stops on both).
  json eos = json::array();
  auto add_eos = [&](uint64_t id) {
    if (std::find(eos.begin(), eos.end(), json(id)) == eos.end()) eos.push_back(id);
  };
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!g.Find(k)) continue;
    HSX_ASSIGN_OR_RETURN(const uint64_t id, g.Unsigned(k));
    add_eos(id);
  }
  // Gemma 3 ends a turn with <end_of_turn>, a stop token of its generation_config.json
  // (eos_token_id [1, 106]), which a GGUF file does not carry and need not name as its EOT
  // (llama.cpp then finds the token by its text): found by its text here too, so a GGUF
  // Gemma 3 stops where its directory model, with that generation_config.json, does.
  if (gemma3 && g.Find("tokenizer.ggml.tokens")) {
    HSX_ASSIGN_OR_RETURN(const auto* tokens, g.Array("tokenizer.ggml.tokens", GgufType::kString));
    for (size_t i = 0; i < tokens->size(); ++i) {
      if ((*tokens)[i].s == "<end_of_turn>") {
        add_eos(i);
        break;
      }
    }
  }
  c["eos_token_id"] = eos;
  c["tie_word_embeddings"] = g.FindTensor("output.weight") == nullptr;

  if (arch_name == "qwen3moe") {
    HSX_ASSIGN_OR_RETURN(c["num_experts"], g.Unsigned(key("expert_count")));
    HSX_ASSIGN_OR_RETURN(c["num_experts_per_tok"], g.Unsigned(key("expert_used_count")));
    HSX_ASSIGN_OR_RETURN(c["moe_intermediate_size"], g.Unsigned(key("expert_feed_forward_length")));
    c["norm_topk_prob"] = true;  // llama.cpp's qwen3moe always renormalizes the chosen experts
    if (has("feed_forward_length")) {
      HSX_ASSIGN_OR_RETURN(c["intermediate_size"], g.Unsigned(key("feed_forward_length")));
    }
  } else {
    HSX_ASSIGN_OR_RETURN(c["intermediate_size"], g.Unsigned(key("feed_forward_length")));
  }
  if (gemma3) {
    // Sliding layers: every layer but each sixth (llama.cpp's and transformers' fixed pattern)
    // at RoPE base 1e4 (both fixed too), over the window the file gives (llama.cpp requires it).
    HSX_ASSIGN_OR_RETURN(c["sliding_window"], g.Unsigned(key("attention.sliding_window")));
    // Queries scale by 1/sqrt(256), transformers' default query_pre_attn_scalar; llama.cpp uses
    // 1/sqrt(head_dim) (27B: 1/sqrt(hidden/heads)), equal only at head dim 256.
    if (head_dim != 256) {
      return Error(g.path() + ": the head dim (metadata '" + p + "attention.key_length') is " + std::to_string(head_dim) +
                   ": hsx reads gemma3 from GGUF only at head dim 256, where llama.cpp's query scale equals "
                   "transformers' (query_pre_attn_scalar 256)");
    }
  }
  if (arch_name == "llama") {
    // llama.cpp's Llama has biases on q/k/v/o only together (attention_bias), on the MLP never here.
    c["attention_bias"] = g.FindTensor("blk.0.attn_q.bias") != nullptr;
  }

  // Whatever else the architecture's namespace holds would change the computation in a way
  // hsx does not know: refuse it by name. Other namespaces: general.* (descriptive),
  // tokenizer.* (read by the tokenizer), quantize.* (how the file was made).
  for (const auto& [k, v] : g.metadata()) {
    if (k.rfind(p, 0) == 0) {
      if (!read.count(k)) {
        return Error(g.path() + ": metadata '" + k + "' is not supported for GGUF architecture " + arch_name);
      }
    } else if (k.rfind("general.", 0) != 0 && k.rfind("tokenizer.", 0) != 0 && k.rfind("quantize.", 0) != 0) {
      return Error(g.path() + ": metadata '" + k + "' is not supported (split or unknown GGUF files are not read)");
    }
  }
  if (g.FindTensor("rope_freqs.weight")) {
    return Error(g.path() + ": tensor 'rope_freqs.weight' (llama 3 RoPE scaling factors) is not supported from GGUF");
  }
  return c;
}

Result<ModelConfig> GgufModelConfig(const GgufFile& file) {
  HSX_ASSIGN_OR_RETURN(const json c, GgufHfConfig(file));
  return ParseModelConfig(c.dump(), file.path() + " (metadata as config.json)");
}

}  // namespace hsx
