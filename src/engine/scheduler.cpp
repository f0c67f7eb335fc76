#include "engine/scheduler.h"

#include <algorithm>

namespace hsx {

void Scheduler::Preempt() {
  std::unique_ptr<Sequence> victim = std::move(running_.back());
  running_.pop_back();
  blocks_.Release(*victim);
  ++victim->preemptions;
  victim->drafts.clear();  // proposed again after its recompute
  waiting_.push_front(std::move(victim));
  ++preemptions_;
}

std::vector<ScheduledChunk> Scheduler::Schedule() {
  std::vector<ScheduledChunk> chunks;
  int budget = config_.max_num_batched_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i].get();
    const int n = std::min(seq->num_scheduled_tokens() - seq->num_computed, budget);
    // A budget that cuts into the drafts verifies fewer of them.
    seq->drafts.resize(std::max(0, std::min<int>(seq->drafts.size(), seq->num_computed + n - seq->num_tokens())));
    if (!blocks_.Reserve(*seq, seq->num_computed + n)) {
      Preempt();  // frees the newest; if that was seq itself, the loop ends
      continue;
    }
    chunks.push_back({seq, n});
    budget -= n;
    ++i;
  }
  while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front().get();
    blocks_.MatchPrefix(*seq);
    const int n = std::min(seq->num_tokens() - seq->num_computed, budget);
    if (!blocks_.Reserve(*seq, seq->num_computed + n)) {
      blocks_.Release(*seq);  // give back the matched prefix; it is matched again next time
      break;
    }
    chunks.push_back({seq, n});
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
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
  return done;
}

}  // namespace hsx
