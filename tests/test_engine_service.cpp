// The engine behind its thread: requests from other threads finish through callbacks,
// a full queue refuses work, shutdown drains what was accepted, and a gathered first
// step waits for its tokens (extract's).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_service.h"
#include "test_util.h"

namespace hsx {
namespace {

// What a callback got. Callbacks run on the engine thread, where a failed ASSERT would
// only return from the callback and leave the test waiting forever: they record, and
// the test thread checks after a bounded wait.
struct Outcome {
  Status status;
  std::unique_ptr<Sequence> seq;
};

Outcome Await(std::future<Outcome>& f) {
  if (f.wait_for(std::chrono::minutes(2)) != std::future_status::ready) {
    ADD_FAILURE() << "no callback within 2 minutes";
    return {Error("no callback"), nullptr};
  }
  return f.get();
}

EngineService::Callback Record(std::promise<Outcome>& p) {
  return [&p](const Status& s, std::unique_ptr<Sequence> seq) { p.set_value({s, std::move(seq)}); };
}

TEST(EngineServiceTest, CallbacksQueueLimitAndDrain) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  SafetensorsFile golden = test::Golden(test::ModelDir("llama") + "/golden.safetensors");
  EngineConfig config;
  config.num_blocks = 64;
  std::atomic<int> ok{0}, failed{0};
  // Declared before the service, so they outlive callbacks that Shutdown may still run.
  std::promise<Outcome> first_done, bad_done;
  std::future<Outcome> first_result = first_done.get_future(), bad_result = bad_done.get_future();
  {
    EngineService service(**model, config, 3);
    ASSERT_TRUE(service.Submit({"a", test::AsIds(golden.Get("prompt_1").value()), 8}, Record(first_done)));
    const Outcome first = Await(first_result);
    ASSERT_TRUE(first.status.ok()) << first.status.message();
    ASSERT_NE(first.seq, nullptr);
    EXPECT_EQ(first.seq->generated(), test::AsIds(golden.Get("greedy_1").value()));
    // A bad request fails alone, through its callback.
    ASSERT_TRUE(service.Submit({"bad", {1, 999}, 1}, Record(bad_done)));
    EXPECT_NE(Await(bad_result).status.message().find("outside the vocabulary"), std::string::npos);
    // At most 3 in the service: a burst beyond that is refused, not buffered.
    int accepted = 0;
    for (int i = 0; i < 20; ++i) {
      accepted += service.Submit({"burst" + std::to_string(i), std::vector<int32_t>(100, 5), 4},
                                 [&](const Status& s, std::unique_ptr<Sequence>) { ++(s.ok() ? ok : failed); });
    }
    EXPECT_GE(accepted, 3);
    EXPECT_LT(accepted, 20);  // far faster to submit than to run: most of the burst is refused
    service.Shutdown();  // drains every accepted request
    EXPECT_EQ(ok.load(), accepted);
    EXPECT_FALSE(service.Submit({"late", {1}, 1}, [](const Status&, std::unique_ptr<Sequence>) {}));
  }
  EXPECT_EQ(failed.load(), 0);
}

// A drain cut short: every unfinished request, running or queued, fails through its
// callback with the reason, and nothing new is accepted.
TEST(EngineServiceTest, AbortAllFailsEveryUnfinishedRequest) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  EngineConfig config;
  config.num_blocks = 300;
  config.scheduler.max_num_seqs = 1;  // the second request waits in the scheduler
  EngineService service(**model, config, 8);
  std::promise<void> started;
  std::atomic<int> tokens{0};
  std::vector<std::promise<std::string>> results(2);
  for (int i = 0; i < 2; ++i) {
    Request r{"long" + std::to_string(i), std::vector<int32_t>(8, 5), 4000};
    if (i == 0) {
      r.on_token = [&](int32_t) {
        if (tokens++ == 0) started.set_value();
      };
    }
    ASSERT_TRUE(service.Submit(std::move(r), [&, i](const Status& s, std::unique_ptr<Sequence> seq) {
      results[i].set_value(s.ok() ? "finished with " + std::to_string(seq->num_generated()) : s.message());
    }));
  }
  started.get_future().get();  // the first is running
  service.AbortAll();
  for (auto& result : results) {
    auto f = result.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);  // not a hang
    EXPECT_NE(f.get().find("the server is shutting down"), std::string::npos);
  }
  EXPECT_FALSE(service.Submit({"late", {1}, 1}, [](const Status&, std::unique_ptr<Sequence>) {}));
  service.Shutdown();
}

// FinishAt from another thread (the server's, which found a stop string) ends the request
// at that token while the engine has run on: the callback gets it cut back, OK and stopped.
TEST(EngineServiceTest, FinishAtEndsARunningRequestAtAToken) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  EngineConfig config;
  config.num_blocks = 300;
  EngineService service(**model, config, 8);
  std::vector<int32_t> seen;  // engine thread only, read after the callback
  std::promise<Outcome> result;
  Request r{"long", std::vector<int32_t>(8, 5), 4000};
  r.on_token = [&](int32_t token) {
    seen.push_back(token);
    if (seen.size() == 5) service.FinishAt("long", 2);  // as a handler thread would, a few tokens late
  };
  ASSERT_TRUE(service.Submit(std::move(r), Record(result)));
  auto f = result.get_future();
  Outcome out = Await(f);
  ASSERT_TRUE(out.status.ok()) << out.status.message();
  ASSERT_TRUE(out.seq);
  ASSERT_GE(seen.size(), 5u);
  EXPECT_EQ(out.seq->generated(), std::vector<int32_t>(seen.begin(), seen.begin() + 2));
  EXPECT_TRUE(out.seq->stopped());
  service.FinishAt("long", 1);  // finished already: nothing to do
  service.Shutdown();
}

// A batch goes in whole or not at all, so a server never runs part of a request.
TEST(EngineServiceTest, SubmitAllTakesAllOrNone) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  EngineConfig config;
  config.num_blocks = 64;
  std::atomic<int> called{0};
  EngineService service(**model, config, 3);
  auto batch = [&](int n) {
    std::vector<std::pair<Request, EngineService::Callback>> requests;
    for (int i = 0; i < n; ++i) {
      requests.emplace_back(Request{"r" + std::to_string(n) + "-" + std::to_string(i), {1, 2, 3}, 2},
                            [&](const Status&, std::unique_ptr<Sequence>) { ++called; });
    }
    return requests;
  };
  EXPECT_FALSE(service.SubmitAll(batch(4)));  // more than the queue holds: none of it
  service.Shutdown();
  EXPECT_EQ(called.load(), 0);
  EngineService fresh(**model, config, 3);
  EXPECT_TRUE(fresh.SubmitAll(batch(3)));
  fresh.Shutdown();
  EXPECT_EQ(called.load(), 3);
}

// extract's first step: it waits for a step's worth of prompt tokens, a full queue or
// Close, never runs a request alone that came first, and later steps go as work comes.
TEST(EngineServiceTest, AGatheredStepWaitsForItsTokensAFullQueueOrClose) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  EngineConfig config;
  config.num_blocks = 64;
  std::atomic<int> done{0};
  auto count = [&](const Status& s, std::unique_ptr<Sequence>) { done += s.ok() ? 1 : 100; };
  auto settled = [&](int n) {  // n callbacks within a minute
    for (int i = 0; i < 600 && done.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return done.load() == n;
  };
  {  // by tokens: 10 are held, 10 more make the 20 it waits for
    EngineService service(**model, config, 8);
    service.GatherNextStep(20);
    ASSERT_TRUE(service.Submit({"a", std::vector<int32_t>(10, 5), 0}, count));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a tiny CPU step: it would have run
    EXPECT_EQ(done.load(), 0);
    EXPECT_EQ(service.stats().steps, 0u);
    EXPECT_EQ(service.load(), 1u);
    ASSERT_TRUE(service.Submit({"b", std::vector<int32_t>(10, 6), 0}, count));
    ASSERT_TRUE(settled(2));
    for (int i = 0; i < 100 && service.stats().steps == 0; ++i) {  // stats follow the callbacks
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(service.stats().steps, 1u);  // both prompts in one step
    // Gathered once: a later request runs at once.
    ASSERT_TRUE(service.Submit({"c", std::vector<int32_t>(3, 7), 0}, count));
    EXPECT_TRUE(settled(3));
  }
  done = 0;
  {  // by a full queue: two short prompts fill max_queued 2
    EngineService service(**model, config, 2);
    service.GatherNextStep(1000);
    ASSERT_TRUE(service.Submit({"a", {1, 2, 3}, 0}, count));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(done.load(), 0);
    ASSERT_TRUE(service.Submit({"b", {4, 5, 6}, 0}, count));
    EXPECT_TRUE(settled(2));
  }
  done = 0;
  {  // by Close: the end of the input runs what came
    EngineService service(**model, config, 8);
    service.GatherNextStep(1000);
    ASSERT_TRUE(service.Submit({"a", {1, 2, 3}, 0}, count));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(done.load(), 0);
    service.Close();
    EXPECT_FALSE(service.Submit({"late", {1}, 0}, count));
    EXPECT_TRUE(settled(1));
    service.Shutdown();
  }
}

}  // namespace
}  // namespace hsx
