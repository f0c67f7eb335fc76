// The configuration of a Gemma 4 MTP drafter (a Hugging Face "gemma4_assistant"
// checkpoint) and how it fits a target model. The drafter's decoder layers are Gemma 4
// layers without K/V projections: each reads the target's KV cache of one target layer.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "util/status.h"

namespace hsx {

struct MtpConfig {
  // The drafter's decoder (text_config, a gemma4_text config). Its layers own no KV:
  // kv_source is -1 for every layer (see MtpTargetKvLayers).
  ModelConfig text;
  int backbone_hidden_size = 0;  // the target's hidden size: the hidden fed in and the one fed back
  bool centroid_head = false;    // use_ordered_embeddings: the centroid-masked head, else the dense tied head
  int num_centroids = 0;
  int centroid_top_k = 0;        // centroid_intermediate_top_k
};

// Reads DIR/config.json as transformers' Gemma4AssistantConfig resolves it (its defaults
// for omitted top-level fields); refuses unknown fields and what the assistant cannot be
// (per-layer inputs, MoE, double-wide MLPs). Errors name the file and field.
Result<MtpConfig> LoadMtpConfig(const std::string& drafter_dir);
Result<MtpConfig> ParseMtpConfig(const std::string& json_text, const std::string& source_name);

// The target layer whose KV each drafter layer reads: the last target layer of the same
// attention type that owns its KV (vLLM's Gemma4Proposer, HF's shared_kv_states). Errors
// name the drafter's field that does not fit the target: backbone_hidden_size, vocab_size,
// layer_types, head_dim, num_key_value_heads.
Result<std::vector<int>> MtpTargetKvLayers(const MtpConfig& drafter, const ModelConfig& target,
                                           const std::string& source_name);

}  // namespace hsx
