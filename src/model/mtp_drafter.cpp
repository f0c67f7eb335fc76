#include "model/mtp_drafter.h"

#include <cstring>

#include "model/decoder_layer.h"

namespace hsx {
namespace {

// Columns [begin, begin + width) of a host matrix, as a new host matrix.
Tensor HostColumns(const Tensor& m, int64_t begin, int64_t width) {
  Tensor out = Tensor::Host(m.dtype(), {m.size(0), width});
  const size_t esize = DTypeSize(m.dtype());
  for (int64_t r = 0; r < m.size(0); ++r) {
    std::memcpy(static_cast<char*>(out.raw()) + r * width * esize,
                static_cast<const char*>(m.raw()) + (r * m.size(1) + begin) * esize, width * esize);
  }
  return out;
}

// masked_embedding.token_ordering (int64 or int32 [V], every entry a token id) as int32 [C, V / C].
Result<Tensor> TokenOrdering(const CheckpointTensors& tensors, const std::string& dir, const MtpConfig& c) {
  const std::string name = "masked_embedding.token_ordering";
  const int64_t vocab = c.text.vocab_size;
  auto it = tensors.find(name);
  if (it == tensors.end()) return Error(dir + ": missing tensor '" + name + "' (expected int64 [" + std::to_string(vocab) + "])");
  const Tensor& t = it->second.first;
  if ((t.dtype() != DType::kI64 && t.dtype() != DType::kI32) || t.shape() != Shape{vocab}) {
    return Error(it->second.second + ": tensor '" + name + "' is " + std::string(DTypeName(t.dtype())) + " " +
                 ShapeToString(t.shape()) + ", expected I64 or I32 [" + std::to_string(vocab) + "]");
  }
  Tensor out = Tensor::Host(DType::kI32, {c.num_centroids, vocab / c.num_centroids});
  for (int64_t i = 0; i < vocab; ++i) {
    int64_t id = 0;
    if (t.dtype() == DType::kI64) {
      std::memcpy(&id, static_cast<const char*>(t.raw()) + i * 8, 8);  // safetensors promises no alignment
    } else {
      int32_t v32 = 0;
      std::memcpy(&v32, static_cast<const char*>(t.raw()) + i * 4, 4);
      id = v32;
    }
    if (id < 0 || id >= vocab) {
      return Error(it->second.second + ": tensor '" + name + "' entry " + std::to_string(i) + " is " +
                   std::to_string(id) + ", not a token id in [0, " + std::to_string(vocab) + ")");
    }
    out.data<int32_t>()[i] = static_cast<int32_t>(id);
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<MtpDrafter>> MtpDrafter::Load(const std::string& drafter_dir, const Model& target,
                                                     Backend& backend) {
  HSX_ASSIGN_OR_RETURN(MtpConfig config, LoadMtpConfig(drafter_dir));
  HSX_ASSIGN_OR_RETURN(std::vector<int> sources, MtpTargetKvLayers(config, target.config(), drafter_dir + "/config.json"));
  MtpWeights w;
  HSX_ASSIGN_OR_RETURN(w.decoder, LoadWeights(drafter_dir, config.text, backend));
  HSX_ASSIGN_OR_RETURN(const CheckpointTensors tensors, OpenCheckpoint(drafter_dir));
  const int64_t ha = config.text.hidden_size, ht = config.backbone_hidden_size;
  HSX_ASSIGN_OR_RETURN(const Tensor pre, CheckpointFloatTensor(tensors, drafter_dir, "pre_projection.weight", {ha, 2 * ht}));
  w.pre_projection_token = backend.UploadWeight(HostColumns(pre, 0, ht));  // the embedding comes first
  w.pre_projection_hidden = backend.UploadWeight(HostColumns(pre, ht, ht));
  HSX_ASSIGN_OR_RETURN(const Tensor post, CheckpointFloatTensor(tensors, drafter_dir, "post_projection.weight", {ht, ha}));
  w.post_projection = backend.UploadWeight(post);
  if (config.centroid_head) {
    HSX_ASSIGN_OR_RETURN(const Tensor centroids, CheckpointFloatTensor(tensors, drafter_dir, "masked_embedding.centroids.weight",
                                                                       {config.num_centroids, ha}));
    w.centroids = backend.UploadWeight(centroids);
    HSX_ASSIGN_OR_RETURN(const Tensor ordering, TokenOrdering(tensors, drafter_dir, config));
    w.token_ordering = backend.Upload(ordering);
  }
  return std::make_unique<MtpDrafter>(std::move(config), std::move(sources), std::move(w), target, backend);
}

MtpDrafter::MtpDrafter(MtpConfig config, std::vector<int> target_kv_layers, MtpWeights weights, const Model& target,
                       Backend& backend)
    : config_(std::move(config)),
      target_kv_layers_(std::move(target_kv_layers)),
      weights_(std::move(weights)),
      target_embed_(target.weights().embed_tokens),
      embed_scale_(target.config().embed_scale),
      backend_(backend) {
  // As the target's forward does: HF rounds the embedding scale to the compute dtype first.
  if (backend_.compute_dtype() == DType::kBF16) embed_scale_ = BF16ToF32(F32ToBF16(embed_scale_));
  rope_ = MakeRopeTables(config_.text, backend_);
}

void MtpDrafter::AttentionBlock(int layer, const Tensor& x, const Tensor& positions, const AttentionBatch& batch,
                                KVCache& target_cache, Tensor& out) {
  const ModelConfig& c = config_.text;
  const LayerSpec& spec = c.layers[layer];
  const LayerWeights& w = weights_.decoder.layers[layer];
  const int64_t t = x.size(0), hd = spec.head_dim, nh = c.num_heads;
  const DType dt = backend_.compute_dtype();
  Tensor q = backend_.Empty(dt, {t, nh, hd});
  backend_.Linear(x, w.qkv_proj, nullptr, q);  // Q-only layers: qkv_proj holds q's rows
  NormRope(backend_, c, w.q_norm, positions, rope_[layer], q);
  AttentionParams params;
  params.scale = c.attention_scale(layer);
  params.sliding_window = spec.sliding ? c.sliding_window : 0;
  params.softcap = c.attn_softcap;
  params.block_size = target_cache.block_size();
  const int source = target_kv_layers_[layer];
  Tensor attn = backend_.Empty(dt, {t, nh, hd});
  backend_.Attention(q, target_cache.k(source), target_cache.v(source), batch, params, attn);
  backend_.Linear(attn.View({t, nh * hd}), w.o_proj, nullptr, out);
}

MtpDraftOutput MtpDrafter::Step(const MtpDraftBatch& batch, const Tensor& hidden, KVCache& target_cache) {
  std::vector<int32_t> positions;
  for (const SequenceSlice& s : batch.seqs) positions.push_back(s.ctx_len - 1);  // the constant position p
  MtpDraftOutput out = Step(backend_.Upload(HostInts(batch.tokens)), backend_.Upload(HostInts(positions)),
                            MakeAttentionBatch(backend_, batch.seqs), hidden, target_cache);
  SamplingBatch greedy;
  greedy.rows.resize(batch.tokens.size());  // temperature 0: the arg max
  out.tokens = backend_.Sample(out.logits, greedy).tokens;
  return out;
}

MtpDraftOutput MtpDrafter::Step(const Tensor& ids, const Tensor& pos, const AttentionBatch& attention_batch,
                                const Tensor& hidden, KVCache& target_cache) {
  const ModelConfig& c = config_.text;
  const int64_t rows = ids.numel(), ha = c.hidden_size;
  const int64_t ht = config_.backbone_hidden_size;
  const DType dt = backend_.compute_dtype();
  const float eps = c.rms_norm_eps;
  const bool one_plus = c.norm_one_plus_weight;

  // x = pre_projection(concat(target_embed(token) * sqrt(H_t), hidden)), as two GEMMs.
  Tensor embedded = backend_.Empty(dt, {rows, ht});
  backend_.Embed(target_embed_, ids, embed_scale_, embedded);
  Tensor x = backend_.Empty(dt, {rows, ha});
  Tensor branch = backend_.Empty(dt, {rows, ha});
  backend_.Linear(embedded, weights_.pre_projection_token, nullptr, x);
  backend_.Linear(hidden, weights_.pre_projection_hidden, nullptr, branch);
  backend_.Add(x, branch);

  Tensor normed = backend_.Empty(dt, {rows, ha});
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& w = weights_.decoder.layers[i];
    backend_.RmsNorm(x, &w.input_norm, eps, one_plus, normed);
    AttentionBlock(i, normed, pos, attention_batch, target_cache, branch);
    backend_.RmsNorm(branch, &w.post_attention_norm, eps, one_plus, branch);
    backend_.AddRmsNorm(x, branch, &w.pre_feedforward_norm, eps, one_plus, normed);
    MlpBlock(backend_, c, i, weights_.decoder.layers[i], normed, branch);
    backend_.RmsNorm(branch, &w.post_feedforward_norm, eps, one_plus, branch);
    backend_.Add(x, branch);
    backend_.ScaleByTensor(x, w.layer_scalar);
  }
  backend_.RmsNorm(x, &weights_.decoder.final_norm, eps, one_plus, normed);

  MtpDraftOutput out;
  out.hidden = backend_.Empty(dt, {rows, ht});
  backend_.Linear(normed, weights_.post_projection, nullptr, out.hidden);
  out.logits = backend_.Empty(DType::kF32, {rows, c.vocab_size});
  if (config_.centroid_head) {
    Tensor centroid_logits = backend_.Empty(DType::kF32, {rows, config_.num_centroids});
    backend_.Linear(normed, weights_.centroids, nullptr, centroid_logits);
    backend_.CentroidMaskedLogits(normed, centroid_logits, weights_.token_ordering, weights_.decoder.lm_head,
                                  config_.centroid_top_k, out.logits);
  } else {
    backend_.Linear(normed, weights_.decoder.lm_head, nullptr, out.logits);
  }
  return out;
}

}  // namespace hsx
