#include "engine/drafter.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "engine/draft_runner.h"

namespace hsx {

int Drafter::DraftRoom(const Sequence& seq, int k) {
  if (!seq.wants_more_tokens() || seq.num_tokens() - seq.num_computed != 1) return 0;
  return std::max(0, std::min(k, seq.turn_max_new_tokens() - seq.turn_generated() - 1));
}

void Drafter::EnableAdaptive(DraftLengthConfig config, const DraftCostModel* injected, DraftCostModel::ShapeRule rule) {
  config.k_max = k_;
  policy_.emplace(config);
  measured_ = DraftCostModel(DraftCostModel::kDraftStepPrior, std::move(rule));
  chosen_lengths_.assign(k_ + 1, 0);
  injected_ = injected != nullptr;
  cost_ = injected_ ? injected : &measured_;
}

void Drafter::StepGraphsRecorded(const std::vector<int>& rows) {
  if (!policy_ || injected_) return;
  for (int r : rows) measured_.MarkWarm(r);
}

void Drafter::Accept(const std::vector<DraftOutcome>& outcomes) {
  if (!policy_) return;
  for (const DraftOutcome& o : outcomes) policy_->Record(o.seq->draft_history, o.proposed, o.accepted);
}

void Drafter::Propose(const DraftStep& step) {
  if (policy_) Plan(step);
  ProposeDrafts(step);
}

int Drafter::Room(const Sequence& seq) const {
  const int room = DraftRoom(seq, k_);
  if (!policy_) return room;
  auto it = planned_.find(&seq);
  return it == planned_.end() ? 0 : std::min(room, it->second);
}

void Drafter::ObserveRound(int seqs, int k, double seconds, bool recorded) {
  if (policy_ && !injected_ && !recorded) measured_.ObserveDraft(seqs, k, seconds);
}

// The step just run is measured (a decode or verification step: prefill rows cost
// otherwise), then every sequence that decodes next gets its K; those that may draft
// none still add their row.
void Drafter::Plan(const DraftStep& step) {
  if (!injected_ && step.decode_only && step.computed_rows > 0 && !step.recorded) {
    measured_.ObserveTarget(step.computed_rows, step.run_seconds, step.graph);
  }
  std::vector<const Sequence*> seqs;
  std::vector<int> rooms;
  std::vector<double> acceptance;
  for (const auto& [seq, n] : step.chunks) {
    if (!seq->wants_more_tokens() || seq->num_tokens() - seq->num_computed != 1) continue;
    seqs.push_back(seq);
    const double a = policy_->Acceptance(seq->draft_history, steps_planned_);
    const int room = DraftsAvailable(*seq, DraftRoom(*seq, k_), a);
    const bool probe = policy_->Probing(seq->draft_history, steps_planned_);
    const int cap = policy_->config().probe_drafts;
    rooms.push_back(probe && cap > 0 ? std::min(room, cap) : room);
    acceptance.push_back(a);
  }
  const std::vector<int> ks = policy_->Choose(rooms, acceptance, *cost_);
  ++steps_planned_;
  planned_.clear();
  round_k_ = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    planned_[seqs[i]] = ks[i];
    round_k_ = std::max(round_k_, ks[i]);
    ++chosen_lengths_[ks[i]];
  }
}

int NgramDrafter::DraftsAvailable(const Sequence& seq, int room, double acceptance) {
  if (room == 0 || acceptance < kMinLookupAcceptance) return 0;
  std::vector<int32_t>& drafts = looked_up_[&seq] = proposer_.Propose(seq.tokens());
  return std::min(room, static_cast<int>(drafts.size()));
}

void NgramDrafter::ProposeDrafts(const DraftStep& step) {
  for (const auto& [seq, n] : step.chunks) {
    const int room = Room(*seq);
    if (room == 0) continue;
    auto it = looked_up_.find(seq);
    seq->drafts = it != looked_up_.end() ? std::move(it->second) : proposer_.Propose(seq->tokens());
    if (static_cast<int>(seq->drafts.size()) > room) seq->drafts.resize(room);
  }
  looked_up_.clear();
}

std::unique_ptr<Drafter> MakeDrafter(const NgramConfig& ngram, Eagle3Draft* eagle3, int eagle3_k, MtpDrafter* mtp,
                                     int mtp_k, const DrafterContext& context) {
  if (eagle3 != nullptr) return std::make_unique<Eagle3Drafter>(*eagle3, eagle3_k, context);
  if (mtp != nullptr) return std::make_unique<MtpAssistantDrafter>(*mtp, mtp_k, context);
  if (ngram.num_speculative_tokens <= 0) return nullptr;
  auto proposer = NgramProposer::Create(ngram, context.max_model_len);
  if (!proposer.ok()) {  // the CLI checked the config: this is a caller's bug
    std::fprintf(stderr, "hsx: %s\n", proposer.status().message().c_str());
    std::abort();
  }
  return std::make_unique<NgramDrafter>(std::move(*proposer), ngram.num_speculative_tokens);
}

}  // namespace hsx
