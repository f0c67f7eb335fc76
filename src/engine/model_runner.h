// The model runner: everything one engine does on the device. It owns the KV cache, the
// buffers captured rows come home in and the recorded step graphs; it runs a scheduled
// batch (the forward, then sampling of its logit rows on the device) and hands back token
// ids, requested logprobs and the captured rows on their way to the host. The engine
// schedules and keeps sequences; it never holds a device tensor.
#pragma once

#include <array>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/eagle3_draft.h"
#include "model/kv_cache.h"
#include "model/mtp_drafter.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace hsx {

struct RunnerConfig {
  int num_blocks = 1;
  int block_size = 16;
  std::vector<int> capture_layers;  // ascending unique layer ids; empty: no capture
  int max_model_len = 0;            // the longest sequence: bounds a block table
  // The scheduler's token budget: the pinned buffers for captured rows are sized for a step
  // this large when first made (pinning 512 MB takes ~90 ms, which a buffer grown a step at
  // a time would cost again mid-run).
  int max_step_rows = 0;
  // Decode steps (every row one token that samples) and verification steps (every
  // sequence K + 1 rows that all verify) replay a graph recorded per (batch-size bucket,
  // rows per sequence), where the backend can record (CUDA) and nothing is captured; so do
  // the drafters' rounds (EAGLE-3's chained single-token steps, MTP's steps), per bucket.
  bool graphs = true;
  int max_graph_batch = 256;  // larger batches (in sequences) run without a graph
  // An EAGLE-3 draft: every step also captures its aux layers, kept on the device for
  // ProposeEagle3 (not with capture_layers).
  Eagle3Draft* eagle3 = nullptr;
  // A Gemma 4 MTP drafter: the step's final-normed logit rows are kept for ProposeMtp.
  MtpDrafter* mtp = nullptr;
  // Tensor parallelism: ranks 1..N-1 of the model (the runner's model is rank 0), each on
  // its own backend. Every rank runs each forward on its own host thread, pinned to its
  // device; rank 0's thread is the caller's, and rank 0 alone samples and copies captured
  // rows home. Not with drafts or decode graphs.
  std::vector<Model*> peer_ranks;
};

// A sequence that drafts after the step: where its chained draft steps run (the position
// of its last known token, the one with no KV yet) and its block table (with room for K - 1
// more slots).
struct DraftRequest {
  int32_t position = 0;
  std::vector<int32_t> block_table;
};

// One step's captured rows on their way to a pinned host buffer.
class CapturedRows {
 public:
  void Wait();  // returns once rows() and non_finite() hold the step's data
  const Tensor& rows() const { return host_rows_; }  // [L, T, H] in the compute dtype
  // Per captured row ([L, T] as one list), nonzero where it holds an inf or NaN.
  const int32_t* non_finite() const { return host_flags_.data<int32_t>(); }

 private:
  friend class ModelRunner;
  Tensor device_rows_, device_flags_;  // kept alive until the copies land
  Tensor host_rows_, host_flags_;
  std::unique_ptr<PendingDownload> rows_copy_, flags_copy_;
};

struct StepResult {
  SampledTokens sampled;                    // Run: one entry per sampling row
  VerifiedTokens verified;                  // Verify: accepted counts and emitted tokens
  std::unique_ptr<CapturedRows> captured;  // null when no layers are captured
};

class ModelRunner {
 public:
  ModelRunner(Model& model, RunnerConfig config);
  ~ModelRunner();

  // Runs batch and samples its logit rows with sampling's rows (one each, in order).
  StepResult Run(const ForwardBatch& batch, const SamplingBatch& sampling);
  // Runs batch and verifies its drafts (speculative decoding): the logit rows are each
  // request's K + 1 rows, in the order of verification's requests.
  StepResult Verify(const ForwardBatch& batch, const VerificationBatch& verification);
  // EAGLE-3 after a step: the draft's first pass (first_pass: the step's computed positions
  // whose KV stays, each fed the token after it; step_rows: each row's row in the step, whose
  // aux states it takes; its logit rows one per request, in order) writes the draft's KV,
  // then num_drafts - 1 chained steps; returns each request's greedy drafts (target ids).
  // MTP after a step: for each request of `batch` (one row each: the token just emitted at
  // the constant position p, ctx_len p + 1), num_drafts drafter steps fed first the final-normed
  // hidden of the step's logit row hidden_rows[r], then their own; returns greedy drafts.
  std::vector<std::vector<int32_t>> ProposeMtp(const MtpDraftBatch& batch, const std::vector<int32_t>& hidden_rows,
                                               int num_drafts);
  std::vector<std::vector<int32_t>> ProposeEagle3(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows,
                                                  const std::vector<DraftRequest>& requests, int num_drafts);

  const RunnerConfig& config() const { return config_; }
  int64_t graph_replays() const { return graph_replays_; }  // decode and verification steps that replayed a graph
  int64_t verify_graph_replays() const { return verify_graph_replays_; }  // of which verification steps
  int64_t draft_graph_replays() const { return draft_graph_replays_; }    // draft rounds that replayed one
  int64_t first_pass_graph_replays() const { return first_pass_graph_replays_; }  // of which with EAGLE-3's first pass
  // Host seconds spent launching step graphs (the replay call alone): at batch 1 a step's
  // GPU idles for what this takes past the previous step's end.
  double graph_launch_seconds() const { return graph_launch_seconds_; }
  int num_blocks() const { return cache_.num_blocks(); }
  Backend& backend() const { return model_.backend(); }

 private:
  // The bucket (the recorded sequence count it pads to) of a step whose sequences all run
  // the same number of rows, each a logit row (decode: 1; verification: K + 1), or 0 if it
  // runs eagerly.
  int GraphBucket(const ForwardBatch& batch) const;
  // The fixed inputs of one kind of graph (int32 words), staged through pinned memory.
  struct GraphInputs {
    Tensor device, staging;
  };
  // Fills `inputs` with batch (q rows per sequence) padded to `bucket` sequences; returns them.
  DeviceBatch StageGraphInputs(const ForwardBatch& batch, int bucket, int q, GraphInputs& inputs);
  // A step on its graph: outputs of [bucket * q] rows (views into the graph pool on a replay).
  ForwardOutput GraphForward(const ForwardBatch& batch, int bucket);
  // The step's logits [T, V], on its graph if bucket > 0, else op by op (EagerLogits); keeps
  // what the drafter reads next.
  Tensor StepLogits(const ForwardBatch& batch, int bucket, StepResult& result);
  // The batch's logits run op by op; starts the copy of its captured rows into *result.
  Tensor EagerLogits(const ForwardBatch& batch, StepResult& result);
  // The layers a step captures: the EAGLE-3 draft's aux layers, or the extraction's.
  const std::vector<int>& StepCaptureLayers() const;
  // Draft rounds (EAGLE-3's chained steps, MTP's steps) keep their drafts on the device,
  // int32 [drafts, rows] (row r of step s at s * rows + r), and download them once.
  // The bucket of a round over `sequences` whose longest block table has that many
  // blocks, or 0: eager.
  int DraftGraphBucket(int sequences, size_t longest_block_table) const;
  // EAGLE-3's chained steps 1..steps of a round for `rows` rows (the requests, then padding
  // rows that store no KV), staged in one upload, into the fixed inputs where `fixed`; step
  // s reads its token ids from row s - 1 of tokens.
  std::vector<DeviceBatch> StageChainedSteps(const std::vector<DraftRequest>& requests, int rows, int steps,
                                             const Tensor& tokens, bool fixed);
  // The fixed drafts every round graph writes (zeros at first: padding rows read them) and
  // the fixed hidden input a round starts from ([max_graph_batch, width]).
  Tensor DraftTokens();
  Tensor DraftHidden(int64_t width);
  // A round (its work reads fixed inputs and leaves its drafts in DraftTokens()) on the
  // graph of its key: (bucket, the first pass's rows per sequence or 0 without it, drafts).
  void DraftRound(const std::array<int, 3>& key, const std::function<void()>& round);
  // EAGLE-3's first pass on the round's graph: the rows per sequence it pads to, or 0 if
  // it runs eagerly.
  int PaddedFirstPassRows(const ForwardBatch& first_pass, int num_drafts) const;
  // Stages the padded first pass (bucket sequences of q rows, each ending with its logit
  // row) into fixed inputs and gathers its aux states into a fixed [bucket q, A, H].
  DeviceBatch StagePaddedFirstPass(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows, int bucket,
                                   int q, int num_drafts, Tensor& aux,
                                   const std::function<void(const std::vector<int32_t>&, Tensor&)>& gather_aux);
  // tokens [drafts, rows] as each of the first `requests` rows' drafts, in one download.
  std::vector<std::vector<int32_t>> DownloadDrafts(const Tensor& tokens, int rows, int requests, int drafts);
  struct StepTimes {
    double seconds = 0;
    int64_t steps = 0, rows = 0;
  };
  void Profile(StepTimes& times, const ForwardBatch& batch, std::chrono::steady_clock::time_point start);
  std::unique_ptr<CapturedRows> StartCaptureCopy(Tensor captured);
  // The forward on every rank at once; rank 0's output.
  ForwardOutput Forward(const ForwardBatch& batch, const std::vector<int>& capture_layers);

  Model& model_;
  RunnerConfig config_;
  KVCache cache_;
  std::vector<std::unique_ptr<KVCache>> peer_caches_;  // each peer rank's share of the KV heads
  std::unique_ptr<ThreadPool> rank_threads_;           // one per rank, the caller's for rank 0
  std::unique_ptr<KVCache> draft_cache_;  // EAGLE-3: the draft's KV at the target's slots
  Tensor aux_;                            // EAGLE-3: the last step's aux states [A, T, H]
  Tensor final_hidden_;                   // MTP: the last step's final-normed logit rows
  bool has_moe_ = false;  // MoE routing downloads expert counts: it cannot be recorded
  bool draft_has_moe_ = false;  // the same for an MTP drafter's layers
  int64_t capture_runs_ = 0;
  Tensor host_buffers_[2];  // captured rows and flags alternate between two pinned buffers

  // The target's graphs of one number of rows per sequence share one set of fixed inputs
  // (ids, positions, slots, sequence info, block tables at a stride of max_blocks_per_seq_).
  struct Graph {
    std::unique_ptr<DeviceGraph> graph;
    ForwardOutput out;  // where a replay leaves logits, captured aux states, final hidden (graph pool)
  };
  std::map<std::pair<int, int>, Graph> graphs_;  // by (bucket, rows per sequence)
  std::map<int, GraphInputs> graph_inputs_;      // by rows per sequence
  int64_t graph_replays_ = 0, verify_graph_replays_ = 0;
  double graph_launch_seconds_ = 0;
  bool graphs_failed_ = false;  // a recording failed (said once): every step runs eagerly
  int64_t max_blocks_per_seq_ = 0;
  // Draft rounds on graphs, by DraftRound's key (a runner has one kind of drafter), their
  // fixed inputs (MTP's steps and EAGLE-3's padded first passes by rows per sequence,
  // EAGLE-3's chained steps), the aux states of a first pass, the hidden rows a round
  // without one starts from, and the drafts they leave.
  std::map<std::array<int, 3>, std::unique_ptr<DeviceGraph>> draft_graphs_;
  std::map<int, GraphInputs> draft_inputs_;
  GraphInputs chain_inputs_;
  Tensor first_pass_aux_, draft_hidden_, draft_tokens_;
  int64_t draft_graph_replays_ = 0, first_pass_graph_replays_ = 0;

  // HSX_PROFILE=1: steps synchronize; seconds and counts per kind of step.
  bool profile_ = std::getenv("HSX_PROFILE") != nullptr;
  StepTimes prefill_times_, decode_times_, graph_times_, verify_times_, verify_graph_times_;
};

}  // namespace hsx
