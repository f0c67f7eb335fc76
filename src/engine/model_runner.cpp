#include "engine/model_runner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>

namespace hsx {
namespace {

using Clock = std::chrono::steady_clock;

// Recorded batch sizes, as vLLM's: 1, 2, 4, then every multiple of 8.
int BucketFor(int rows) {
  if (rows <= 4) return rows <= 1 ? 1 : rows <= 2 ? 2 : 4;
  return (rows + 7) / 8 * 8;
}

// Rows per sequence a graph may have: K + 1 for the speculative config's largest K (64).
constexpr int kMaxGraphRowsPerSeq = 65;

// A view of a recorded output that does not own it: the block goes back to the graph pool,
// which only graphs (replayed one at a time, in stream order) reuse, so what a replay left
// stays until the next replay, and whatever reads it is queued before that.
Tensor Unowned(const Tensor& t) {
  return t.defined() ? Tensor(t.raw(), t.dtype(), t.shape(), t.device(), nullptr) : Tensor();
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
  if (config_.mtp != nullptr) {
    for (const LayerSpec& layer : config_.mtp->config().text.layers) draft_has_moe_ = draft_has_moe_ || layer.moe;
  }
  if (config_.max_model_len <= 0) config_.max_model_len = model.config().max_model_len();
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
  line("verification, graphs", verify_graph_times_);
  std::fprintf(stderr, "hsx profile: %zu step graphs recorded (profiling runs them eagerly)\n", graphs_.size());
}

int ModelRunner::GraphBucket(const ForwardBatch& batch) const {
  const int seqs = static_cast<int>(batch.seqs.size());
  // Under tensor parallelism steps run eagerly: the ranks' graphs would have to be recorded
  // and replayed together, NCCL calls inside them.
  if (!config_.graphs || graphs_failed_ || !backend().can_record() || has_moe_ || !config_.capture_layers.empty() ||
      !config_.peer_ranks.empty() || seqs == 0 || seqs > config_.max_graph_batch) {
    return 0;
  }
  const int q = batch.seqs[0].q_len;
  const size_t rows = static_cast<size_t>(seqs) * q;
  if (q < 1 || q > kMaxGraphRowsPerSeq || batch.token_ids.size() != rows || batch.logit_rows.size() != rows) return 0;
  for (size_t i = 0; i < rows; ++i) {
    if (batch.logit_rows[i] != static_cast<int32_t>(i)) return 0;
  }
  for (int i = 0; i < seqs; ++i) {
    const SequenceSlice& s = batch.seqs[i];
    if (s.q_len != q || s.q_start != i * q || s.ctx_len < q ||
        static_cast<int64_t>(s.block_table.size()) > max_blocks_per_seq_) {
      return 0;
    }
  }
  return BucketFor(seqs);
}

// Layout of one kind's fixed inputs, in int32 words, for B = max_graph_batch sequences of q
// rows: ids [B q], positions [B q], slots [B q], sequence info [B, 4], then block tables.
// Each bucket reads a prefix of every section, so one upload of a prefix serves any bucket
// and the pointers a graph recorded stay valid.
DeviceBatch ModelRunner::StageGraphInputs(const ForwardBatch& batch, int bucket, int q, GraphInputs& in) {
  Backend& backend = model_.backend();
  const int64_t b = config_.max_graph_batch, n = b * q;
  if (!in.device.defined()) {
    const int64_t words = 3 * n + 4 * b + b * max_blocks_per_seq_;
    in.device = backend.Empty(DType::kI32, {words});
    in.staging = backend.HostBuffer(DType::kI32, {words});
  }
  // Padding sequences need the blocks of q positions; real ones have at least as many.
  int64_t stride = (q + config_.block_size - 1) / config_.block_size;
  for (const SequenceSlice& s : batch.seqs) stride = std::max<int64_t>(stride, s.block_table.size());
  int32_t* staged = in.staging.data<int32_t>();
  int32_t *ids = staged, *positions = staged + n, *slots = staged + 2 * n, *info = staged + 3 * n;
  int32_t* tables = staged + 3 * n + 4 * b;
  const int seqs = static_cast<int>(batch.seqs.size());
  for (int i = 0; i < bucket; ++i) {
    const int32_t offset = static_cast<int32_t>(i * stride);
    if (i < seqs) {
      const SequenceSlice& s = batch.seqs[i];
      std::copy_n(batch.token_ids.begin() + i * q, q, ids + i * q);
      std::copy_n(batch.positions.begin() + i * q, q, positions + i * q);
      std::copy_n(batch.slot_mapping.begin() + i * q, q, slots + i * q);
      std::copy(s.block_table.begin(), s.block_table.end(), tables + offset);
      std::copy_n(std::array<int32_t, 4>{i * q, q, s.ctx_len, offset}.begin(), 4, info + 4 * i);
    } else {
      // Padding: token 0 at positions 0..q-1 stores no KV and attends to the first slots of
      // block 0; its rows stay its own (every op is row-wise or per sequence) and are never read.
      for (int j = 0; j < q; ++j) {
        ids[i * q + j] = 0;
        positions[i * q + j] = j;
        slots[i * q + j] = -1;
      }
      std::fill_n(tables + offset, stride, 0);
      std::copy_n(std::array<int32_t, 4>{i * q, q, q, offset}.begin(), 4, info + 4 * i);
    }
  }
  const int64_t used = 3 * n + 4 * b + bucket * stride;
  Tensor dst = in.device.Rows(0, used);
  backend.UploadTo(in.staging.Rows(0, used), dst);

  const int64_t rows = static_cast<int64_t>(bucket) * q;
  DeviceBatch inputs;
  inputs.token_ids = in.device.Rows(0, rows);
  inputs.positions = in.device.Rows(n, n + rows);
  inputs.slot_mapping = in.device.Rows(2 * n, 2 * n + rows);
  inputs.attention.seq_info = in.device.Rows(3 * n, 3 * n + 4 * bucket).View({bucket, 4});
  inputs.attention.block_tables = in.device.Rows(3 * n + 4 * b, 3 * n + 4 * b + bucket * stride);
  // No host copy of the sequence info: kernels that schedule from it (attention_hopper)
  // fall back to ones whose launch depends only on the shapes, as a replay needs.
  inputs.attention.max_q_len = q;
  inputs.logit_rows.resize(rows);
  for (int64_t i = 0; i < rows; ++i) inputs.logit_rows[i] = static_cast<int32_t>(i);
  return inputs;
}

const std::vector<int>& ModelRunner::StepCaptureLayers() const {
  return config_.eagle3 != nullptr ? config_.eagle3->config().aux_layer_ids : config_.capture_layers;
}

// A step on a graph: replayed if its (bucket, rows per sequence) has one; otherwise run
// eagerly (its GEMMs tune on first sight, which a recording cannot hold) and recorded for
// the next such step.
ForwardOutput ModelRunner::GraphForward(const ForwardBatch& batch, int bucket) {
  const int q = batch.seqs[0].q_len;
  const DeviceBatch inputs = StageGraphInputs(batch, bucket, q, graph_inputs_[q]);
  const auto key = std::make_pair(bucket, q);
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    const auto launch = Clock::now();
    it->second.graph->Replay();
    graph_launch_seconds_ += std::chrono::duration<double>(Clock::now() - launch).count();
    ++graph_replays_;
    verify_graph_replays_ += q > 1;
    return it->second.out;
  }
  ForwardOutput out = model_.Forward(inputs, cache_, StepCaptureLayers());
  Graph g;
  ForwardOutput recorded;
  g.graph = backend().Record([&] { recorded = model_.Forward(inputs, cache_, StepCaptureLayers()); });
  if (!g.graph) {
    graphs_failed_ = true;
    return out;
  }
  g.out.logits = Unowned(recorded.logits);
  g.out.captured = Unowned(recorded.captured);
  g.out.final_hidden = Unowned(recorded.final_hidden);
  graphs_.emplace(key, std::move(g));
  return out;
}

Tensor ModelRunner::StepLogits(const ForwardBatch& batch, int bucket, StepResult& result) {
  if (bucket == 0) return EagerLogits(batch, result);
  ForwardOutput out = GraphForward(batch, bucket);
  // Padded rows follow the real ones, which keep their indices.
  if (config_.eagle3 != nullptr) aux_ = std::move(out.captured);
  if (config_.mtp != nullptr) final_hidden_ = std::move(out.final_hidden);
  return out.logits.Rows(0, static_cast<int64_t>(batch.token_ids.size()));
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
  if (buffer.numel() < flags_at + flag_rows) {  // made once for the largest step (RunnerConfig::max_step_rows)
    const int64_t rows = std::max<int64_t>(captured.size(1), config_.max_step_rows);
    const int64_t row_bytes = static_cast<int64_t>(captured.nbytes()) / std::max<int64_t>(1, captured.size(1));
    const int64_t words = (row_bytes * rows + 3) / 4 + captured.size(0) * rows;
    buffer = backend.HostBuffer(DType::kI32, {words});
    // The other buffer too, the first time (not in use yet), so the next step does not pin.
    Tensor& other = host_buffers_[capture_runs_ % 2];
    if (!other.defined()) other = backend.HostBuffer(DType::kI32, {words});
  }
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
  ForwardOutput out = Forward(batch, StepCaptureLayers());
  if (config_.eagle3 != nullptr) {
    aux_ = std::move(out.captured);
    return std::move(out.logits);
  }
  if (config_.mtp != nullptr) final_hidden_ = out.final_hidden;
  // The copy starts now, beside the sampling and the next step.
  if (!config_.capture_layers.empty()) result.captured = StartCaptureCopy(std::move(out.captured));
  return std::move(out.logits);
}

StepResult ModelRunner::Run(const ForwardBatch& batch, const SamplingBatch& sampling) {
  const auto start = Clock::now();
  StepResult result;
  const int bucket = GraphBucket(batch);
  const Tensor logits = StepLogits(batch, bucket, result);
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
  const int bucket = GraphBucket(batch);
  const Tensor logits = StepLogits(batch, bucket, result);
  result.verified = backend().VerifyDrafts(logits, nullptr, verification, nullptr);
  if (profile_) Profile(bucket > 0 ? verify_graph_times_ : verify_times_, batch, start);
  return result;
}

std::vector<std::vector<int32_t>> ModelRunner::ProposeMtp(const MtpDraftBatch& batch,
                                                            const std::vector<int32_t>& hidden_rows, int num_drafts) {
  Backend& backend = model_.backend();
  const int n = static_cast<int>(batch.tokens.size());
  if (n == 0) return std::vector<std::vector<int32_t>>();
  // Every step of the round has the same inputs but the token: one row per sequence at its
  // constant position p (ctx_len - 1), storing no KV.
  ForwardBatch round;
  size_t longest_table = 0;
  for (int i = 0; i < n; ++i) {
    round.token_ids.push_back(batch.tokens[i]);
    round.positions.push_back(batch.seqs[i].ctx_len - 1);
    round.slot_mapping.push_back(-1);
    round.logit_rows.push_back(i);
    round.seqs.push_back(batch.seqs[i]);
    longest_table = std::max(longest_table, batch.seqs[i].block_table.size());
  }
  const int bucket = DraftGraphBucket(n, longest_table);
  const int rows = bucket > 0 ? bucket : n;
  const DeviceBatch in = bucket > 0 ? StageGraphInputs(round, bucket, 1, draft_inputs_[1]) : UploadBatch(backend, round);
  const int64_t width = final_hidden_.size(1);
  Tensor tokens = bucket > 0 ? DraftTokens() : backend.Empty(DType::kI32, {int64_t{num_drafts} * n});
  const Tensor hidden = bucket > 0 ? DraftHidden(width).Rows(0, bucket) : backend.Empty(final_hidden_.dtype(), {n, width});
  Tensor first_hidden = hidden.Rows(0, n);
  backend.GatherRows(final_hidden_, hidden_rows, first_hidden);
  // Step s reads draft s - 1 (step 0 the emitted token) and the hidden the step before left.
  auto steps = [&] {
    Tensor h = hidden;
    for (int s = 0; s < num_drafts; ++s) {
      const Tensor ids = s == 0 ? in.token_ids : tokens.Rows(int64_t{s - 1} * rows, int64_t{s} * rows);
      MtpDraftOutput out = config_.mtp->Step(ids, in.positions, in.attention, h, cache_);
      Tensor next = tokens.Rows(int64_t{s} * rows, int64_t{s + 1} * rows);
      backend.GreedyTokens(out.logits, nullptr, next);
      h = std::move(out.hidden);
    }
  };
  if (bucket > 0) {
    DraftRound({bucket, 0, num_drafts}, steps);
  } else {
    steps();
  }
  return DownloadDrafts(tokens, rows, n, num_drafts);
}

std::vector<std::vector<int32_t>> ModelRunner::ProposeEagle3(const ForwardBatch& first_pass,
                                                               const std::vector<int32_t>& step_rows,
                                                               const std::vector<DraftRequest>& requests,
                                                               int num_drafts) {
  Eagle3Draft& draft = *config_.eagle3;
  Backend& backend = model_.backend();
  if (first_pass.token_ids.empty()) return std::vector<std::vector<int32_t>>(requests.size());
  const int n = static_cast<int>(requests.size());
  size_t longest_table = 0;
  for (const DraftRequest& r : requests) longest_table = std::max(longest_table, r.block_table.size());
  int bucket = DraftGraphBucket(n, longest_table);
  const int q = bucket > 0 ? PaddedFirstPassRows(first_pass, num_drafts) : 0;
  if (q == 0 && num_drafts == 1) bucket = 0;  // the first pass alone, eagerly: nothing to record
  const int rows = bucket > 0 ? bucket : n;
  // Drafts stay on the device, step after step ([num_drafts, rows]); one download at the end.
  Tensor tokens = bucket > 0 ? DraftTokens() : backend.Empty(DType::kI32, {int64_t{num_drafts} * n});
  const int64_t layers = aux_.size(0), total = aux_.size(1), h = aux_.size(2);
  // The first pass's aux states, [R, A, H]: every aux layer's state of each of its rows.
  auto gather_aux = [&](const std::vector<int32_t>& rows_of_step, Tensor& out) {
    std::vector<int32_t> gather;
    for (int32_t r : rows_of_step)
      for (int64_t l = 0; l < layers; ++l) gather.push_back(static_cast<int32_t>(l * total + r));
    backend.GatherRows(aux_.View({layers * total, h}), gather, out);
  };
  DeviceBatch padded;  // the first pass on the graph (q > 0), and its aux states
  Tensor padded_aux;
  Tensor hidden;  // otherwise: the hidden rows the chained steps start from
  if (q > 0) {
    padded = StagePaddedFirstPass(first_pass, step_rows, bucket, q, num_drafts, padded_aux, gather_aux);
  } else {
    const int64_t first_rows = static_cast<int64_t>(step_rows.size());
    Tensor aux = backend.Empty(aux_.dtype(), {layers * first_rows, h});
    gather_aux(step_rows, aux);
    const Eagle3Output out =
        draft.Forward(first_pass, draft.CombineHiddenStates(aux.View({first_rows, layers, h})), *draft_cache_);
    if (n == 0) return {};
    Tensor first = tokens.Rows(0, n);
    draft.GreedyTargetTokens(out.logits, first);
    hidden = out.next_hidden;
    if (bucket > 0) {
      hidden = DraftHidden(draft.decoder().hidden_size).Rows(0, bucket);
      Tensor dst = hidden.Rows(0, n);
      backend.Copy(out.next_hidden, dst);
    }
  }
  const std::vector<DeviceBatch> steps =
      num_drafts > 1 ? StageChainedSteps(requests, rows, num_drafts - 1, tokens, bucket > 0) : std::vector<DeviceBatch>();
  // [the first pass, then] step s: each request's draft s - 1 at the position after, fed the
  // hidden it left.
  auto round = [&] {
    Tensor in = hidden;
    if (q > 0) {
      Eagle3Output out = draft.Forward(padded, draft.CombineHiddenStates(padded_aux), *draft_cache_);
      Tensor first = tokens.Rows(0, rows);
      draft.GreedyTargetTokens(out.logits, first);
      in = std::move(out.next_hidden);
    }
    for (int s = 1; s < num_drafts; ++s) {
      Eagle3Output step = draft.Forward(steps[s - 1], in, *draft_cache_);
      Tensor next = tokens.Rows(int64_t{s} * rows, int64_t{s + 1} * rows);
      draft.GreedyTargetTokens(step.logits, next);
      in = std::move(step.next_hidden);
    }
  };
  if (bucket > 0) {
    DraftRound({bucket, q, num_drafts}, round);
  } else {
    round();
  }
  return DownloadDrafts(tokens, rows, n, num_drafts);
}

// A first pass fits a graph when every sequence in it drafts (its logit row its last) and
// runs at most num_drafts + 1 rows (a verification step's), with at least as many positions
// before its end as the widest: each is padded at its front to that width (q) with rows at
// the positions before, which store no KV, so its last row stays the block's last.
int ModelRunner::PaddedFirstPassRows(const ForwardBatch& first_pass, int num_drafts) const {
  const size_t seqs = first_pass.seqs.size();
  if (first_pass.logit_rows.size() != seqs) return 0;
  int q = 1;
  for (const SequenceSlice& s : first_pass.seqs) q = std::max(q, s.q_len);
  if (q > num_drafts + 1 || q > kMaxGraphRowsPerSeq) return 0;
  for (size_t i = 0; i < seqs; ++i) {
    const SequenceSlice& s = first_pass.seqs[i];
    if (s.q_len < 1 || s.ctx_len < q || first_pass.logit_rows[i] != s.q_start + s.q_len - 1) return 0;
  }
  return q;
}

DeviceBatch ModelRunner::StagePaddedFirstPass(
    const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows, int bucket, int q, int num_drafts, Tensor& aux,
    const std::function<void(const std::vector<int32_t>&, Tensor&)>& gather_aux) {
  ForwardBatch padded;
  std::vector<int32_t> rows_of_step;  // each padded row's row in the step (padding: its sequence's first)
  for (const SequenceSlice& s : first_pass.seqs) {
    const int pad = q - s.q_len;
    for (int j = 0; j < q; ++j) {
      const int32_t row = s.q_start + std::max(0, j - pad);
      padded.token_ids.push_back(first_pass.token_ids[row]);
      padded.positions.push_back(s.ctx_len - q + j);
      padded.slot_mapping.push_back(j < pad ? -1 : first_pass.slot_mapping[row]);
      rows_of_step.push_back(step_rows[row]);
    }
    SequenceSlice slice = s;
    slice.q_start = static_cast<int32_t>(padded.seqs.size()) * q;
    slice.q_len = q;
    padded.seqs.push_back(std::move(slice));
  }
  rows_of_step.resize(static_cast<size_t>(bucket) * q, rows_of_step.front());  // padding sequences
  DeviceBatch inputs = StageGraphInputs(padded, bucket, q, draft_inputs_[q]);
  inputs.logit_rows.clear();
  for (int i = 1; i <= bucket; ++i) inputs.logit_rows.push_back(i * q - 1);
  const int64_t layers = aux_.size(0), h = aux_.size(2);
  if (!first_pass_aux_.defined() || first_pass_aux_.numel() < layers * bucket * q * h) {
    // Sized for the largest bucket and a verification step's rows (num_drafts + 1), once per
    // runner in practice; graphs recorded on a smaller one go with it.
    draft_graphs_.clear();
    first_pass_aux_ = backend().Empty(aux_.dtype(), {layers * config_.max_graph_batch * (num_drafts + 1) * h});
  }
  aux = first_pass_aux_.Rows(0, layers * bucket * q * h).View({layers * bucket * q, h});
  gather_aux(rows_of_step, aux);
  aux = aux.View({int64_t{bucket} * q, layers, h});
  return inputs;
}

// Layout, in int32 words, for S steps of R rows: per step positions [R], slots [R] and
// sequence info [R, 4], then the block tables (one per row at a stride, shared by the steps).
std::vector<DeviceBatch> ModelRunner::StageChainedSteps(const std::vector<DraftRequest>& requests, int rows, int steps,
                                                        const Tensor& tokens, bool fixed) {
  Backend& backend = model_.backend();
  const int n = static_cast<int>(requests.size()), bs = config_.block_size;
  int64_t stride = 1;
  for (const DraftRequest& r : requests) stride = std::max<int64_t>(stride, r.block_table.size());
  const int64_t per_step = 6 * int64_t{rows}, words = steps * per_step + rows * stride;
  if (fixed && !chain_inputs_.device.defined()) {
    const int64_t most = kMaxGraphRowsPerSeq * 6 * config_.max_graph_batch + config_.max_graph_batch * max_blocks_per_seq_;
    chain_inputs_.device = backend.Empty(DType::kI32, {most});
    chain_inputs_.staging = backend.HostBuffer(DType::kI32, {most});
  }
  Tensor host = fixed ? chain_inputs_.staging.Rows(0, words) : Tensor::Host(DType::kI32, {words});
  int32_t* staged = host.data<int32_t>();
  int32_t* tables = staged + steps * per_step;
  std::fill_n(tables, rows * stride, 0);  // padding rows attend to the first slot of block 0
  for (int i = 0; i < n; ++i) std::copy(requests[i].block_table.begin(), requests[i].block_table.end(), tables + i * stride);
  std::vector<std::vector<SequenceSlice>> seqs(steps);  // the host copies eager attention reads
  for (int s = 0; s < steps; ++s) {
    int32_t *positions = staged + s * per_step, *slots = positions + rows, *info = slots + rows;
    for (int i = 0; i < rows; ++i) {
      // Padding: token at position 0, storing no KV.
      const int32_t pos = i < n ? requests[i].position + s : 0;
      positions[i] = pos;
      slots[i] = i < n ? static_cast<int32_t>(SlotOf(requests[i].block_table, pos, bs)) : -1;
      std::copy_n(std::array<int32_t, 4>{i, 1, pos + 1, static_cast<int32_t>(i * stride)}.begin(), 4, info + 4 * i);
      if (!fixed) seqs[s].push_back({i, 1, pos + 1, requests[i].block_table});
    }
  }
  Tensor device;
  if (fixed) {
    device = chain_inputs_.device.Rows(0, words);
    backend.UploadTo(host, device);
  } else {
    device = backend.Upload(host);
  }
  std::vector<DeviceBatch> batches(steps);
  for (int s = 0; s < steps; ++s) {
    DeviceBatch& b = batches[s];
    const int64_t at = s * per_step;
    b.token_ids = tokens.Rows(int64_t{s} * rows, int64_t{s + 1} * rows);
    b.positions = device.Rows(at, at + rows);
    b.slot_mapping = device.Rows(at + rows, at + 2 * rows);
    b.attention.seq_info = device.Rows(at + 2 * rows, at + 6 * rows).View({rows, 4});
    b.attention.block_tables = device.Rows(steps * per_step, words);
    b.attention.max_q_len = 1;
    if (!fixed) {  // a graph gets no host copy: kernels that schedule from one would bake it in
      b.attention.seq_info_host.assign(staged + at + 2 * rows, staged + at + 6 * rows);
      b.attention.seqs = std::move(seqs[s]);
    }
    for (int i = 0; i < rows; ++i) b.logit_rows.push_back(i);  // every row, in order: no gather
  }
  return batches;
}

int ModelRunner::DraftGraphBucket(int sequences, size_t longest_block_table) const {
  if (!config_.graphs || graphs_failed_ || !backend().can_record() || draft_has_moe_ || sequences == 0 ||
      sequences > config_.max_graph_batch || static_cast<int64_t>(longest_block_table) > max_blocks_per_seq_) {
    return 0;
  }
  return BucketFor(sequences);
}

Tensor ModelRunner::DraftTokens() {
  if (!draft_tokens_.defined()) {
    // Zeros: padding rows' token ids are read before any step writes them.
    draft_tokens_ = backend().Upload(Tensor::Host(DType::kI32, {kMaxGraphRowsPerSeq * config_.max_graph_batch}));
  }
  return draft_tokens_;
}

Tensor ModelRunner::DraftHidden(int64_t width) {
  if (!draft_hidden_.defined()) draft_hidden_ = backend().Empty(backend().compute_dtype(), {config_.max_graph_batch, width});
  return draft_hidden_;
}

// As GraphForward: replayed where its key has a graph, else run on the fixed inputs
// (its GEMMs tune) and recorded for the next round.
void ModelRunner::DraftRound(const std::array<int, 3>& key, const std::function<void()>& round) {
  if (auto it = draft_graphs_.find(key); it != draft_graphs_.end()) {
    it->second->Replay();
    ++draft_graph_replays_;
    first_pass_graph_replays_ += key[1] > 0;
    return;
  }
  round();
  if (graphs_failed_) return;
  std::unique_ptr<DeviceGraph> graph = backend().Record(round);
  if (!graph) {
    graphs_failed_ = true;
    return;
  }
  draft_graphs_.emplace(key, std::move(graph));
}

std::vector<std::vector<int32_t>> ModelRunner::DownloadDrafts(const Tensor& tokens, int rows, int requests,
                                                              int drafts) {
  const Tensor host = backend().Download(tokens.Rows(0, int64_t{drafts} * rows));
  const int32_t* words = host.data<int32_t>();
  std::vector<std::vector<int32_t>> out(requests);
  for (int i = 0; i < requests; ++i) {
    for (int s = 0; s < drafts; ++s) out[i].push_back(words[int64_t{s} * rows + i]);
  }
  return out;
}

void ModelRunner::Profile(StepTimes& t, const ForwardBatch& batch, Clock::time_point start) {
  backend().Synchronize();
  t.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  ++t.steps;
  t.rows += static_cast<int64_t>(batch.token_ids.size());
}

}  // namespace hsx
