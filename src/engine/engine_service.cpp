#include "engine/engine_service.h"

namespace hsx {

EngineService::EngineService(Model& model, EngineConfig config, size_t max_queued)
    : engine_(model, std::move(config)), max_queued_(max_queued) {
  stats_.total_blocks = engine_.num_blocks();
  thread_ = std::thread([this] { Loop(); });
}

EngineService::~EngineService() {
  Shutdown();
  engine_.model().backend().PinThread();  // the engine frees its device memory on this thread
}

bool EngineService::Submit(Request request, Callback done) {
  std::vector<std::pair<Request, Callback>> one;
  one.emplace_back(std::move(request), std::move(done));
  return SubmitAll(std::move(one));
}

bool EngineService::SubmitAll(std::vector<std::pair<Request, Callback>> requests) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || abort_all_ || incoming_.size() + in_flight_ + requests.size() > max_queued_) return false;
    for (auto& [request, done] : requests) {
      incoming_tokens_ += static_cast<int64_t>(request.prompt.size());
      incoming_.push_back({std::move(request), std::move(done)});
    }
  }
  wake_.notify_one();
  return true;
}

void EngineService::Abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.insert(id);
  }
  wake_.notify_one();
}

void EngineService::FinishAt(const std::string& id, int num_generated) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finish_at_.emplace(id, num_generated);
  }
  wake_.notify_one();
}

void EngineService::AbortAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_all_ = true;
  }
  wake_.notify_one();
}

size_t EngineService::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return incoming_.size() + in_flight_;
}

void EngineService::GatherNextStep(int64_t prompt_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  gather_tokens_ = prompt_tokens;
}

void EngineService::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
}

void EngineService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineService::Stats EngineService::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void EngineService::Loop() {
  engine_.model().backend().PinThread();  // this thread queues all of the engine's device work
  for (;;) {
    std::deque<Pending> incoming;
    std::unordered_set<std::string> aborts;
    std::unordered_map<std::string, int> finish_at;
    bool abort_all = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        if (stopping_ || !aborts_.empty() || !finish_at_.empty() || engine_.has_work()) return true;
        if (incoming_.empty()) return false;
        return gather_tokens_ <= 0 || abort_all_ || incoming_tokens_ >= gather_tokens_ ||
               incoming_.size() + in_flight_ >= max_queued_;
      });
      if (stopping_ && incoming_.empty() && !engine_.has_work()) return;
      if (!incoming_.empty()) gather_tokens_ = 0;  // gathered: later steps go as work comes
      incoming.swap(incoming_);
      incoming_tokens_ = 0;
      // Taken requests still count against max_queued until they are admitted or fail, so
      // Submit sees no free room in between.
      in_flight_ += incoming.size();
      aborts.swap(aborts_);
      finish_at.swap(finish_at_);
      abort_all = abort_all_;
    }
    if (abort_all) {
      for (const auto& [id, done] : callbacks_) aborts.insert(id);
    }
    // Admission happens here, on the engine's thread; a rejected request fails alone.
    for (Pending& p : incoming) {
      const std::string id = p.request.id;
      const int prompt = static_cast<int>(p.request.prompt.size());
      Status s;
      try {
        s = abort_all              ? Error("request '" + id + "' was cancelled: the server is shutting down")
            : callbacks_.count(id) ? Error("request '" + id + "': an unfinished request already has this id")
                                   : engine_.Add(std::move(p.request));
      } catch (const std::exception& e) {  // e.g. bad_alloc for its buffers: it fails alone
        s = Error("request '" + id + "': " + e.what());
      }
      if (!s.ok()) {
        {  // its room is free before its callback runs: the caller may submit again at once
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.requests_failed;
          --in_flight_;
        }
        p.done(s, nullptr);
        continue;
      }
      callbacks_[id] = std::move(p.done);
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prompt_tokens += prompt;
    }
    for (const std::string& id : aborts) engine_.Abort(id);
    for (const auto& [id, n] : finish_at) engine_.FinishAt(id, n);

    const uint64_t computed_before = engine_.stats().tokens_computed;
    std::vector<std::unique_ptr<Sequence>> finished;
    if (engine_.has_work()) finished = engine_.Step();
    for (auto& seq : finished) {
      auto it = callbacks_.find(seq->id());
      if (it == callbacks_.end()) continue;
      Callback done = std::move(it->second);
      callbacks_.erase(it);
      {
        std::lock_guard<std::mutex> lock(mu_);
        in_flight_ = callbacks_.size();
      }
      const bool aborted = seq->aborted, failed = aborted || !seq->error.ok();
      const int generated = seq->num_generated();
      // A failed sequence goes with its error: a capture sink records the failure by its id.
      Status status = aborted ? Error("request '" + seq->id() + "' was cancelled" +
                                      (abort_all ? ": the server is shutting down" : ""))
                              : seq->error;
      done(status, std::move(seq));
      std::lock_guard<std::mutex> lock(mu_);
      ++(failed ? stats_.requests_failed : stats_.requests_finished);
      stats_.generation_tokens += generated;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.steps = engine_.stats().steps;
    stats_.tokens_computed = engine_.stats().tokens_computed;
    stats_.last_batch_tokens = static_cast<size_t>(engine_.stats().tokens_computed - computed_before);
    stats_.queued = incoming_.size();
    stats_.running = in_flight_ = callbacks_.size();
    stats_.free_blocks = engine_.num_free_blocks();
    stats_.prefix_cache_hit_rate = engine_.prefix_cache_hit_rate();
    stats_.engine = engine_.stats();
  }
}

}  // namespace hsx
