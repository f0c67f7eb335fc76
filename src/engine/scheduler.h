// Decides what each step computes: FCFS under a token budget. Running sequences go
// first (decodes and the rest of chunked prefills), then waiting ones are admitted; a
// prompt longer than the budget is spread over steps (chunked prefill). When KV blocks
// run out a running sequence is preempted and later recomputed: the newest of the group
// holding the most.
//
// Fair between groups (a request's n choices are one group): admission first takes
// waiting sequences whose group holds fewer than its share of the sequence slots
// (max_num_seqs / groups present), then the rest, each pass in queue order; and when a
// sequence of a group holding nothing could not be admitted (no slot or no blocks), the
// next step preempts one sequence of the group holding the most, if it holds more than
// its share. So a request arriving behind a large one runs within a few steps instead of
// after all of it. Sequences of single-choice requests are each their own group, so
// among them this is plain FCFS.
//
// The scheduler alone owns the KV blocks (its BlockManager): it reserves them for what it
// schedules, and the engine and drafters go through it to register blocks for prefix
// sharing, reserve a drafter's lookahead slots and free a finished sequence's blocks.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
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
  Scheduler(SchedulerConfig config, BlockManager blocks) : config_(config), blocks_(std::move(blocks)) {}

  void Add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }
  std::vector<ScheduledChunk> Schedule();
  // Removes a running sequence; its blocks stay held until the caller releases them
  // (after the last of its captured rows are stored and its blocks registered).
  std::unique_ptr<Sequence> Detach(Sequence* seq);
  // Removes a waiting or running sequence by request id (nullptr if unknown); blocks stay held.
  std::unique_ptr<Sequence> Remove(const std::string& id);
  // Frees the blocks of a sequence Detach or Remove handed back (cached ones stay reusable).
  void Release(Sequence& seq) { blocks_.Release(seq); }
  // Registers seq's full prompt blocks within its first `tokens` tokens for prefix sharing
  // (BlockManager::Commit): the caller knows their KV and captured rows are complete.
  void Commit(Sequence& seq, int tokens) { blocks_.Commit(seq, tokens); }
  // A drafter's slots past what this step scheduled (EAGLE-3's chained steps write draft
  // KV up to position tokens - 1): grows seq's block table; false (no change) if short of blocks.
  bool ReserveLookahead(Sequence& seq, int tokens) { return blocks_.Reserve(seq, tokens); }

  // Whether a sequence of `tokens` tokens could ever fit the KV cache (all blocks its own).
  bool Fits(int64_t tokens) const {
    return tokens <= static_cast<int64_t>(blocks_.num_blocks()) * blocks_.block_size();
  }
  int num_blocks() const { return blocks_.num_blocks(); }
  int num_free_blocks() const { return blocks_.num_free_blocks(); }
  int block_size() const { return blocks_.block_size(); }
  // Prompt tokens served from cached blocks, over prompt tokens looked up.
  double prefix_cache_hit_rate() const {
    return blocks_.queries() ? static_cast<double>(blocks_.hits()) / blocks_.queries() : 0.0;
  }

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  uint64_t num_preemptions() const { return preemptions_; }

 private:
  // running_[index] goes back to the front of the queue, its blocks released.
  void Preempt(size_t index);
  // The running sequence at or after `from` to preempt: of those whose group holds the most
  // running sequences, the newest (running_.back() when every group holds as many).
  size_t Victim(size_t from) const;
  int Held(const Sequence& seq) const;

  SchedulerConfig config_;
  BlockManager blocks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  uint64_t preemptions_ = 0;
  // Running sequences per group; groups holding none are absent.
  std::map<std::string, int, std::less<>> held_;
  // Set when a sequence whose group held nothing could not be admitted for want of a
  // slot or blocks: the next step makes room by preempting the largest group's newest.
  bool starved_ = false;
};

}  // namespace hsx
