// The drafters whose rounds run on the device, and those rounds' CUDA graphs: an EAGLE-3
// draft (its first pass over the step's kept positions, then K - 1 chained single-token
// steps, on its own KV cache at the target's slots) and a Gemma 4 MTP assistant (K steps
// at the constant position p over the target's KV). Each owns its draft state; the
// target's step outputs it reads (aux states, final-normed rows) come from the runner.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "engine/drafter.h"
#include "model/eagle3_draft.h"
#include "model/kv_cache.h"
#include "model/mtp_drafter.h"

namespace hsx {

// A sequence that drafts after the step: where its chained draft steps run (the position
// of its last known token, the one with no KV yet) and its block table (with room for K - 1
// more slots).
struct DraftRequest {
  int32_t position = 0;
  std::vector<int32_t> block_table;
};

// What both device drafters share: rounds on graphs, per (bucket, first-pass rows, K).
class DeviceDrafter : public Drafter {
 public:
  // moe: the drafter's decoder where it has MoE layers (its experts and sizes), else null.
  DeviceDrafter(int k, const DrafterContext& context, const ModelConfig* moe);
  int64_t graph_replays() const override { return draft_graph_replays_; }
  int64_t first_pass_graph_replays() const override { return first_pass_graph_replays_; }
  int64_t kv_only_graph_replays() const override { return kv_only_graph_replays_; }
  int64_t eager_first_passes() const override { return eager_first_passes_; }
  // The rounds of every bucket, with K drafts (adaptive draft lengths: also 0..K - 1), over
  // padding-only inputs, where graphs record: as the runner's step graphs
  // (ModelRunner::RecordGraphs), a round first met while serving pays its recording in that
  // step. Rounds of larger first passes (after a prefill) are recorded at first use.
  void RecordRounds() override;
  int64_t rounds_recorded() const override { return static_cast<int64_t>(draft_graphs_.size()); }

 protected:
  Backend& backend() const { return runner_.backend(); }
  // Draft rounds (EAGLE-3's chained steps, MTP's steps) keep their drafts on the device,
  // int32 [drafts, rows] (row r of step s at s * rows + r), and download them once.
  // The bucket of a round over `sequences` whose longest block table has that many
  // blocks, or 0: eager. A drafter with MoE layers (forwards of one row a sequence) records
  // only where the backend's MoE of bucket rows needs no host synchronization.
  int DraftGraphBucket(int sequences, size_t longest_block_table) const;
  // The fixed drafts every round graph writes (zeros at first: padding rows read them) and
  // the fixed hidden input a round starts from ([max_graph_batch, width]).
  Tensor DraftTokens();
  Tensor DraftHidden(int64_t width);
  // A round (its work reads fixed inputs and leaves its drafts in DraftTokens()) on the
  // graph of its key: (bucket, the first pass's rows per sequence or 0 without it, drafts).
  void DraftRound(const std::array<int, 3>& key, const std::function<void()>& round);
  // The rounds of a bucket with `drafts` drafts (0: EAGLE-3's KV-only pass), each staged
  // over padding only and run through DraftRound, the stream synchronized after each (the
  // next round stages its inputs through the same pinned memory).
  virtual void RecordPaddingRounds(int bucket, int drafts) = 0;
  // tokens [drafts, rows] as each of the first `requests` rows' drafts, in one download.
  std::vector<std::vector<int32_t>> DownloadDrafts(const Tensor& tokens, int rows, int requests, int drafts);

  ModelRunner& runner_;
  Scheduler& scheduler_;  // owns the KV blocks: reserves the chained steps' slots
  int block_size_;
  bool enable_prefix_caching_;
  // The drafter's MoE shape, or null: above the backend's host-free MoE size, routing
  // downloads expert counts and a round cannot be recorded.
  const ModelConfig* moe_;
  // Draft rounds on graphs, by DraftRound's key (a drafter has one kind of round), their
  // fixed inputs (MTP's steps and EAGLE-3's padded first passes by rows per sequence,
  // EAGLE-3's chained steps), the aux states of a first pass, the hidden rows a round
  // without one starts from, and the drafts they leave.
  std::map<std::array<int, 3>, std::unique_ptr<DeviceGraph>> draft_graphs_;
  std::map<int, ModelRunner::GraphInputs> draft_inputs_;
  Tensor draft_hidden_, draft_tokens_;
  int64_t draft_graph_replays_ = 0, first_pass_graph_replays_ = 0, kv_only_graph_replays_ = 0, eager_first_passes_ = 0;
  // Whether this step's round ran a graph's first time and recorded it (the first run
  // also plans its GEMMs): its time is no measurement of the round.
  bool round_recorded_ = false;
};

// vLLM's "eagle3" method: the draft's first pass covers every position of the step whose
// KV stays, fed the token after it, so the draft's KV follows the target's; a sequence
// that decodes next gets K - 1 more slots for the chained steps.
class Eagle3Drafter : public DeviceDrafter {
 public:
  Eagle3Drafter(Eagle3Draft& draft, int k, const DrafterContext& context);

  // A decode step's KV-only pass, queued on its sampled tokens before the host has them:
  // the draft's row at position p reads the target's aux states at p and the token
  // sampled after it, nothing the host learns later. When no request drafts after the
  // step (the usual step where drafts are not accepted), Propose then has nothing to queue
  // and the GPU no host work to wait for; when some do, their round's first pass writes
  // the same rows' KV again. Only where the pass fits a graph of one row a sequence.
  void DecodeSampled(const ForwardBatch& step, const Tensor& tokens) override;
  int64_t kv_passes_ahead() const override { return kv_passes_ahead_; }

  // The round: the draft's first pass (first_pass: the step's computed positions whose KV
  // stays, each fed the token after it; step_rows: each row's row in the step, whose aux
  // states it takes; its logit rows one per request, in order) writes the draft's KV, then
  // num_drafts - 1 chained steps; returns each request's greedy drafts (target ids).
  std::vector<std::vector<int32_t>> Round(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows,
                                          const std::vector<DraftRequest>& requests, int num_drafts);
  // The same round for a token tree (its tokens on the device until the end; on a graph
  // where every request takes the whole tree): the first pass, then one draft forward per
  // depth over the nodes there that have children, each fed its token and its parent's
  // hidden at position + depth - 1, its draft KV at the slot of position + node (scratch),
  // attending to the request's draft KV before `position` and its tree ancestors; a node's
  // children take the rank-th most likely tokens of its row. nodes[r]: request r's first
  // nodes of the tree (a prefix: whole depths). Returns each request's node tokens.
  std::vector<std::vector<int32_t>> TreeRound(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows,
                                              const std::vector<DraftRequest>& requests, const std::vector<int>& nodes);

  // EAGLE-2's round for dynamic trees (engine/dynamic_tree.h): the first pass, then per
  // depth d < depths[r] request r's topk best candidates of depth d, expanded in one draft
  // forward: rows at position + d - 1 fed their tokens and their parents' hidden, KV at the
  // scratch slot position + (d - 1) topk + j, attending to the request's draft KV before
  // `position` and their expanded ancestors; each row's topk tokens scored on the device
  // (backend/draft_tree.h). Returns each request's tree of its budgets[r] best candidates.
  std::vector<DraftTree> DynamicTreeRound(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows,
                                          const std::vector<DraftRequest>& requests, const std::vector<int>& depths,
                                          const std::vector<int>& budgets);

 protected:
  void ProposeDrafts(const DraftStep& step) override;
  void RecordPaddingRounds(int bucket, int drafts) override;

 private:
  // A round's work: the padded first pass (when padded is not null; its aux [R q, A, H]),
  // else from `hidden`, then num_drafts - 1 chained steps; drafts into tokens [drafts, rows].
  void RunRound(const DeviceBatch* padded, const Tensor& padded_aux, const Tensor& hidden,
                const std::vector<DeviceBatch>& steps, const Tensor& tokens, int rows, int num_drafts);
  // The padded graph a first pass fits (bucket 0: none, it runs eagerly) and its rows per
  // sequence; seq_of_request gets the sequence of each logit row.
  struct FirstPassShape {
    int bucket = 0, q = 0;
  };
  FirstPassShape PaddedFirstPass(const ForwardBatch& first_pass, std::vector<int>& seq_of_request) const;
  void GatherAux(const std::vector<int32_t>& rows_of_step, Tensor& out);
  void KeepKV(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows);
  // Stages the padded first pass (bucket sequences of q rows, each ending with its logit
  // row) into fixed inputs and gathers its aux states into a fixed [bucket q, A, H]
  // (first_pass empty: padding only, aux as it is).
  DeviceBatch StagePaddedFirstPass(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows,
                                   const FirstPassShape& shape, Tensor& aux);
  bool kv_stored_ahead_ = false;  // by DecodeSampled, for the step Propose is about to see
  int64_t kv_passes_ahead_ = 0;
  // EAGLE-3's chained steps 1..steps of a round for `rows` rows (row i: row_requests[i], or
  // padding that stores no KV where null or past its end), staged in one upload, into the
  // fixed inputs where `fixed`; step s reads its token ids from row s - 1 of tokens.
  std::vector<DeviceBatch> StageChainedSteps(const std::vector<const DraftRequest*>& row_requests, int rows, int steps,
                                             const Tensor& tokens, bool fixed);

  Eagle3Draft& draft_;
  const TokenTree* tree_;  // tree drafts, or null
  const DynamicTreeConfig* dynamic_tree_;  // or dynamic trees, or null
  KVCache cache_;  // the draft's KV at the target's slots
  ModelRunner::GraphInputs chain_inputs_;
  Tensor first_pass_aux_;
  // A tree round's rows: per slot (request_at[slot]: its request, or -1), node i's token
  // at source[slot][i] of the round's top tokens ([rows, width] flattened: the first
  // pass's slots first, then each depth's rows); per depth, the requests' rows as a batch
  // and every slot's rows' token sources and parents' rows in the depth before.
  struct TreePlan {
    struct Depth {
      ForwardBatch batch;
      std::vector<int32_t> token_sources, hidden_rows;
      int64_t first_row = 0;  // its rows' place among all rows
    };
    std::vector<Depth> depths;
    std::vector<std::vector<int32_t>> source;
    int64_t rows = 0, width = 0;
  };
  TreePlan PlanTree(const std::vector<DraftRequest>& requests, const std::vector<int>& nodes,
                    const std::vector<int>& request_at) const;
  // The round on the graph of (bucket, q, tree size): the padded first pass (q > 0), else
  // from the hidden rows in DraftHidden(), then the depths; top tokens into TreeTopTokens().
  void TreeGraphRound(int bucket, int q, const TreePlan& plan, const DeviceBatch* padded, const Tensor& padded_aux);
  void KeepTopTokens(const Tensor& logits, const Tensor& top, int64_t first_row, int64_t width);
  Tensor DepthIndices(const TreePlan::Depth& depth);
  Tensor TreeDepth(const TreePlan::Depth& depth, const DeviceBatch& in, const Tensor& indices, const Tensor& parents_of,
                   const Tensor& top, int64_t width);
  Tensor FirstPassInput(const std::vector<int32_t>& step_rows);
  // Dynamic trees: the round on a graph, an expansion (into depth d's fixed inputs where
  // given), depth d's batch, and the fixed state, limits, trees and parents' rows a round
  // keeps on the device.
  void DynamicGraphRound(int bucket, int q, DraftTreeState& state, const std::vector<DeviceBatch>& inputs,
                         const DeviceBatch* padded, const Tensor& padded_aux, const Tensor& limits, const Tensor& out);
  void Expand(const Tensor& ids, const Tensor& logprobs, int d, DraftTreeState& state, const DeviceBatch* next, int part);
  ForwardBatch DynamicDepthBatch(int d, const std::vector<DraftRequest>& requests, const std::vector<int>& depths,
                                 const std::vector<int>& request_at, bool graph) const;
  Tensor TreeLimits(const std::vector<int>& request_at, const std::vector<int>& depths, const std::vector<int>& budgets);
  DraftTreeState TreeState(int slots);
  Tensor TreeOut();
  Tensor TreeRows(int part, int64_t rows);
  DraftTreeState tree_state_;
  ModelRunner::GraphInputs tree_limits_;
  Tensor tree_out_, tree_rows_;
  // Tree rounds on graphs: each depth's fixed inputs, by depth; each bucket's device
  // indices (per depth: the rows' token sources then their parents' rows); the top tokens
  // of every row of a round.
  std::map<int, ModelRunner::GraphInputs> tree_inputs_;
  std::map<int, std::vector<Tensor>> tree_indices_;
  Tensor tree_top_;
  Tensor TreeTopTokens(int64_t width);
};

// The "mtp" method with a Gemma 4 assistant: no draft KV; each round starts from the step's
// final-normed hidden of the row that emitted the sequence's last token, that token, and
// queries at p, the last position with KV, over the target's cache.
class MtpAssistantDrafter : public DeviceDrafter {
 public:
  MtpAssistantDrafter(MtpDrafter& drafter, int k, const DrafterContext& context);

  // For each request of `batch` (one row each: the token just emitted at the constant
  // position p, ctx_len p + 1), num_drafts drafter steps fed first the final-normed hidden
  // of the step's logit row hidden_rows[r], then their own; returns greedy drafts.
  std::vector<std::vector<int32_t>> Round(const MtpDraftBatch& batch, const std::vector<int32_t>& hidden_rows,
                                          int num_drafts);

 protected:
  void ProposeDrafts(const DraftStep& step) override;
  void RecordPaddingRounds(int bucket, int drafts) override;

 private:
  // The round's num_drafts steps from inputs `in` (one row a sequence) and hidden [rows, H].
  void RunSteps(const DeviceBatch& in, const Tensor& hidden, const Tensor& tokens, int rows, int num_drafts);
  MtpDrafter& drafter_;
};

}  // namespace hsx
