#include "model/decoder_layer.h"

#include <algorithm>

namespace hsx {

std::vector<RopeTable> MakeRopeTables(const ModelConfig& config, Backend& backend) {
  std::vector<RopeTable> tables;
  for (const LayerSpec& l : config.layers) {
    RopeTable table;
    const std::vector<float> f = RopeInverseFrequencies(l.rope, l.head_dim, &table.rotary_dims);
    Tensor host = Tensor::Host(DType::kF32, {static_cast<int64_t>(f.size())});
    std::copy(f.begin(), f.end(), host.data<float>());
    table.inv_freq = backend.Upload(host);
    tables.push_back(table);
  }
  return tables;
}

Tensor HostInts(const std::vector<int32_t>& v) {
  Tensor t = Tensor::Host(DType::kI32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

void NormRope(Backend& backend, const ModelConfig& config, const Tensor& norm, const Tensor& positions,
              const RopeTable& rope, Tensor& x) {
  if (config.qk_norm) {
    backend.RmsNormRope(x, norm, config.rms_norm_eps, config.norm_one_plus_weight, positions, rope);
  } else {
    backend.Rope(x, positions, rope);
  }
}

namespace {

HeadNorms HeadNormsOf(const ModelConfig& config, const LayerWeights& w) {
  HeadNorms norms;
  if (config.qk_norm) {
    norms.q = &w.q_norm;
    norms.k = &w.k_norm;
  }
  norms.v = config.v_norm;
  norms.eps = config.rms_norm_eps;
  norms.one_plus_weight = config.norm_one_plus_weight;
  return norms;
}

}  // namespace

void AttentionBlock(Backend& backend, const ModelConfig& config, int layer, const LayerWeights& w,
                    const RopeTable& rope, const Tensor& x, const Tensor& positions, const Tensor& slots,
                    const AttentionBatch& batch, KVCache& cache, Tensor& out) {
  const LayerSpec& spec = config.layers[layer];
  const int64_t t = x.size(0), hd = spec.head_dim, nh = config.num_heads;
  const DType dt = backend.compute_dtype();
  AttentionParams params;
  params.scale = config.attention_scale(layer);
  params.sliding_window = spec.sliding ? config.sliding_window : 0;
  params.softcap = config.attn_softcap;
  params.block_size = cache.block_size();
  params.sinks = w.sinks.defined() ? &w.sinks : nullptr;
  Tensor attn = backend.Empty(dt, {t, nh, hd});
  const Tensor* bias = w.qkv_bias.defined() ? &w.qkv_bias : nullptr;
  if (spec.kv_source != layer) {
    Tensor q = backend.Empty(dt, {t, nh, hd});
    backend.Linear(x, w.qkv_proj, bias, q);  // q's rows alone: the KV is another layer's
    NormRope(backend, config, w.q_norm, positions, rope, q);
    backend.Attention(q, cache.k(layer), cache.v(layer), batch, params, attn);
  } else {
    // One GEMM for q, k and v; the values are the raw keys when k_eq_v (no v rows).
    Tensor qkv = backend.Empty(dt, {t, w.qkv_proj.size(0)});
    backend.Linear(x, w.qkv_proj, bias, qkv);
    backend.QkvAttention(qkv, spec.k_eq_v, HeadNormsOf(config, w), positions, rope, slots, cache.k(layer),
                         cache.v(layer), batch, params, attn);
  }
  backend.Linear(attn.View({t, nh * hd}), w.o_proj, w.o_bias.defined() ? &w.o_bias : nullptr, out);
}

void StoreLayerKV(Backend& backend, const ModelConfig& config, int layer, const LayerWeights& w,
                  const RopeTable& rope, const Tensor& x, const Tensor& positions, const Tensor& slots, KVCache& cache) {
  const LayerSpec& spec = config.layers[layer];
  const int64_t t = x.size(0);
  const DType dt = backend.compute_dtype();
  Tensor qkv = backend.Empty(dt, {t, w.qkv_proj.size(0)});
  backend.Linear(x, w.qkv_proj, w.qkv_bias.defined() ? &w.qkv_bias : nullptr, qkv);
  Tensor q = backend.Empty(dt, {t, config.num_heads, spec.head_dim});  // written, not read
  backend.NormRopeStoreKV(qkv, spec.k_eq_v, HeadNormsOf(config, w), positions, rope, slots, cache.k(layer),
                          cache.v(layer), q);
}

void MlpBlock(Backend& backend, const ModelConfig& config, int layer, const LayerWeights& w, const Tensor& x,
              Tensor& out) {
  const int64_t t = x.size(0);
  const DType dt = backend.compute_dtype();
  if (config.layers[layer].moe) {
    // Routing is discontinuous: bf16 logits flip near-tied experts that the f32
    // reference keeps apart, so the router's GEMM writes f32 (the same bf16 inputs).
    Tensor router_logits = backend.Empty(DType::kF32, {t, config.num_experts});
    backend.Linear(x, w.router, w.router_bias.defined() ? &w.router_bias : nullptr, router_logits);
    MoeSpec spec;
    spec.top_k = config.experts_per_token;
    spec.renormalize = config.norm_topk_prob;
    spec.act = config.activation;
    spec.swiglu_limit = config.swiglu_limit;
    spec.swiglu_alpha = config.swiglu_alpha;
    backend.MoeMlp(x, router_logits, w.experts, spec, out);
    return;
  }
  if (w.down_proj.dtype() == DType::kF8E4M3) {  // the activation writes down_proj's FP8 input itself
    Tensor gate_up = backend.Empty(dt, {t, w.gate_up_proj.size(0)});
    backend.Linear(x, w.gate_up_proj, nullptr, gate_up);
    backend.Linear(backend.GatedActivationFp8(gate_up, config.activation), w.down_proj, nullptr, out);
    return;
  }
  Tensor hidden = backend.Empty(dt, {t, config.intermediate_size});
  backend.GatedLinear(x, w.gate_up_proj, config.activation, hidden);
  backend.Linear(hidden, w.down_proj, nullptr, out);
}

}  // namespace hsx
