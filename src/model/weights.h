// The tensors of a decoder-only model, found by their Hugging Face names, checked
// against the config's shapes, and placed on the backend's device.
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "tensor/safetensors.h"

namespace hsx {

struct LayerWeights {
  Tensor input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  // q_proj's rows, then (a layer that owns its KV) k_proj's, then v_proj's unless k_eq_v:
  // one GEMM. qkv_bias has the same rows (Qwen2).
  Tensor qkv_proj, o_proj;
  Tensor qkv_bias, o_bias;  // o_bias: gpt-oss
  Tensor sinks;             // gpt-oss: f32 [num_heads], the attention sink logits
  Tensor q_norm, k_norm;
  Tensor gate_up_proj, down_proj;  // dense MLP: gate_proj's rows then up_proj's, [2I, H]
  Tensor router, router_bias;            // MoE: [E, H]; gpt-oss's bias [E]
  MoeWeights experts;
  Tensor layer_scalar;                   // Gemma 4: [1]
  Tensor per_layer_input_gate, per_layer_projection, post_per_layer_input_norm;  // Gemma 4
};

struct ModelWeights {
  Tensor embed_tokens, final_norm, lm_head;  // lm_head aliases embed_tokens when tied
  Tensor embed_tokens_per_layer, per_layer_model_projection, per_layer_projection_norm;  // Gemma 4
  std::vector<LayerWeights> layers;
};

enum class LoadFormat { kSafetensors, kDummy };

// Every tensor of a checkpoint directory (DIR/model.safetensors or the shards that
// model.safetensors.index.json names), mmapped and validated: name -> (tensor, its file).
using CheckpointTensors = std::map<std::string, std::pair<Tensor, std::string>>;
Result<CheckpointTensors> OpenCheckpoint(const std::string& model_dir);
// The named host tensor with exactly `shape` and one of `dtypes` (`expected` describes
// them), aligned for typed reads; errors name the file, the tensor and what was expected.
Result<Tensor> CheckpointTensor(const CheckpointTensors& tensors, const std::string& model_dir, const std::string& name,
                                const Shape& shape, std::initializer_list<DType> dtypes, const char* expected);
// The same for a float tensor (BF16, F16 or F32), on the host ...
Result<Tensor> CheckpointFloatTensor(const CheckpointTensors& tensors, const std::string& model_dir,
                                     const std::string& name, const Shape& shape);
// ... and placed on the backend's device as a weight.
Result<Tensor> UploadCheckpointWeight(const CheckpointTensors& tensors, const std::string& model_dir,
                                      const std::string& name, const Shape& shape, Backend& backend);

// Writes `part` into rows [row, row + its rows) of `fused`, which the first part to arrive
// allocates with `total_rows` rows in the part's dtype. The one place where projections that
// run as one GEMM (q/k/v, gate/up) are concatenated: part by part as they load, so no second copy
// of the separate weights stays. `name` (the part's) is for the error of a dtype mismatch.
Status PlaceRows(Backend& backend, const Tensor& part, int64_t row, int64_t total_rows, const std::string& name,
                 Tensor& fused);

// Loads every tensor the config implies from `fetch` (a host float tensor of the given
// Hugging Face name and full shape), one at a time, each placed on the device (a rank's
// slice of it) before the next.
using WeightSource = std::function<Result<Tensor>(const std::string& name, const Shape& shape)>;
Result<ModelWeights> LoadWeightsFrom(const WeightSource& fetch, const ModelConfig& config, Backend& backend,
                                     Shard shard = {});
// Loads DIR/model.safetensors or the shards listed in DIR/model.safetensors.index.json;
// a tensor-parallel rank reads only its slices (model/tensor_parallel.h).
Result<ModelWeights> LoadWeights(const std::string& model_dir, const ModelConfig& config, Backend& backend,
                                 Shard shard = {});
// Random weights (fixed seed, std 1/sqrt(fan_in), norms near 1) in config.dtype; a rank's
// slices are drawn at their own shape (they are not slices of the unsharded draw).
ModelWeights DummyWeights(const ModelConfig& config, Backend& backend, uint64_t seed = 0, Shard shard = {});
// Parameters the config implies, counting tied tensors once.
int64_t CountParameters(const ModelConfig& config);

}  // namespace hsx
