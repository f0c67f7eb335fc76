// The data-parallel dispatcher: M EngineServices (one per device) behind the one
// interface serve, generate and extract use. A request (all choices of one completion
// together) goes to the replica ReplicaRouter picks: its first block's replica, for the
// prefix cache, unless that one is busier than the least loaded by the slack; a replica
// whose queue is full hands it to the next least loaded. Stats are the replicas' summed.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/replica_router.h"
#include "engine/engine_service.h"

namespace hsx {

class EngineReplicas {
 public:
  using Callback = EngineService::Callback;

  // At least one replica, all of the same model and settings.
  EngineReplicas(std::vector<std::unique_ptr<EngineService>> replicas, int block_size, size_t affinity_slack);
  ~EngineReplicas();  // Shutdown()

  // As EngineService's, on one replica; false when no replica can take them all.
  bool Submit(Request request, Callback done);
  bool SubmitAll(std::vector<std::pair<Request, Callback>> requests);
  Status Validate(const Request& request) const { return replicas_[0]->Validate(request); }
  const ModelConfig& model_config() const { return replicas_[0]->model_config(); }
  const EngineConfig& engine_config() const { return replicas_[0]->engine_config(); }
  size_t max_queued() const { return replicas_[0]->max_queued(); }  // per completion: one replica takes it
  void Abort(const std::string& id);
  void FinishAt(const std::string& id, int num_generated);
  void AbortAll();
  void GatherNextStep(int64_t prompt_tokens);  // on every replica (EngineService's)
  void Close();     // every replica refuses new requests and drains; returns at once
  void Shutdown();  // Close(), then waits for every replica to drain
  EngineService::Stats stats() const;  // summed; the prefix cache hit rate averaged
  std::vector<EngineService::Stats> replica_stats() const;
  size_t size() const { return replicas_.size(); }

 private:
  std::vector<std::unique_ptr<EngineService>> replicas_;
  ReplicaRouter router_;
  std::mutex mu_;
  std::unordered_map<std::string, size_t> owner_;  // unfinished request id -> its replica
};

}  // namespace hsx
