// A decoder layer's pieces, written once on the Backend ops: the target model and the
// drafts built from the same layers (EAGLE-3's decoder; Gemma 4 MTP's MLPs) share them.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace hsx {

// Per layer, the rotary table of its RoPE variant, on the backend's device.
std::vector<RopeTable> MakeRopeTables(const ModelConfig& config, Backend& backend);

// An int32 host tensor holding v (for an upload).
Tensor HostInts(const std::vector<int32_t>& v);

// q/k norm (when the config has one) then RoPE, in place on x [T, heads, D].
void NormRope(Backend& backend, const ModelConfig& config, const Tensor& norm, const Tensor& positions,
              const RopeTable& rope, Tensor& x);

// Self-attention of `layer` on x [T, K] into out [T, H]: the q/k/v GEMM (k = v, v norm
// and KV sharing as the config says), q/k norms and RoPE, the KV store at `slots` for a
// layer that owns its KV, paged attention over `cache`, o_proj.
void AttentionBlock(Backend& backend, const ModelConfig& config, int layer, const LayerWeights& w,
                    const RopeTable& rope, const Tensor& x, const Tensor& positions, const Tensor& slots,
                    const AttentionBatch& batch, KVCache& cache, Tensor& out);

// Only the KV store of AttentionBlock, for a layer that owns its KV: the q/k/v GEMM, the
// k norm and RoPE, the store at `slots` (the same bits as AttentionBlock stores); no
// attention, no o_proj. An EAGLE-3 draft keeps its KV this way for requests not drafting.
void StoreLayerKV(Backend& backend, const ModelConfig& config, int layer, const LayerWeights& w,
                  const RopeTable& rope, const Tensor& x, const Tensor& positions, const Tensor& slots, KVCache& cache);

// The MLP of `layer` (gated, or the MoE experts) on x [T, H] into out [T, H].
void MlpBlock(Backend& backend, const ModelConfig& config, int layer, const LayerWeights& w, const Tensor& x,
              Tensor& out);

}  // namespace hsx
