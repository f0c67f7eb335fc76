// The model runner: everything one engine does on the device. It owns the KV cache and
// the recorded step graphs; it runs a scheduled batch (the forward with its capture taps,
// then sampling of its logit rows on the device) and hands back token ids, requested
// logprobs and the captured rows on their way to the host, whose copy it starts into the
// capture object's pinned staging (capture_staging.h). The engine schedules and keeps
// sequences; it never holds a device tensor.
#pragma once

#include <array>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "engine/capture_staging.h"
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
  // Where captured rows land on the host (the engine's capture object owns it); required
  // with capture_layers.
  CaptureStaging* capture_staging = nullptr;
  // Decode steps (every row one token that samples) and verification steps (every
  // sequence K + 1 rows that all verify) replay a graph recorded per (batch-size bucket,
  // rows per sequence), where the backend can record (CUDA), capturing or not; so do the
  // drafters' rounds (draft_runner.h), per bucket.
  bool graphs = true;
  int max_graph_batch = 256;  // larger batches (in sequences) run without a graph
  // Where the backend cannot record (the CPU): steps and draft rounds still take their graph
  // shapes (bucket padding, fixed inputs) and run them eagerly, so that CPU tests cover the
  // padding the device's graphs run. Counted as replays.
  bool graph_shapes_without_recording = false;
  // An EAGLE-3 draft: every step also captures its aux layers, kept on the device for
  // the drafter's next round (step_aux; not with capture_layers).
  Eagle3Draft* eagle3 = nullptr;
  // A Gemma 4 MTP drafter: the step's final-normed logit rows are kept for its next round
  // (step_final_hidden).
  MtpDrafter* mtp = nullptr;
  // Tensor parallelism: ranks 1..N-1 of the model (the runner's model is rank 0), each on
  // its own backend. Every rank runs each forward on its own host thread, pinned to its
  // device; rank 0's thread is the caller's, and rank 0 alone samples and copies captured
  // rows home. Not with drafts or decode graphs.
  std::vector<Model*> peer_ranks;
};

struct StepResult {
  SampledTokens sampled;                    // Run: one entry per sampling row
  VerifiedTokens verified;                  // Verify: accepted counts and emitted tokens
  std::unique_ptr<CapturedRows> captured;  // null when no layers are captured
  // How it ran (what the adaptive draft length's cost model keys a step by): the rows it
  // computed (a graph's padding included), on a graph or eagerly, and whether it recorded
  // that graph (then its time is no measurement of the step).
  int computed_rows = 0;
  bool graph = false;
  bool recorded = false;
};

class ModelRunner {
 public:
  ModelRunner(Model& model, RunnerConfig config);
  ~ModelRunner();

  // Runs batch and samples its logit rows with sampling's rows (one each, in order);
  // `ahead` queues work on the sampled tokens before they reach the host (Backend::Sample).
  StepResult Run(const ForwardBatch& batch, const SamplingBatch& sampling, const SampledAhead& ahead = {});
  // Runs batch and verifies its drafts (speculative decoding): the logit rows are each
  // request's K + 1 rows, in the order of verification's requests.
  StepResult Verify(const ForwardBatch& batch, const VerificationBatch& verification);
  // What the last step left for a drafter, on the device until the next step: EAGLE-3's
  // aux states [A, T, H] (RunnerConfig::eagle3), MTP's final-normed logit rows
  // (RunnerConfig::mtp). Views into the graph pool after a replay: read them before the
  // next replay.
  const Tensor& step_aux() const { return aux_; }
  const Tensor& step_final_hidden() const { return final_hidden_; }
  KVCache& cache() { return cache_; }  // the target's (an MTP drafter attends to it)

  // Graphs, shared with the drafters' rounds (draft_runner.h). Recorded batch sizes, as
  // vLLM's: 1, 2, 4, then every multiple of 8.
  static int BucketFor(int rows) {
    if (rows <= 4) return rows <= 1 ? 1 : rows <= 2 ? 2 : 4;
    return (rows + 7) / 8 * 8;
  }
  // Rows per sequence a graph may have: K + 1 for the speculative config's largest K (64).
  static constexpr int kMaxGraphRowsPerSeq = 65;
  // Whether steps may record and replay graphs (on, recordable, and no recording failed).
  bool graphs_on() const {
    return config_.graphs && !graphs_failed_ && (backend().can_record() || config_.graph_shapes_without_recording);
  }
  // Whether graph shapes run eagerly (graph_shapes_without_recording on a backend that cannot record).
  bool replays_eagerly() const { return !backend().can_record(); }
  // A recording failed (said once): from now on every step and round runs eagerly.
  void RecordingFailed() { graphs_failed_ = true; }
  bool recording_failed() const { return graphs_failed_; }
  int max_graph_batch() const { return config_.max_graph_batch; }  // a bucket
  int64_t max_blocks_per_seq() const { return max_blocks_per_seq_; }
  // The fixed inputs of one kind of graph (int32 words), staged through pinned memory.
  struct GraphInputs {
    Tensor device, staging;
  };
  // Fills `inputs` with batch padded to `bucket` sequences of q rows (or, packed, of
  // `rows` rows in all: GraphWidths); returns them. A sequence of fewer rows is padded at
  // its front with rows at the positions before its first (which store no KV: its real
  // rows see exactly their own context), so it needs ctx_len >= q. With `tree`, the inputs
  // carry the token trees' words too (each sequence's tree_base, each row's mask; padding
  // rows plain).
  DeviceBatch StageGraphInputs(const ForwardBatch& batch, int bucket, int q, GraphInputs& inputs, bool tree = false,
                               int rows = 0);
  // Each graph sequence's rows (the batch's, then the bucket's padding sequences), none
  // past q, summing to `rows` (0: bucket * q, every sequence q). Packed: a padding sequence
  // takes 1 row, the rest go to padding sequences up to q, then to the batch's sequences'
  // fronts in order.
  static std::vector<int32_t> GraphWidths(const ForwardBatch& batch, int bucket, int q, int rows);

  // How a step runs on a graph: `bucket` (the recorded sequence count it pads to) sequences
  // of at most q rows, `rows` in all (bucket * q, or fewer when packed). bucket 0: eagerly.
  struct GraphShape {
    int bucket = 0;
    int q = 0;
    bool padded = false;  // some sequence runs fewer than q rows: its real rows are gathered out
    bool tree = false;    // some sequence verifies a token tree: the inputs carry its mask words
    int rows = 0;
  };
  // The shape of a decode or verification step of `seqs` sequences with at most q rows each
  // and `rows` in all, by GraphShapeOf's rule for any batch of that kind (a batch's
  // particulars, such as a block table past the graphs' or a token tree, may still run it
  // eagerly): what the adaptive draft length prices a plan by. A step of mixed draft counts
  // runs bucket * q rows up to kMaxPaddedGraphRows; past that, packed: one row a sequence
  // plus its draft rows rounded up to a power of two, at least kMinPackedDraftRows (at
  // batch 128, 7 drafting requests of K = 3 run 149 rows in a graph of 128 + 32 instead of
  // 512, or eagerly). Powers of two keep the shapes, each recorded at first use, few.
  GraphShape ShapeFor(int seqs, int q, int rows) const;
  static constexpr int kMinPackedDraftRows = 16;
  // Records the step graphs of every bucket for q = 1..max_q rows a sequence, up to
  // kMaxStartupGraphRows rows (vLLM captures its sizes at start-up too): a shape first met
  // while serving pays its recording in that step (H200, Qwen3-8B shape: ~45 ms, which
  // cost n-gram's batch of 32 8% of a 256-step run in its three rare verification shapes).
  // Larger shapes are still recorded at first use. Nothing where steps do not record.
  // tree_q > 0: also the token-tree verification graphs of that many rows a sequence.
  void RecordGraphs(int max_q, int tree_q = 0);
  static constexpr int kMaxStartupGraphRows = 512;
  int64_t graphs_recorded() const { return static_cast<int64_t>(graphs_.size()); }
  // The rows of each step graph recorded so far, token trees' aside (a step of those rows
  // replays it: its GEMMs are planned).
  std::vector<int> recorded_step_rows() const;

  const RunnerConfig& config() const { return config_; }
  int64_t graph_replays() const { return graph_replays_; }  // decode and verification steps that replayed a graph
  int64_t verify_graph_replays() const { return verify_graph_replays_; }  // of which verification steps
  // Steps on packed graph shapes (ShapeFor), replayed or recorded at first use: a packed
  // shape's rows vary with the step's drafts, so many are first sights.
  int64_t packed_graph_steps() const { return packed_graph_steps_; }
  // Host seconds spent launching step graphs (the replay call alone): at batch 1 a step's
  // GPU idles for what this takes past the previous step's end.
  double graph_launch_seconds() const { return graph_launch_seconds_; }
  int num_blocks() const { return cache_.num_blocks(); }
  Backend& backend() const { return model_.backend(); }

 private:
  // A step whose every row is a logit row, in order (decode: 1 a sequence; verification: its
  // drafts + 1) fits a graph: at q = its sequences' most rows, those with fewer padded, while
  // the padded step stays within kMaxPaddedGraphRows (mixed draft lengths).
  GraphShape GraphShapeOf(const ForwardBatch& batch) const;
  // A step of mixed rows per sequence runs padded on a graph up to this many rows: below it
  // the decode GEMMs read each weight once whatever the rows (H200: ~200 FLOP a byte of
  // bf16 weights), so the padding rows ride along nearly free; above it eagerly.
  static constexpr int kMaxPaddedGraphRows = 192;
  // A step on its graph: outputs of [bucket * q] rows (views into the graph pool on a replay).
  ForwardOutput GraphForward(const ForwardBatch& batch, const GraphShape& shape);
  // The step's logits [T, V], on its graph if shape.bucket > 0, else op by op (EagerLogits);
  // keeps what the drafter reads next. A padded step's outputs come back in the batch's rows.
  Tensor StepLogits(const ForwardBatch& batch, const GraphShape& shape, StepResult& result);
  ForwardOutput RealRows(const ForwardBatch& batch, const GraphShape& shape, const ForwardOutput& padded);
  // The batch's logits run op by op; starts the copy of its captured rows into *result.
  Tensor EagerLogits(const ForwardBatch& batch, StepResult& result);
  // The layers a step captures: the EAGLE-3 draft's aux layers, or the extraction's.
  const std::vector<int>& StepCaptureLayers() const;
  struct StepTimes {
    double seconds = 0;
    int64_t steps = 0, rows = 0;
  };
  void Profile(StepTimes& times, const ForwardBatch& batch, std::chrono::steady_clock::time_point start);
  // Flags captured's non-finite rows on the device and starts copying both into the staging.
  std::unique_ptr<CapturedRows> StartCaptureCopy(Tensor captured);
  // The forward on every rank at once; rank 0's output.
  ForwardOutput Forward(const ForwardBatch& batch, const std::vector<int>& capture_layers);

  Model& model_;
  RunnerConfig config_;
  KVCache cache_;
  std::vector<std::unique_ptr<KVCache>> peer_caches_;  // each peer rank's share of the KV heads
  std::unique_ptr<ThreadPool> rank_threads_;           // one per rank, the caller's for rank 0
  Tensor aux_;                            // EAGLE-3: the last step's aux states [A, T, H]
  Tensor final_hidden_;                   // MTP: the last step's final-normed logit rows
  // A step with MoE layers is recorded only where the backend keeps MoeMlp on the device
  // at its rows (MoeRecordable: CUDA's grouped GEMVs, up to 256 tokens).
  bool has_moe_ = false;

  // The target's graphs of one number of rows per sequence share one set of fixed inputs
  // (ids, positions, slots, sequence info, block tables at a stride of max_blocks_per_seq_).
  struct Graph {
    std::unique_ptr<DeviceGraph> graph;
    ForwardOutput out;  // where a replay leaves logits, captured aux states, final hidden (graph pool)
  };
  std::map<std::tuple<int, int, bool, int>, Graph> graphs_;  // by (bucket, most rows a sequence, tree, rows)
  std::map<int, GraphInputs> graph_inputs_;      // by rows per sequence
  int64_t graph_replays_ = 0, verify_graph_replays_ = 0, packed_graph_steps_ = 0;
  double graph_launch_seconds_ = 0;
  bool graphs_failed_ = false;  // a recording failed (said once): every step runs eagerly
  int64_t max_blocks_per_seq_ = 0;

  // HSX_PROFILE=1: steps synchronize; seconds and counts per kind of step.
  bool profile_ = std::getenv("HSX_PROFILE") != nullptr;
  StepTimes prefill_times_, decode_times_, graph_times_, verify_times_, verify_graph_times_;
};

}  // namespace hsx
