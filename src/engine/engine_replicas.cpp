#include "engine/engine_replicas.h"

#include <algorithm>
#include <numeric>

namespace hsx {

EngineReplicas::EngineReplicas(std::vector<std::unique_ptr<EngineService>> replicas, int block_size,
                               size_t affinity_slack)
    : replicas_(std::move(replicas)), router_(block_size, affinity_slack) {}

EngineReplicas::~EngineReplicas() { Shutdown(); }

bool EngineReplicas::Submit(Request request, Callback done) {
  std::vector<std::pair<Request, Callback>> one;
  one.emplace_back(std::move(request), std::move(done));
  return SubmitAll(std::move(one));
}

bool EngineReplicas::SubmitAll(std::vector<std::pair<Request, Callback>> requests) {
  if (requests.empty()) return replicas_[0]->SubmitAll({});
  std::vector<size_t> loads(replicas_.size());
  for (size_t r = 0; r < replicas_.size(); ++r) loads[r] = replicas_[r]->load();
  // The router's pick first, then the others from the least loaded.
  std::vector<size_t> order(replicas_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return loads[a] < loads[b]; });
  const size_t first = static_cast<size_t>(router_.Pick(requests[0].first.prompt, loads));
  std::rotate(order.begin(), std::find(order.begin(), order.end(), first), std::find(order.begin(), order.end(), first) + 1);
  // Each callback forgets its request's owner; owners are recorded before submitting
  // since a callback can run before SubmitAll returns.
  std::vector<std::string> ids;
  for (auto& [request, done] : requests) {
    ids.push_back(request.id);
    done = [this, id = request.id, inner = std::move(done)](const Status& status, std::unique_ptr<Sequence> seq) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        owner_.erase(id);
      }
      inner(status, std::move(seq));
    };
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t r = order[i];
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [request, done] : requests) owner_[request.id] = r;
    }
    // A refused batch is gone once moved: only the last attempt may move it.
    const bool last = i + 1 == order.size();
    if (replicas_[r]->SubmitAll(last ? std::move(requests) : requests)) return true;
    if (last) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : ids) owner_.erase(id);
  return false;
}

void EngineReplicas::Abort(const std::string& id) {
  size_t r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owner_.find(id);
    if (it == owner_.end()) return;  // finished already
    r = it->second;
  }
  replicas_[r]->Abort(id);
}

void EngineReplicas::FinishAt(const std::string& id, int num_generated) {
  size_t r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owner_.find(id);
    if (it == owner_.end()) return;  // finished already: the server cuts it itself
    r = it->second;
  }
  replicas_[r]->FinishAt(id, num_generated);
}

void EngineReplicas::AbortAll() {
  for (auto& r : replicas_) r->AbortAll();
}

void EngineReplicas::GatherNextStep(int64_t prompt_tokens) {
  for (auto& r : replicas_) r->GatherNextStep(prompt_tokens);
}

void EngineReplicas::Close() {
  for (auto& r : replicas_) r->Close();
}

void EngineReplicas::Shutdown() {
  Close();  // all at once: a replica still gathering its first step must not wait for the others' drains
  for (auto& r : replicas_) r->Shutdown();
}

std::vector<EngineService::Stats> EngineReplicas::replica_stats() const {
  std::vector<EngineService::Stats> all;
  for (const auto& replica : replicas_) all.push_back(replica->stats());
  return all;
}

EngineService::Stats EngineReplicas::stats() const {
  EngineService::Stats sum;
  for (const EngineService::Stats& s : replica_stats()) {
    sum.requests_finished += s.requests_finished;
    sum.requests_failed += s.requests_failed;
    sum.prompt_tokens += s.prompt_tokens;
    sum.generation_tokens += s.generation_tokens;
    sum.tokens_computed += s.tokens_computed;
    sum.steps += s.steps;
    sum.queued += s.queued;
    sum.running += s.running;
    sum.last_batch_tokens += s.last_batch_tokens;
    sum.free_blocks += s.free_blocks;
    sum.total_blocks += s.total_blocks;
    sum.prefix_cache_hit_rate += s.prefix_cache_hit_rate / static_cast<double>(replicas_.size());
    EngineStats& e = sum.engine;
    e.steps += s.engine.steps;
    e.tokens_computed += s.engine.tokens_computed;
    e.tokens_generated += s.engine.tokens_generated;
    e.num_drafts += s.engine.num_drafts;
    e.num_draft_tokens += s.engine.num_draft_tokens;
    e.num_accepted_tokens += s.engine.num_accepted_tokens;
    const auto& per_pos = s.engine.num_accepted_tokens_per_pos;
    if (e.num_accepted_tokens_per_pos.size() < per_pos.size()) e.num_accepted_tokens_per_pos.resize(per_pos.size());
    for (size_t i = 0; i < per_pos.size(); ++i) e.num_accepted_tokens_per_pos[i] += per_pos[i];
    for (int i = 0; i < EngineStats::kNumStages; ++i) e.stage_seconds[i] += s.engine.stage_seconds[i];
  }
  return sum;
}

}  // namespace hsx
