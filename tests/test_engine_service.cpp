// The engine behind its thread: requests from other threads finish through callbacks,
// a full queue refuses work, and shutdown drains what was accepted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

#include "backend/cpu/cpu_backend.h"
#include "server/engine_service.h"
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

}  // namespace
}  // namespace hsx
