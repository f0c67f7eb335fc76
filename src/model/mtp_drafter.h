// A Gemma 4 MTP drafter ("assistant") on the Backend ops, driven as vLLM (Gemma4Proposer)
// and SGLang (frozen-KV MTP) drive it, not as transformers' own assisted generation does
// (../shared/SPECULATIVE.md §2). One step, per row: embed a token with the TARGET's
// embedding, join it with a target-width hidden through the pre-projection, run Q-only
// Gemma 4 layers whose queries sit at the row's constant position p and read the target's
// paged K/V of positions 0..p (sliding layers the last `sliding_window` of them), then the
// final norm, the post-projection (the next step's hidden) and the head (dense tied, or
// centroid-masked). The drafter writes no KV.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/mtp_config.h"
#include "model/weights.h"

namespace hsx {

struct MtpWeights {
  ModelWeights decoder;  // layers without K/V, final norm; embed_tokens serves only as the tied head
  // pre_projection [H_a, 2 H_t] split by input columns: the embedding's half, the hidden's half.
  Tensor pre_projection_token, pre_projection_hidden;
  Tensor post_projection;  // [H_t, H_a]
  Tensor centroids;        // [C, H_a], centroid head only
  Tensor token_ordering;   // int32 [C, V / C], centroid head only
};

// R rows, one token each. Row r's slice: q_start r, q_len 1, ctx_len p + 1 where p is the
// last position the target has verified for that sequence (the same p for every step of a
// round), block_table the sequence's table in the target's cache.
struct MtpDraftBatch {
  std::vector<int32_t> tokens;
  std::vector<SequenceSlice> seqs;
};

struct MtpDraftOutput {
  Tensor logits;                // f32 [R, V] on the device; a centroid head's unselected tokens hold the lowest float
  Tensor hidden;                // [R, H_t] compute dtype: the post-projection, the next step's hidden input
  std::vector<int32_t> tokens;  // [R] each row's arg max (lowest id on ties): the next step's token (host Step only)
};

class MtpDrafter {
 public:
  // Reads DIR's config.json and weights and checks them against the target (errors name
  // the field or tensor). Shares the target's embedding table (tensors share storage).
  static Result<std::unique_ptr<MtpDrafter>> Load(const std::string& drafter_dir, const Model& target, Backend& backend);
  MtpDrafter(MtpConfig config, std::vector<int> target_kv_layers, MtpWeights weights, const Model& target,
             Backend& backend);

  const MtpConfig& config() const { return config_; }
  // The target layer whose KV cache each drafter layer reads.
  const std::vector<int>& target_kv_layers() const { return target_kv_layers_; }

  // One draft step. hidden [R, H_t] in the compute dtype: a round's first step takes the
  // target's final-normed last hidden at p; later steps the previous step's output.hidden.
  // target_cache is the target's KV cache; it is only read.
  MtpDraftOutput Step(const MtpDraftBatch& batch, const Tensor& hidden, KVCache& target_cache);
  // The same on inputs already on the device (tokens and positions int32 [R], the rows'
  // attention batch), reading nothing from the host, so a graph can record it; the
  // output's tokens stay empty (Backend::GreedyTokens gives them on the device).
  MtpDraftOutput Step(const Tensor& tokens, const Tensor& positions, const AttentionBatch& attention,
                      const Tensor& hidden, KVCache& target_cache);

 private:
  void AttentionBlock(int layer, const Tensor& x, const Tensor& positions, const AttentionBatch& batch,
                      KVCache& target_cache, Tensor& out);

  MtpConfig config_;
  std::vector<int> target_kv_layers_;
  MtpWeights weights_;
  Tensor target_embed_;
  float embed_scale_;
  Backend& backend_;
  std::vector<RopeTable> rope_;  // per layer
};

}  // namespace hsx
