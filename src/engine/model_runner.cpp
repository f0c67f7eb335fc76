#include "engine/model_runner.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdio>
#include <numeric>

namespace hsx {
namespace {

using Clock = std::chrono::steady_clock;

// A view of a recorded output that does not own it: the block goes back to the graph pool,
// which only graphs (replayed one at a time, in stream order) reuse, so what a replay left
// stays until the next replay, and whatever reads it is queued before that.
Tensor Unowned(const Tensor& t) {
  return t.defined() ? Tensor(t.raw(), t.dtype(), t.shape(), t.device(), nullptr) : Tensor();
}

}  // namespace

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
  if (config_.max_model_len <= 0) config_.max_model_len = model.config().max_model_len();
  max_blocks_per_seq_ = (config_.max_model_len + config_.block_size - 1) / config_.block_size;
  config_.max_graph_batch = BucketFor(std::max(1, config_.max_graph_batch));
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

ModelRunner::GraphShape ModelRunner::GraphShapeOf(const ForwardBatch& batch) const {
  const size_t rows = batch.token_ids.size();
  if (batch.seqs.empty() || batch.logit_rows.size() != rows) return {};
  for (size_t i = 0; i < rows; ++i) {
    if (batch.logit_rows[i] != static_cast<int32_t>(i)) return {};
  }
  int q = 0;
  for (const SequenceSlice& s : batch.seqs) q = std::max(q, s.q_len);
  int32_t start = 0;
  for (const SequenceSlice& s : batch.seqs) {
    if (s.q_len < 1 || s.q_start != start || s.ctx_len < q || static_cast<int64_t>(s.block_table.size()) > max_blocks_per_seq_) {
      return {};
    }
    start += s.q_len;
  }
  const int seqs = static_cast<int>(batch.seqs.size());
  GraphShape shape = ShapeFor(seqs, q, static_cast<int>(rows));
  shape.tree = std::any_of(batch.seqs.begin(), batch.seqs.end(), [](const SequenceSlice& s) { return s.tree_base >= 0; });
  return shape;
}

ModelRunner::GraphShape ModelRunner::ShapeFor(int seqs, int q, int rows) const {
  // Under tensor parallelism steps run eagerly: the ranks' graphs would have to be recorded
  // and replayed together, NCCL calls inside them.
  if (!graphs_on() || !config_.peer_ranks.empty() || seqs <= 0 ||
      seqs > config_.max_graph_batch || q < 1 || q > kMaxGraphRowsPerSeq || rows < seqs || rows > seqs * q) {
    return {};
  }
  const int bucket = BucketFor(seqs);
  const bool padded = rows != seqs * q;
  int graph_rows = bucket * q;
  if (padded && graph_rows > kMaxPaddedGraphRows) {
    graph_rows = bucket + std::max(kMinPackedDraftRows, static_cast<int>(std::bit_ceil(static_cast<unsigned>(rows - seqs))));
    if (graph_rows >= bucket * q) return {};  // no fewer rows than every sequence padded to q: eagerly
  }
  if (has_moe_ && !replays_eagerly()) {  // the graph runs graph_rows rows, padding included
    const ModelConfig& c = model_.rank_config();
    if (!backend().MoeRecordable(graph_rows, c.num_experts, c.hidden_size, c.moe_intermediate_size)) return {};
  }
  return {bucket, q, padded, false, graph_rows};
}

std::vector<int32_t> ModelRunner::GraphWidths(const ForwardBatch& batch, int bucket, int q, int rows) {
  const int seqs = static_cast<int>(batch.seqs.size());
  if (rows == 0 || rows == bucket * q) return std::vector<int32_t>(bucket, q);
  std::vector<int32_t> widths(bucket, 1);
  int64_t left = rows - (bucket - seqs);
  for (int i = 0; i < seqs; ++i) left -= (widths[i] = batch.seqs[i].q_len);
  for (int i = seqs; i < bucket && left > 0; ++i) {
    const int more = static_cast<int>(std::min<int64_t>(left, q - 1));
    widths[i] += more;
    left -= more;
  }
  for (int i = 0; i < seqs && left > 0; ++i) {
    const int more = static_cast<int>(std::min<int64_t>(left, q - widths[i]));
    widths[i] += more;
    left -= more;
  }
  return widths;
}

void ModelRunner::RecordGraphs(int max_q, int tree_q) {
  if (!graphs_on()) return;  // graph shapes without recording run each once: CPU tests cover this path
  const ForwardBatch padding_only;  // every sequence of the bucket is padding: stores no KV
  std::vector<std::pair<int, bool>> kinds;  // (q, tree)
  for (int q = 1; q <= std::min(max_q, kMaxGraphRowsPerSeq); ++q) kinds.emplace_back(q, false);
  if (tree_q > 0 && tree_q <= kMaxGraphRowsPerSeq) kinds.emplace_back(tree_q, true);
  for (const auto& [q, tree] : kinds) {
    for (int seqs = 1; seqs <= config_.max_graph_batch; seqs = BucketFor(seqs) + 1) {
      GraphShape shape = ShapeFor(seqs, q, seqs * q);
      shape.tree = tree;
      if (shape.bucket == 0 || shape.rows > kMaxStartupGraphRows) continue;
      if (graphs_.count({shape.bucket, q, tree, shape.rows}) > 0) continue;
      GraphForward(padding_only, shape);
      backend().Synchronize();  // the next shape stages its inputs through the same pinned memory
      if (graphs_failed_) break;
    }
  }
  graph_replays_ = verify_graph_replays_ = packed_graph_steps_ = 0;  // what ran here served no step
}

// Layout of one kind's fixed inputs, in int32 words, for B = max_graph_batch sequences of q
// rows: ids [B q], positions [B q], slots [B q], sequence info [B, 4], the token trees'
// words (AttentionBatch::tree: tree bases [B] then a 64-bit mask per row, at an even word),
// then block tables. Each bucket reads a prefix of every section, so one upload of a prefix
// serves any bucket and the pointers a graph recorded stay valid.
DeviceBatch ModelRunner::StageGraphInputs(const ForwardBatch& batch, int bucket, int q, GraphInputs& in, bool tree,
                                          int graph_rows) {
  Backend& backend = model_.backend();
  const int64_t b = config_.max_graph_batch, n = b * q;
  const int64_t tree_at = (3 * n + 4 * b + 1) / 2 * 2, mask_offset = (b + 1) / 2 * 2;
  const int64_t tables_at = tree_at + mask_offset + 2 * n;
  if (!in.device.defined()) {
    const int64_t words = tables_at + b * max_blocks_per_seq_;
    in.device = backend.Empty(DType::kI32, {words});
    in.staging = backend.HostBuffer(DType::kI32, {words});
  }
  // Padding sequences need the blocks of q positions; real ones have at least as many.
  int64_t stride = (q + config_.block_size - 1) / config_.block_size;
  for (const SequenceSlice& s : batch.seqs) stride = std::max<int64_t>(stride, s.block_table.size());
  int32_t* staged = in.staging.data<int32_t>();
  int32_t *ids = staged, *positions = staged + n, *slots = staged + 2 * n, *info = staged + 3 * n;
  int32_t *tables = staged + tables_at, *tree_bases = staged + tree_at;
  auto* masks = reinterpret_cast<uint64_t*>(tree_bases + mask_offset);
  const int seqs = static_cast<int>(batch.seqs.size());
  const std::vector<int32_t> widths = GraphWidths(batch, bucket, q, graph_rows);
  const int64_t rows = std::accumulate(widths.begin(), widths.end(), int64_t{0});
  if (tree) {
    std::fill_n(tree_bases, bucket, -1);
    std::fill_n(masks, rows, uint64_t{0});  // padding rows: plain causal rows
  }
  for (int i = 0, start = 0; i < bucket; start += widths[i++]) {
    const int32_t offset = static_cast<int32_t>(i * stride), w = widths[i];
    if (i < seqs) {
      const SequenceSlice& s = batch.seqs[i];
      // Front padding: the positions before its first row, storing no KV (its first token as
      // the id: any would do, the row is never read).
      const int pad = w - s.q_len, first = batch.positions[s.q_start];
      for (int j = 0; j < pad; ++j) {
        ids[start + j] = batch.token_ids[s.q_start];
        positions[start + j] = first - pad + j;
        slots[start + j] = -1;
      }
      std::copy_n(batch.token_ids.begin() + s.q_start, s.q_len, ids + start + pad);
      std::copy_n(batch.positions.begin() + s.q_start, s.q_len, positions + start + pad);
      std::copy_n(batch.slot_mapping.begin() + s.q_start, s.q_len, slots + start + pad);
      std::copy(s.block_table.begin(), s.block_table.end(), tables + offset);
      std::fill(tables + offset + s.block_table.size(), tables + offset + stride, 0);  // not a stale table
      std::copy_n(std::array<int32_t, 4>{start, w, s.ctx_len, offset}.begin(), 4, info + 4 * i);
      if (tree && s.tree_base >= 0) {
        tree_bases[i] = s.tree_base;
        std::copy(s.tree_mask.begin(), s.tree_mask.end(), masks + start + pad);
      }
    } else {
      // Padding: token 0 at positions 0..w-1 stores no KV and attends to the first slots of
      // block 0; its rows stay its own (every op is row-wise or per sequence) and are never read.
      for (int j = 0; j < w; ++j) {
        ids[start + j] = 0;
        positions[start + j] = j;
        slots[start + j] = -1;
      }
      std::fill_n(tables + offset, stride, 0);
      std::copy_n(std::array<int32_t, 4>{start, w, w, offset}.begin(), 4, info + 4 * i);
    }
  }
  const int64_t used = tables_at + bucket * stride;
  Tensor dst = in.device.Rows(0, used);
  backend.UploadTo(in.staging.Rows(0, used), dst);

  DeviceBatch inputs;
  inputs.token_ids = in.device.Rows(0, rows);
  inputs.positions = in.device.Rows(n, n + rows);
  inputs.slot_mapping = in.device.Rows(2 * n, 2 * n + rows);
  inputs.attention.seq_info = in.device.Rows(3 * n, 3 * n + 4 * bucket).View({bucket, 4});
  inputs.attention.block_tables = in.device.Rows(tables_at, tables_at + bucket * stride);
  if (tree) {
    inputs.attention.tree = in.device.Rows(tree_at, tables_at);
    inputs.attention.tree_mask_offset = mask_offset;
  }
  // No host copy of the sequence info: kernels that schedule from it (attention_hopper)
  // fall back to ones whose launch depends only on the shapes, as a replay needs.
  inputs.attention.max_q_len = q;
  inputs.logit_rows.resize(rows);
  for (int64_t i = 0; i < rows; ++i) inputs.logit_rows[i] = static_cast<int32_t>(i);
  return inputs;
}

std::vector<int> ModelRunner::recorded_step_rows() const {
  std::vector<int> rows;
  for (const auto& [key, graph] : graphs_) {
    if (!std::get<2>(key)) rows.push_back(std::get<3>(key));
  }
  return rows;
}

const std::vector<int>& ModelRunner::StepCaptureLayers() const {
  return config_.eagle3 != nullptr ? config_.eagle3->config().aux_layer_ids : config_.capture_layers;
}

// A step on a graph: replayed if its (bucket, rows per sequence) has one; otherwise run
// eagerly (its GEMMs tune on first sight, which a recording cannot hold) and recorded for
// the next such step.
ForwardOutput ModelRunner::GraphForward(const ForwardBatch& batch, const GraphShape& shape) {
  const int bucket = shape.bucket, q = shape.q;
  const DeviceBatch inputs = StageGraphInputs(batch, bucket, q, graph_inputs_[q], shape.tree, shape.rows);
  const auto key = std::make_tuple(bucket, q, shape.tree, shape.rows);
  packed_graph_steps_ += shape.rows != bucket * q;
  if (replays_eagerly()) {
    ++graph_replays_;
    verify_graph_replays_ += q > 1;
    return model_.Forward(inputs, cache_, StepCaptureLayers());
  }
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

Tensor ModelRunner::StepLogits(const ForwardBatch& batch, const GraphShape& shape, StepResult& result) {
  result.graph = shape.bucket > 0;
  result.computed_rows = result.graph ? shape.rows : static_cast<int>(batch.token_ids.size());
  if (!result.graph) return EagerLogits(batch, result);
  const size_t recorded = graphs_.size();
  ForwardOutput out = GraphForward(batch, shape);
  result.recorded = graphs_.size() != recorded || graphs_failed_;
  if (shape.padded) out = RealRows(batch, shape, out);
  // Padded rows follow the real ones, which keep their indices.
  if (config_.eagle3 != nullptr) aux_ = std::move(out.captured);
  if (config_.mtp != nullptr) final_hidden_ = std::move(out.final_hidden);
  if (!config_.capture_layers.empty()) {
    // Extraction's decode steps (one-pass regenerate-and-extract, include_output_tokens)
    // replay graphs too. A replay's rows live in the graph pool until the next replay,
    // which the copy stream's download would race, so they are first copied (on the
    // compute stream, [L, graph rows, H]: padded rows ride along, the engine reads the
    // first ones) into a tensor of the step's own.
    Tensor rows = backend().Empty(out.captured.dtype(), out.captured.shape());
    backend().Copy(out.captured, rows);
    result.captured = StartCaptureCopy(std::move(rows));
  }
  return out.logits.Rows(0, static_cast<int64_t>(batch.token_ids.size()));
}

// A padded step's outputs in the batch's own rows (sequence i's real rows are the last
// q_len of its width), gathered out of the graph pool into tensors of the step's own.
ForwardOutput ModelRunner::RealRows(const ForwardBatch& batch, const GraphShape& shape, const ForwardOutput& padded) {
  const std::vector<int32_t> widths = GraphWidths(batch, shape.bucket, shape.q, shape.rows);
  std::vector<int32_t> rows;
  rows.reserve(batch.token_ids.size());
  int32_t start = 0;
  for (size_t i = 0; i < batch.seqs.size(); start += widths[i++]) {
    const SequenceSlice& s = batch.seqs[i];
    for (int j = 0; j < s.q_len; ++j) rows.push_back(start + widths[i] - s.q_len + j);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  Backend& backend = this->backend();
  // Only what a step made: a step without capture or MTP leaves those outputs empty.
  auto gather = [&](const Tensor& t) {  // [R, W] -> [n, W]
    if (!t.defined() || t.numel() == 0) return t;
    Tensor out = backend.Empty(t.dtype(), {n, t.size(1)});
    backend.GatherRows(t, rows, out);
    return out;
  };
  auto gather_layers = [&](const Tensor& t) {  // [L, R, H] -> [L, n, H]
    if (!t.defined() || t.numel() == 0) return t;
    const int64_t layers = t.size(0), total = t.size(1), h = t.size(2);
    std::vector<int32_t> layer_rows;
    layer_rows.reserve(static_cast<size_t>(layers * n));
    for (int64_t l = 0; l < layers; ++l)
      for (int32_t r : rows) layer_rows.push_back(static_cast<int32_t>(l * total + r));
    Tensor out = backend.Empty(t.dtype(), {layers * n, h});
    backend.GatherRows(t.View({layers * total, h}), layer_rows, out);
    return out.View({layers, n, h});
  };
  ForwardOutput out;
  out.logits = gather(padded.logits.Rows(0, shape.rows));
  out.captured = gather_layers(padded.captured);
  out.final_hidden = gather(padded.final_hidden);
  return out;
}

std::unique_ptr<CapturedRows> ModelRunner::StartCaptureCopy(Tensor captured) {
  Backend& backend = model_.backend();
  // Flags for non-finite rows, computed where the rows are (a reduction on the device).
  const int64_t flag_rows = captured.size(0) * captured.size(1);
  Tensor flags = backend.Empty(DType::kI32, {flag_rows});
  backend.FlagNonFiniteRows(captured.View({flag_rows, captured.size(2)}), flags);
  CaptureStaging::Landing host = config_.capture_staging->Next(backend, captured);
  std::unique_ptr<PendingDownload> rows_copy = backend.DownloadAsync(captured, host.rows);
  std::unique_ptr<PendingDownload> flags_copy = backend.DownloadAsync(flags, host.flags);
  return std::make_unique<CapturedRows>(std::move(captured), std::move(flags), std::move(host.rows),
                                        std::move(host.flags), std::move(rows_copy), std::move(flags_copy));
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

StepResult ModelRunner::Run(const ForwardBatch& batch, const SamplingBatch& sampling, const SampledAhead& ahead) {
  const auto start = Clock::now();
  StepResult result;
  const GraphShape shape = GraphShapeOf(batch);
  const Tensor logits = StepLogits(batch, shape, result);
  if (!sampling.rows.empty()) result.sampled = backend().Sample(logits, sampling, ahead);
  if (profile_) {
    bool decode = !batch.seqs.empty();
    for (const SequenceSlice& s : batch.seqs) decode = decode && s.q_len == 1;
    Profile(shape.bucket > 0 ? graph_times_ : decode ? decode_times_ : prefill_times_, batch, start);
  }
  return result;
}

StepResult ModelRunner::Verify(const ForwardBatch& batch, const VerificationBatch& verification) {
  const auto start = Clock::now();
  StepResult result;
  const GraphShape shape = GraphShapeOf(batch);
  const Tensor logits = StepLogits(batch, shape, result);
  result.verified = backend().VerifyDrafts(logits, nullptr, verification, nullptr);
  if (profile_) Profile(shape.bucket > 0 ? verify_graph_times_ : verify_times_, batch, start);
  return result;
}

void ModelRunner::Profile(StepTimes& t, const ForwardBatch& batch, Clock::time_point start) {
  backend().Synchronize();
  t.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  ++t.steps;
  t.rows += static_cast<int64_t>(batch.token_ids.size());
}

}  // namespace hsx
