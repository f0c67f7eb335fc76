#include "model/decode_traffic.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace hsx {
namespace {

int64_t StoredBytes(const Tensor& t) {
  if (!t.defined()) return 0;
  const Tensor* scales = t.row_scales();
  return static_cast<int64_t>(t.nbytes()) + (scales ? static_cast<int64_t>(scales->nbytes()) : 0);
}

}  // namespace

int64_t DecodeWeightBytes(const ModelWeights& w) {
  int64_t bytes = 0;
  auto add = [&](std::initializer_list<const Tensor*> tensors) {
    for (const Tensor* t : tensors) bytes += StoredBytes(*t);
  };
  // Not embed_tokens nor embed_tokens_per_layer: gathered by row.
  add({&w.lm_head, &w.final_norm, &w.per_layer_model_projection, &w.per_layer_projection_norm});
  for (const LayerWeights& l : w.layers) {
    add({&l.input_norm, &l.post_attention_norm, &l.pre_feedforward_norm, &l.post_feedforward_norm, &l.qkv_proj,
         &l.o_proj, &l.qkv_bias, &l.o_bias, &l.sinks, &l.router_bias, &l.experts.gate_bias, &l.experts.up_bias,
         &l.experts.down_bias, &l.q_norm, &l.k_norm, &l.gate_up_proj, &l.down_proj, &l.router, &l.layer_scalar,
         &l.per_layer_input_gate, &l.per_layer_projection, &l.post_per_layer_input_norm});
    for (const std::vector<Tensor>* experts : {&l.experts.gate, &l.experts.up, &l.experts.down}) {
      for (const Tensor& e : *experts) bytes += StoredBytes(e);
    }
  }
  return bytes;
}

double ExpectedDecodeWeightBytes(const ModelWeights& w, int batch, int top_k) {
  double bytes = static_cast<double>(DecodeWeightBytes(w));
  for (const LayerWeights& l : w.layers) {
    const size_t experts = l.experts.gate.size();
    if (experts == 0) continue;
    int64_t expert_bytes = 0;
    for (const std::vector<Tensor>* matrices : {&l.experts.gate, &l.experts.up, &l.experts.down}) {
      for (const Tensor& e : *matrices) expert_bytes += StoredBytes(e);
    }
    const double unused = std::pow(1.0 - std::min(1.0, static_cast<double>(top_k) / experts), batch);
    bytes -= unused * static_cast<double>(expert_bytes);
  }
  return bytes;
}

int64_t KvBytesPerToken(const ModelConfig& c, DType dtype) {
  int64_t bytes = 0;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerSpec& l = c.layers[i];
    if (l.kv_source != static_cast<int>(i)) continue;
    bytes += (l.k_eq_v ? 1 : 2) * static_cast<int64_t>(l.num_kv_heads) * l.head_dim * DTypeSize(dtype);
  }
  return bytes;
}

}  // namespace hsx
