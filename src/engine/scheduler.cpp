#include "engine/scheduler.h"

#include <algorithm>
#include <set>
#include <string_view>

namespace hsx {

int Scheduler::Held(const Sequence& seq) const {
  auto it = held_.find(seq.group());
  return it == held_.end() ? 0 : it->second;
}

size_t Scheduler::Victim(size_t from) const {
  size_t victim = running_.size() - 1;
  for (size_t i = running_.size() - 1; i > from; --i) {  // newest first; ties keep the newer
    if (Held(*running_[i - 1]) > Held(*running_[victim])) victim = i - 1;
  }
  return victim;
}

void Scheduler::Preempt(size_t index) {
  std::unique_ptr<Sequence> victim = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  if (auto it = held_.find(victim->group()); --it->second == 0) held_.erase(it);
  blocks_.Release(*victim);
  ++victim->preemptions;
  victim->KeepDrafts(0);  // proposed again after its recompute
  waiting_.push_front(std::move(victim));
  ++preemptions_;
}

std::vector<ScheduledChunk> Scheduler::Schedule() {
  // Each group's share of the slots: the groups running or waiting split max_num_seqs.
  std::set<std::string_view> waiting_groups;
  for (const auto& seq : waiting_) {
    if (!held_.count(seq->group())) waiting_groups.insert(seq->group());
  }
  const size_t groups = held_.size() + waiting_groups.size();
  const int share = std::max<int>(1, config_.max_num_seqs / static_cast<int>(std::max<size_t>(1, groups)));
  // A group holding nothing waited last step for a slot or blocks: free one.
  if (starved_ && !running_.empty()) {
    const size_t victim = Victim(0);
    if (Held(*running_[victim]) > share) Preempt(victim);
  }
  starved_ = false;

  std::vector<ScheduledChunk> chunks;
  int budget = config_.max_num_batched_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i].get();
    const int n = std::min(seq->num_scheduled_tokens() - seq->num_computed, budget);
    // A budget that cuts into the drafts verifies fewer of them.
    seq->KeepDrafts(static_cast<size_t>(std::max(0, seq->num_computed + n - seq->num_tokens())));
    if (!blocks_.Reserve(*seq, seq->num_computed + n)) {
      Preempt(Victim(i));  // one not yet scheduled this step; if it was seq, the next one takes its place
      continue;
    }
    chunks.push_back({seq, n});
    budget -= n;
    ++i;
  }

  // Admits waiting_[k]; false when nothing more can be admitted this step.
  auto admit = [&](size_t k) {
    Sequence* seq = waiting_[k].get();
    const bool holds_none = Held(*seq) == 0;
    if (static_cast<int>(running_.size()) >= config_.max_num_seqs) {
      starved_ = holds_none;
      return false;
    }
    blocks_.MatchPrefix(*seq);
    const int n = std::min(seq->num_tokens() - seq->num_computed, budget);
    if (!blocks_.Reserve(*seq, seq->num_computed + n)) {
      blocks_.Release(*seq);  // give back the matched prefix; it is matched again next time
      starved_ = holds_none;
      return false;
    }
    chunks.push_back({seq, n});
    budget -= n;
    ++held_[seq->group()];
    running_.push_back(std::move(waiting_[k]));
    return true;
  };
  // First the sequences of groups under their share, then the rest; queue order in each.
  bool open = true;
  for (size_t k = 0; open && budget > 0 && k < waiting_.size(); ++k) {
    if (Held(*waiting_[k]) < share) open = admit(k);
  }
  for (size_t k = 0; open && budget > 0 && k < waiting_.size(); ++k) {
    if (waiting_[k]) open = admit(k);
  }
  std::erase_if(waiting_, [](const auto& seq) { return seq == nullptr; });
  return chunks;
}

std::unique_ptr<Sequence> Scheduler::Remove(const std::string& id) {
  auto waiting = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& p) { return p->id() == id; });
  if (waiting != waiting_.end()) {
    std::unique_ptr<Sequence> seq = std::move(*waiting);
    waiting_.erase(waiting);
    return seq;
  }
  auto running = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p->id() == id; });
  return running == running_.end() ? nullptr : Detach(running->get());
}

std::unique_ptr<Sequence> Scheduler::Detach(Sequence* seq) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == seq; });
  std::unique_ptr<Sequence> done = std::move(*it);
  running_.erase(it);
  if (auto held = held_.find(done->group()); --held->second == 0) held_.erase(held);
  return done;
}

}  // namespace hsx
