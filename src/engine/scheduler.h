// Decides what each step computes: FCFS under a token budget. Running sequences go
// first (decodes and the rest of chunked prefills), then waiting ones are admitted; a
// prompt longer than the budget is spread over steps (chunked prefill). When KV blocks
// run out the newest running sequence is preempted and later recomputed.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace hsx {

struct SchedulerConfig {
  int max_num_batched_tokens = 8192;
  int max_num_seqs = 256;
};

struct ScheduledChunk {
  Sequence* seq;
  int num_tokens;  // tokens computed this step, starting at seq->num_computed (drafts last)
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockManager& blocks) : config_(config), blocks_(blocks) {}

  void Add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }
  std::vector<ScheduledChunk> Schedule();
  // Removes a running sequence; its blocks stay held until the caller releases them
  // (after the last of its captured rows are stored and its blocks registered).
  std::unique_ptr<Sequence> Detach(Sequence* seq);
  // Removes a waiting or running sequence by request id (nullptr if unknown); blocks stay held.
  std::unique_ptr<Sequence> Remove(const std::string& id);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  uint64_t num_preemptions() const { return preemptions_; }

 private:
  void Preempt();  // the newest running sequence goes back to the front of the queue

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  uint64_t preemptions_ = 0;
};

}  // namespace hsx
