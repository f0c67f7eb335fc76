#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "engine/sampler.h"
#include "util/thread_pool.h"

namespace hsx {
namespace {

// Whether a step that computes the next n tokens of seq samples its next token(s): the
// chunk completes its known tokens and drafts, and it wants more. BuildBatch asks for a logit row exactly
// where Step samples, so both use this.
bool SamplesAfter(const Sequence& seq, int n) {
  return seq.num_computed + n == seq.num_scheduled_tokens() && seq.wants_more_tokens();
}

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// max_model_len and num_blocks as the engine runs them (0 means: from the model, from the budget).
EngineConfig Resolve(const Model& model, EngineConfig c) {
  // A RoPE variant that changes its table for longer sequences (dynamic, longrope) bounds it.
  const auto& layers = model.config().layers;
  const bool rope_bound = std::any_of(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.rope.position_limit > 0; });
  if (c.max_model_len <= 0 || (rope_bound && c.max_model_len > model.config().max_model_len())) {
    c.max_model_len = model.config().max_model_len();
  }
  if (c.num_blocks <= 0) {
    const DType dtype = model.backend().compute_dtype();
    // An EAGLE-3 draft keeps its own KV at every slot of the target's: a block costs both.
    const size_t draft = c.eagle3.draft ? KVCache::BytesPerToken(c.eagle3.draft->decoder(), dtype) : 0;
    const size_t per_block = (KVCache::BytesPerToken(model.rank_config(), dtype) + draft) * c.block_size;
    c.num_blocks = static_cast<int>(std::max<size_t>(1, c.kv_cache_bytes / per_block));
  }
  return c;
}

RunnerConfig RunnerConfigFor(const EngineConfig& c) {
  RunnerConfig r;
  r.num_blocks = c.num_blocks;
  r.block_size = c.block_size;
  r.capture_layers = c.capture_layers;
  r.max_model_len = c.max_model_len;
  r.max_step_rows = c.scheduler.max_num_batched_tokens;
  r.graphs = c.graphs;
  r.max_graph_batch = c.scheduler.max_num_seqs;
  r.eagle3 = c.eagle3.draft;
  r.mtp = c.mtp.drafter;
  r.peer_ranks = c.tensor_parallel_peers;
  return r;
}

}  // namespace

Engine::Engine(Model& model, EngineConfig config)
    : model_(model),
      config_(Resolve(model, std::move(config))),
      runner_(model, RunnerConfigFor(config_)),
      // A cached block holds the EAGLE-3 draft's KV too, made with the token after it.
      blocks_(runner_.num_blocks(), config_.block_size, config_.enable_prefix_caching, config_.eagle3.draft ? 1 : 0),
      scheduler_(config_.scheduler, blocks_),
      drafter_(MakeDrafter(config_.ngram, config_.eagle3.draft, config_.eagle3.num_speculative_tokens,
                           config_.mtp.drafter, config_.mtp.num_speculative_tokens,
                           {runner_, blocks_, config_.block_size, config_.enable_prefix_caching, config_.max_model_len})) {
  if (drafter_ && config_.draft_length.adaptive) {
    drafter_->EnableAdaptive(config_.draft_length.policy, config_.draft_length.cost_model);
  }
  if (config_.enable_prefix_caching && !config_.capture_layers.empty()) {
    // Host pages are committed only as rows land in them.
    capture_cache_ = Tensor::Host(config_.capture_dtype,
                                  {static_cast<int64_t>(runner_.num_blocks()) * config_.block_size,
                                   static_cast<int64_t>(config_.capture_layers.size()), model.config().hidden_size});
  }
}

Engine::~Engine() {
  if (profile_) {
    std::fprintf(stderr, "hsx profile: engine waiting for capture copies %.2f s, capture store %.2f s, %lu steps\n",
                 profile_seconds_[0], profile_seconds_[1], static_cast<unsigned long>(stats_.steps));
  }
}

Status Engine::Validate(const Request& request) const {
  const std::string who = "request '" + request.id + "'";
  if (request.prompt.empty()) return Error(who + ": empty prompt (expected at least one token)");
  const int vocab = model_.config().vocab_size;
  auto check_ids = [&](const std::vector<int32_t>& ids, const char* what) -> Status {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        return Error(who + ": " + what + " id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                     " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
      }
    }
    return {};
  };
  HSX_RETURN_IF_ERROR(check_ids(request.prompt, "token"));
  HSX_RETURN_IF_ERROR(check_ids(request.stop_token_ids, "stop token"));
  if (request.max_new_tokens < 0 || request.min_new_tokens < 0 || request.min_new_tokens > request.max_new_tokens) {
    return Error(who + ": expected 0 <= min_new_tokens (" + std::to_string(request.min_new_tokens) +
                 ") <= max_new_tokens (" + std::to_string(request.max_new_tokens) + ")");
  }
  // 64-bit: an int sum wraps for max_new_tokens near INT32_MAX and would pass.
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_new_tokens;
  if (total > config_.max_model_len) {
    return Error(who + ": " + std::to_string(request.prompt.size()) + " prompt tokens + " +
                 std::to_string(request.max_new_tokens) + " new tokens exceed max_model_len " +
                 std::to_string(config_.max_model_len));
  }
  if (BlockManager::BlocksFor(static_cast<int>(total), config_.block_size) > blocks_.num_blocks()) {
    return Error(who + ": " + std::to_string(total) + " tokens do not fit the KV cache (" +
                 std::to_string(blocks_.num_blocks() * config_.block_size) + " token slots)");
  }
  return {};
}

Status Engine::Add(Request request) {
  HSX_RETURN_IF_ERROR(Validate(request));
  auto seq = std::make_unique<Sequence>(std::move(request));
  if (seq->request().capture && !config_.capture_layers.empty()) {
    const int64_t layers = static_cast<int64_t>(config_.capture_layers.size());
    // A conversation regenerated turn by turn also holds the known tokens after each
    // answer: room for them from the start, so a single answer's conversation never
    // grows its buffer (large buffers are mmapped: rows never written take no memory).
    const int64_t rows = seq->request().next_turn
                             ? std::min<int64_t>(config_.max_model_len, seq->max_capture_rows() + kTurnHeadroomRows)
                             : seq->max_capture_rows();
    seq->hidden_states = Tensor::Host(config_.capture_dtype, {rows, layers, model_.config().hidden_size});
  }
  scheduler_.Add(std::move(seq));
  return {};
}

ForwardBatch Engine::BuildBatch(const std::vector<ScheduledChunk>& chunks) const {
  ForwardBatch batch;
  const int bs = config_.block_size;
  for (const auto& [seq, n] : chunks) {
    SequenceSlice slice;
    slice.q_start = static_cast<int32_t>(batch.token_ids.size());
    slice.q_len = n;
    slice.ctx_len = seq->num_computed + n;
    slice.block_table = seq->block_table;
    for (int p = seq->num_computed; p < slice.ctx_len; ++p) {
      batch.token_ids.push_back(seq->token_at(p));
      batch.positions.push_back(p);
      batch.slot_mapping.push_back(static_cast<int32_t>(SlotOf(seq->block_table, p, bs)));
    }
    if (SamplesAfter(*seq, n)) {  // the last known token's row, and each draft's
      for (int r = n - 1 - static_cast<int>(seq->drafts.size()); r < n; ++r) batch.logit_rows.push_back(slice.q_start + r);
    }
    batch.seqs.push_back(std::move(slice));
  }
  return batch;
}

// Copies a step's rows out of its [L, T, H] capture (now on the host) into each
// sequence's [rows, L, H] buffer by position, converting to the output dtype; rows in
// parallel. Positions are absolute, so a recompute after preemption rewrites the same
// rows instead of adding any.
void Engine::StoreCaptured(const PendingCapture& step) {
  const Tensor& captured = step.copy->rows();
  // total is the capture's row stride: a graph-replayed step's padded rows follow the real ones.
  const int64_t layers = captured.size(0), total = captured.size(1), h = captured.size(2);
  const size_t in_size = DTypeSize(captured.dtype());
  ThreadPool::Global().ParallelFor(static_cast<int64_t>(step.rows.size()), [&](int64_t b, int64_t e) {
    std::vector<float> f32(static_cast<size_t>(h));
    for (int64_t r = b; r < e; ++r) {
      const auto& [seq, pos, slot, preemptions] = step.rows[r];
      Tensor& dst = seq->hidden_states;
      if (!dst.defined() || pos >= dst.size(0)) continue;
      const size_t out_size = DTypeSize(dst.dtype());
      for (int64_t l = 0; l < layers; ++l) {
        const char* src = captured.data<char>() + (l * total + r) * h * in_size;
        char* out = dst.data<char>() + (pos * layers + l) * h * out_size;
        if (captured.dtype() == dst.dtype()) {
          std::memcpy(out, src, h * in_size);
        } else {
          ConvertToF32(captured.dtype(), src, f32.data(), f32.size());
          ConvertFromF32(f32.data(), dst.dtype(), out, f32.size());
        }
      }
      if (capture_cache_.defined()) {
        const size_t row_bytes = static_cast<size_t>(layers * h) * out_size;
        std::memcpy(capture_cache_.data<char>() + slot * row_bytes, dst.data<char>() + pos * row_bytes, row_bytes);
      }
    }
  });
}

// Names the lowest layer, then the lowest position in it, where the inf or NaN is: where
// it arose (attention may spread it to earlier positions, as 0 * NaN in P·V).
void Engine::FailNonFinite(const PendingCapture& step) {
  const int64_t layers = step.copy->rows().size(0), total = step.copy->rows().size(1);
  const int32_t* flags = step.copy->non_finite();
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t r = 0; r < static_cast<int64_t>(step.rows.size()); ++r) {  // padded rows after them: not read
      Sequence& seq = *step.rows[r].seq;
      if (flags[l * total + r] == 0 || !seq.hidden_states.defined() || !seq.error.ok()) continue;
      seq.error = Error("request '" + seq.id() + "': the hidden state of layer " +
                        std::to_string(config_.capture_layers[l]) + " at token position " +
                        std::to_string(step.rows[r].pos) + " is not finite (inf or NaN); its states are not stored");
      seq.Stop();  // ends once its prompt has run; its remaining steps are wasted, not written
    }
  }
}

// Which sequence, position and KV slot each row of a step's capture belongs to.
std::unique_ptr<Engine::PendingCapture> Engine::TrackCapture(const std::vector<ScheduledChunk>& chunks,
                                                             std::unique_ptr<CapturedRows> copy) const {
  auto step = std::make_unique<PendingCapture>();
  const int bs = config_.block_size;
  for (const auto& [seq, n] : chunks) {
    for (int i = 0; i < n; ++i) {
      const int64_t pos = seq->num_computed + i;
      step->rows.push_back(
          {seq, pos, SlotOf(seq->block_table, pos, bs), seq->preemptions});
    }
  }
  step->copy = std::move(copy);
  return step;
}

// Waits for the pending step's copy, stores its rows and hands back the sequences that
// were waiting for them.
void Engine::FinishCapture(std::vector<std::unique_ptr<Sequence>>& finished) {
  if (!pending_) return;
  const auto t0 = Clock::now();
  pending_->copy->Wait();
  const auto t1 = Clock::now();
  StoreCaptured(*pending_);
  FailNonFinite(*pending_);
  profile_seconds_[0] += Seconds(t0, t1);
  profile_seconds_[1] += Seconds(t1, Clock::now());
  // Blocks whose rows are now all stored can be shared; then the finished let go of theirs.
  // A sequence preempted since this step ran holds other blocks now, whose rows (from
  // its recompute) are still to come: registering those would share unstored rows.
  // A failed sequence's rows are not shared: its block with the bad row is never registered.
  for (const auto& row : pending_->rows) {
    if (row.seq->preemptions != row.preemptions || !row.seq->error.ok()) continue;
    Commit(*row.seq, static_cast<int>(row.pos) + 1);
  }
  for (auto& seq : pending_->finishing) Retire(std::move(seq), finished);
  pending_.reset();
}

void Engine::Commit(Sequence& seq, int tokens) {
  if (capture_cache_.defined() && !seq.hidden_states.defined()) return;  // its blocks lack rows
  blocks_.Commit(seq, tokens);
}

void Engine::Retire(std::unique_ptr<Sequence> seq, std::vector<std::unique_ptr<Sequence>>& finished) {
  blocks_.Release(*seq);
  if (seq->hidden_states.defined()) seq->hidden_states = seq->hidden_states.Rows(0, seq->num_capture_rows());
  finished.push_back(std::move(seq));
}

// A sequence admitted onto cached blocks gets those blocks' captured rows.
void Engine::CopyCachedRows(Sequence& seq) {
  const int cached = seq.num_cached_tokens;
  seq.num_cached_tokens = 0;
  if (cached == 0 || !capture_cache_.defined() || !seq.hidden_states.defined()) return;
  const int bs = config_.block_size;
  const size_t row_bytes = seq.hidden_states.nbytes() / static_cast<size_t>(seq.hidden_states.size(0));
  for (int pos = 0; pos < cached; ++pos) {
    const int64_t slot = SlotOf(seq.block_table, pos, bs);
    std::memcpy(seq.hidden_states.data<char>() + pos * row_bytes, capture_cache_.data<char>() + slot * row_bytes,
                row_bytes);
  }
}

bool Engine::Abort(const std::string& id) {
  std::unique_ptr<Sequence> seq = scheduler_.Remove(id);
  if (!seq) return false;
  seq->aborted = true;
  if (pending_) {
    pending_->finishing.push_back(std::move(seq));  // the in-flight step may still name it
  } else {
    blocks_.Release(*seq);
    aborted_.push_back(std::move(seq));
  }
  return true;
}

bool Engine::FinishAt(const std::string& id, int num_generated) {
  std::unique_ptr<Sequence> seq = scheduler_.Remove(id);
  if (!seq) return false;
  if (num_generated < 1 || num_generated > seq->num_generated() || seq->request().next_turn) {
    seq->error = Error("request '" + id + "': cannot finish it at " + std::to_string(num_generated) +
                       " generated tokens (it has " + std::to_string(seq->num_generated()) +
                       (seq->request().next_turn ? ", in several turns)" : ")"));
  } else {
    seq->KeepGenerated(num_generated);
  }
  // As Abort: the in-flight step may still name it, and its rows are stored before it goes.
  if (pending_) {
    pending_->finishing.push_back(std::move(seq));
  } else {
    Retire(std::move(seq), aborted_);
  }
  return true;
}

SamplingBatch Engine::SamplingRows(const std::vector<ScheduledChunk>& chunks, std::vector<Sequence*>& sampling) const {
  SamplingBatch rows;
  for (const auto& [seq, n] : chunks) {
    if (!SamplesAfter(*seq, n)) continue;
    sampling.push_back(seq);
    // min_tokens: stop tokens cannot be drawn before then.
    const bool hold_stops = seq->turn_generated() < seq->request().min_new_tokens;
    rows.rows.push_back(
        MakeSamplingRow(*seq, hold_stops ? seq->request().stop_token_ids : std::vector<int32_t>{}, rows.adjust));
    rows.max_logprobs = std::max(rows.max_logprobs, rows.rows.back().num_logprobs);
  }
  return rows;
}

VerificationBatch Engine::VerificationRows(const std::vector<ScheduledChunk>& chunks,
                                           std::vector<Sequence*>& sampling) const {
  VerificationBatch batch;
  batch.forced_accept_rate = config_.spec_bench_accept_rate;
  for (const auto& [seq, n] : chunks) {
    if (!SamplesAfter(*seq, n)) continue;
    sampling.push_back(seq);
    const auto& drafts = seq->drafts;
    batch.num_drafts.push_back(static_cast<int32_t>(drafts.size()));
    batch.drafts.insert(batch.drafts.end(), drafts.begin(), drafts.end());
    for (size_t j = 0; j <= drafts.size(); ++j) {  // row j: the token after the first j drafts
      const bool hold_stops = seq->turn_generated() + static_cast<int>(j) < seq->request().min_new_tokens;
      batch.sampling.rows.push_back(
          MakeSamplingRowAfter(*seq, std::span<const int32_t>(drafts.data(), j),
                               hold_stops ? seq->request().stop_token_ids : std::vector<int32_t>{}, batch.sampling.adjust));
      batch.sampling.max_logprobs = std::max(batch.sampling.max_logprobs, batch.sampling.rows.back().num_logprobs);
    }
  }
  return batch;
}

bool Engine::AcceptToken(Sequence& seq, const SampledTokens& tokens, size_t row, int max_logprobs) {
  const int32_t token = tokens.tokens[row];
  seq.Append(token);
  ++stats_.tokens_generated;
  if (const int k = seq.request().sampling.logprobs; k >= 0) {
    Sequence::TokenLogprobs lp{tokens.logprobs[row], {}};
    for (int j = 0; j < k; ++j) {
      const size_t at = row * max_logprobs + j;
      lp.top.emplace_back(tokens.top_ids[at], tokens.top_logprobs[at]);
    }
    seq.logprobs.push_back(std::move(lp));
  }
  const auto& stops = seq.request().stop_token_ids;
  if (seq.request().on_token) seq.request().on_token(token);
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) seq.Stop();
  if (!seq.wants_more_tokens() && seq.request().next_turn && seq.error.ok()) {
    if (std::optional<Request::Turn> turn = seq.request().next_turn(seq)) {
      BeginTurn(seq, *turn);
      return false;  // drafts still to accept this step were the ended turn's
    }
  }
  return seq.wants_more_tokens();
}

// A turn's known continuation, checked as a request is (Validate), and room for its rows.
void Engine::BeginTurn(Sequence& seq, const Request::Turn& turn) {
  const std::string who = "request '" + seq.id() + "'";
  for (int32_t t : turn.known) {
    if (t < 0 || t >= model_.config().vocab_size) {
      seq.error = Error(who + ": the next turn's token id " + std::to_string(t) + " is outside the vocabulary");
      return seq.Stop();
    }
  }
  const int64_t total = static_cast<int64_t>(seq.num_tokens()) + static_cast<int64_t>(turn.known.size()) +
                        std::max(0, turn.max_new_tokens);
  if (turn.max_new_tokens < 0 || total > config_.max_model_len ||
      BlockManager::BlocksFor(static_cast<int>(std::min<int64_t>(total, INT32_MAX)), config_.block_size) > blocks_.num_blocks()) {
    seq.error = Error(who + ": the next turn (" + std::to_string(turn.known.size()) + " known + " +
                      std::to_string(turn.max_new_tokens) + " new tokens) takes the conversation to " +
                      std::to_string(total) + " tokens, past max_model_len " + std::to_string(config_.max_model_len) +
                      " or the KV cache");
    return seq.Stop();
  }
  seq.BeginTurn(turn);
  const Tensor& old = seq.hidden_states;
  if (old.defined() && old.size(0) < total) {
    // On the engine thread: grown at least twofold (and with room for the next known
    // tokens), so a conversation of many turns copies its rows O(log turns) times, and
    // only the rows computed so far (the step in flight stores its rows into the new one).
    const int64_t rows = std::min<int64_t>(config_.max_model_len,
                                           std::max<int64_t>(total + kTurnHeadroomRows, 2 * old.size(0)));
    Tensor grown = Tensor::Host(old.dtype(), {rows, old.size(1), old.size(2)});
    const int64_t written = std::min<int64_t>(seq.num_computed, old.size(0));
    std::memcpy(grown.raw(), old.raw(), static_cast<size_t>(written) * (old.nbytes() / static_cast<size_t>(old.size(0))));
    seq.hidden_states = std::move(grown);
  }
}

// Appends each sampling sequence's token (and its logprobs), and stops the sequences that
// drew a stop token.
void Engine::Accept(const std::vector<Sequence*>& sampling, const SamplingBatch& rows, const SampledTokens& sampled) {
  for (size_t r = 0; r < sampling.size(); ++r) AcceptToken(*sampling[r], sampled, r, rows.max_logprobs);
}

// Appends each sequence's emitted tokens (its accepted drafts, then the correction or
// bonus token) until one stops it, and takes back the KV of rejected drafts: their slots
// hold what later steps overwrite.
std::vector<int32_t> Engine::AcceptVerified(const std::vector<Sequence*>& sampling, const VerificationBatch& batch,
                                            const VerifiedTokens& verified, std::vector<DraftOutcome>& outcomes) {
  std::vector<int32_t> last_rows;
  size_t row = 0;
  for (size_t r = 0; r < sampling.size(); ++r) {
    Sequence& seq = *sampling[r];
    const int drafts = batch.num_drafts[r], accepted = verified.num_accepted[r];
    if (drafts > 0) ++stats_.num_drafts;
    stats_.num_draft_tokens += drafts;
    stats_.num_accepted_tokens += accepted;
    if (stats_.num_accepted_tokens_per_pos.size() < static_cast<size_t>(drafts))
      stats_.num_accepted_tokens_per_pos.resize(drafts);
    for (int j = 0; j < accepted; ++j) ++stats_.num_accepted_tokens_per_pos[j];
    // Computed positions: the last known token's and the accepted drafts'.
    const int computed = seq.num_computed - (drafts - accepted);
    for (int j = 0; j <= accepted; ++j) {
      if (!AcceptToken(seq, verified.emitted, row + j, batch.sampling.max_logprobs)) break;
    }
    seq.num_computed = std::min(computed, seq.num_tokens());
    seq.drafts.clear();
    last_rows.push_back(static_cast<int32_t>(row + accepted));
    outcomes.push_back({&seq, drafts, accepted});
    row += drafts + 1;
  }
  return last_rows;
}

std::vector<std::unique_ptr<Sequence>> Engine::Step() {
  std::vector<std::unique_ptr<Sequence>> finished = std::move(aborted_);
  aborted_.clear();
  Clock::time_point stage_start = Clock::now();
  auto end_stage = [&](EngineStats::Stage stage) {
    const Clock::time_point now = Clock::now();
    stats_.stage_seconds[stage] += Seconds(stage_start, now);
    stage_start = now;
  };
  // Schedule.
  const std::vector<ScheduledChunk> chunks = scheduler_.Schedule();
  if (chunks.empty()) {
    FinishCapture(finished);
    return finished;
  }
  for (const auto& [seq, n] : chunks) CopyCachedRows(*seq);
  // Run: the forward and, on the device, one sampled token per sequence whose known tokens
  // this step completes.
  const ForwardBatch batch = BuildBatch(chunks);
  bool verifying = false, decode_only = true;
  for (const auto& [seq, n] : chunks) {
    verifying = verifying || !seq->drafts.empty();
    decode_only = decode_only && n == 1 + static_cast<int>(seq->drafts.size());
  }
  std::vector<Sequence*> sampling;
  SamplingBatch rows;
  VerificationBatch verification;
  StepResult result;
  end_stage(EngineStats::kSchedule);
  if (verifying) {
    verification = VerificationRows(chunks, sampling);
    result = runner_.Verify(batch, verification);
  } else {
    rows = SamplingRows(chunks, sampling);
    result = runner_.Run(batch, rows);
  }
  std::unique_ptr<PendingCapture> capture;
  if (result.captured) capture = TrackCapture(chunks, std::move(result.captured));
  ++stats_.steps;
  stats_.tokens_computed += batch.token_ids.size();
  for (const auto& [seq, n] : chunks) seq->num_computed += n;
  const double run_seconds = Seconds(stage_start, Clock::now());
  end_stage(EngineStats::kRun);
  // Accept.
  std::vector<std::pair<Sequence*, int32_t>> sampled;
  std::vector<DraftOutcome> outcomes;
  if (verifying) {
    const std::vector<int32_t> last_rows = AcceptVerified(sampling, verification, result.verified, outcomes);
    for (size_t i = 0; i < sampling.size(); ++i) sampled.emplace_back(sampling[i], last_rows[i]);
  } else {
    Accept(sampling, rows, result.sampled);
    for (size_t i = 0; i < sampling.size(); ++i) {
      sampled.emplace_back(sampling[i], static_cast<int32_t>(i));
      outcomes.push_back({sampling[i], 0, 0});
    }
  }
  end_stage(EngineStats::kAccept);
  // Propose: the drafter hears how its drafts fared, then drafts for the next step (not
  // with capture layers).
  if (drafter_ && config_.capture_layers.empty()) {
    drafter_->Accept(outcomes);
    drafter_->Propose({batch, chunks, sampled, run_seconds, static_cast<int>(batch.token_ids.size()), decode_only});
  }
  end_stage(EngineStats::kPropose);
  // Retire.
  for (const auto& [seq, n] : chunks) {
    if (!capture) Commit(*seq, seq->num_computed);  // no rows to wait for
    if (seq->num_computed >= seq->must_compute() && !seq->wants_more_tokens()) {
      // A finished sequence keeps its blocks until this step's captured rows are stored.
      std::unique_ptr<Sequence> done = scheduler_.Detach(seq);
      if (capture) {
        capture->finishing.push_back(std::move(done));
      } else {
        Retire(std::move(done), finished);
      }
    }
  }
  FinishCapture(finished);  // the previous step's, overlapping the forward just queued
  pending_ = std::move(capture);
  end_stage(EngineStats::kRetire);
  return finished;
}

}  // namespace hsx
