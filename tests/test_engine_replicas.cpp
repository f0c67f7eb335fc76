// Data-parallel serving: two CPU replicas behind EngineReplicas. Requests sharing a
// first block meet on one replica; one whose replica's queue is full goes to the other;
// an abort reaches the replica that holds the request; stats are the replicas' summed.
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "backend/cpu/cpu_backend.h"
#include "engine/replica_router.h"
#include "engine/engine_replicas.h"
#include "test_util.h"

namespace hsx {
namespace {

struct Outcome {
  Status status;
  std::vector<int32_t> generated;
};

class EngineReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < 2; ++r) {
      auto m = Model::Load(test::ModelDir("qwen3"), backends_[r]);
      ASSERT_TRUE(m.ok()) << m.status().message();
      models_[r] = std::move(m).value();
    }
  }
  // Two replicas, each taking `max_queued` requests at most.
  std::unique_ptr<EngineReplicas> Make(size_t max_queued) {
    EngineConfig config;
    config.num_blocks = 600;
    std::vector<std::unique_ptr<EngineService>> services;
    for (auto& m : models_) services.push_back(std::make_unique<EngineService>(*m, config, max_queued));
    return std::make_unique<EngineReplicas>(std::move(services), config.block_size, 4);
  }
  EngineReplicas::Callback Record(std::promise<Outcome>& p) {
    return [&p](const Status& s, std::unique_ptr<Sequence> seq) {
      p.set_value({s, seq ? seq->generated() : std::vector<int32_t>{}});
    };
  }
  static Outcome Await(std::future<Outcome>& f) {
    if (f.wait_for(std::chrono::minutes(2)) != std::future_status::ready) {
      ADD_FAILURE() << "no callback within 2 minutes";
      return {Error("no callback"), {}};
    }
    return f.get();
  }

  CpuBackend backends_[2];
  std::unique_ptr<Model> models_[2];
};

std::vector<int32_t> Prompt(int32_t first, int len) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back((first + i * 7) % 500);
  return p;
}

TEST_F(EngineReplicasTest, ASharedFirstBlockMeetsOnItsReplica) {
  // Promises outlive the replicas, whose Shutdown may still run callbacks.
  std::promise<Outcome> done[4];
  std::future<Outcome> results[4];
  for (int i = 0; i < 4; ++i) results[i] = done[i].get_future();
  auto replicas = Make(16);
  // A prefix whose replica is 1: routing by load alone would pick replica 0 at equal loads.
  std::vector<int32_t> shared;
  for (int32_t first = 0; ReplicaRouter(16, 4).Preferred(shared, 2) != 1; ++first) shared = Prompt(first, 24);
  const int home = 1;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = shared;
    p.push_back(i);  // the same first block, a different rest
    ASSERT_TRUE(replicas->Submit({"r" + std::to_string(i), p, 2}, Record(done[i])));
    EXPECT_TRUE(Await(results[i]).status.ok());  // one at a time: loads stay equal, affinity decides
  }
  replicas->Shutdown();
  const auto stats = replicas->replica_stats();
  EXPECT_EQ(stats[static_cast<size_t>(home)].requests_finished, 4u);
  EXPECT_EQ(stats[static_cast<size_t>(1 - home)].requests_finished, 0u);
  EXPECT_EQ(replicas->stats().requests_finished, 4u);
  EXPECT_EQ(replicas->stats().generation_tokens, 8u);
}

TEST_F(EngineReplicasTest, AFullReplicaHandsOnAndAbortsReachTheOwner) {
  std::promise<Outcome> long_done, next_done, refused_done;
  std::future<Outcome> long_result = long_done.get_future(), next_result = next_done.get_future();
  auto replicas = Make(1);
  const std::vector<int32_t> shared = Prompt(5, 20);
  const int home = ReplicaRouter(16, 4).Preferred(shared, 2);
  // A long generation holds its replica's one queue slot...
  ASSERT_TRUE(replicas->Submit({"long", shared, 3000}, Record(long_done)));
  // ...so the next request of the same prefix goes to the other replica,
  std::vector<int32_t> next = shared;
  next.push_back(1);
  ASSERT_TRUE(replicas->Submit({"next", next, 3000}, Record(next_done)));
  // and with both full, a third is refused (its callback never runs).
  EXPECT_FALSE(replicas->Submit({"refused", shared, 1}, Record(refused_done)));
  replicas->Abort("long");
  replicas->Abort("next");
  EXPECT_NE(Await(long_result).status.message().find("'long' was cancelled"), std::string::npos);
  EXPECT_NE(Await(next_result).status.message().find("'next' was cancelled"), std::string::npos);
  replicas->Shutdown();
  const auto stats = replicas->replica_stats();
  EXPECT_EQ(stats[static_cast<size_t>(home)].requests_failed, 1u);
  EXPECT_EQ(stats[static_cast<size_t>(1 - home)].requests_failed, 1u);
  replicas->Abort("long");  // finished: a no-op
}

}  // namespace
}  // namespace hsx
