#include "engine/draft_runner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>
#include <utility>

namespace hsx {

DeviceDrafter::DeviceDrafter(int k, const DrafterContext& context, const ModelConfig* moe)
    : Drafter(k),
      runner_(context.runner),
      scheduler_(context.scheduler),
      block_size_(context.block_size),
      enable_prefix_caching_(context.enable_prefix_caching),
      moe_(moe) {}

namespace {

const ModelConfig* MoeOf(const MtpDrafter& drafter) {
  for (const LayerSpec& layer : drafter.config().text.layers) {
    if (layer.moe) return &drafter.config().text;
  }
  return nullptr;
}

}  // namespace

Eagle3Drafter::Eagle3Drafter(Eagle3Draft& draft, int k, const DrafterContext& context)
    : DeviceDrafter(k, context, nullptr),
      draft_(draft),
      tree_(context.tree),
      dynamic_tree_(context.dynamic_tree),
      cache_(draft.decoder(), context.runner.backend(), context.runner.num_blocks(), context.block_size) {}

// The draft's first pass covers every position of the step whose KV stays (a chunk's, up to
// the accepted drafts) and whose next token is known, each fed that token, so the draft's KV
// follows the target's (also for a sequence that just finished: its blocks may be cached); a
// sequence that decodes next also gets K - 1 more slots for the chained steps.
void Eagle3Drafter::ProposeDrafts(const DraftStep& step) {
  const bool kv_ahead = std::exchange(kv_stored_ahead_, false);
  // DecodeSampled queued this step's KV-only pass: with no drafts planned (the policy chose
  // K = 0 for every request) nothing is left to do, and the host's time here is the GPU's idle.
  if (kv_ahead && RoundLength() == 0) return;
  const int k = std::max(1, RoundLength());  // 1 when none drafts: the first pass alone
  const ForwardBatch& batch = step.batch;
  ForwardBatch first;
  std::vector<int32_t> step_rows;
  std::vector<DraftRequest> requests;
  std::vector<std::pair<Sequence*, int>> drafting;  // with its room
  std::vector<int> tree_nodes;  // token trees: each drafting request's nodes
  std::vector<int> tree_depths;  // dynamic trees: each drafting request's depths
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    Sequence* seq = step.chunks[i].seq;
    const SequenceSlice& ran = batch.seqs[i];
    // A verified tree: its root's row runs at position tree_base, the accepted node at
    // depth d came from row root + 1 + path[d - 1] and its KV now sits at tree_base + d.
    const bool tree_chunk = ran.tree_base >= 0 && step.tree_paths != nullptr && i < step.tree_paths->size();
    const int start = batch.positions[ran.q_start];
    const int end = std::min({seq->num_computed, seq->num_tokens() - 1, tree_chunk ? seq->num_computed : start + ran.q_len});
    if (end <= start || (!seq->wants_more_tokens() && !enable_prefix_caching_)) continue;
    int room = Room(*seq);
    // A tree's room is its depth (a path of room drafts at most is accepted).
    const int depth = dynamic_tree_ != nullptr ? std::min(dynamic_tree_->depth, room) : 0;
    const int nodes = tree_ != nullptr                 ? tree_->NodesUpToDepth(room)
                      : dynamic_tree_ != nullptr && depth > 0 ? std::min(num_speculative_tokens(), dynamic_tree_->candidates(depth))
                                                          : 0;
    // The chained steps write the draft's KV up to position num_computed + k - 2; a tree's
    // up to num_computed + nodes - 1, a dynamic tree's to its last expanded node's.
    const int64_t reach = tree_ != nullptr           ? seq->num_computed + nodes
                          : dynamic_tree_ != nullptr ? seq->num_computed + (depth - 1) * dynamic_tree_->topk
                                                     : seq->num_computed + k - 1;
    if (room > 0 && !scheduler_.ReserveLookahead(*seq, reach)) room = 0;  // no KV room: plain decode
    SequenceSlice slice;
    slice.q_start = static_cast<int32_t>(first.token_ids.size());
    slice.q_len = end - start;
    slice.ctx_len = end;
    slice.block_table = seq->block_table;
    for (int p = start; p < end; ++p) {
      first.token_ids.push_back(seq->tokens()[p + 1]);
      first.positions.push_back(p);
      if (tree_chunk && p > ran.tree_base) {
        const int32_t node = (*step.tree_paths)[i][p - ran.tree_base - 1];
        first.slot_mapping.push_back(static_cast<int32_t>(SlotOf(seq->block_table, p, block_size_)));
        step_rows.push_back(ran.q_start + (ran.tree_base - start) + 1 + node);
      } else {
        first.slot_mapping.push_back(batch.slot_mapping[ran.q_start + p - start]);
        step_rows.push_back(ran.q_start + p - start);
      }
    }
    if (room > 0) {
      first.logit_rows.push_back(slice.q_start + slice.q_len - 1);
      requests.push_back({seq->num_computed, seq->block_table});
      drafting.emplace_back(seq, room);
      tree_nodes.push_back(nodes);
      tree_depths.push_back(depth);
    }
    first.seqs.push_back(std::move(slice));
  }
  if (kv_ahead && requests.empty()) return;  // none could draft after all (no room)
  // Its staging's pinned memory is the round's too: the copies it queued must have run.
  if (kv_ahead) backend().Synchronize();
  const auto start = std::chrono::steady_clock::now();
  round_recorded_ = false;
  if (tree_ != nullptr) {
    const auto drafts = TreeRound(first, step_rows, requests, tree_nodes);
    for (size_t i = 0; i < drafting.size(); ++i) {
      drafting[i].first->drafts = drafts[i];
      drafting[i].first->draft_parents.assign(tree_->parent.begin(), tree_->parent.begin() + tree_nodes[i]);
    }
    return;
  }
  if (dynamic_tree_ != nullptr) {
    std::vector<DraftTree> trees = DynamicTreeRound(first, step_rows, requests, tree_depths, tree_nodes);
    for (size_t i = 0; i < drafting.size(); ++i) {
      drafting[i].first->drafts = std::move(trees[i].tokens);
      drafting[i].first->draft_parents = std::move(trees[i].parents);
    }
    return;
  }
  const auto drafts = Round(first, step_rows, requests, k);
  if (!requests.empty()) {
    ObserveRound(static_cast<int>(requests.size()), k,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), round_recorded_);
  }
  for (size_t i = 0; i < drafting.size(); ++i) {
    auto& [seq, room] = drafting[i];
    seq->drafts.assign(drafts[i].begin(), drafts[i].begin() + std::min<size_t>(room, drafts[i].size()));
  }
}

MtpAssistantDrafter::MtpAssistantDrafter(MtpDrafter& drafter, int k, const DrafterContext& context)
    : DeviceDrafter(k, context, MoeOf(drafter)), drafter_(drafter) {}

// The drafter's round for each sequence that decodes next: its queries sit at p, the last
// position with KV (whose final-normed hidden starts the round), over the target's KV 0..p.
void MtpAssistantDrafter::ProposeDrafts(const DraftStep& step) {
  const int k = RoundLength();
  MtpDraftBatch batch;
  std::vector<int32_t> hidden_rows;
  std::vector<std::pair<Sequence*, int>> drafting;  // with its room
  for (const auto& [seq, row] : step.sampled) {
    const int room = Room(*seq);
    if (room == 0) continue;
    SequenceSlice slice;
    slice.q_start = static_cast<int32_t>(batch.tokens.size());
    slice.q_len = 1;
    slice.ctx_len = seq->num_computed;  // p + 1
    slice.block_table = seq->block_table;
    batch.tokens.push_back(seq->tokens().back());
    batch.seqs.push_back(std::move(slice));
    hidden_rows.push_back(row);
    drafting.emplace_back(seq, room);
  }
  const auto start = std::chrono::steady_clock::now();
  round_recorded_ = false;
  const auto drafts = Round(batch, hidden_rows, k);
  if (!drafting.empty()) {
    ObserveRound(static_cast<int>(drafting.size()), k,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), round_recorded_);
  }
  for (size_t i = 0; i < drafting.size(); ++i) {
    auto& [seq, room] = drafting[i];
    seq->drafts.assign(drafts[i].begin(), drafts[i].begin() + room);
  }
}

std::vector<std::vector<int32_t>> MtpAssistantDrafter::Round(const MtpDraftBatch& batch,
                                                             const std::vector<int32_t>& hidden_rows, int num_drafts) {
  Backend& backend = this->backend();
  const Tensor& final_hidden = runner_.step_final_hidden();
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
  const DeviceBatch in = bucket > 0 ? runner_.StageGraphInputs(round, bucket, 1, draft_inputs_[1]) : UploadBatch(backend, round);
  const int64_t width = final_hidden.size(1);
  Tensor tokens = bucket > 0 ? DraftTokens() : backend.Empty(DType::kI32, {int64_t{num_drafts} * n});
  const Tensor hidden = bucket > 0 ? DraftHidden(width).Rows(0, bucket) : backend.Empty(final_hidden.dtype(), {n, width});
  Tensor first_hidden = hidden.Rows(0, n);
  backend.GatherRows(final_hidden, hidden_rows, first_hidden);
  auto steps = [&] { RunSteps(in, hidden, tokens, rows, num_drafts); };
  if (bucket > 0) {
    DraftRound({bucket, 0, num_drafts}, steps);
  } else {
    steps();
  }
  return DownloadDrafts(tokens, rows, n, num_drafts);
}

// Step s reads draft s - 1 (step 0 the emitted token) and the hidden the step before left.
void MtpAssistantDrafter::RunSteps(const DeviceBatch& in, const Tensor& hidden, const Tensor& tokens, int rows,
                                   int num_drafts) {
  Tensor h = hidden;
  for (int s = 0; s < num_drafts; ++s) {
    const Tensor ids = s == 0 ? in.token_ids : tokens.Rows(int64_t{s - 1} * rows, int64_t{s} * rows);
    MtpDraftOutput out = drafter_.Step(ids, in.positions, in.attention, h, runner_.cache());
    Tensor next = tokens.Rows(int64_t{s} * rows, int64_t{s + 1} * rows);
    backend().GreedyTokens(out.logits, nullptr, next);
    h = std::move(out.hidden);
  }
}

void MtpAssistantDrafter::RecordPaddingRounds(int bucket, int drafts) {
  if (drafts == 0) return;  // no KV-only pass: the assistant keeps no KV
  const DeviceBatch in = runner_.StageGraphInputs(ForwardBatch(), bucket, 1, draft_inputs_[1]);
  const Tensor hidden = DraftHidden(drafter_.config().backbone_hidden_size).Rows(0, bucket);  // the target's width
  const Tensor tokens = DraftTokens();
  DraftRound({bucket, 0, drafts}, [&] { RunSteps(in, hidden, tokens, bucket, drafts); });
  backend().Synchronize();  // the next round stages its inputs through the same pinned memory
}

std::vector<std::vector<int32_t>> Eagle3Drafter::Round(const ForwardBatch& first_pass,
                                                       const std::vector<int32_t>& step_rows,
                                                       const std::vector<DraftRequest>& requests, int num_drafts) {
  Eagle3Draft& draft = draft_;
  Backend& backend = this->backend();
  if (first_pass.token_ids.empty()) return std::vector<std::vector<int32_t>>(requests.size());
  const int n = static_cast<int>(requests.size());
  if (n == 0) {
    KeepKV(first_pass, step_rows);
    return {};
  }
  // The first pass on a graph of all its sequences (those that draft nothing ride along:
  // their drafts are dropped, their chained rows pad), where it fits one; else eagerly, and
  // the chained steps alone on a graph of the requests.
  std::vector<int> seq_of_request;
  const FirstPassShape shape = PaddedFirstPass(first_pass, seq_of_request);
  const int q = shape.q;
  std::vector<const DraftRequest*> chain_rows;  // the chained steps' rows: a request, or null (padding)
  int bucket = shape.bucket;
  if (q > 0) {
    chain_rows.assign(first_pass.seqs.size(), nullptr);
    for (int r = 0; r < n; ++r) chain_rows[seq_of_request[r]] = &requests[r];
  } else {
    size_t longest_table = 0;
    for (const DraftRequest& r : requests) {
      longest_table = std::max(longest_table, r.block_table.size());
      chain_rows.push_back(&r);
    }
    // The first pass alone, eagerly, has nothing to record.
    bucket = num_drafts > 1 ? DraftGraphBucket(n, longest_table) : 0;
  }
  const int rows = bucket > 0 ? bucket : n;
  // Drafts stay on the device, step after step ([num_drafts, rows]); one download at the end.
  Tensor tokens = bucket > 0 ? DraftTokens() : backend.Empty(DType::kI32, {int64_t{num_drafts} * n});
  DeviceBatch padded;  // the first pass on the graph (q > 0), and its aux states
  Tensor padded_aux;
  Tensor hidden;  // otherwise: the hidden rows the chained steps start from
  if (q > 0) {
    padded = StagePaddedFirstPass(first_pass, step_rows, shape, padded_aux);
  } else {
    ++eager_first_passes_;
    const Eagle3Output out = draft.Forward(first_pass, FirstPassInput(step_rows), cache_);
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
      num_drafts > 1 ? StageChainedSteps(chain_rows, rows, num_drafts - 1, tokens, bucket > 0) : std::vector<DeviceBatch>();
  auto round = [&] { RunRound(q > 0 ? &padded : nullptr, padded_aux, hidden, steps, tokens, rows, num_drafts); };
  if (bucket > 0) {
    DraftRound({bucket, q, num_drafts}, round);
  } else {
    round();
  }
  std::vector<std::vector<int32_t>> drafts =
      DownloadDrafts(tokens, rows, static_cast<int>(chain_rows.size()), num_drafts);
  if (q == 0) return drafts;
  std::vector<std::vector<int32_t>> of_requests(n);
  for (int r = 0; r < n; ++r) of_requests[r] = std::move(drafts[seq_of_request[r]]);
  return of_requests;
}

// [The first pass, then] step s: each request's draft s - 1 at the position after, fed the
// hidden it left.
void Eagle3Drafter::RunRound(const DeviceBatch* padded, const Tensor& padded_aux, const Tensor& hidden,
                             const std::vector<DeviceBatch>& steps, const Tensor& tokens, int rows, int num_drafts) {
  Eagle3Draft& draft = draft_;
  Tensor in = hidden;
  if (padded != nullptr) {
    Eagle3Output out = draft.Forward(*padded, draft.CombineHiddenStates(padded_aux), cache_);
    Tensor first = tokens.Rows(0, rows);
    draft.GreedyTargetTokens(out.logits, first);
    in = std::move(out.next_hidden);
  }
  for (int s = 1; s < num_drafts; ++s) {
    Eagle3Output step = draft.Forward(steps[s - 1], in, cache_);
    Tensor next = tokens.Rows(int64_t{s} * rows, int64_t{s + 1} * rows);
    draft.GreedyTargetTokens(step.logits, next);
    in = std::move(step.next_hidden);
  }
}

// Every first-pass width q = 1..K + 1 (a verification step's rows), as a KV-only pass
// (drafts 0) or a drafting round; and the chained steps alone (q = 0: after a prefill,
// whose first pass runs eagerly).
void Eagle3Drafter::RecordPaddingRounds(int bucket, int drafts) {
  if (dynamic_tree_ != nullptr) {
    // Dynamic trees: a round after a first pass of q = 1 to depth + 1 rows, and the depths
    // alone (q = 0: after a prefill, whose first pass and expansion run eagerly).
    if (drafts != num_speculative_tokens()) return;
    const int k = dynamic_tree_->topk, depth = dynamic_tree_->depth;
    const std::vector<int> request_at(bucket, -1);
    DraftTreeState state = TreeState(bucket);
    const Tensor limits = TreeLimits(request_at, {}, {});
    std::vector<DeviceBatch> inputs;
    for (int d = 1; d < depth; ++d) {
      inputs.push_back(
          runner_.StageGraphInputs(DynamicDepthBatch(d, {}, {}, request_at, true), bucket, k, tree_inputs_[d - 1], true));
    }
    const int widest = std::min({depth + 1, num_speculative_tokens() + 1, ModelRunner::kMaxGraphRowsPerSeq});
    for (int q = 0; q <= widest; ++q) {
      Tensor aux;
      const DeviceBatch padded = q > 0 ? StagePaddedFirstPass(ForwardBatch(), {}, {bucket, q}, aux) : DeviceBatch();
      if (q == 0) {  // depth 1's parents' rows, which a real round's eager expansion writes first
        Tensor first_rows = TreeRows(0, int64_t{bucket} * k);
        backend().UploadTo(Tensor::Host(DType::kI32, {int64_t{bucket} * k}), first_rows);
      }
      DynamicGraphRound(bucket, q, state, inputs, q > 0 ? &padded : nullptr, aux, limits, TreeOut().Rows(0, bucket));
      backend().Synchronize();  // the next round stages its inputs through the same pinned memory
    }
    return;
  }
  if (tree_ != nullptr) {
    // A tree's rounds: the whole tree (it is not adaptive) after a first pass of q = 1 to
    // its depth + 1 rows, and its depths alone (q = 0: after a prefill).
    if (drafts != tree_->size()) return;
    const TreePlan plan = PlanTree({}, {}, std::vector<int>(bucket, -1));
    for (int q = 0; q <= std::min(tree_->max_depth + 1, ModelRunner::kMaxGraphRowsPerSeq); ++q) {
      Tensor aux;
      const DeviceBatch padded = q > 0 ? StagePaddedFirstPass(ForwardBatch(), {}, {bucket, q}, aux) : DeviceBatch();
      TreeGraphRound(bucket, q, plan, q > 0 ? &padded : nullptr, aux);
      backend().Synchronize();  // the next round stages its inputs through the same pinned memory
    }
    return;
  }
  Eagle3Draft& draft = draft_;
  if (drafts > 1) {
    const Tensor tokens = DraftTokens(), hidden = DraftHidden(draft.decoder().hidden_size).Rows(0, bucket);
    const std::vector<DeviceBatch> steps = StageChainedSteps({}, bucket, drafts - 1, tokens, true);
    DraftRound({bucket, 0, drafts}, [&] { RunRound(nullptr, Tensor(), hidden, steps, tokens, bucket, drafts); });
    backend().Synchronize();
  }
  for (int q = 1; q <= std::min(num_speculative_tokens() + 1, ModelRunner::kMaxGraphRowsPerSeq); ++q) {
    Tensor aux;
    const DeviceBatch padded = StagePaddedFirstPass(ForwardBatch(), {}, {bucket, q}, aux);
    if (drafts == 0) {
      DraftRound({bucket, q, 0}, [&] { draft.StoreKV(padded, draft.CombineHiddenStates(aux), cache_); });
    } else {
      const Tensor tokens = DraftTokens();
      const std::vector<DeviceBatch> steps = drafts > 1 ? StageChainedSteps({}, bucket, drafts - 1, tokens, true)
                                                        : std::vector<DeviceBatch>();
      DraftRound({bucket, q, drafts}, [&] { RunRound(&padded, aux, Tensor(), steps, tokens, bucket, drafts); });
    }
    backend().Synchronize();  // the next stages its inputs through the same pinned memory
  }
}

// A token tree's round. Node i's token is the rank[i]-th best of its parent's row (the
// first pass's for the root's children); a depth's nodes that have children run as one
// batch, fed their tokens and their parents' hidden rows. Which row each node takes
// depends only on the tree and each request's node count, so every depth's batch is
// built first (PlanTree), and the tokens stay on the device (gathered from the top-token
// rows of the depth before) until one download at the end. Where every request takes the
// whole tree, the round runs on a graph (TreeGraphRound): its first pass padded as a
// chain's (every sequence of the step a slot; else eagerly, and the depths on a graph of
// the requests' bucket).
std::vector<std::vector<int32_t>> Eagle3Drafter::TreeRound(const ForwardBatch& first_pass,
                                                           const std::vector<int32_t>& step_rows,
                                                           const std::vector<DraftRequest>& requests,
                                                           const std::vector<int>& nodes) {
  Backend& backend = this->backend();
  const int n = static_cast<int>(requests.size());
  if (first_pass.token_ids.empty()) return std::vector<std::vector<int32_t>>(n);
  if (n == 0) {
    KeepKV(first_pass, step_rows);
    return {};
  }
  const TokenTree& tree = *tree_;
  size_t longest_table = 0;
  for (const DraftRequest& r : requests) longest_table = std::max(longest_table, r.block_table.size());
  const bool whole = std::all_of(nodes.begin(), nodes.end(), [&](int k) { return k == tree.size(); });
  std::vector<int> slot_of;  // each request's slot: its sequence in the padded first pass, or itself
  // A first pass after a verification has at most depth + 1 rows a sequence (the graphs
  // recorded at start-up); a longer one (a short prompt's) runs eagerly.
  FirstPassShape shape = whole ? PaddedFirstPass(first_pass, slot_of) : FirstPassShape{};
  if (shape.q > tree.max_depth + 1) shape = {};
  const int bucket = shape.q > 0 ? shape.bucket : whole ? DraftGraphBucket(n, longest_table) : 0;
  if (shape.q == 0) {
    slot_of.resize(n);
    std::iota(slot_of.begin(), slot_of.end(), 0);
  }
  std::vector<int> request_at(bucket > 0 ? bucket : n, -1);
  for (int r = 0; r < n; ++r) request_at[slot_of[r]] = r;
  const TreePlan plan = PlanTree(requests, nodes, request_at);
  Tensor top = bucket > 0 ? TreeTopTokens(plan.width).Rows(0, plan.rows * plan.width)
                          : backend.Empty(DType::kI32, {plan.rows * plan.width});
  DeviceBatch padded;  // the first pass on the graph, and its aux states
  Tensor padded_aux;
  if (shape.q > 0) {
    padded = StagePaddedFirstPass(first_pass, step_rows, shape, padded_aux);
    TreeGraphRound(bucket, shape.q, plan, &padded, padded_aux);
  } else {
    ++eager_first_passes_;
    Eagle3Output out = draft_.Forward(first_pass, FirstPassInput(step_rows), cache_);
    KeepTopTokens(out.logits, top, 0, plan.width);
    if (bucket > 0) {
      Tensor requests_hidden = DraftHidden(draft_.decoder().hidden_size).Rows(0, n);
      backend.Copy(out.next_hidden, requests_hidden);
      TreeGraphRound(bucket, 0, plan, nullptr, Tensor());
    } else {
      Tensor hidden = out.next_hidden;  // the rows the next depth's parents left
      for (const TreePlan::Depth& depth : plan.depths) {
        hidden = TreeDepth(depth, UploadBatch(backend, depth.batch), DepthIndices(depth), hidden, top, plan.width);
      }
    }
  }
  std::vector<int32_t> wanted;  // every request's nodes in order
  for (int r = 0; r < n; ++r) {
    const std::vector<int32_t>& of_slot = plan.source[slot_of[r]];
    wanted.insert(wanted.end(), of_slot.begin(), of_slot.begin() + nodes[r]);
  }
  std::vector<std::vector<int32_t>> tokens(n);
  if (wanted.empty()) return tokens;
  Tensor drafts = backend.Empty(DType::kI32, {static_cast<int64_t>(wanted.size()), 1});
  backend.GatherRows(top.View({plan.rows * plan.width, 1}), wanted, drafts);
  const Tensor host = backend.Download(drafts);
  const int32_t* at = host.data<int32_t>();
  for (int r = 0; r < n; ++r) {
    tokens[r].assign(at, at + nodes[r]);
    at += nodes[r];
  }
  return tokens;
}

// EAGLE-2's round. Each depth's rows have a fixed shape (k a slot), so the host builds
// every depth's batch before the first forward; the rows' tokens, their parents' hidden
// rows and their masks are what the depth before chose, which the device writes
// (ExpandDraftTrees) into the next depth's inputs. On a graph (every depth's inputs fixed:
// the slots of the step's sequences, or of the requests' bucket after an eager first pass)
// the round replays whole; else it runs eagerly and each depth's tokens and masks come
// home for its batch (one download a depth). One download of the trees at the end.
std::vector<DraftTree> Eagle3Drafter::DynamicTreeRound(const ForwardBatch& first_pass,
                                                       const std::vector<int32_t>& step_rows,
                                                       const std::vector<DraftRequest>& requests,
                                                       const std::vector<int>& depths, const std::vector<int>& budgets) {
  Backend& backend = this->backend();
  const int n = static_cast<int>(requests.size()), k = dynamic_tree_->topk, depth = dynamic_tree_->depth;
  if (first_pass.token_ids.empty()) return std::vector<DraftTree>(n);
  if (n == 0) {
    KeepKV(first_pass, step_rows);
    return {};
  }
  size_t longest_table = 0;
  for (const DraftRequest& r : requests) longest_table = std::max(longest_table, r.block_table.size());
  std::vector<int> slot_of;  // each request's slot: its sequence in the padded first pass, or itself
  FirstPassShape shape = PaddedFirstPass(first_pass, slot_of);
  if (shape.q > depth + 1) shape = {};  // a short prompt's: the graphs recorded stop at depth + 1
  const int bucket = shape.q > 0 ? shape.bucket : DraftGraphBucket(n, longest_table);
  if (shape.q == 0) {
    slot_of.resize(n);
    std::iota(slot_of.begin(), slot_of.end(), 0);
  }
  const int slots = bucket > 0 ? bucket : n;
  std::vector<int> request_at(slots, -1);
  for (int r = 0; r < n; ++r) request_at[slot_of[r]] = r;
  DraftTreeState state = TreeState(slots);
  const Tensor limits = TreeLimits(request_at, depths, budgets);
  std::vector<ForwardBatch> batches;  // depth d's at d - 1
  for (int d = 1; d < depth; ++d) batches.push_back(DynamicDepthBatch(d, requests, depths, request_at, bucket > 0));
  const Tensor out = TreeOut().Rows(0, slots);
  if (bucket > 0) {
    // Every depth's inputs are staged first: the expansions write into them after the upload.
    std::vector<DeviceBatch> inputs;
    for (int d = 1; d < depth; ++d) {
      inputs.push_back(runner_.StageGraphInputs(batches[d - 1], bucket, k, tree_inputs_[d - 1], true));
    }
    DeviceBatch padded;
    Tensor padded_aux;
    if (shape.q > 0) {
      padded = StagePaddedFirstPass(first_pass, step_rows, shape, padded_aux);
    } else {
      ++eager_first_passes_;
      const Eagle3Output first = draft_.Forward(first_pass, FirstPassInput(step_rows), cache_);
      Tensor requests_hidden = DraftHidden(draft_.decoder().hidden_size).Rows(0, n);
      backend.Copy(first.next_hidden, requests_hidden);
      // The bucket's rows past the requests expand no token (-1).
      Tensor ids = backend.Empty(DType::kI32, {bucket, k}), logprobs = backend.Empty(DType::kF32, {bucket, k});
      Tensor request_ids = ids.Rows(0, n), request_logprobs = logprobs.Rows(0, n);
      draft_.TopTargetTokens(first.logits, request_ids, request_logprobs);
      if (bucket > n) {
        Tensor minus_one = Tensor::Host(DType::kI32, {int64_t{bucket - n} * k});
        std::fill_n(minus_one.data<int32_t>(), minus_one.numel(), -1);
        Tensor rest = ids.Rows(n, bucket);
        backend.UploadTo(minus_one.View({bucket - n, k}), rest);
      }
      Expand(ids, logprobs, 1, state, depth > 1 ? &inputs[0] : nullptr, 0);
    }
    DynamicGraphRound(bucket, shape.q, state, inputs, shape.q > 0 ? &padded : nullptr, padded_aux, limits, out);
  } else {
    ++eager_first_passes_;
    const Eagle3Output first = draft_.Forward(first_pass, FirstPassInput(step_rows), cache_);
    Tensor hidden = first.next_hidden;
    Tensor ids = backend.Empty(DType::kI32, {n, k}), logprobs = backend.Empty(DType::kF32, {n, k});
    draft_.TopTargetTokens(first.logits, ids, logprobs);
    // Each depth's inputs from the depth before: token ids [S k], rows [S k], masks [S 2k].
    Tensor next = backend.Empty(DType::kI32, {4 * int64_t{n} * k});
    for (int d = 1; d <= depth; ++d) {
      const bool more = d < depth;
      Tensor next_ids = next.Rows(0, n * k), next_rows = next.Rows(n * k, 2 * n * k), next_masks = next.Rows(2 * n * k, 4 * n * k);
      backend.ExpandDraftTrees(ids, logprobs, d, state, more ? &next_ids : nullptr, more ? &next_rows : nullptr,
                               more ? &next_masks : nullptr);
      if (!more) break;
      ForwardBatch& batch = batches[d - 1];
      const Tensor host = backend.Download(next);
      const int32_t* words = host.data<int32_t>();
      const auto* masks = reinterpret_cast<const uint64_t*>(words + 2 * n * k);
      for (SequenceSlice& slice : batch.seqs) {
        for (int j = 0; j < slice.q_len; ++j) {
          batch.token_ids[slice.q_start + j] = words[slice.q_start + j];
          if (slice.tree_base >= 0) slice.tree_mask[j] = masks[slice.q_start + j];
        }
      }
      Tensor parents = backend.Empty(hidden.dtype(), {int64_t{n} * k, hidden.size(1)});
      backend.GatherRowsAt(hidden, next_rows, parents);
      Eagle3Output step = draft_.Forward(batch, parents, cache_);
      ids = backend.Empty(DType::kI32, {int64_t{n} * k, k});
      logprobs = backend.Empty(DType::kF32, {int64_t{n} * k, k});
      draft_.TopTargetTokens(step.logits, ids, logprobs);
      hidden = std::move(step.next_hidden);
    }
    Tensor trees = out;
    backend.SelectDraftTrees(state, limits, trees);
  }
  const Tensor host = backend.Download(out);
  const int32_t* words = host.data<int32_t>();
  const int most = num_speculative_tokens();
  std::vector<DraftTree> trees(n);
  for (int r = 0; r < n; ++r) {
    const int32_t* row = words + int64_t{slot_of[r]} * 2 * most;
    for (int i = 0; i < most && row[i] >= 0; ++i) {
      trees[r].tokens.push_back(row[i]);
      trees[r].parents.push_back(row[most + i]);
    }
  }
  return trees;
}

// The round on the graph of (bucket, q, K): the padded first pass (q > 0; else its
// expansion already wrote depth 1's inputs, from the hidden rows in DraftHidden()), each
// depth's forward and expansion into the next's inputs, and the trees into `out`.
void Eagle3Drafter::DynamicGraphRound(int bucket, int q, DraftTreeState& state, const std::vector<DeviceBatch>& inputs,
                                      const DeviceBatch* padded, const Tensor& padded_aux, const Tensor& limits,
                                      const Tensor& out) {
  Backend& backend = this->backend();
  const int k = dynamic_tree_->topk, depth = dynamic_tree_->depth;
  const Tensor hidden = DraftHidden(draft_.decoder().hidden_size).Rows(0, bucket);
  DraftRound({bucket, q, num_speculative_tokens()}, [&] {
    Tensor parents_of = hidden;
    if (padded != nullptr) {
      Eagle3Output first = draft_.Forward(*padded, draft_.CombineHiddenStates(padded_aux), cache_);
      Tensor ids = backend.Empty(DType::kI32, {bucket, k}), logprobs = backend.Empty(DType::kF32, {bucket, k});
      draft_.TopTargetTokens(first.logits, ids, logprobs);
      Expand(ids, logprobs, 1, state, depth > 1 ? &inputs[0] : nullptr, 0);
      parents_of = std::move(first.next_hidden);
    }
    for (int d = 1; d < depth; ++d) {
      const int64_t n = int64_t{bucket} * k;
      Tensor parents = backend.Empty(parents_of.dtype(), {n, parents_of.size(1)});
      backend.GatherRowsAt(parents_of, TreeRows(d - 1, n), parents);
      Eagle3Output step = draft_.Forward(inputs[d - 1], parents, cache_);
      Tensor ids = backend.Empty(DType::kI32, {n, k}), logprobs = backend.Empty(DType::kF32, {n, k});
      draft_.TopTargetTokens(step.logits, ids, logprobs);
      Expand(ids, logprobs, d + 1, state, d + 1 < depth ? &inputs[d] : nullptr, d);
      parents_of = std::move(step.next_hidden);
    }
    Tensor trees = out;
    backend.SelectDraftTrees(state, limits, trees);
  });
}

// Expansion into depth d; next: depth d's fixed inputs (their token ids and mask words), its
// parents' rows into TreeRows(part).
void Eagle3Drafter::Expand(const Tensor& ids, const Tensor& logprobs, int d, DraftTreeState& state,
                           const DeviceBatch* next, int part) {
  if (next == nullptr) {
    backend().ExpandDraftTrees(ids, logprobs, d, state, nullptr, nullptr, nullptr);
    return;
  }
  const int64_t n = next->token_ids.numel(), offset = next->attention.tree_mask_offset;
  Tensor next_ids = next->token_ids, next_rows = TreeRows(part, n);
  Tensor next_masks = next->attention.tree.Rows(offset, offset + 2 * n);
  backend().ExpandDraftTrees(ids, logprobs, d, state, &next_ids, &next_rows, &next_masks);
}

// Depth d's rows, k a slot: a request's (while d < its depth) at position + d - 1, KV at
// the scratch slots position + (d - 1) k + j, tree rows (their tokens and masks written
// later); other slots padding (positions 0..k-1, no KV, block 0). On a graph the slots
// after the last request are left to the staging's padding.
ForwardBatch Eagle3Drafter::DynamicDepthBatch(int d, const std::vector<DraftRequest>& requests,
                                              const std::vector<int>& depths, const std::vector<int>& request_at,
                                              bool graph) const {
  const int k = dynamic_tree_->topk;
  int end = static_cast<int>(request_at.size());
  while (graph && end > 0 && request_at[end - 1] < 0) --end;
  ForwardBatch batch;
  for (int s = 0; s < end; ++s) {
    const int r = request_at[s];
    const bool rows = r >= 0 && d < depths[r];
    SequenceSlice slice;
    slice.q_start = static_cast<int32_t>(batch.token_ids.size());
    slice.q_len = k;
    const int32_t position = rows ? requests[r].position : 0, scratch = (d - 1) * k;
    slice.ctx_len = rows ? position + scratch + k : k;
    // Padding: block 0 for each of its k positions' blocks.
    slice.block_table = rows ? requests[r].block_table : std::vector<int32_t>((k + block_size_ - 1) / block_size_, 0);
    if (rows) slice.tree_base = position;
    for (int j = 0; j < k; ++j) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(rows ? position + d - 1 : j);
      batch.slot_mapping.push_back(rows ? static_cast<int32_t>(SlotOf(requests[r].block_table, position + scratch + j, block_size_)) : -1);
      batch.logit_rows.push_back(static_cast<int32_t>(batch.logit_rows.size()));
      if (rows) slice.tree_mask.push_back(0);
    }
    batch.seqs.push_back(std::move(slice));
  }
  return batch;
}

// The round's trees: each slot's (places of its depths, budget) staged into a fixed
// tensor (padding slots: no places).
Tensor Eagle3Drafter::TreeLimits(const std::vector<int>& request_at, const std::vector<int>& depths,
                                 const std::vector<int>& budgets) {
  const int64_t slots = static_cast<int64_t>(request_at.size());
  if (!tree_limits_.device.defined()) {
    tree_limits_.device = backend().Upload(Tensor::Host(DType::kI32, {2 * int64_t{runner_.max_graph_batch()}}));
    tree_limits_.staging = backend().HostBuffer(DType::kI32, {2 * int64_t{runner_.max_graph_batch()}});
  }
  int32_t* at = tree_limits_.staging.data<int32_t>();
  for (int64_t s = 0; s < slots; ++s) {
    const int r = request_at[s];
    at[2 * s] = r >= 0 ? dynamic_tree_->candidates(depths[r]) : 0;
    at[2 * s + 1] = r >= 0 ? budgets[r] : 0;
  }
  Tensor device = tree_limits_.device.Rows(0, 2 * slots);
  backend().UploadTo(tree_limits_.staging.Rows(0, 2 * slots), device);
  return device.View({slots, 2});
}

// Fixed for the largest bucket (graphs keep their addresses); zeros: a round recorded at
// start-up runs over them.
DraftTreeState Eagle3Drafter::TreeState(int slots) {
  const int64_t most = runner_.max_graph_batch(), k = dynamic_tree_->topk,
                places = dynamic_tree_->candidates(dynamic_tree_->depth);
  if (!tree_state_.tokens.defined()) {
    auto zeros = [&](DType dtype, int64_t width) { return backend().Upload(Tensor::Host(dtype, {most, width})); };
    tree_state_ = {dynamic_tree_->topk, zeros(DType::kI32, places), zeros(DType::kF32, places),
                   zeros(DType::kI32, places), zeros(DType::kI32, k), zeros(DType::kI32, 2 * k)};
  }
  const DraftTreeState& all = tree_state_;
  return {all.topk, all.tokens.Rows(0, slots), all.scores.Rows(0, slots), all.parents.Rows(0, slots),
          all.frontier.Rows(0, slots), all.masks.Rows(0, slots)};
}

Tensor Eagle3Drafter::TreeOut() {
  if (!tree_out_.defined()) {
    tree_out_ = backend().Upload(Tensor::Host(DType::kI32, {runner_.max_graph_batch(), 2 * num_speculative_tokens()}));
  }
  return tree_out_;
}

// Depth d's parents' rows (part d - 1, its first `rows`): each part at a fixed place for
// every bucket, so a part holds rows of a smaller bucket's rounds at most (zeros at first),
// which a round recorded at start-up over padding may read.
Tensor Eagle3Drafter::TreeRows(int part, int64_t rows) {
  const int64_t most = int64_t{runner_.max_graph_batch()} * dynamic_tree_->topk;
  if (!tree_rows_.defined()) {
    tree_rows_ = backend().Upload(Tensor::Host(DType::kI32, {std::max(1, dynamic_tree_->depth - 1) * most}));
  }
  return tree_rows_.Rows(part * most, part * most + rows);
}

// Slots without a request (request_at -1) take the whole tree: on a graph they are padding
// (no KV); those before the last request's slot are staged as padding rows, the rest the
// graph's staging pads.
Eagle3Drafter::TreePlan Eagle3Drafter::PlanTree(const std::vector<DraftRequest>& requests, const std::vector<int>& nodes,
                                               const std::vector<int>& request_at) const {
  const TokenTree& tree = *tree_;
  const int slots = static_cast<int>(request_at.size());
  int last_slot = -1;
  for (int r = 0; r < slots; ++r) {
    if (request_at[r] >= 0) last_slot = r;
  }
  auto nodes_of = [&](int slot) { return request_at[slot] >= 0 ? nodes[request_at[slot]] : tree.size(); };
  std::vector<std::vector<int32_t>> kids(tree.size() + 1);  // kids[0]: the root's, kids[1 + i]: node i's
  for (int i = 0; i < tree.size(); ++i) kids[tree.parent[i] + 1].push_back(i);
  TreePlan plan;
  plan.width = 1 + *std::max_element(tree.rank.begin(), tree.rank.end());
  plan.source.assign(slots, std::vector<int32_t>(tree.size(), -1));
  auto take_children = [&](int r, int parent, int64_t parent_row) {
    for (int32_t c : kids[parent + 1]) {
      if (c < nodes_of(r)) plan.source[r][c] = static_cast<int32_t>(parent_row * plan.width + tree.rank[c]);
    }
  };
  for (int r = 0; r < slots; ++r) take_children(r, -1, r);
  std::vector<std::vector<int32_t>> row_of(slots, std::vector<int32_t>(tree.size(), -1));  // node -> row in its depth
  plan.rows = slots;
  for (int d = 1; d < tree.max_depth; ++d) {
    TreePlan::Depth depth;
    depth.first_row = plan.rows;
    ForwardBatch& batch = depth.batch;
    std::vector<std::pair<int, int>> who;  // (slot, node) per row
    for (int r = 0; r < slots; ++r) {
      // The rows: depth d's nodes from the first to the last with children (vLLM's order
      // keeps a depth's nodes together), so that row k sits at the slot of its own step
      // position position + node, where every backend's kernels expect a step's rows; the
      // childless ones between them only fill the gaps.
      auto has_kids = [&](int i) {
        return std::any_of(kids[i + 1].begin(), kids[i + 1].end(), [&](int32_t c) { return c < nodes_of(r); });
      };
      int first = -1, last = -1;
      for (int i = 0; i < nodes_of(r); ++i) {
        if (tree.depth[i] != d || !has_kids(i)) continue;
        if (first < 0) first = i;
        last = i;
      }
      SequenceSlice slice;
      slice.q_start = static_cast<int32_t>(batch.token_ids.size());
      const int request = request_at[r];
      for (int i = first, j = 0; first >= 0 && i <= last; ++i, ++j) {
        depth.token_sources.push_back(plan.source[r][i]);
        depth.hidden_rows.push_back(d == 1 ? r : row_of[r][tree.parent[i]]);
        who.emplace_back(r, i);
        if (request < 0 && r > last_slot) continue;
        // A slot between requests that drafts nothing: padding rows as the staging makes
        // them (positions 0.., no KV, block 0).
        const int32_t position = request >= 0 ? requests[request].position : 0;
        batch.token_ids.push_back(0);  // gathered on the device
        batch.positions.push_back(request >= 0 ? position + d - 1 : j);
        batch.slot_mapping.push_back(
            request >= 0 ? static_cast<int32_t>(SlotOf(requests[request].block_table, position + i, block_size_)) : -1);
        if (request >= 0) slice.tree_mask.push_back(tree.AncestorMask(i));
      }
      slice.q_len = static_cast<int32_t>(batch.token_ids.size()) - slice.q_start;
      if (slice.q_len == 0) continue;
      if (request >= 0) {
        slice.ctx_len = requests[request].position + last + 1;
        slice.tree_base = requests[request].position;
        slice.block_table = requests[request].block_table;
      } else {
        slice.ctx_len = slice.q_len;
        slice.block_table.assign((slice.q_len + block_size_ - 1) / block_size_, 0);
      }
      batch.seqs.push_back(std::move(slice));
    }
    if (who.empty()) break;
    for (size_t k = 0; k < who.size(); ++k) {
      const auto [r, i] = who[k];
      if (request_at[r] >= 0) batch.logit_rows.push_back(static_cast<int32_t>(k));  // eager: every row is a request's
      row_of[r][i] = static_cast<int32_t>(k);
      take_children(r, i, plan.rows + static_cast<int64_t>(k));
    }
    plan.rows += static_cast<int64_t>(who.size());
    plan.depths.push_back(std::move(depth));
  }
  return plan;
}

// Each depth's inputs staged as a tree verification step's; its token ids and parent rows
// gathered on the device by indices fixed per bucket (every slot takes the whole tree).
void Eagle3Drafter::TreeGraphRound(int bucket, int q, const TreePlan& plan, const DeviceBatch* padded,
                                   const Tensor& padded_aux) {
  std::vector<DeviceBatch> inputs;  // each depth's, fixed
  for (size_t d = 0; d < plan.depths.size(); ++d) {
    const int rows = static_cast<int>(plan.depths[d].hidden_rows.size()) / bucket;
    inputs.push_back(runner_.StageGraphInputs(plan.depths[d].batch, bucket, rows, tree_inputs_[static_cast<int>(d)], true));
  }
  std::vector<Tensor>& indices = tree_indices_[bucket];
  if (indices.empty()) {
    for (const TreePlan::Depth& depth : plan.depths) indices.push_back(DepthIndices(depth));
  }
  const Tensor top = TreeTopTokens(plan.width).Rows(0, plan.rows * plan.width);
  const Tensor hidden = DraftHidden(draft_.decoder().hidden_size).Rows(0, bucket);  // the eager first pass's
  DraftRound({bucket, q, tree_->size()}, [&] {
    Tensor parents_of = hidden;
    if (padded != nullptr) {
      Eagle3Output first = draft_.Forward(*padded, draft_.CombineHiddenStates(padded_aux), cache_);
      KeepTopTokens(first.logits, top, 0, plan.width);
      parents_of = std::move(first.next_hidden);
    }
    for (size_t d = 0; d < plan.depths.size(); ++d) {
      parents_of = TreeDepth(plan.depths[d], inputs[d], indices[d], parents_of, top, plan.width);
    }
  });
}

// A depth's rows' token sources, then their parents' rows, on the device.
Tensor Eagle3Drafter::DepthIndices(const TreePlan::Depth& depth) {
  std::vector<int32_t> words = depth.token_sources;
  words.insert(words.end(), depth.hidden_rows.begin(), depth.hidden_rows.end());
  Tensor host = Tensor::Host(DType::kI32, {static_cast<int64_t>(words.size())});
  std::copy(words.begin(), words.end(), host.data<int32_t>());
  return backend().Upload(host);
}

// One depth: its token ids and parents' hidden rows gathered by `indices` (DepthIndices),
// the draft's forward, its rows' top tokens kept; returns the hidden rows it left.
Tensor Eagle3Drafter::TreeDepth(const TreePlan::Depth& depth, const DeviceBatch& in, const Tensor& indices,
                                const Tensor& parents_of, const Tensor& top, int64_t width) {
  Backend& backend = this->backend();
  const auto rows = static_cast<int64_t>(depth.hidden_rows.size());
  Tensor ids = in.token_ids.View({rows, 1});
  backend.GatherRowsAt(top.View({top.numel(), 1}), indices.Rows(0, rows), ids);
  Tensor parents = backend.Empty(parents_of.dtype(), {rows, parents_of.size(1)});
  backend.GatherRowsAt(parents_of, indices.Rows(rows, 2 * rows), parents);
  Eagle3Output step = draft_.Forward(in, parents, cache_);
  KeepTopTokens(step.logits, top, depth.first_row, width);
  return std::move(step.next_hidden);
}

// Rows first_row.. of top ([rows, width] flattened) get each logit row's `width` best, as target ids.
void Eagle3Drafter::KeepTopTokens(const Tensor& logits, const Tensor& top, int64_t first_row, int64_t width) {
  Tensor rows = top.Rows(first_row * width, (first_row + logits.size(0)) * width).View({logits.size(0), width});
  draft_.GreedyTargetTokens(logits, rows);
}

Tensor Eagle3Drafter::TreeTopTokens(int64_t width) {
  if (!tree_top_.defined()) {
    // The most rows a round has: every slot of the largest bucket, its first pass and a row
    // per node. Zeros: a padding slot's first nodes take their tokens from rows no first
    // pass wrote.
    tree_top_ = backend().Upload(Tensor::Host(DType::kI32, {runner_.max_graph_batch() * (1 + tree_->size()) * width}));
  }
  return tree_top_;
}

// An eager first pass's input: its rows' aux states, combined.
Tensor Eagle3Drafter::FirstPassInput(const std::vector<int32_t>& step_rows) {
  const Tensor& step_aux = runner_.step_aux();
  const int64_t layers = step_aux.size(0), h = step_aux.size(2), rows = static_cast<int64_t>(step_rows.size());
  Tensor aux = backend().Empty(step_aux.dtype(), {layers * rows, h});
  GatherAux(step_rows, aux);
  return draft_.CombineHiddenStates(aux.View({rows, layers, h}));
}

// The first pass's aux states, [R, A, H]: every aux layer's state of each of its rows.
void Eagle3Drafter::GatherAux(const std::vector<int32_t>& rows_of_step, Tensor& out) {
  const Tensor& step_aux = runner_.step_aux();
  const int64_t layers = step_aux.size(0), total = step_aux.size(1), h = step_aux.size(2);
  std::vector<int32_t> gather;
  for (int32_t r : rows_of_step)
    for (int64_t l = 0; l < layers; ++l) gather.push_back(static_cast<int32_t>(l * total + r));
  backend().GatherRows(step_aux.View({layers * total, h}), gather, out);
}

void Eagle3Drafter::DecodeSampled(const ForwardBatch& step, const Tensor& tokens) {
  kv_stored_ahead_ = false;
  const int n = static_cast<int>(step.seqs.size());
  ForwardBatch first;  // Propose's first pass of a decode step, its tokens still on the device
  std::vector<int32_t> step_rows;
  for (const SequenceSlice& s : step.seqs) {
    if (s.q_len != 1) return;
    const int32_t p = step.positions[s.q_start];
    SequenceSlice slice;
    slice.q_start = static_cast<int32_t>(first.token_ids.size());
    slice.q_len = 1;
    slice.ctx_len = p + 1;
    slice.block_table = s.block_table;
    first.token_ids.push_back(0);  // the token sampled after p: copied in on the device
    first.positions.push_back(p);
    first.slot_mapping.push_back(step.slot_mapping[s.q_start]);
    first.seqs.push_back(std::move(slice));
    step_rows.push_back(s.q_start);
  }
  std::vector<int> no_requests;
  const FirstPassShape shape = PaddedFirstPass(first, no_requests);
  if (n == 0 || shape.bucket == 0) return;  // eagerly: Propose's pass uploads the host's tokens
  Tensor aux;
  const DeviceBatch padded = StagePaddedFirstPass(first, step_rows, shape, aux);
  Tensor ids = padded.token_ids.Rows(0, n);  // one row a sequence: the real rows lead
  backend().Copy(tokens.Rows(0, n), ids);
  DraftRound({shape.bucket, shape.q, 0}, [&] { draft_.StoreKV(padded, draft_.CombineHiddenStates(aux), cache_); });
  kv_stored_ahead_ = true;
  ++kv_passes_ahead_;
}

// A step where no request drafts: the first pass only keeps the draft's KV (StoreKV: for a
// one-layer draft its k/v projections alone), on a graph per (bucket, rows per sequence)
// where the pass fits one, padded as a drafting first pass is. At zero acceptance, with
// adaptive draft lengths, this is every step's draft work (after a decode step that fits
// the graph, DecodeSampled's instead, queued before the download).
void Eagle3Drafter::KeepKV(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows) {
  Eagle3Draft& draft = draft_;
  std::vector<int> no_requests;
  const FirstPassShape shape = PaddedFirstPass(first_pass, no_requests);
  if (shape.bucket == 0) {
    draft.StoreKV(first_pass, FirstPassInput(step_rows), cache_);
    return;
  }
  Tensor aux;
  const DeviceBatch padded = StagePaddedFirstPass(first_pass, step_rows, shape, aux);
  // Key (bucket, q, 0 drafts): a KV-only pass, apart from every drafting round's.
  DraftRound({shape.bucket, shape.q, 0}, [&] { draft.StoreKV(padded, draft.CombineHiddenStates(aux), cache_); });
}

// A first pass fits a graph of its sequences' bucket when each logit row (one per request,
// in order) is its sequence's last, and each sequence runs at most a verification step's
// rows (K + 1) and has at least as many positions before its end as the widest (q): each is
// padded at its front to q rows at the positions before, which store no KV, so its last row
// stays the block's last. seq_of_request gets each logit row's sequence.
Eagle3Drafter::FirstPassShape Eagle3Drafter::PaddedFirstPass(const ForwardBatch& first_pass,
                                                             std::vector<int>& seq_of_request) const {
  const size_t seqs = first_pass.seqs.size();
  int q = 1;
  size_t longest_table = 0;
  for (const SequenceSlice& s : first_pass.seqs) {
    q = std::max(q, s.q_len);
    longest_table = std::max(longest_table, s.block_table.size());
  }
  if (q > std::min(num_speculative_tokens() + 1, ModelRunner::kMaxGraphRowsPerSeq)) return {};
  for (const SequenceSlice& s : first_pass.seqs) {
    if (s.q_len < 1 || s.ctx_len < q) return {};
  }
  seq_of_request.clear();
  size_t i = 0;
  for (int32_t row : first_pass.logit_rows) {
    while (i < seqs && first_pass.seqs[i].q_start + first_pass.seqs[i].q_len - 1 < row) ++i;
    if (i == seqs || first_pass.seqs[i].q_start + first_pass.seqs[i].q_len - 1 != row) return {};
    seq_of_request.push_back(static_cast<int>(i++));
  }
  const int bucket = DraftGraphBucket(static_cast<int>(seqs), longest_table);
  return bucket > 0 ? FirstPassShape{bucket, q} : FirstPassShape{};
}

DeviceBatch Eagle3Drafter::StagePaddedFirstPass(const ForwardBatch& first_pass, const std::vector<int32_t>& step_rows,
                                                const FirstPassShape& shape, Tensor& aux) {
  const int bucket = shape.bucket, q = shape.q;
  // The runner's staging pads each sequence at its front to q rows (positions before, no
  // KV); each padded row takes the aux states of its row in the step (padding: its
  // sequence's first row's).
  std::vector<int32_t> rows_of_step;
  rows_of_step.reserve(first_pass.seqs.size() * q);
  for (const SequenceSlice& s : first_pass.seqs) {
    const int pad = q - s.q_len;
    for (int j = 0; j < q; ++j) rows_of_step.push_back(step_rows[s.q_start + std::max(0, j - pad)]);
  }
  DeviceBatch inputs = runner_.StageGraphInputs(first_pass, bucket, q, draft_inputs_[q]);
  inputs.logit_rows.clear();
  for (int i = 1; i <= bucket; ++i) inputs.logit_rows.push_back(i * q - 1);
  const int64_t layers = draft_.config().num_aux(), h = draft_.decoder().hidden_size;  // the target's
  if (!first_pass_aux_.defined()) {
    // Sized for the largest bucket and a verification step's rows (K + 1): graphs keep its
    // address. Zeros: a round recorded at start-up runs once over them.
    const int64_t words = layers * runner_.max_graph_batch() * (num_speculative_tokens() + 1) * h;
    first_pass_aux_ = backend().Upload(Tensor::Host(backend().compute_dtype(), {words}));
  }
  aux = first_pass_aux_.Rows(0, layers * bucket * q * h).View({layers * bucket * q, h});
  if (!rows_of_step.empty()) {
    rows_of_step.resize(static_cast<size_t>(bucket) * q, rows_of_step.front());  // padding sequences
    GatherAux(rows_of_step, aux);
  }
  aux = aux.View({int64_t{bucket} * q, layers, h});
  return inputs;
}

// Layout, in int32 words, for S steps of R rows: per step positions [R], slots [R] and
// sequence info [R, 4], then the block tables (one per row at a stride, shared by the steps).
std::vector<DeviceBatch> Eagle3Drafter::StageChainedSteps(const std::vector<const DraftRequest*>& row_requests,
                                                        int rows, int steps, const Tensor& tokens, bool fixed) {
  Backend& backend = this->backend();
  const int n = static_cast<int>(row_requests.size()), bs = block_size_;
  int64_t stride = 1;
  for (const DraftRequest* r : row_requests) {
    if (r != nullptr) stride = std::max<int64_t>(stride, r->block_table.size());
  }
  const int64_t per_step = 6 * int64_t{rows}, words = steps * per_step + rows * stride;
  if (fixed && !chain_inputs_.device.defined()) {
    const int64_t most = ModelRunner::kMaxGraphRowsPerSeq * 6 * runner_.max_graph_batch() +
                         runner_.max_graph_batch() * runner_.max_blocks_per_seq();
    chain_inputs_.device = backend.Empty(DType::kI32, {most});
    chain_inputs_.staging = backend.HostBuffer(DType::kI32, {most});
  }
  Tensor host = fixed ? chain_inputs_.staging.Rows(0, words) : Tensor::Host(DType::kI32, {words});
  int32_t* staged = host.data<int32_t>();
  int32_t* tables = staged + steps * per_step;
  std::fill_n(tables, rows * stride, 0);  // padding rows attend to the first slot of block 0
  for (int i = 0; i < n; ++i) {
    if (row_requests[i] != nullptr) std::copy(row_requests[i]->block_table.begin(), row_requests[i]->block_table.end(), tables + i * stride);
  }
  std::vector<std::vector<SequenceSlice>> seqs(steps);  // the host copies eager attention reads
  for (int s = 0; s < steps; ++s) {
    int32_t *positions = staged + s * per_step, *slots = positions + rows, *info = slots + rows;
    for (int i = 0; i < rows; ++i) {
      // Padding: token at position 0, storing no KV, attending to the first slot of block 0.
      const DraftRequest* r = i < n ? row_requests[i] : nullptr;
      const int32_t pos = r != nullptr ? r->position + s : 0;
      positions[i] = pos;
      slots[i] = r != nullptr ? static_cast<int32_t>(SlotOf(r->block_table, pos, bs)) : -1;
      std::copy_n(std::array<int32_t, 4>{i, 1, pos + 1, static_cast<int32_t>(i * stride)}.begin(), 4, info + 4 * i);
      if (!fixed) seqs[s].push_back({i, 1, pos + 1, r != nullptr ? r->block_table : std::vector<int32_t>{0}});
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

void DeviceDrafter::RecordRounds() {
  if (!runner_.graphs_on()) return;  // graph shapes without recording run each once: CPU tests cover this path
  const int k = num_speculative_tokens();
  for (int seqs = 1; seqs <= runner_.max_graph_batch() && !runner_.recording_failed();
       seqs = ModelRunner::BucketFor(seqs) + 1) {
    const int bucket = DraftGraphBucket(seqs, 0);
    for (int drafts = adaptive() ? 0 : k; bucket > 0 && drafts <= k && !runner_.recording_failed(); ++drafts) {
      RecordPaddingRounds(bucket, drafts);
    }
  }
  draft_graph_replays_ = first_pass_graph_replays_ = kv_only_graph_replays_ = 0;  // what ran here served no round
}

int DeviceDrafter::DraftGraphBucket(int sequences, size_t longest_block_table) const {
  if (!runner_.graphs_on() || sequences == 0 || sequences > runner_.max_graph_batch() ||
      static_cast<int64_t>(longest_block_table) > runner_.max_blocks_per_seq()) {
    return 0;
  }
  const int bucket = ModelRunner::BucketFor(sequences);
  // The round's forwards run bucket rows, padding included (ModelRunner::GraphShapeOf's rule).
  if (moe_ != nullptr && !runner_.replays_eagerly() &&
      !backend().MoeRecordable(bucket, moe_->num_experts, moe_->hidden_size, moe_->moe_intermediate_size)) {
    return 0;
  }
  return bucket;
}

Tensor DeviceDrafter::DraftTokens() {
  if (!draft_tokens_.defined()) {
    // Zeros: padding rows' token ids are read before any step writes them.
    draft_tokens_ = backend().Upload(Tensor::Host(DType::kI32, {ModelRunner::kMaxGraphRowsPerSeq * runner_.max_graph_batch()}));
  }
  return draft_tokens_;
}

Tensor DeviceDrafter::DraftHidden(int64_t width) {
  if (!draft_hidden_.defined()) {
    // Zeros: padding rows read rows no round wrote, whose norms and top tokens must be finite.
    draft_hidden_ = backend().Upload(Tensor::Host(backend().compute_dtype(), {runner_.max_graph_batch(), width}));
  }
  return draft_hidden_;
}

// As GraphForward: replayed where its key has a graph, else run on the fixed inputs
// (its GEMMs tune) and recorded for the next round.
void DeviceDrafter::DraftRound(const std::array<int, 3>& key, const std::function<void()>& round) {
  const bool eager = runner_.replays_eagerly();
  auto it = draft_graphs_.find(key);
  if (eager || it != draft_graphs_.end()) {
    if (eager) {
      round();
    } else {
      it->second->Replay();
    }
    const bool drafts = key[2] > 0;
    draft_graph_replays_ += drafts;
    first_pass_graph_replays_ += drafts && key[1] > 0;
    kv_only_graph_replays_ += !drafts;
    return;
  }
  round();
  if (runner_.recording_failed()) return;
  round_recorded_ = true;
  std::unique_ptr<DeviceGraph> graph = backend().Record(round);
  if (!graph) {
    runner_.RecordingFailed();
    return;
  }
  draft_graphs_.emplace(key, std::move(graph));
}

std::vector<std::vector<int32_t>> DeviceDrafter::DownloadDrafts(const Tensor& tokens, int rows, int requests,
                                                                int drafts) {
  const Tensor host = backend().Download(tokens.Rows(0, int64_t{drafts} * rows));
  const int32_t* words = host.data<int32_t>();
  std::vector<std::vector<int32_t>> out(requests);
  for (int i = 0; i < requests; ++i) {
    for (int s = 0; s < drafts; ++s) out[i].push_back(words[int64_t{s} * rows + i]);
  }
  return out;
}

}  // namespace hsx
