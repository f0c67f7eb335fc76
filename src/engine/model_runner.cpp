#include "engine/model_runner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>

namespace hsx {
namespace {

using Clock = std::chrono::steady_clock;

// Recorded batch sizes, as vLLM's: 1, 2, 4, then every multiple of 8.
int BucketFor(int rows) {
  if (rows <= 4) return rows <= 1 ? 1 : rows <= 2 ? 2 : 4;
  return (rows + 7) / 8 * 8;
}

}  // namespace

void CapturedRows::Wait() {
  rows_copy_->Wait();
  flags_copy_->Wait();
}

ModelRunner::ModelRunner(Model& model, RunnerConfig config)
    : model_(model),
      config_(std::move(config)),
      cache_(model.rank_config(), model.backend(), config_.num_blocks, config_.block_size) {
  for (Model* peer : config_.peer_ranks) {
    peer->backend().PinThread();
    peer_caches_.push_back(
        std::make_unique<KVCache>(peer->rank_config(), peer->backend(), config_.num_blocks, config_.block_size));
  }
  if (!config_.peer_ranks.empty()) {
    model.backend().PinThread();
    rank_threads_ = std::make_unique<ThreadPool>(static_cast<int>(config_.peer_ranks.size()) + 1);
  }
  for (const LayerSpec& layer : model.config().layers) has_moe_ = has_moe_ || layer.moe;
  if (config_.max_model_len <= 0) config_.max_model_len = model.config().max_position_embeddings;
  max_blocks_per_seq_ = (config_.max_model_len + config_.block_size - 1) / config_.block_size;
  config_.max_graph_batch = BucketFor(std::max(1, config_.max_graph_batch));
  if (config_.eagle3 != nullptr) {
    draft_cache_ = std::make_unique<KVCache>(config_.eagle3->decoder(), model.backend(), config_.num_blocks,
                                             config_.block_size);
  }
}

ModelRunner::~ModelRunner() {
  if (!profile_) return;
  auto line = [](const char* what, const StepTimes& t) {
    if (t.steps == 0) return;
    std::fprintf(stderr, "hsx profile: %-22s %7ld steps %9ld rows %9.3f s %8.3f ms/step\n", what,
                 static_cast<long>(t.steps), static_cast<long>(t.rows), t.seconds, 1e3 * t.seconds / t.steps);
  };
  line("prefill or mixed steps", prefill_times_);
  line("decode steps, eager", decode_times_);
  line("decode steps, graphs", graph_times_);
  line("verification steps", verify_times_);
  std::fprintf(stderr, "hsx profile: %zu decode graphs recorded (profiling runs them eagerly)\n", graphs_.size());
}

int ModelRunner::GraphBucket(const ForwardBatch& batch) const {
  const int rows = static_cast<int>(batch.token_ids.size());
  // Under tensor parallelism steps run eagerly: the ranks' graphs would have to be recorded
  // and replayed together, NCCL calls inside them.
  if (!config_.graphs || graphs_failed_ || !backend().can_record() || has_moe_ || !config_.capture_layers.empty() ||
      !config_.peer_ranks.empty() ||
      config_.eagle3 != nullptr || config_.mtp != nullptr ||
      rows == 0 || rows > config_.max_graph_batch || batch.seqs.size() != static_cast<size_t>(rows) ||
      batch.logit_rows.size() != static_cast<size_t>(rows)) {
    return 0;
  }
  for (int i = 0; i < rows; ++i) {
    const SequenceSlice& s = batch.seqs[i];
    if (s.q_len != 1 || batch.logit_rows[i] != i || static_cast<int64_t>(s.block_table.size()) > max_blocks_per_seq_) {
      return 0;
    }
  }
  return BucketFor(rows);
}

// Layout of the fixed inputs, in int32 words, for B = max_graph_batch: ids [B], positions
// [B], slots [B], sequence info [B, 4], then block tables. Each bucket reads a prefix of
// every section, so one upload of a prefix serves any bucket and the pointers a graph
// recorded stay valid.
DeviceBatch ModelRunner::StageGraphInputs(const ForwardBatch& batch, int bucket) {
  Backend& backend = model_.backend();
  const int64_t b = config_.max_graph_batch;
  if (!graph_inputs_.defined()) {
    const int64_t words = 7 * b + b * max_blocks_per_seq_;
    graph_inputs_ = backend.Empty(DType::kI32, {words});
    graph_staging_ = backend.HostBuffer(DType::kI32, {words});
  }
  int64_t stride = 1;
  for (const SequenceSlice& s : batch.seqs) stride = std::max<int64_t>(stride, s.block_table.size());
  int32_t* staged = graph_staging_.data<int32_t>();
  int32_t *ids = staged, *positions = staged + b, *slots = staged + 2 * b, *info = staged + 3 * b;
  int32_t* tables = staged + 7 * b;
  const int rows = static_cast<int>(batch.seqs.size());
  for (int i = 0; i < bucket; ++i) {
    const int32_t offset = static_cast<int32_t>(i * stride);
    if (i < rows) {
      const SequenceSlice& s = batch.seqs[i];
      ids[i] = batch.token_ids[i];
      positions[i] = batch.positions[i];
      slots[i] = batch.slot_mapping[i];
      std::copy(s.block_table.begin(), s.block_table.end(), tables + offset);
      std::copy_n(std::array<int32_t, 4>{i, 1, s.ctx_len, offset}.begin(), 4, info + 4 * i);
    } else {
      // Padding: token 0 at position 0 stores no KV and attends to slot 0 of block 0; its
      // rows stay its own (every op is row-wise or per sequence) and are never sampled.
      ids[i] = 0;
      positions[i] = 0;
      slots[i] = -1;
      tables[offset] = 0;
      std::copy_n(std::array<int32_t, 4>{i, 1, 1, offset}.begin(), 4, info + 4 * i);
    }
  }
  const int64_t used = 7 * b + bucket * stride;
  Tensor dst = graph_inputs_.Rows(0, used);
  backend.UploadTo(graph_staging_.Rows(0, used), dst);

  DeviceBatch inputs;
  inputs.token_ids = graph_inputs_.Rows(0, bucket);
  inputs.positions = graph_inputs_.Rows(b, b + bucket);
  inputs.slot_mapping = graph_inputs_.Rows(2 * b, 2 * b + bucket);
  inputs.attention.seq_info = graph_inputs_.Rows(3 * b, 3 * b + 4 * bucket).View({bucket, 4});
  inputs.attention.block_tables = graph_inputs_.Rows(7 * b, 7 * b + bucket * stride);
  inputs.attention.max_q_len = 1;
  inputs.logit_rows.resize(bucket);
  for (int i = 0; i < bucket; ++i) inputs.logit_rows[i] = i;
  return inputs;
}

// The logits of a decode step on a graph: replayed if the bucket has one; otherwise run
// eagerly (its GEMMs tune on first sight, which a recording cannot hold) and recorded for
// the bucket's next step.
Tensor ModelRunner::GraphLogits(const ForwardBatch& batch, int bucket) {
  const DeviceBatch inputs = StageGraphInputs(batch, bucket);
  if (auto it = graphs_.find(bucket); it != graphs_.end()) {
    it->second.graph->Replay();
    ++graph_replays_;
    return it->second.logits;
  }
  Tensor logits = model_.Forward(inputs, cache_, {}).logits;
  Graph g;
  Tensor recorded;
  g.graph = backend().Record([&] { recorded = model_.Forward(inputs, cache_, {}).logits; });
  if (!g.graph) {
    graphs_failed_ = true;
    return logits;
  }
  // A view that does not own: the block goes back to the graph pool, which only other
  // graphs (replayed one at a time, each read before the next) reuse.
  g.logits = Tensor(recorded.raw(), recorded.dtype(), recorded.shape(), recorded.device(), nullptr);
  graphs_.emplace(bucket, std::move(g));
  return logits;
}

std::unique_ptr<CapturedRows> ModelRunner::StartCaptureCopy(Tensor captured) {
  Backend& backend = model_.backend();
  auto rows = std::make_unique<CapturedRows>();
  // Flags for non-finite rows, computed where the rows are (a reduction on the device).
  const int64_t flag_rows = captured.size(0) * captured.size(1);
  rows->device_flags_ = backend.Empty(DType::kI32, {flag_rows});
  backend.FlagNonFiniteRows(captured.View({flag_rows, captured.size(2)}), rows->device_flags_);
  // One pinned buffer holds the rows, then (4-byte aligned) their flags. Two alternate:
  // the engine still reads the previous step's while this one's copy runs.
  const int64_t flags_at = static_cast<int64_t>((captured.nbytes() + 3) / 4);
  Tensor& buffer = host_buffers_[capture_runs_++ % 2];
  if (buffer.numel() < flags_at + flag_rows) buffer = backend.HostBuffer(DType::kI32, {flags_at + flag_rows});
  rows->host_rows_ = Tensor(buffer.raw(), captured.dtype(), captured.shape(), Device::kCPU, nullptr);
  rows->host_flags_ = Tensor(buffer.data<int32_t>() + flags_at, DType::kI32, {flag_rows}, Device::kCPU, nullptr);
  rows->device_rows_ = std::move(captured);
  rows->rows_copy_ = backend.DownloadAsync(rows->device_rows_, rows->host_rows_);
  rows->flags_copy_ = backend.DownloadAsync(rows->device_flags_, rows->host_flags_);
  return rows;
}

ForwardOutput ModelRunner::Forward(const ForwardBatch& batch, const std::vector<int>& capture_layers) {
  if (config_.peer_ranks.empty()) return model_.Forward(batch, cache_, capture_layers);
  ForwardOutput out;
  // ParallelFor gives each rank one index (the caller's thread takes 0); the residual is
  // the same on every rank, so only rank 0 captures.
  rank_threads_->ParallelFor(rank_threads_->size(), [&](int64_t rank, int64_t) {
    if (rank == 0) {
      out = model_.Forward(batch, cache_, capture_layers);
      return;
    }
    Model& peer = *config_.peer_ranks[rank - 1];
    peer.backend().PinThread();
    peer.Forward(batch, *peer_caches_[rank - 1], {});
  });
  return out;
}

Tensor ModelRunner::EagerLogits(const ForwardBatch& batch, StepResult& result) {
  if (config_.eagle3 != nullptr) {
    ForwardOutput out = model_.Forward(batch, cache_, config_.eagle3->config().aux_layer_ids);
    aux_ = std::move(out.captured);
    return std::move(out.logits);
  }
  ForwardOutput out = Forward(batch, config_.capture_layers);
  if (config_.mtp != nullptr) final_hidden_ = out.final_hidden;
  // The copy starts now, beside the sampling and the next step.
  if (!config_.capture_layers.empty()) result.captured = StartCaptureCopy(std::move(out.captured));
  return std::move(out.logits);
}

StepResult ModelRunner::Run(const ForwardBatch& batch, const SamplingBatch& sampling) {
  const auto start = Clock::now();
  StepResult result;
  const int bucket = GraphBucket(batch);
  const Tensor logits = bucket > 0 ? GraphLogits(batch, bucket).Rows(0, static_cast<int64_t>(batch.token_ids.size()))
                                   : EagerLogits(batch, result);
  if (!sampling.rows.empty()) result.sampled = backend().Sample(logits, sampling);
  if (profile_) {
    bool decode = !batch.seqs.empty();
    for (const SequenceSlice& s : batch.seqs) decode = decode && s.q_len == 1;
    Profile(bucket > 0 ? graph_times_ : decode ? decode_times_ : prefill_times_, batch, start);
  }
  return result;
}

StepResult ModelRunner::Verify(const ForwardBatch& batch, const VerificationBatch& verification) {
  const auto start = Clock::now();
  StepResult result;
  const Tensor logits = EagerLogits(batch, result);
  result.verified = backend().VerifyDrafts(logits, nullptr, verification, nullptr);
  if (profile_) Profile(verify_times_, batch, start);
  return result;
}

std::vector<std::vector<int32_t>> ModelRunner::ProposeMtp(const MtpDraftBatch& batch,
                                                            const std::vector<int32_t>& hidden_rows, int num_drafts) {
  std::vector<std::vector<int32_t>> drafts(batch.tokens.size());
  if (batch.tokens.empty()) return drafts;
  Tensor hidden = model_.backend().Empty(final_hidden_.dtype(), {static_cast<int64_t>(hidden_rows.size()),
                                                                  final_hidden_.size(1)});
  model_.backend().GatherRows(final_hidden_, hidden_rows, hidden);
  MtpDraftBatch step = batch;
  for (int s = 0; s < num_drafts; ++s) {
    MtpDraftOutput out = config_.mtp->Step(step, hidden, cache_);
    for (size_t i = 0; i < drafts.size(); ++i) drafts[i].push_back(out.tokens[i]);
    step.tokens = std::move(out.tokens);  // the next step: each argmax at the same position
    hidden = std::move(out.hidden);
  }
  return drafts;
}

std::vector<std::vector<int32_t>> ModelRunner::ProposeEagle3(const ForwardBatch& first_pass,
                                                               const std::vector<int32_t>& step_rows,
                                                               const std::vector<DraftRequest>& requests,
                                                               int num_drafts) {
  Eagle3Draft& draft = *config_.eagle3;
  Backend& backend = model_.backend();
  std::vector<std::vector<int32_t>> drafts(requests.size());
  if (first_pass.token_ids.empty()) return drafts;
  // The first pass's aux states: its rows of every aux layer of the step, [A, R, H].
  const int64_t layers = aux_.size(0), total = aux_.size(1), h = aux_.size(2);
  const int64_t rows = static_cast<int64_t>(step_rows.size());
  std::vector<int32_t> gather;
  for (int64_t l = 0; l < layers; ++l)
    for (int32_t r : step_rows) gather.push_back(static_cast<int32_t>(l * total + r));
  Tensor aux = backend.Empty(aux_.dtype(), {layers * rows, h});
  backend.GatherRows(aux_.View({layers * total, h}), gather, aux);
  Eagle3Output out = draft.Forward(first_pass, draft.CombineHiddenStates(aux.View({layers, rows, h})), *draft_cache_);
  if (requests.empty()) return drafts;
  std::vector<int32_t> tokens = draft.GreedyTargetTokens(out.logits);
  const int bs = config_.block_size;
  for (int s = 2;; ++s) {
    for (size_t i = 0; i < requests.size(); ++i) drafts[i].push_back(tokens[i]);
    if (s > num_drafts) break;
    // Step s: each request's previous draft at the position after, fed the hidden it left.
    ForwardBatch step;
    for (size_t i = 0; i < requests.size(); ++i) {
      const int32_t pos = requests[i].position + s - 2;
      SequenceSlice slice;
      slice.q_start = static_cast<int32_t>(i);
      slice.q_len = 1;
      slice.ctx_len = pos + 1;
      slice.block_table = requests[i].block_table;
      step.token_ids.push_back(tokens[i]);
      step.positions.push_back(pos);
      step.slot_mapping.push_back(slice.block_table[pos / bs] * bs + pos % bs);
      step.logit_rows.push_back(static_cast<int32_t>(i));
      step.seqs.push_back(std::move(slice));
    }
    out = draft.Forward(step, out.next_hidden, *draft_cache_);
    tokens = draft.GreedyTargetTokens(out.logits);
  }
  return drafts;
}

void ModelRunner::Profile(StepTimes& t, const ForwardBatch& batch, Clock::time_point start) {
  backend().Synchronize();
  t.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  ++t.steps;
  t.rows += static_cast<int64_t>(batch.token_ids.size());
}

}  // namespace hsx
