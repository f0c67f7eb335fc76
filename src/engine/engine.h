// The engine: sequences and their steps, over a Scheduler (which alone owns the KV
// blocks), a ModelRunner that does everything on the device, the capture object that
// brings captured rows to each request, and a Drafter. Add requests, call Step until
// there is no work; each Step returns the sequences that finished in it. Every entry point
// (extract, generate, serve, bench) drives this one loop.
#pragma once

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "engine/drafter.h"
#include "engine/dynamic_tree.h"
#include "engine/token_tree.h"
#include "engine/hidden_state_capture.h"
#include "engine/model_runner.h"
#include "engine/ngram_proposer.h"
#include "engine/scheduler.h"
#include "model/model.h"

namespace hsx {

struct EngineConfig {
  SchedulerConfig scheduler;
  int block_size = 16;
  int num_blocks = 0;                  // 0: from kv_cache_bytes
  size_t kv_cache_bytes = 1ull << 30;  // per device (per rank under tensor parallelism)
  std::vector<int> capture_layers;     // ascending unique layer ids; empty: no capture
  DType capture_dtype = DType::kBF16;
  int max_model_len = 0;               // 0 (or more): the model's ModelConfig::max_model_len()
  // Reuse the KV and captured hidden states of cached prompt blocks (see BlockManager).
  bool enable_prefix_caching = true;
  // Decode steps replay recorded CUDA graphs (RunnerConfig::graphs); false: vLLM's --enforce-eager.
  bool graphs = true;
  // Testing: graph shapes run eagerly where the backend cannot record (RunnerConfig's).
  bool graph_shapes_without_recording = false;
  // Speculative decoding by prompt lookup: K > 0 proposes up to K drafts per decoding
  // sequence each step, verified losslessly by the next (not with capture layers).
  NgramConfig ngram;
  // Speculative decoding by an EAGLE-3 draft proposing num_speculative_tokens a step
  // (not with capture layers; a cached block holds the draft's KV too).
  struct Eagle3Drafting {
    Eagle3Draft* draft = nullptr;
    int num_speculative_tokens = 0;
    // Tree drafts (vLLM's speculative_token_tree; num_speculative_tokens is its node
    // count): each step drafts the tree's nodes and verifies them in one tree-masked pass.
    std::optional<TokenTree> tree;
    // Or EAGLE-2's dynamic trees (engine/dynamic_tree.h; num_speculative_tokens is its
    // node budget): each request's tree is chosen by the draft's path scores every step.
    std::optional<DynamicTreeConfig> dynamic_tree;
  } eagle3;
  // Speculative decoding by a Gemma 4 MTP drafter (no draft KV: it reads the target's).
  struct MtpDrafting {
    MtpDrafter* drafter = nullptr;
    int num_speculative_tokens = 0;
  } mtp;
  // "draft_length" of --speculative-config: "fixed" (adaptive false) drafts K_max (the
  // method's num_speculative_tokens, within each request's room) every step; "adaptive"
  // chooses K in 0..K_max per request per step (engine/draft_length.h), from its acceptance
  // and a cost model measured as steps run, or cost_model where given (tests).
  struct DraftLength {
    bool adaptive = false;
    DraftLengthConfig policy;  // k_max comes from the method
    const DraftCostModel* cost_model = nullptr;
  } draft_length;
  // Tensor parallelism: ranks 1..N-1 of the engine's model (RunnerConfig::peer_ranks).
  std::vector<Model*> tensor_parallel_peers;
  // hsx bench --spec-bench-accept-rate: in [0, 1], each draft is accepted with this
  // probability whatever the target says (VerificationBatch::forced_accept_rate), so the
  // output is NOT the target's; negative: lossless verification.
  float spec_bench_accept_rate = -1.0f;
};

struct EngineStats {
  uint64_t steps = 0;
  uint64_t tokens_computed = 0;   // rows run through the model (drafts verified included)
  uint64_t tokens_generated = 0;  // tokens appended to sequences
  // Speculative decoding, as vLLM's spec_decode metrics count it: verifications of at
  // least one draft, drafts verified, drafts accepted, and accepted by position.
  uint64_t num_drafts = 0, num_draft_tokens = 0, num_accepted_tokens = 0;
  std::vector<uint64_t> num_accepted_tokens_per_pos;
  // Host wall time in each stage of Step (kStageNames), blocking downloads included: at
  // small batches the device works while the host waits in run and propose, and idles
  // while it is in the others.
  enum Stage { kSchedule, kRun, kAccept, kPropose, kRetire, kNumStages };
  static constexpr const char* kStageNames[kNumStages] = {"schedule", "run", "accept", "propose", "retire"};
  double stage_seconds[kNumStages] = {};
};

class Engine {
 public:
  static constexpr int64_t kTurnHeadroomRows = HiddenStateCapture::kTurnHeadroomRows;

  Engine(Model& model, EngineConfig config);
  ~Engine();

  // Validates and queues a request; an invalid one is rejected alone with a message
  // that names it.
  Status Add(Request request);
  // Add's checks without queueing: vocabulary, lengths, KV fit. Reads only what never
  // changes after construction, so any thread may call it while the engine runs.
  Status Validate(const Request& request) const;
  std::vector<std::unique_ptr<Sequence>> Step();
  // Cancels a queued or running request: it comes back from a later Step with
  // aborted set, its blocks released. False if no such request is unfinished.
  bool Abort(const std::string& id);
  // Ends a queued or running single-turn request after its first `num_generated` tokens, as
  // if it had stopped there: a stop string that the server matched off the engine thread
  // while the engine ran on. Later tokens and their logprobs go, and it finishes normally,
  // stopped, from a later Step: its rows up to there are stored and kept (with
  // include_output_tokens, those of its first prompt + num_generated - 1 tokens), so a
  // capture sink writes what it would have had the engine stopped there itself. A count
  // outside [1, num_generated] (or a request of several turns) fails the request instead.
  // False if no such request is unfinished.
  bool FinishAt(const std::string& id, int num_generated);
  int num_free_blocks() const { return scheduler_.num_free_blocks(); }
  int num_blocks() const { return scheduler_.num_blocks(); }
  bool has_work() const { return scheduler_.has_work() || capture_.in_flight() || !aborted_.empty(); }
  uint64_t num_preemptions() const { return scheduler_.num_preemptions(); }
  // Prompt tokens served from cached blocks, over prompt tokens looked up.
  double prefix_cache_hit_rate() const { return scheduler_.prefix_cache_hit_rate(); }

  const EngineConfig& config() const { return config_; }
  const EngineStats& stats() const { return stats_; }
  const Model& model() const { return model_; }
  const ModelRunner& runner() const { return runner_; }
  const Scheduler& scheduler() const { return scheduler_; }  // its running sequences hold their drafts
  const Drafter* drafter() const { return drafter_.get(); }  // null without drafts

 private:
  // The stages of a Step: schedule (the scheduler picks chunks, drafts included); run (the
  // runner computes them and samples, or verifies the drafts); accept (the emitted tokens
  // are appended); propose (the drafter's Accept and Propose: drafts for the next step);
  // retire (the finished go).
  ForwardBatch BuildBatch(const std::vector<ScheduledChunk>& chunks) const;
  // The sampling rows of the chunks that sample, and those chunks' sequences, in order:
  // one row per sequence, or with drafts one per draft and one more (verification).
  SamplingBatch SamplingRows(const std::vector<ScheduledChunk>& chunks, std::vector<Sequence*>& sampling) const;
  VerificationBatch VerificationRows(const std::vector<ScheduledChunk>& chunks, std::vector<Sequence*>& sampling) const;
  // Appends seq's token from row `row` of `tokens` (with its logprobs) and applies the stop
  // rules; false once seq wants no more tokens.
  bool AcceptToken(Sequence& seq, const SampledTokens& tokens, size_t row, int max_logprobs);
  // Starts seq's next turn (Request::next_turn), or fails it naming why it cannot.
  void BeginTurn(Sequence& seq, const Request::Turn& turn);
  void Accept(const std::vector<Sequence*>& sampling, const SamplingBatch& rows, const SampledTokens& sampled);
  // Returns, per sequence, the logit row its last emitted token came from; adds each
  // sequence's drafts and accepted drafts to outcomes. With token trees, moves the KV of
  // the accepted nodes to their path's positions and fills tree_paths (per sequence).
  std::vector<int32_t> AcceptVerified(const std::vector<Sequence*>& sampling, const VerificationBatch& batch,
                                      const VerifiedTokens& verified, std::vector<DraftOutcome>& outcomes,
                                      std::vector<std::vector<int32_t>>* tree_paths);
  // Stores the previous step's captured rows (HiddenStateCapture::Land), registers the
  // blocks they complete, and hands back the sequences that were waiting for them.
  void LandCapture(std::vector<std::unique_ptr<Sequence>>& finished);
  // Lets a finished sequence's blocks go (cached ones stay reusable) and hands it back.
  void Retire(std::unique_ptr<Sequence> seq, std::vector<std::unique_ptr<Sequence>>& finished);
  // Registers seq's prompt blocks within `tokens` for reuse, if they hold what a reuser
  // needs: KV always, captured rows when the engine captures.
  void Commit(Sequence& seq, int tokens);

  Model& model_;
  EngineConfig config_;
  HiddenStateCapture capture_;  // before the runner, which copies into its staging
  ModelRunner runner_;
  Scheduler scheduler_;
  // The speculative config's drafter (draft state is its own), called once per step after
  // accept; null without drafts.
  std::unique_ptr<Drafter> drafter_;
  // When the last step's draft round ended (unset after an idle Step): the next step's
  // whole cycle to its own round, host work included, is what the adaptive cost model
  // measures of a target step.
  std::optional<std::chrono::steady_clock::time_point> last_round_end_;
  EngineStats stats_;
  std::vector<std::unique_ptr<Sequence>> aborted_;  // aborted or finished early: handed back by the next Step
  // HSX_PROFILE=1: the capture object's seconds waiting for copies and storing rows (the
  // runner reports its steps).
  bool profile_ = std::getenv("HSX_PROFILE") != nullptr;
};

}  // namespace hsx
