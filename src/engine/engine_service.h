// Runs an Engine on its own thread so requests can come from any thread: Submit queues
// a request and returns at once; its callback runs on the engine thread when it ends.
// The queue is bounded (a full one refuses new work: the server answers 503, extract and
// generate wait for room), an aborted request frees its blocks, and Shutdown drains what
// was accepted. serve, generate and extract all dispatch through it (EngineReplicas).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace hsx {

class EngineService {
 public:
  // Called once per accepted request with the finished sequence and OK, or an error
  // Status and the sequence when it ran (cancelled, or failed while running), else null.
  using Callback = std::function<void(const Status&, std::unique_ptr<Sequence>)>;

  // Builds the engine on the calling thread (pin the model's device first).
  EngineService(Model& model, EngineConfig config, size_t max_queued);
  ~EngineService();  // Shutdown(), then destroys the engine with its device pinned

  // False (and the callback is never called) when the queue is full or shutting down.
  bool Submit(Request request, Callback done);
  // Several requests, all or none: false (and no callback is called) when they do not
  // all fit the queue, so a batch never runs in part.
  bool SubmitAll(std::vector<std::pair<Request, Callback>> requests);
  // The engine's checks (Engine::Validate), from any thread, before submitting.
  Status Validate(const Request& request) const { return engine_.Validate(request); }
  const ModelConfig& model_config() const { return engine_.model().config(); }
  // The engine's settings as it runs them (max_model_len and num_blocks resolved).
  const EngineConfig& engine_config() const { return engine_.config(); }
  size_t max_queued() const { return max_queued_; }
  // Requests accepted and not yet finished (queued or running), now: what max_queued bounds.
  size_t load() const;
  // The next step waits until the queue holds `prompt_tokens` prompt tokens, or is full, or
  // Close: a batch job (extract) whose first requests trickle in from a parser would
  // otherwise run a short first step on the first few, and one step more in all.
  void GatherNextStep(int64_t prompt_tokens);
  // Drops a request that has not finished; its callback gets an error.
  void Abort(const std::string& id);
  // Ends an unfinished request after its first `num_generated` tokens (Engine::FinishAt):
  // a stop string the server found on its own threads. Its callback gets the cut sequence.
  void FinishAt(const std::string& id, int num_generated);
  // Fails every unfinished request (each callback gets an error) and refuses new ones:
  // a server whose drain was cut short.
  void AbortAll();
  // Refuses new requests and lets the thread finish the accepted ones; returns at once.
  void Close();
  // Close(), then waits for the thread to finish every accepted request and stop.
  void Shutdown();

  struct Stats {
    uint64_t requests_finished = 0, requests_failed = 0, prompt_tokens = 0, generation_tokens = 0;
    uint64_t tokens_computed = 0, steps = 0;
    size_t queued = 0, running = 0, last_batch_tokens = 0;
    int free_blocks = 0, total_blocks = 0;
    double prefix_cache_hit_rate = 0;
    EngineStats engine;  // the engine's own counters (speculative decoding's among them)
  };
  Stats stats() const;

 private:
  void Loop();

  struct Pending {
    Request request;
    Callback done;
  };
  Engine engine_;
  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Pending> incoming_;
  std::unordered_set<std::string> aborts_;
  std::unordered_map<std::string, int> finish_at_;  // FinishAt's, applied after the aborts
  std::unordered_map<std::string, Callback> callbacks_;  // accepted, unfinished; engine thread only
  size_t in_flight_ = 0;  // callbacks_.size() plus requests taken from incoming_ and not yet admitted, under mu_
  int64_t incoming_tokens_ = 0;  // incoming_'s prompt tokens
  int64_t gather_tokens_ = 0;    // > 0: the next step waits for this many (GatherNextStep)
  bool stopping_ = false;
  bool abort_all_ = false;
  Stats stats_;
  std::thread thread_;
};

}  // namespace hsx
