// Speculative decoding's drafting side, one class per method (vLLM v1's proposers): prompt
// lookup (NgramDrafter, here), an EAGLE-3 draft and a Gemma 4 MTP assistant (draft_runner.h,
// whose rounds run on the device). The engine calls each once per step, after accept:
// Accept with what verification did to the drafts it proposed, then Propose, which sets the
// drafts of every sequence that decodes next. A drafter owns its state (draft KV cache,
// draft graphs and their fixed inputs, per-request history); what it reads of the target
// step (EAGLE-3's aux states, MTP's final-normed rows, the target's KV) the runner keeps
// until the next step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/draft_length.h"
#include "engine/dynamic_tree.h"
#include "engine/model_runner.h"
#include "engine/ngram_proposer.h"
#include "engine/scheduler.h"
#include "engine/token_tree.h"

namespace hsx {

// What the step that just ran did, as a drafter reads it.
struct DraftStep {
  const ForwardBatch& batch;                   // the target's batch, one slice per chunk
  const std::vector<ScheduledChunk>& chunks;  // num_computed already advanced, tokens accepted
  // The sequences that got tokens, with the logit row their last emitted token came from
  // (whose final-normed hidden an MTP round starts from).
  const std::vector<std::pair<Sequence*, int32_t>>& sampled;
  // The step's seconds (the engine's cycle since the last draft round: host work and the
  // forward), whether every chunk was a decode or verification (one row and its drafts),
  // and how the runner ran it (StepResult's rows computed, graph, recorded): what the
  // adaptive cost model measures.
  double run_seconds = 0;
  bool decode_only = false;
  int computed_rows = 0;
  bool graph = false;
  bool recorded = false;
  // Token trees: per chunk, the accepted nodes of its verified tree in path order (node
  // indices; empty: none accepted or no tree). Null without trees. The step row of the node
  // at depth d is the chunk's root row + 1 + paths[i][d - 1]; its KV has been moved to
  // position root + d.
  const std::vector<std::vector<int32_t>>* tree_paths = nullptr;
};

// One sequence's verification in the step: drafts it proposed, how many were accepted.
struct DraftOutcome {
  Sequence* seq;
  int proposed;
  int accepted;
};

class Drafter {
 public:
  explicit Drafter(int num_speculative_tokens) : k_(num_speculative_tokens) {}
  virtual ~Drafter() = default;

  int num_speculative_tokens() const { return k_; }
  // The verifications of the step (every sampling sequence, with or without drafts): with
  // adaptive draft lengths, each sequence's acceptance history.
  void Accept(const std::vector<DraftOutcome>& outcomes);
  // Sets seq->drafts for each sequence that decodes next step: at most its DraftRoom, and
  // with adaptive draft lengths at most the K the policy chose for it this step.
  void Propose(const DraftStep& step);
  // "draft_length": "adaptive": K per request per step from its acceptance and the cost
  // model, measured as steps run in the shapes `rule` says the runner runs them, or
  // `injected` (fixed figures: tests).
  void EnableAdaptive(DraftLengthConfig config, const DraftCostModel* injected,
                      DraftCostModel::ShapeRule rule = nullptr);
  bool adaptive() const { return policy_.has_value(); }
  // The rows of the step graphs the runner recorded at start-up (DraftCostModel::MarkWarm).
  void StepGraphsRecorded(const std::vector<int>& rows);
  const DraftCostModel& cost_model() const { return *cost_; }
  // Request-steps by the K the policy chose (index K, 0..K_max): what bench reports.
  const std::vector<int64_t>& chosen_lengths() const { return chosen_lengths_; }

  // Draft rounds that replayed a graph, and of those EAGLE-3 rounds whose first pass was in it.
  virtual int64_t graph_replays() const { return 0; }
  virtual int64_t first_pass_graph_replays() const { return 0; }
  // EAGLE-3 steps where no request drafted whose KV-only first pass replayed a graph.
  virtual int64_t kv_only_graph_replays() const { return 0; }
  // EAGLE-3 drafting rounds whose first pass ran eagerly, graphs on or not: it did not fit
  // a padded graph (a prompt's rows, a sequence past the graphs' sizes).
  virtual int64_t eager_first_passes() const { return 0; }
  // A decode step's sampled tokens (int32 [rows], a row per sequence of `step`, each q_len
  // 1) on the device, queued but not yet on the host: a drafter may queue work on them
  // then, ahead of Propose (EAGLE-3: the draft's KV-only pass, engine/draft_runner.h).
  virtual void DecodeSampled(const ForwardBatch& /*step*/, const Tensor& /*tokens*/) {}
  virtual int64_t kv_passes_ahead() const { return 0; }  // EAGLE-3 KV-only passes DecodeSampled queued
  // Records the device rounds' graphs when the engine starts (draft_runner.h); nothing for
  // drafters without device rounds.
  virtual void RecordRounds() {}
  virtual int64_t rounds_recorded() const { return 0; }

 protected:
  // How many drafts seq may take next step (0 if it does not decode next): its remaining
  // tokens less the one verification always emits, at most `k`.
  static int DraftRoom(const Sequence& seq, int k);
  // What Propose does once the step's draft lengths are chosen.
  virtual void ProposeDrafts(const DraftStep& step) = 0;
  // seq's drafts this step: DraftRoom at K_max, or the policy's K for it.
  int Room(const Sequence& seq) const;
  // How many draft steps a round runs this step: K_max, or the largest K chosen.
  int RoundLength() const { return policy_ ? round_k_ : k_; }
  // A device round over `seqs` requests of k drafts took `seconds` (the cost model's); one
  // that recorded a graph is no measurement.
  void ObserveRound(int seqs, int k, double seconds, bool recorded);
  // How many drafts each decoding sequence could take this step at most, when a method
  // knows before the policy chooses (n-gram: its prompt-lookup match); K_max otherwise.
  // `acceptance`: the policy's estimate for it this step (the prior when it probes).
  virtual int DraftsAvailable(const Sequence& /*seq*/, int room, double /*acceptance*/) { return room; }

 private:
  void Plan(const DraftStep& step);

  int k_;
  std::optional<DraftLengthPolicy> policy_;
  DraftCostModel measured_;
  const DraftCostModel* cost_ = &measured_;
  bool injected_ = false;
  std::unordered_map<const Sequence*, int> planned_;  // this step's K per decoding sequence
  int round_k_ = 0;
  int64_t steps_planned_ = 0;  // the policy's clock: idle requests probe on its multiples of probe_interval
  std::vector<int64_t> chosen_lengths_;
};

// vLLM's "ngram" method: prompt lookup on the host.
class NgramDrafter : public Drafter {
 public:
  NgramDrafter(NgramProposer proposer, int k) : Drafter(k), proposer_(std::move(proposer)) {}

 protected:
  void ProposeDrafts(const DraftStep& step) override;
  // With adaptive draft lengths the lookup runs first: a sequence without a match is a
  // plain row to the policy, which prices the verification step the matches make. Not for
  // a sequence whose acceptance is under kMinLookupAcceptance (until it probes): its drafts
  // would add under 5% to its tokens, and the lookups of a whole batch cost (128 requests of
  // 768 tokens: 0.33 ms a step on the H200's host, 3% of the step).
  int DraftsAvailable(const Sequence& seq, int room, double acceptance) override;
  static constexpr double kMinLookupAcceptance = 0.05;

 private:
  NgramProposer proposer_;
  std::unordered_map<const Sequence*, std::vector<int32_t>> looked_up_;  // this step's, adaptive
};

// What a drafter may use of the engine: the runner (device, target KV, graph settings)
// and the scheduler, which owns the KV blocks (EAGLE-3 reserves its chained steps' slots).
struct DrafterContext {
  ModelRunner& runner;
  Scheduler& scheduler;
  int block_size;
  bool enable_prefix_caching;
  int64_t max_model_len;
  const TokenTree* tree = nullptr;  // EAGLE-3 tree drafts (its nodes are K), or chains
  const DynamicTreeConfig* dynamic_tree = nullptr;  // or EAGLE-3 dynamic trees (K nodes)
};

// The engine's drafter for its speculative config (ngram, eagle3 or mtp), or null.
std::unique_ptr<Drafter> MakeDrafter(const NgramConfig& ngram, Eagle3Draft* eagle3, int eagle3_k, MtpDrafter* mtp,
                                     int mtp_k, const DrafterContext& context);

}  // namespace hsx
