// The engine: a scheduler, a KV cache and a model. Add requests, call Step until there
// is no work; each Step returns the sequences that finished in it. Every entry point
// (extract, generate, later the server) drives this one loop.
#pragma once

#include <cstdlib>
#include <memory>
#include <vector>

#include "engine/block_manager.h"
#include "engine/scheduler.h"
#include "model/model.h"

namespace hsx {

struct EngineConfig {
  SchedulerConfig scheduler;
  int block_size = 16;
  int num_blocks = 0;                  // 0: from kv_cache_bytes
  size_t kv_cache_bytes = 1ull << 30;
  std::vector<int> capture_layers;     // ascending unique layer ids; empty: no capture
  DType capture_dtype = DType::kBF16;
  int max_model_len = 0;               // 0: the model's max_position_embeddings
  // Reuse the KV and captured hidden states of cached prompt blocks (see BlockManager).
  bool enable_prefix_caching = true;
};

struct EngineStats {
  uint64_t steps = 0;
  uint64_t tokens_computed = 0;
};

class Engine {
 public:
  Engine(Model& model, EngineConfig config);
  ~Engine();

  // Validates and queues a request; an invalid one is rejected alone with a message
  // that names it.
  Status Add(Request request);
  // Add's checks without queueing: vocabulary, lengths, KV fit. Reads only what never
  // changes after construction, so any thread may call it while the engine runs.
  Status Validate(const Request& request) const;
  std::vector<std::unique_ptr<Sequence>> Step();
  // Cancels a queued or running request: it comes back from a later Step with
  // aborted set, its blocks released. False if no such request is unfinished.
  bool Abort(const std::string& id);
  int num_free_blocks() const { return blocks_.num_free_blocks(); }
  int num_blocks() const { return blocks_.num_blocks(); }
  bool has_work() const { return scheduler_.has_work() || pending_ != nullptr || !aborted_.empty(); }
  size_t num_unfinished() const {
    return scheduler_.num_waiting() + scheduler_.num_running() + (pending_ ? pending_->finishing.size() : 0);
  }
  uint64_t num_preemptions() const { return scheduler_.num_preemptions(); }
  // Prompt tokens served from cached blocks, over prompt tokens looked up.
  double prefix_cache_hit_rate() const {
    return blocks_.queries() ? static_cast<double>(blocks_.hits()) / blocks_.queries() : 0.0;
  }

  const EngineConfig& config() const { return config_; }
  const EngineStats& stats() const { return stats_; }
  const Model& model() const { return model_; }

 private:
  ForwardBatch BuildBatch(const std::vector<ScheduledChunk>& chunks) const;
  // A step whose captured rows are still being copied to the host.
  struct PendingCapture {
    struct Row {
      Sequence* seq;
      int64_t pos;
      int64_t slot;  // KV slot: where the row lives in the capture cache
      int preemptions;  // the sequence's count when the row ran (see FinishCapture)
    };
    std::vector<Row> rows;  // one per batch row
    Tensor device, host_view;
    // Per captured row ([L, T] as one list), 1 where it holds an inf or NaN: computed on
    // the device, copied back after the rows.
    Tensor non_finite_device, non_finite_host;
    std::unique_ptr<PendingDownload> copy, non_finite_copy;
    std::vector<std::unique_ptr<Sequence>> finishing;  // done once these rows are stored
  };
  std::unique_ptr<PendingCapture> StartCapture(const std::vector<ScheduledChunk>& chunks, Tensor captured);
  void FinishCapture(std::vector<std::unique_ptr<Sequence>>& finished);
  void StoreCaptured(const PendingCapture& step);
  // Fails (and stops) each sequence with a non-finite row in the step, naming the first.
  void FailNonFinite(const PendingCapture& step);
  void CopyCachedRows(Sequence& seq);
  // Lets a finished sequence's blocks go (cached ones stay reusable) and hands it back.
  void Retire(std::unique_ptr<Sequence> seq, std::vector<std::unique_ptr<Sequence>>& finished);
  // Registers seq's prompt blocks within `tokens` for reuse, if they hold what a reuser
  // needs: KV always, captured rows when the engine captures.
  void Commit(Sequence& seq, int tokens);

  Model& model_;
  EngineConfig config_;
  KVCache cache_;
  BlockManager blocks_;
  Scheduler scheduler_;
  EngineStats stats_;
  Tensor host_buffers_[2];
  // Prefix caching with capture: every computed prompt row, by KV slot, so sequences
  // that reuse cached blocks also get those blocks' hidden states. [slots, L, H].
  Tensor capture_cache_;
  std::unique_ptr<PendingCapture> pending_;
  std::vector<std::unique_ptr<Sequence>> aborted_;  // handed back by the next Step
  // HSX_PROFILE=1: seconds in forward (synchronized), capture download, capture store.
  bool profile_ = std::getenv("HSX_PROFILE") != nullptr;
  double profile_seconds_[3] = {0, 0, 0};
};

}  // namespace hsx
