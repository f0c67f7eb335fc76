#include "model/eagle3_draft.h"

#include <algorithm>
#include <cassert>
#include <set>

#include "model/decoder_layer.h"

namespace hsx {
namespace {

// The original EAGLE repository names the first layer `midlayer`; vLLM and speculators'
// converter read it as layers.0.
Result<CheckpointTensors> WithSpeculatorsNames(CheckpointTensors tensors) {
  CheckpointTensors out;
  for (auto& [name, entry] : tensors) {
    std::string renamed = name;
    if (name.rfind("midlayer.", 0) == 0) renamed = "layers.0." + name.substr(9);
    const std::string file = entry.second;
    if (!out.emplace(renamed, std::move(entry)).second) {
      return Error(file + ": tensor '" + name + "' is given twice (as midlayer.* and layers.0.*)");
    }
  }
  return out;
}

// d2t [Vd] int64 (target id = i + d2t[i]) must land in the target vocabulary; t2d [V]
// bool, where present, must mark exactly those ids (vLLM ignores it; a mismatch means
// the two tensors describe different vocabularies).
Result<std::vector<int32_t>> ReadVocabMap(const CheckpointTensors& tensors, const std::string& dir, int vd, int v) {
  HSX_ASSIGN_OR_RETURN(const Tensor d2t, CheckpointTensor(tensors, dir, "d2t", {vd}, {DType::kI64}, "I64"));
  const std::string& file = tensors.at("d2t").second;
  std::vector<int32_t> offsets(static_cast<size_t>(vd));
  for (int i = 0; i < vd; ++i) {
    const int64_t offset = d2t.data<int64_t>()[i];
    // Overflow-safe: |offset| <= V keeps i + offset in int64 and the result in int32.
    if (offset < -int64_t{v} || offset > v || i + offset < 0 || i + offset >= v) {
      return Error(file + ": tensor 'd2t': entry " + std::to_string(i) + " is " + std::to_string(offset) +
                   ", which maps draft id " + std::to_string(i) + " outside the target vocabulary [0, " +
                   std::to_string(v) + ")");
    }
    offsets[i] = static_cast<int32_t>(offset);
  }
  if (!tensors.count("t2d")) return offsets;
  HSX_ASSIGN_OR_RETURN(const Tensor t2d, CheckpointTensor(tensors, dir, "t2d", {v}, {DType::kBool}, "BOOL"));
  const uint8_t* mask = t2d.data<uint8_t>();
  int64_t count = 0;
  for (int i = 0; i < v; ++i) {
    if (mask[i] > 1) return Error(tensors.at("t2d").second + ": tensor 't2d': entry " + std::to_string(i) + " is not 0 or 1");
    count += mask[i];
  }
  for (int i = 0; i < vd; ++i) {
    if (!mask[i + offsets[i]]) {
      return Error(file + ": tensors 'd2t' and 't2d' disagree: d2t maps draft id " + std::to_string(i) + " to target id " +
                   std::to_string(i + offsets[i]) + ", which t2d does not mark");
    }
  }
  if (count != vd) {
    return Error(tensors.at("t2d").second + ": tensor 't2d' marks " + std::to_string(count) + " target ids, expected " +
                 std::to_string(vd) + " (draft_vocab_size)");
  }
  return offsets;
}

}  // namespace

Eagle3Draft::Eagle3Draft(Eagle3Config config, Eagle3Weights weights, Backend& backend)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      backend_(backend),
      rope_(MakeRopeTables(config_.decoder, backend)) {
  if (!weights_.d2t.empty()) d2t_ = backend.Upload(HostInts(weights_.d2t));
}

Result<std::unique_ptr<Eagle3Draft>> Eagle3Draft::Load(const std::string& dir, const Model& target, Backend& backend) {
  HSX_ASSIGN_OR_RETURN(Eagle3Config config, LoadEagle3Config(dir, target.config()));
  HSX_ASSIGN_OR_RETURN(CheckpointTensors opened, OpenCheckpoint(dir));
  HSX_ASSIGN_OR_RETURN(const CheckpointTensors tensors, WithSpeculatorsNames(std::move(opened)));
  const ModelConfig& d = config.decoder;
  const int64_t h = d.hidden_size, v = d.vocab_size, vd = config.draft_vocab_size, a = config.num_aux();
  std::set<std::string> used;
  Eagle3Weights w;
  auto take = [&](const std::string& name, Shape shape, Tensor& dst) -> Status {
    used.insert(name);
    HSX_ASSIGN_OR_RETURN(dst, UploadCheckpointWeight(tensors, dir, name, shape, backend));
    return {};
  };
  // One of the rows [row, row + shape[0]) of a fused weight (model/weights.h's PlaceRows).
  auto take_rows = [&](const std::string& name, Shape shape, int64_t row, int64_t total_rows, Tensor& fused) -> Status {
    Tensor part;
    HSX_RETURN_IF_ERROR(take(name, std::move(shape), part));
    return PlaceRows(backend, part, row, total_rows, dir + ": " + name, fused);
  };

  // Drafts may leave out the (frozen) copy of the target's embedding; vLLM then uses the target's.
  if (tensors.count("embed_tokens.weight")) {
    HSX_RETURN_IF_ERROR(take("embed_tokens.weight", {v, h}, w.embed_tokens));
  } else {
    w.embed_tokens = target.weights().embed_tokens;
  }
  HSX_RETURN_IF_ERROR(take("fc.weight", {h, a * h}, w.fc));
  if (config.norm_before_fc) HSX_RETURN_IF_ERROR(take("input_norm.weight", {a * h}, w.input_norm));
  if (config.fc_norm) {
    w.fc_norms.resize(static_cast<size_t>(a));
    for (int i = 0; i < a; ++i) HSX_RETURN_IF_ERROR(take("fc_norm." + std::to_string(i) + ".weight", {h}, w.fc_norms[i]));
  }
  HSX_RETURN_IF_ERROR(take("layers.0.hidden_norm.weight", {h}, w.hidden_norm));
  w.layers.resize(static_cast<size_t>(d.num_layers));
  for (int i = 0; i < d.num_layers; ++i) {
    const LayerSpec& spec = d.layers[i];
    LayerWeights& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t in = i == 0 ? 2 * h : h;  // layer 0 reads [embedding | hidden]
    const int64_t q_out = static_cast<int64_t>(d.num_heads) * spec.head_dim;
    const int64_t kv_out = static_cast<int64_t>(spec.num_kv_heads) * spec.head_dim;
    HSX_RETURN_IF_ERROR(take(p + "input_layernorm.weight", {h}, l.input_norm));
    HSX_RETURN_IF_ERROR(take(p + "post_attention_layernorm.weight", {h}, l.post_attention_norm));
    const int64_t qkv = q_out + 2 * kv_out;
    HSX_RETURN_IF_ERROR(take_rows(p + "self_attn.q_proj.weight", {q_out, in}, 0, qkv, l.qkv_proj));
    HSX_RETURN_IF_ERROR(take_rows(p + "self_attn.k_proj.weight", {kv_out, in}, q_out, qkv, l.qkv_proj));
    HSX_RETURN_IF_ERROR(take_rows(p + "self_attn.v_proj.weight", {kv_out, in}, q_out + kv_out, qkv, l.qkv_proj));
    HSX_RETURN_IF_ERROR(take(p + "self_attn.o_proj.weight", {h, q_out}, l.o_proj));
    if (d.qk_norm) {
      HSX_RETURN_IF_ERROR(take(p + "self_attn.q_norm.weight", {spec.head_dim}, l.q_norm));
      HSX_RETURN_IF_ERROR(take(p + "self_attn.k_norm.weight", {spec.head_dim}, l.k_norm));
    }
    const int64_t inter = d.intermediate_size;
    HSX_RETURN_IF_ERROR(take_rows(p + "mlp.gate_proj.weight", {inter, h}, 0, 2 * inter, l.gate_up_proj));
    HSX_RETURN_IF_ERROR(take_rows(p + "mlp.up_proj.weight", {inter, h}, inter, 2 * inter, l.gate_up_proj));
    HSX_RETURN_IF_ERROR(take(p + "mlp.down_proj.weight", {h, d.intermediate_size}, l.down_proj));
  }
  HSX_RETURN_IF_ERROR(take("norm.weight", {h}, w.final_norm));
  if (tensors.count("lm_head.weight")) {
    HSX_RETURN_IF_ERROR(take("lm_head.weight", {vd, h}, w.lm_head));
  } else if (vd == v) {
    w.lm_head = target.weights().lm_head;  // vLLM shares the target's head when the draft has none
  } else {
    return Error(dir + ": missing tensor 'lm_head.weight' (expected shape " + ShapeToString({vd, h}) +
                 "; the target's head cannot stand in for a draft vocabulary of " + std::to_string(vd) + " tokens)");
  }
  if (vd < v) {
    used.insert("d2t");
    used.insert("t2d");
    HSX_ASSIGN_OR_RETURN(w.d2t, ReadVocabMap(tensors, dir, static_cast<int>(vd), static_cast<int>(v)));
  }
  for (const auto& [name, entry] : tensors) {
    if (used.count(name)) continue;
    return Error(entry.second + ": tensor '" + name + "' is not part of the EAGLE-3 draft config.json describes " +
                 "(check draft_vocab_size, norm_before_fc, fc_norm, num_hidden_layers and the layer model_type)");
  }
  return std::make_unique<Eagle3Draft>(std::move(config), std::move(w), backend);
}

Tensor Eagle3Draft::CombineHiddenStates(const Tensor& aux) {
  const int64_t t = aux.size(0), a = aux.size(1), h = aux.size(2);
  assert(a == config_.num_aux() && h == config_.decoder.hidden_size);
  const DType dt = backend_.compute_dtype();
  const float eps = config_.decoder.rms_norm_eps;
  const Tensor rows = aux.View({t, a * h});  // each token's aux states side by side: fc's input as it is
  Tensor g = rows;
  if (config_.fc_norm) {
    g = backend_.Empty(dt, {t, a * h});
    Tensor chunk = backend_.Empty(dt, {t, h});
    for (int64_t i = 0; i < a; ++i) {
      backend_.SliceColumns(rows, i * h, chunk);
      backend_.RmsNorm(chunk, &weights_.fc_norms[i], eps, false, chunk);
      backend_.WriteColumns(chunk, i * h, g);
    }
  }
  if (config_.norm_before_fc) {  // never with fc_norm (the loader refuses both)
    g = backend_.Empty(dt, {t, a * h});
    backend_.RmsNorm(rows, &weights_.input_norm, eps, false, g);
  }
  Tensor hidden = backend_.Empty(dt, {t, h});
  backend_.Linear(g, weights_.fc, nullptr, hidden);
  return hidden;
}

Eagle3Output Eagle3Draft::Forward(const ForwardBatch& batch, const Tensor& hidden, KVCache& cache) {
  return Forward(UploadBatch(backend_, batch), hidden, cache);
}

void Eagle3Draft::StoreKV(const ForwardBatch& batch, const Tensor& hidden, KVCache& cache) {
  StoreKV(UploadBatch(backend_, batch), hidden, cache);
}

void Eagle3Draft::StoreKV(const DeviceBatch& batch, const Tensor& hidden, KVCache& cache) {
  const ModelConfig& d = config_.decoder;
  if (d.num_layers != 1 || d.layers[0].kv_source != 0) {
    DeviceBatch kv_only = batch;
    kv_only.logit_rows.clear();
    Forward(kv_only, hidden, cache);
    return;
  }
  const int64_t t = batch.token_ids.numel(), h = d.hidden_size;
  const DType dt = backend_.compute_dtype();
  Tensor x = backend_.Empty(dt, {t, h});
  Tensor input = backend_.Empty(dt, {t, 2 * h});
  backend_.DraftLayerInput(weights_.embed_tokens, batch.token_ids, hidden, weights_.layers[0].input_norm,
                           weights_.hidden_norm, d.rms_norm_eps, config_.norm_before_residual, input, x);
  StoreLayerKV(backend_, d, 0, weights_.layers[0], rope_[0], input, batch.positions, batch.slot_mapping, cache);
}

Eagle3Output Eagle3Draft::Forward(const DeviceBatch& batch, const Tensor& hidden, KVCache& cache) {
  const ModelConfig& d = config_.decoder;
  const int64_t t = batch.token_ids.numel(), h = d.hidden_size;
  const DType dt = backend_.compute_dtype();
  const float eps = d.rms_norm_eps;
  const Tensor& ids = batch.token_ids;
  const Tensor& positions = batch.positions;
  const Tensor& slots = batch.slot_mapping;
  const AttentionBatch& attention_batch = batch.attention;

  // Layer 0's input: [rms(embedding, input_layernorm) | rms(hidden, hidden_norm)], the
  // embedding unscaled (speculators' plain nn.Embedding, also for Gemma targets).
  Tensor x = backend_.Empty(dt, {t, h});
  Tensor input = backend_.Empty(dt, {t, 2 * h});
  backend_.DraftLayerInput(weights_.embed_tokens, ids, hidden, weights_.layers[0].input_norm, weights_.hidden_norm,
                           eps, config_.norm_before_residual, input, x);

  // Logits come for the last row of each of r blocks of t / r rows (every row when t == r):
  // a column slice, not a gather (whose index upload a graph cannot record). When every row
  // gives logits (chained steps), the last layer's residual add fuses with the final norm.
  const int64_t r = static_cast<int64_t>(batch.logit_rows.size());
  const int64_t q = r > 0 && t % r == 0 ? t / r : 0;
  bool block_ends = q > 0;
  for (int64_t i = 0; block_ends && i < r; ++i) block_ends = batch.logit_rows[i] == (i + 1) * q - 1;
  const bool every_row = q == 1 && block_ends;
  Tensor final_normed = backend_.Empty(dt, {r, h});

  Tensor normed = backend_.Empty(dt, {t, h});
  Tensor branch = backend_.Empty(dt, {t, h});
  for (int i = 0; i < d.num_layers; ++i) {
    const LayerWeights& w = weights_.layers[i];
    if (i > 0) backend_.RmsNorm(x, &w.input_norm, eps, false, normed);
    AttentionBlock(backend_, d, i, weights_.layers[i], rope_[i], i == 0 ? input : normed, positions, slots,
                   attention_batch, cache, branch);
    backend_.AddRmsNorm(x, branch, &w.post_attention_norm, eps, false, normed);
    MlpBlock(backend_, d, i, weights_.layers[i], normed, branch);
    if (every_row && i == d.num_layers - 1) {
      backend_.AddRmsNorm(x, branch, &weights_.final_norm, eps, false, final_normed);
    } else {
      backend_.Add(x, branch);
    }
  }

  Eagle3Output out;
  if (r == 0) return out;  // a pass that only fills the draft's KV
  if (every_row) {
    out.prenorm = x;
  } else {
    out.prenorm = backend_.Empty(dt, {r, h});
    if (block_ends) {  // a first pass on a graph: each sequence's q rows end with its last
      backend_.SliceColumns(x.View({r, q * h}), (q - 1) * h, out.prenorm);
    } else {
      backend_.GatherRows(x, batch.logit_rows, out.prenorm);
    }
    backend_.RmsNorm(out.prenorm, &weights_.final_norm, eps, false, final_normed);
  }
  out.logits = backend_.Empty(DType::kF32, {r, config_.draft_vocab_size});
  backend_.Linear(final_normed, weights_.lm_head, nullptr, out.logits);
  out.next_hidden = config_.norm_output ? final_normed : out.prenorm;
  return out;
}

void Eagle3Draft::GreedyTargetTokens(const Tensor& logits, Tensor& tokens) {
  backend_.GreedyTokens(logits, d2t_.defined() ? &d2t_ : nullptr, tokens);
}

std::vector<int32_t> Eagle3Draft::GreedyTargetTokens(const Tensor& logits) {
  Tensor tokens = backend_.Empty(DType::kI32, {logits.size(0)});
  GreedyTargetTokens(logits, tokens);
  const Tensor host = backend_.Download(tokens);
  return std::vector<int32_t>(host.data<int32_t>(), host.data<int32_t>() + host.numel());
}

void Eagle3Draft::TopTargetTokens(const Tensor& logits, Tensor& ids, Tensor& logprobs) {
  backend_.TopLogprobs(logits, d2t_.defined() ? &d2t_ : nullptr, ids, logprobs);
}

}  // namespace hsx
