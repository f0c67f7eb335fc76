#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "engine/sampler.h"

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

CaptureConfig CaptureConfigFor(const Model& model, const EngineConfig& c) {
  CaptureConfig r;
  r.layers = c.capture_layers;
  r.dtype = c.capture_dtype;
  r.hidden_size = model.config().hidden_size;
  r.max_model_len = c.max_model_len;
  r.max_step_rows = c.scheduler.max_num_batched_tokens;
  r.prefix_caching = c.enable_prefix_caching;
  r.num_blocks = c.num_blocks;
  r.block_size = c.block_size;
  return r;
}

RunnerConfig RunnerConfigFor(const EngineConfig& c, CaptureStaging* staging) {
  RunnerConfig r;
  r.num_blocks = c.num_blocks;
  r.block_size = c.block_size;
  r.capture_layers = c.capture_layers;
  r.capture_staging = staging;
  r.max_model_len = c.max_model_len;
  r.graphs = c.graphs;
  r.graph_shapes_without_recording = c.graph_shapes_without_recording;
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
      capture_(CaptureConfigFor(model, config_)),
      runner_(model, RunnerConfigFor(config_, capture_.staging())),
      // A cached block holds the EAGLE-3 draft's KV too, made with the token after it.
      scheduler_(config_.scheduler, BlockManager(runner_.num_blocks(), config_.block_size,
                                                 config_.enable_prefix_caching, config_.eagle3.draft ? 1 : 0)),
      drafter_(MakeDrafter(config_.ngram, config_.eagle3.draft, config_.eagle3.num_speculative_tokens,
                           config_.mtp.drafter, config_.mtp.num_speculative_tokens,
                           {runner_, scheduler_, config_.block_size, config_.enable_prefix_caching, config_.max_model_len,
                            config_.eagle3.tree ? &*config_.eagle3.tree : nullptr,
                            config_.eagle3.dynamic_tree ? &*config_.eagle3.dynamic_tree : nullptr})) {
  if (drafter_ && config_.draft_length.adaptive) {
    // The policy prices a plan in the shape the runner will run it: a graph's padded rows,
    // packed past them, or eagerly.
    drafter_->EnableAdaptive(config_.draft_length.policy, config_.draft_length.cost_model,
                             [this](int seqs, int q, int rows) {
                               const ModelRunner::GraphShape g = runner_.ShapeFor(seqs, q, rows);
                               return g.bucket > 0 ? StepShape{g.rows, true} : StepShape{rows, false};
                             });
  }
  // Decode steps, verification steps of every draft count or of the whole token tree, then
  // the drafter's rounds.
  const auto start = Clock::now();
  const bool trees = config_.eagle3.tree || config_.eagle3.dynamic_tree;
  runner_.RecordGraphs(drafter_ && !trees ? 1 + drafter_->num_speculative_tokens() : 1,
                       trees ? 1 + drafter_->num_speculative_tokens() : 0);
  if (drafter_) {
    drafter_->StepGraphsRecorded(runner_.recorded_step_rows());  // their first replays are measurements
    drafter_->RecordRounds();
  }
  if (runner_.graphs_recorded() > 0) {
    std::fprintf(stderr, "hsx: recorded %ld step graphs and %ld draft rounds in %.1f s\n",
                 static_cast<long>(runner_.graphs_recorded()), static_cast<long>(drafter_ ? drafter_->rounds_recorded() : 0),
                 Seconds(start, Clock::now()));
  }
}

Engine::~Engine() {
  if (profile_) {
    std::fprintf(stderr, "hsx profile: engine waiting for capture copies %.2f s, capture store %.2f s, %lu steps\n",
                 capture_.wait_seconds(), capture_.store_seconds(), static_cast<unsigned long>(stats_.steps));
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
  if (!scheduler_.Fits(total)) {
    return Error(who + ": " + std::to_string(total) + " tokens do not fit the KV cache (" +
                 std::to_string(scheduler_.num_blocks() * config_.block_size) + " token slots)");
  }
  return {};
}

Status Engine::Add(Request request) {
  HSX_RETURN_IF_ERROR(Validate(request));
  auto seq = std::make_unique<Sequence>(std::move(request));
  capture_.Allocate(*seq);
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
    // A token tree's rows: the root (the last known token) and node i at position root +
    // depth, their KV at the slots of root + 1 + i until the accepted path's is moved.
    const std::vector<int32_t>& parents = seq->draft_parents;
    const bool tree = !seq->drafts.empty() && !parents.empty();
    const int root = seq->num_tokens() - 1;
    if (tree) slice.tree_base = root;
    for (int p = seq->num_computed; p < slice.ctx_len; ++p) {
      batch.token_ids.push_back(seq->token_at(p));
      batch.positions.push_back(tree && p > root ? root + NodeDepth(parents, p - root - 1) : p);
      batch.slot_mapping.push_back(static_cast<int32_t>(SlotOf(seq->block_table, p, bs)));
      if (tree) slice.tree_mask.push_back(p < root ? 0 : p == root ? 1 : AncestorMask(parents, p - root - 1) << 1 | 1);
    }
    if (SamplesAfter(*seq, n)) {  // the last known token's row, and each draft's
      for (int r = n - 1 - static_cast<int>(seq->drafts.size()); r < n; ++r) batch.logit_rows.push_back(slice.q_start + r);
    }
    batch.seqs.push_back(std::move(slice));
  }
  return batch;
}

void Engine::LandCapture(std::vector<std::unique_ptr<Sequence>>& finished) {
  HiddenStateCapture::Landed landed = capture_.Land();
  // Blocks whose rows are now all stored can be shared; then the finished let go of theirs.
  for (const auto& [seq, tokens] : landed.stored) Commit(*seq, tokens);
  for (auto& seq : landed.finishing) Retire(std::move(seq), finished);
}

void Engine::Commit(Sequence& seq, int tokens) {
  if (capture_.Shareable(seq)) scheduler_.Commit(seq, tokens);  // else its blocks lack rows
}

void Engine::Retire(std::unique_ptr<Sequence> seq, std::vector<std::unique_ptr<Sequence>>& finished) {
  scheduler_.Release(*seq);
  capture_.Trim(*seq);
  finished.push_back(std::move(seq));
}

bool Engine::Abort(const std::string& id) {
  std::unique_ptr<Sequence> seq = scheduler_.Remove(id);
  if (!seq) return false;
  seq->aborted = true;
  if (!capture_.Hold(seq)) {  // else the step in flight may still name it
    scheduler_.Release(*seq);
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
  if (!capture_.Hold(seq)) Retire(std::move(seq), aborted_);
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
  // Token trees: every request's drafts get parents (a chain's are its previous draft).
  const bool trees = std::any_of(chunks.begin(), chunks.end(), [](const ScheduledChunk& c) {
    return !c.seq->drafts.empty() && !c.seq->draft_parents.empty();
  });
  for (const auto& [seq, n] : chunks) {
    if (!SamplesAfter(*seq, n)) continue;
    sampling.push_back(seq);
    const auto& drafts = seq->drafts;
    batch.num_drafts.push_back(static_cast<int32_t>(drafts.size()));
    batch.drafts.insert(batch.drafts.end(), drafts.begin(), drafts.end());
    const std::vector<int32_t>& parents = seq->draft_parents;  // empty: a chain
    for (size_t i = 0; trees && i < drafts.size(); ++i) {
      batch.parents.push_back(parents.empty() ? static_cast<int32_t>(i) - 1 : parents[i]);
    }
    for (size_t j = 0; j <= drafts.size(); ++j) {
      // Row j: the token after the first j drafts, or in a tree after node j - 1's path.
      std::vector<int32_t> before(drafts.begin(), drafts.begin() + (parents.empty() ? j : 0));
      for (int i = static_cast<int>(j) - 1; !parents.empty() && i >= 0; i = parents[i]) {
        before.insert(before.begin(), drafts[i]);
      }
      const bool hold_stops = seq->turn_generated() + static_cast<int>(before.size()) < seq->request().min_new_tokens;
      batch.sampling.rows.push_back(
          MakeSamplingRowAfter(*seq, std::span<const int32_t>(before.data(), before.size()),
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
  if (turn.max_new_tokens < 0 || total > config_.max_model_len || !scheduler_.Fits(total)) {
    seq.error = Error(who + ": the next turn (" + std::to_string(turn.known.size()) + " known + " +
                      std::to_string(turn.max_new_tokens) + " new tokens) takes the conversation to " +
                      std::to_string(total) + " tokens, past max_model_len " + std::to_string(config_.max_model_len) +
                      " or the KV cache");
    return seq.Stop();
  }
  seq.BeginTurn(turn);
  capture_.Grow(seq, total);
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
                                            const VerifiedTokens& verified, std::vector<DraftOutcome>& outcomes,
                                            std::vector<std::vector<int32_t>>* tree_paths) {
  std::vector<int32_t> last_rows;
  std::vector<int32_t> move_from, move_to;  // token trees: KV slots of accepted nodes, and of their path
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
    const bool is_tree = !batch.parents.empty() && drafts > 0;
    std::vector<int32_t> path;
    if (is_tree) {
      // Node i's KV sits at root + 1 + i; the node at depth d belongs at root + d. Sources
      // lie at or after their destinations and all are read before any is written.
      const int root = seq.num_tokens() - 1, bs = config_.block_size;
      for (int d = 1; d <= accepted; ++d) {
        const int32_t node = verified.path[row + d - 1];
        path.push_back(node);
        if (node == d - 1) continue;
        move_from.push_back(static_cast<int32_t>(SlotOf(seq.block_table, root + 1 + node, bs)));
        move_to.push_back(static_cast<int32_t>(SlotOf(seq.block_table, root + d, bs)));
      }
    }
    if (tree_paths != nullptr) tree_paths->push_back(path);
    for (int j = 0; j <= accepted; ++j) {
      if (!AcceptToken(seq, verified.emitted, row + j, batch.sampling.max_logprobs)) break;
    }
    seq.num_computed = std::min(computed, seq.num_tokens());
    seq.KeepDrafts(0);
    last_rows.push_back(static_cast<int32_t>(is_tree ? row + (accepted > 0 ? 1 + path.back() : 0) : row + accepted));
    outcomes.push_back({&seq, drafts, accepted});
    row += drafts + 1;
  }
  runner_.cache().MoveSlots(runner_.backend(), move_from, move_to);
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
    last_round_end_.reset();  // idle: the next cycle's time would include the wait
    LandCapture(finished);
    return finished;
  }
  for (const auto& [seq, n] : chunks) capture_.AdoptCachedRows(*seq);
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
    // A decode step samples each sequence's next token: a drafter may queue work on them
    // before the host has them (EAGLE-3's KV-only pass).
    SampledAhead ahead;
    if (drafter_ && config_.capture_layers.empty() && decode_only && sampling.size() == chunks.size()) {
      ahead = [&](const Tensor& tokens) { drafter_->DecodeSampled(batch, tokens); };
    }
    result = runner_.Run(batch, rows, ahead);
  }
  if (result.captured) capture_.Track(chunks, std::move(result.captured));
  ++stats_.steps;
  stats_.tokens_computed += batch.token_ids.size();
  for (const auto& [seq, n] : chunks) seq->num_computed += n;
  const double run_seconds = Seconds(stage_start, Clock::now());
  end_stage(EngineStats::kRun);
  // Accept.
  std::vector<std::pair<Sequence*, int32_t>> sampled;
  std::vector<DraftOutcome> outcomes;
  std::vector<std::vector<int32_t>> tree_paths;  // per chunk, with token trees
  if (verifying) {
    std::vector<std::vector<int32_t>> paths;  // per sampling sequence
    const bool trees = !verification.parents.empty();
    const std::vector<int32_t> last_rows =
        AcceptVerified(sampling, verification, result.verified, outcomes, trees ? &paths : nullptr);
    for (size_t i = 0; i < sampling.size(); ++i) sampled.emplace_back(sampling[i], last_rows[i]);
    if (trees) {
      for (const auto& [seq, n] : chunks) {
        const auto it = std::find(sampling.begin(), sampling.end(), seq);
        tree_paths.push_back(it == sampling.end() ? std::vector<int32_t>() : paths[it - sampling.begin()]);
      }
    }
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
    // The step's cost to the policy: everything since the last draft round ended (the last
    // step's retire, this one's schedule, run and accept: host work grows with rows and
    // drafts as the forward does), or the run alone after an idle step.
    const double cycle_seconds = last_round_end_ ? Seconds(*last_round_end_, Clock::now()) : run_seconds;
    drafter_->Propose({batch, chunks, sampled, cycle_seconds, decode_only, result.computed_rows, result.graph,
                       result.recorded, !verification.parents.empty() ? &tree_paths : nullptr});
    last_round_end_ = Clock::now();
  }
  end_stage(EngineStats::kPropose);
  // Retire.
  const bool captured = capture_.tracking();
  for (const auto& [seq, n] : chunks) {
    if (!captured) Commit(*seq, seq->num_computed);  // no rows to wait for
    if (seq->num_computed >= seq->must_compute() && !seq->wants_more_tokens()) {
      // A finished sequence keeps its blocks until this step's captured rows are stored.
      std::unique_ptr<Sequence> done = scheduler_.Detach(seq);
      if (!captured || !capture_.Hold(done)) Retire(std::move(done), finished);
    }
  }
  LandCapture(finished);  // the previous step's, overlapping the forward just queued
  end_stage(EngineStats::kRetire);
  return finished;
}

}  // namespace hsx
