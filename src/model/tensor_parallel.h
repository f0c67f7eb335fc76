// How a model splits over tensor-parallel ranks (Megatron's scheme): q/k/v and gate/up
// are split by output rows (heads, intermediate columns), o_proj and down_proj by input
// columns, so each rank's attention and MLP output is a partial sum that an all-reduce
// completes. KV heads split across ranks, or are replicated where there are fewer than
// ranks. MoE experts split inside (each expert's intermediate). The embedding, norms,
// router and Gemma 4's per-layer-input tensors are replicated; the LM head splits by
// vocabulary rows when the vocabulary divides evenly (docs/ARCHITECTURE.md says why).
#pragma once

#include <cstdint>

#include "model/config.h"
#include "util/status.h"

namespace hsx {

struct Shard {
  int rank = 0;
  int size = 1;
};

// Whether `size` ranks can split the model; errors name --tensor-parallel-size and the
// config.json field that does not divide.
Status CheckTensorParallel(const ModelConfig& config, int size);

// What one rank computes: heads, each layer's KV heads and the intermediate sizes divided
// (a rank holds at least one KV head); everything else as the model's.
ModelConfig RankConfig(const ModelConfig& config, Shard shard);

// The first KV head of `layer` this rank holds.
int64_t FirstKvHead(const ModelConfig& config, int layer, Shard shard);

// Whether the LM head splits by vocabulary rows (logits all-gathered) or is replicated.
bool VocabParallel(const ModelConfig& config, int size);

}  // namespace hsx
