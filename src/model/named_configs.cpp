// Published shapes of common targets, for --load-format dummy runs that need no
// checkpoint. Each is a config.json as the model's hub repository has it, trimmed to
// the fields hsx reads, and goes through the same parser as a real one.
#include <map>

#include "model/config.h"

namespace hsx {
namespace {

const std::map<std::string, const char*>& NamedConfigs() {
  static const std::map<std::string, const char*> kConfigs = {
      {"qwen3-0.6b", R"({"architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16", "hidden_size": 1024,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 3072, "vocab_size": 151936, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 1000000, "max_position_embeddings": 40960, "tie_word_embeddings": true,
        "eos_token_id": 151645})"},
      {"qwen3-8b", R"({"architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16", "hidden_size": 4096,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 12288, "vocab_size": 151936, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 1000000, "max_position_embeddings": 40960, "tie_word_embeddings": false,
        "eos_token_id": 151645})"},
      {"llama-3.1-8b", R"({"architectures": ["LlamaForCausalLM"], "dtype": "bfloat16", "hidden_size": 4096,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256, "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "tie_word_embeddings": false,
        "eos_token_id": [128001, 128008, 128009]})"},
      {"llama-3.1-70b", R"({"architectures": ["LlamaForCausalLM"], "dtype": "bfloat16", "hidden_size": 8192,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
        "vocab_size": 128256, "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "tie_word_embeddings": false,
        "eos_token_id": [128001, 128008, 128009]})"},
      {"qwen3-30b-a3b", R"({"architectures": ["Qwen3MoeForCausalLM"], "dtype": "bfloat16", "hidden_size": 2048,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
        "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 40960,
        "tie_word_embeddings": false, "eos_token_id": 151645})"},
      // openai/gpt-oss-20b's shape, with bf16 experts (the hub file's MXFP4 quantization_config
      // dropped: dummy weights are drawn in the compute dtype); layer_types alternate by default.
      {"gpt-oss-20b", R"({"architectures": ["GptOssForCausalLM"], "dtype": "bfloat16", "hidden_size": 2880,
        "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088,
        "attention_bias": true, "sliding_window": 128, "swiglu_limit": 7.0, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072, "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn",
        "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
        "original_max_position_embeddings": 4096}, "tie_word_embeddings": false, "eos_token_id": 200002})"},
      // Five sliding layers then one full-attention layer (the hub file lists all 60
      // layer_types; sliding_window_pattern 6 spells the same sequence).
      {"gemma-4-31b", R"({"architectures": ["Gemma4ForConditionalGeneration"], "text_config": {
        "dtype": "bfloat16", "hidden_size": 5376, "num_hidden_layers": 60, "num_attention_heads": 32,
        "num_key_value_heads": 16, "head_dim": 256, "num_global_key_value_heads": 4, "global_head_dim": 512,
        "attention_k_eq_v": true, "intermediate_size": 21504, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "sliding_window": 1024,
        "sliding_window_pattern": 6, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
        "rope_type": "proportional"}, "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "vocab_size": 262144, "max_position_embeddings": 262144, "tie_word_embeddings": true,
        "eos_token_id": 1}})"},
  };
  return kConfigs;
}

}  // namespace

Result<ModelConfig> NamedModelConfig(const std::string& name) {
  auto it = NamedConfigs().find(name);
  if (it == NamedConfigs().end()) {
    std::string known;
    for (const auto& [k, v] : NamedConfigs()) known += (known.empty() ? "" : ", ") + k;
    return Error("--model '" + name + "' is neither a model directory nor a named config (" + known + ")");
  }
  return ParseModelConfig(it->second, "named config " + name);
}

}  // namespace hsx
