// ModelConfig: everything the forward needs from a Hugging Face config.json, resolved
// per layer. Architectures differ here, in data, far more than in code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "tensor/dtype.h"
#include "util/status.h"

namespace hsx {

enum class Arch { kLlama, kMistral, kQwen2, kQwen3, kQwen3Moe, kGemma3, kGemma4, kGptOss };

struct RopeSpec {
  enum class Type { kDefault, kLinear, kLlama3, kProportional, kYarn, kDynamic, kLongrope } type = Type::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  // linear: frequencies divided by factor; llama3: frequency-dependent scaling.
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
  // yarn: the ramp between interpolated and extrapolated frequencies.
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  // dynamic: the length the frequencies are computed for (max_position_embeddings;
  // transformers recomputes them only past it, which hsx does not run: position_limit).
  double dynamic_seq_len = 0;
  // longrope: per-frequency divisors; the short ones apply up to
  // original_max_position_embeddings tokens (hsx runs no longer sequences).
  std::vector<double> short_factor, long_factor;
  // transformers multiplies cos and sin by it (yarn, longrope), so q.k by its square:
  // hsx folds that square into the softmax scale (ModelConfig::attention_scale).
  double attention_factor = 1.0;
  // The longest sequence whose positions this table rotates as transformers does
  // (dynamic and longrope switch tables past it); 0: no limit.
  int64_t position_limit = 0;
};

struct LayerSpec {
  bool sliding = false;       // sliding-window attention (window = ModelConfig::sliding_window)
  int head_dim = 0;
  int num_kv_heads = 0;
  bool k_eq_v = false;        // no v_proj: values are the keys (Gemma 4 full-attention layers)
  int kv_source = -1;         // layer whose KV this layer reads (itself unless KV-shared)
  bool moe = false;
  RopeSpec rope;
};

struct ModelConfig {
  std::string architecture;  // e.g. "Qwen3ForCausalLM"
  Arch arch = Arch::kLlama;
  DType dtype = DType::kBF16;
  // The checkpoint's projections are FP8 already (model/quantization_config.h): they load
  // as E4M3 codes with row scales and run on --quantization fp8's path.
  bool fp8_checkpoint = false;
  // The checkpoint's expert projections are MXFP4 (quantization_config.quant_method
  // "mxfp4", gpt-oss): `<name>_blocks` + `<name>_scales` tensors, dequantized at load.
  bool mxfp4_experts = false;

  int hidden_size = 0, num_layers = 0, vocab_size = 0, intermediate_size = 0, num_heads = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  Activation activation = Activation::kSilu;
  bool tie_word_embeddings = false;
  std::vector<int32_t> eos_token_ids;

  // Architecture traits.
  bool norm_one_plus_weight = false;  // Gemma 3: RMSNorm scales by (1 + w)
  bool qkv_bias = false;              // Qwen2, gpt-oss
  bool o_bias = false;                // gpt-oss: o_proj has a bias too
  bool attention_sinks = false;       // gpt-oss: a learned logit per head (self_attn.sinks) in each softmax
  bool qk_norm = false;               // Qwen3, Gemma
  bool v_norm = false;                // Gemma 4: weightless RMSNorm on values
  bool sandwich_norms = false;        // Gemma: norms after attention and MLP too
  bool layer_scalar = false;          // Gemma 4: per-layer output scale
  float embed_scale = 1.0f;           // Gemma: sqrt(hidden_size)
  float attn_scale = 0.0f;            // 0: 1 / sqrt(head_dim)
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  int sliding_window = 0;

  // Mixture of experts (Qwen3-MoE, gpt-oss).
  int num_experts = 0, experts_per_token = 0, moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  // gpt-oss: router and expert biases, softmax over the top-k logits only, and the
  // clamped SwiGLU with (up + 1) (MoeSpec); its experts are stacked tensors in the
  // checkpoint (mlp.experts.gate_up_proj [E, H, 2I], gate and up columns interleaved).
  bool moe_biases = false;
  bool moe_softmax_after_topk = false;
  float swiglu_limit = 0.0f, swiglu_alpha = 0.0f;  // 0: the plain gated activation

  // Gemma 4 per-layer input embeddings (0: none).
  int per_layer_input_size = 0;
  int per_layer_vocab_size = 0;

  std::vector<LayerSpec> layers;

  // The softmax scale, with the RoPE attention factor's square folded in.
  float attention_scale(int layer) const;
  // The longest sequence hsx runs: max_position_embeddings, or less where a RoPE variant
  // would change its frequencies for longer ones (RopeSpec::position_limit).
  int max_model_len() const;
};

// Rotary frequencies for one layer, as transformers computes them; rotary_dims receives
// how many leading dims of each rotate-half pair set turn.
std::vector<float> RopeInverseFrequencies(const RopeSpec& rope, int head_dim, int* rotary_dims);

// Reads DIR/config.json (or its text_config) as transformers 5.x resolves it: 4.x and 5.x
// keys, the architecture's defaults for omitted fields; refuses fields hsx does not
// implement. Adds DIR/generation_config.json's eos_token_id to the stop tokens.
// Errors name the file and field. A .gguf file's metadata is read instead (gguf_config.h).
Result<ModelConfig> LoadModelConfig(const std::string& model_dir);
Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source_name);

// Published shapes for dummy-weight runs ("qwen3-8b", "llama-3.1-8b", ...).
Result<ModelConfig> NamedModelConfig(const std::string& name);

}  // namespace hsx
