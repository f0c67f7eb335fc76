// What a decode step must read from memory, the basis of `hsx bench --decode`'s bound: the
// weights as they are stored on the device, and the KV cache per token of context.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace hsx {

// Bytes of the weights one decode step reads, as loaded: each tensor in its own dtype (an
// FP8 weight's 1-byte codes plus its f32 row scales), all but the embedding tables, of
// which a step gathers only its tokens' rows (a tied LM head still reads the embedding in
// full). Every MoE expert counts, as if the batch routed to all of them. A tensor-parallel
// rank's weights are its slices, so this is that rank's share.
int64_t DecodeWeightBytes(const ModelWeights& weights);

// DecodeWeightBytes for a step of `batch` tokens routed uniformly at random, top_k experts
// each: a MoE layer's experts count by the expected share of them the step uses, 1 - (1 -
// top_k / E)^batch (batch 1 of gpt-oss-20b: 4 of 32; batch 32: 31.6 of 32). Dense layers:
// DecodeWeightBytes.
double ExpectedDecodeWeightBytes(const ModelWeights& weights, int batch, int top_k);

// Bytes of KV cache one token of context occupies (layers that own a cache).
int64_t KvBytesPerToken(const ModelConfig& config, DType dtype);

}  // namespace hsx
