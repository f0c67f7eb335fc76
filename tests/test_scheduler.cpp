// The scheduler alone, stepped by a stand-in for the engine (a scheduled chunk is computed
// at once; a sequence whose tokens are all computed gets its next token): one request's
// many choices must not starve a request behind them, and single-choice requests stay FCFS.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/block_manager.h"
#include "engine/scheduler.h"

namespace hsx {
namespace {

class SchedulerSim {
 public:
  SchedulerSim(int num_blocks, int max_num_seqs, int budget = 256)
      : scheduler_(SchedulerConfig{budget, max_num_seqs}, BlockManager(num_blocks, /*block_size=*/4, /*prefix_caching=*/false)) {}

  void Add(const std::string& id, const std::string& group, int prompt_len, int max_new_tokens) {
    Request r;
    r.id = id;
    r.group = group;
    r.prompt.assign(prompt_len, 7);
    r.max_new_tokens = max_new_tokens;
    scheduler_.Add(std::make_unique<Sequence>(std::move(r)));
  }

  // One step; returns the ids scheduled, in order.
  std::vector<std::string> Step() {
    std::vector<std::string> ids;
    std::vector<Sequence*> finished;
    for (const ScheduledChunk& c : scheduler_.Schedule()) {
      ids.push_back(c.seq->id());
      if (!first_step_.count(c.seq->id())) first_step_[c.seq->id()] = steps_;
      c.seq->num_computed += c.num_tokens;
      if (c.seq->num_computed == c.seq->num_tokens()) {
        c.seq->Append(1);
        if (!c.seq->wants_more_tokens()) finished.push_back(c.seq);
      }
    }
    for (Sequence* seq : finished) {
      done_[seq->id()] = steps_;
      scheduler_.Release(*scheduler_.Detach(seq));
    }
    ++steps_;
    return ids;
  }
  void RunUntil(const std::string& id, int max_steps) {
    while (!done_.count(id) && steps_ < max_steps && scheduler_.has_work()) Step();
  }

  Scheduler& scheduler() { return scheduler_; }
  int steps() const { return steps_; }
  std::map<std::string, int> first_step_, done_;

 private:
  Scheduler scheduler_;
  int steps_ = 0;
};

// A request of 64 choices x 100 tokens fills every slot (or every block); a 1-token
// request sent after it must run within a few steps, not after the big one's ~800.
void ExpectSmallRequestIsNotStarved(int num_blocks, int max_num_seqs) {
  SchedulerSim sim(num_blocks, max_num_seqs);
  for (int j = 0; j < 64; ++j) sim.Add("big-" + std::to_string(j), "big", 8, 100);
  for (int s = 0; s < 5; ++s) sim.Step();
  ASSERT_FALSE(sim.done_.count("big-0"));
  const int sent = sim.steps();
  sim.Add("small", "", 4, 1);
  sim.RunUntil("small", sent + 50);
  ASSERT_TRUE(sim.done_.count("small")) << "the small request is still waiting after 50 steps";
  EXPECT_LE(sim.done_["small"] - sent, 4);
  // The big request still finishes, every choice of it.
  sim.RunUntil("", 100000);
  EXPECT_EQ(sim.done_.size(), 65u);
  EXPECT_FALSE(sim.scheduler().has_work());
}

TEST(SchedulerTest, ManyChoicesHoldingEverySlotDoNotStarveALaterRequest) {
  ExpectSmallRequestIsNotStarved(/*num_blocks=*/4096, /*max_num_seqs=*/8);
}

TEST(SchedulerTest, ManyChoicesHoldingEveryBlockDoNotStarveALaterRequest) {
  // 8 choices' prompts and outputs (27 blocks each) fill the cache well before 64 slots.
  ExpectSmallRequestIsNotStarved(/*num_blocks=*/8 * 27, /*max_num_seqs=*/64);
}

// Single-choice requests are each their own group: admitted strictly in arrival order.
TEST(SchedulerTest, SingleChoiceRequestsStayFirstComeFirstServed) {
  SchedulerSim sim(4096, 3);
  for (int k = 0; k < 10; ++k) sim.Add("r" + std::to_string(k), "", 8, 5 + k % 3);
  sim.RunUntil("", 1000);
  ASSERT_EQ(sim.first_step_.size(), 10u);
  for (int k = 1; k < 10; ++k) {
    EXPECT_LE(sim.first_step_["r" + std::to_string(k - 1)], sim.first_step_["r" + std::to_string(k)]) << k;
  }
  EXPECT_EQ(sim.scheduler().num_preemptions(), 0u);
}

// Two large requests share the slots without preempting each other back and forth: the
// later one is let in once (one preemption), then waits for slots like any other.
TEST(SchedulerTest, TwoLargeRequestsDoNotThrash) {
  SchedulerSim sim(4096, 8);
  for (int j = 0; j < 16; ++j) sim.Add("a-" + std::to_string(j), "a", 8, 20);
  sim.Step();
  for (int j = 0; j < 16; ++j) sim.Add("b-" + std::to_string(j), "b", 8, 20);
  sim.RunUntil("", 10000);
  EXPECT_EQ(sim.done_.size(), 32u);
  EXPECT_LE(sim.first_step_["b-0"], 3);
  EXPECT_LE(sim.scheduler().num_preemptions(), 2u);
}

}  // namespace
}  // namespace hsx
