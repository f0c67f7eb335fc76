#include "model/model.h"

#include <cmath>

#include "model/decoder_layer.h"
#include "model/fp8_quantization.h"
#include "model/gguf_config.h"
#include "model/gguf_weights.h"

namespace hsx {

Model::Model(ModelConfig config, ModelWeights weights, Backend& backend, Communicator* comm)
    : config_(std::move(config)),
      rank_config_(comm ? RankConfig(config_, {comm->rank(), comm->size()}) : config_),
      comm_(comm),
      weights_(std::move(weights)),
      backend_(backend),
      rope_(MakeRopeTables(config_, backend)) {}

Result<std::unique_ptr<Model>> Model::Load(const std::string& model_dir, Backend& backend, Communicator* comm) {
  const Shard shard = comm ? Shard{comm->rank(), comm->size()} : Shard{};
  if (IsGgufPath(model_dir)) {
    HSX_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::Open(model_dir));
    HSX_ASSIGN_OR_RETURN(ModelConfig config, GgufModelConfig(file));
    HSX_RETURN_IF_ERROR(CheckTensorParallel(config, shard.size).with_context(model_dir));
    HSX_ASSIGN_OR_RETURN(ModelWeights weights, LoadGgufWeights(file, config, backend, shard));
    return std::make_unique<Model>(std::move(config), std::move(weights), backend, comm);
  }
  HSX_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  HSX_RETURN_IF_ERROR(CheckTensorParallel(config, shard.size).with_context(model_dir));
  HSX_ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(model_dir, config, backend, shard));
  return std::make_unique<Model>(std::move(config), std::move(weights), backend, comm);
}

// A row-parallel projection's partial sums, completed across the ranks.
void Model::AllReduce(Tensor& partial_sums) {
  if (comm_ != nullptr) comm_->AllReduceSum(partial_sums);
}

// Logits f32 [R, V] of final-normed rows [R, H]. A vocabulary-parallel rank computes its
// V / N columns; the all-gather stacks the ranks' [R, V / N] blocks, placed side by side.
Tensor Model::Logits(const Tensor& rows) {
  const int64_t r = rows.size(0), v = config_.vocab_size;
  Tensor logits = backend_.Empty(DType::kF32, {r, v});
  if (comm_ == nullptr || !VocabParallel(config_, comm_->size())) {
    backend_.Linear(rows, weights_.lm_head, nullptr, logits);
    return logits;
  }
  const int64_t n = comm_->size(), part = v / n;
  Tensor mine = backend_.Empty(DType::kF32, {r, part});
  backend_.Linear(rows, weights_.lm_head, nullptr, mine);
  Tensor all = backend_.Empty(DType::kF32, {n * r, part});
  comm_->AllGather(mine, all);
  for (int64_t k = 0; k < n; ++k) backend_.WriteColumns(all.Rows(k * r, (k + 1) * r), k * part, logits);
  return logits;
}

Status Model::QuantizeWeightsFp8() { return QuantizeLinearWeightsFp8(weights_, backend_); }

// Gemma 4: a per-layer input for every token and layer, [T, L * P], from a second
// embedding table plus a projection of the main embedding.
Tensor Model::PerLayerInputs(const Tensor& ids, const Tensor& embeds) {
  const int64_t t = ids.numel(), p = config_.per_layer_input_size, total = config_.num_layers * p;
  const DType dt = backend_.compute_dtype();
  Tensor per_layer = backend_.Empty(dt, {t, total});
  backend_.Embed(weights_.embed_tokens_per_layer, ids, std::sqrt(static_cast<float>(p)), per_layer);
  Tensor projected = backend_.Empty(dt, {t, total});
  backend_.Linear(embeds, weights_.per_layer_model_projection, nullptr, projected);
  backend_.Scale(projected, 1.0f / std::sqrt(static_cast<float>(config_.hidden_size)));
  Tensor rows = projected.View({t * config_.num_layers, p});
  backend_.RmsNorm(rows, &weights_.per_layer_projection_norm, config_.rms_norm_eps, false, rows);
  backend_.Add(projected, per_layer);
  backend_.Scale(projected, static_cast<float>(1.0 / std::sqrt(2.0)));
  return projected;
}

DeviceBatch UploadBatch(Backend& backend, const ForwardBatch& batch) {
  DeviceBatch d;
  d.token_ids = backend.Upload(HostInts(batch.token_ids));
  d.positions = backend.Upload(HostInts(batch.positions));
  d.slot_mapping = backend.Upload(HostInts(batch.slot_mapping));
  d.attention = MakeAttentionBatch(backend, batch.seqs);
  d.logit_rows = batch.logit_rows;
  return d;
}

ForwardOutput Model::Forward(const ForwardBatch& batch, KVCache& cache, const std::vector<int>& capture_layers) {
  return Forward(UploadBatch(backend_, batch), cache, capture_layers);
}

ForwardOutput Model::Forward(const DeviceBatch& batch, KVCache& cache, const std::vector<int>& capture_layers) {
  const int64_t t = batch.token_ids.numel(), h = config_.hidden_size;
  const DType dt = backend_.compute_dtype();
  const float eps = config_.rms_norm_eps;
  const bool one_plus = config_.norm_one_plus_weight;
  const Tensor& ids = batch.token_ids;
  const Tensor& positions = batch.positions;
  const Tensor& slots = batch.slot_mapping;
  const AttentionBatch& attention_batch = batch.attention;

  ForwardOutput result;
  result.captured = backend_.Empty(dt, {static_cast<int64_t>(capture_layers.size()), t, h});
  size_t next_capture = 0;
  auto capture = [&](int id, const Tensor& x) {
    if (next_capture < capture_layers.size() && capture_layers[next_capture] == id) {
      Tensor dst = result.captured.Rows(next_capture, next_capture + 1).View({t, h});
      backend_.Copy(x, dst);
      ++next_capture;
    }
  };

  Tensor x = backend_.Empty(dt, {t, h});
  // HF casts the embedding scale to the compute dtype first (sqrt(3072) = 55.43 is 55.5 in bf16).
  float embed_scale = config_.embed_scale;
  if (dt == DType::kBF16) embed_scale = BF16ToF32(F32ToBF16(embed_scale));
  backend_.Embed(weights_.embed_tokens, ids, embed_scale, x);
  Tensor per_layer_inputs;
  if (config_.per_layer_input_size > 0) per_layer_inputs = PerLayerInputs(ids, x);

  Tensor normed = backend_.Empty(dt, {t, h});
  Tensor branch = backend_.Empty(dt, {t, h});
  // Each residual add is fused with the norm that follows it; `carry` marks a branch (the
  // previous layer's MLP output) still to be added to x, which the next input norm does.
  bool carry = false;
  // A block's input: x (plus `add`, into x) normed into `normed`, or, when the block's
  // projection is FP8 (--quantization fp8), into its FP8 codes and row scales in one pass.
  auto norm = [&](const Tensor* add, const Tensor& weight, bool fp8) {
    if (fp8) return backend_.RmsNormFp8(x, add, &weight, eps, one_plus);
    if (add != nullptr) {
      backend_.AddRmsNorm(x, *add, &weight, eps, one_plus, normed);
    } else {
      backend_.RmsNorm(x, &weight, eps, one_plus, normed);
    }
    return normed;
  };
  for (int i = 0; i < config_.num_layers; ++i) {
    const LayerWeights& w = weights_.layers[i];
    const Tensor attention_in = norm(carry ? &branch : nullptr, w.input_norm, w.qkv_proj.dtype() == DType::kF8E4M3);
    capture(i, x);
    AttentionBlock(backend_, rank_config_, i, w, rope_[i], attention_in, positions, slots, attention_batch, cache,
                   branch);
    AllReduce(branch);
    if (config_.sandwich_norms) backend_.RmsNorm(branch, &w.post_attention_norm, eps, one_plus, branch);
    const Tensor& mlp_norm = config_.sandwich_norms ? w.pre_feedforward_norm : w.post_attention_norm;
    const bool mlp_fp8 = !rank_config_.layers[i].moe && w.gate_up_proj.dtype() == DType::kF8E4M3;
    const Tensor mlp_in = norm(&branch, mlp_norm, mlp_fp8);
    MlpBlock(backend_, rank_config_, i, w, mlp_in, branch);
    AllReduce(branch);
    if (config_.sandwich_norms) backend_.RmsNorm(branch, &w.post_feedforward_norm, eps, one_plus, branch);
    carry = !per_layer_inputs.defined() && !config_.layer_scalar;
    if (carry) continue;
    backend_.Add(x, branch);
    if (per_layer_inputs.defined()) {
      const int64_t p = config_.per_layer_input_size;
      Tensor gate = backend_.Empty(dt, {t, p});
      backend_.Linear(x, w.per_layer_input_gate, nullptr, gate);
      backend_.Activate(gate, config_.activation);
      Tensor layer_input = backend_.Empty(dt, {t, p});
      backend_.SliceColumns(per_layer_inputs, i * p, layer_input);
      backend_.Multiply(gate, layer_input);
      backend_.Linear(gate, w.per_layer_projection, nullptr, branch);
      backend_.RmsNorm(branch, &w.post_per_layer_input_norm, eps, one_plus, branch);
      backend_.Add(x, branch);
    }
    if (config_.layer_scalar) backend_.ScaleByTensor(x, w.layer_scalar);
  }
  if (carry) backend_.Add(x, branch);
  capture(config_.num_layers, x);

  if (!batch.logit_rows.empty()) {
    const int64_t r = static_cast<int64_t>(batch.logit_rows.size());
    Tensor rows = backend_.Empty(dt, {r, h});
    bool every_row = r == t;
    for (int64_t i = 0; every_row && i < r; ++i) every_row = batch.logit_rows[i] == i;
    if (every_row) {  // a decode step: no gather (nor its upload, which a graph cannot record)
      backend_.RmsNorm(x, &weights_.final_norm, eps, one_plus, rows);
    } else {
      backend_.GatherRows(x, batch.logit_rows, rows);
      backend_.RmsNorm(rows, &weights_.final_norm, eps, one_plus, rows);
    }
    result.final_hidden = rows;
    result.logits = Logits(rows);
    if (config_.final_softcap > 0.0f) backend_.Softcap(result.logits, config_.final_softcap);
  }
  return result;
}

}  // namespace hsx
