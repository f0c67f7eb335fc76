// An EAGLE-3 draft model (speculators' checkpoint format) on the Backend ops: fc over
// the target's aux hidden states, then a decoder whose first layer reads [embedding |
// hidden], then the draft LM head over a (possibly reduced) draft vocabulary. The math
// is SPECULATIVE.md §1.3 (speculators' forward, vLLM's proposer semantics).
//
// Driving it (vLLM's llm_base_proposer): a first pass over every token the target just
// ran, with the target's positions and slot mapping, row j holding token t[j+1] and
// hidden CombineHiddenStates(aux)[j]; then single-token steps at the next positions, each
// fed the previous step's draft token and `next_hidden`. The draft's KV is a KVCache of
// decoder() indexed by the target's slots, so it shares the target's block tables.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/eagle3_config.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/weights.h"

namespace hsx {

struct Eagle3Weights {
  Tensor embed_tokens;            // [V, H], target vocabulary: the draft's own or the target's
  Tensor fc;                      // [H, A*H]
  Tensor input_norm;              // [A*H], norm_before_fc only
  std::vector<Tensor> fc_norms;   // A x [H], fc_norm only
  Tensor hidden_norm;             // [H], layer 0's norm of the hidden half
  std::vector<LayerWeights> layers;  // layer 0's q/k/v take 2H inputs
  Tensor final_norm;              // [H]
  Tensor lm_head;                 // [Vd, H]: the draft's own, or the target's when Vd == V and it has none
  std::vector<int32_t> d2t;       // target id = i + d2t[i]; empty when Vd == V
};

struct Eagle3Output {
  Tensor logits;       // [R, Vd] f32 for batch.logit_rows, draft-vocabulary columns
  Tensor prenorm;      // [R, H] compute dtype: the last layer's output (before the final norm)
  Tensor next_hidden;  // [R, H]: what the next step takes as hidden (rms(out) if norm_output, else prenorm)
};

class Eagle3Draft {
 public:
  Eagle3Draft(Eagle3Config config, Eagle3Weights weights, Backend& backend);
  // Reads DIR (config.json + model.safetensors) for `target`: the config is checked
  // against the target's, every tensor's shape and dtype validated, unknown tensors
  // refused; embed_tokens and lm_head come from the target where the checkpoint lacks
  // them (lm_head only when the draft vocabulary is the target's).
  static Result<std::unique_ptr<Eagle3Draft>> Load(const std::string& draft_dir, const Model& target, Backend& backend);

  const Eagle3Config& config() const { return config_; }
  // The draft decoder's config: build the draft's KVCache from it (same blocks as the target's).
  const ModelConfig& decoder() const { return config_.decoder; }
  const Eagle3Weights& weights() const { return weights_; }

  // fc over the target's aux states, aux [T, A, H] in aux_layer_ids order (speculators'
  // layout: a token's aux states side by side are fc's input row as it is): [T, H].
  Tensor CombineHiddenStates(const Tensor& aux);
  // One draft pass over a packed batch: hidden [T, H] is CombineHiddenStates' output
  // (first pass) or the previous step's next_hidden rows. Writes every token's K/V into
  // `cache` at batch.slot_mapping; returns logits and hidden states for batch.logit_rows
  // (undefined tensors when it is empty).
  Eagle3Output Forward(const ForwardBatch& batch, const Tensor& hidden, KVCache& cache);
  // The same on a batch already on the device; reads nothing from the host but logit_rows
  // and the attention batch's host fields, so a CUDA graph can record it where the logit
  // rows are the last of each of R equal blocks (0..T-1 in order, or a padded first pass's
  // sequence ends): those it slices rather than gathers.
  Eagle3Output Forward(const DeviceBatch& batch, const Tensor& hidden, KVCache& cache);

  // Only the KV writes of Forward (the same bits at each slot), for rows whose logits no
  // one reads: a request that drafts nothing this step still keeps the draft's KV. With one
  // decoder layer (speculators' drafts) that is layer 0's k/v; a deeper draft runs Forward,
  // since a later layer's KV needs the earlier layers' outputs. batch.logit_rows are
  // ignored. Graph-recordable as Forward.
  void StoreKV(const DeviceBatch& batch, const Tensor& hidden, KVCache& cache);
  void StoreKV(const ForwardBatch& batch, const Tensor& hidden, KVCache& cache);

  // Greedy drafts: each row's highest logit (lowest id on ties), as target ids, into
  // tokens int32 [R] on the device (a graph can record it); or to the host. tokens int32
  // [R, k]: each row's k highest, highest first (a token tree's children).
  void GreedyTargetTokens(const Tensor& logits, Tensor& tokens);
  std::vector<int32_t> GreedyTargetTokens(const Tensor& logits);
  // Each row's k most likely tokens with their raw logprobs (Backend::TopLogprobs: ids
  // int32 [R, k] as target ids, -1 where none; logprobs f32 [R, k]), on the device: EAGLE-2's
  // dynamic trees score paths with them.
  void TopTargetTokens(const Tensor& logits, Tensor& ids, Tensor& logprobs);

 private:
  Eagle3Config config_;
  Eagle3Weights weights_;
  Backend& backend_;
  Tensor d2t_;  // weights_.d2t on the device; undefined when the vocabularies are the same
  std::vector<RopeTable> rope_;  // per draft layer
};

}  // namespace hsx
