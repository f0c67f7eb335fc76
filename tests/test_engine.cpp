// The engine against the goldens: greedy continuations token for token and hidden
// states row for row, under chunked prefill, batching and preemption.
#include <gtest/gtest.h>

#include <map>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "test_util.h"

namespace hsx {
namespace {

struct EngineRun {
  std::map<std::string, std::unique_ptr<Sequence>> done;
  uint64_t steps = 0;
};

EngineRun RunAll(Engine& engine, const SafetensorsFile& golden, int max_new_tokens) {
  for (int k = 0; k < 3; ++k) {
    Request r;
    r.id = "p" + std::to_string(k);
    r.prompt = test::AsIds(golden.Get("prompt_" + std::to_string(k)).value());
    r.max_new_tokens = max_new_tokens;
    Status s = engine.Add(std::move(r));
    EXPECT_TRUE(s.ok()) << s.message();
  }
  EngineRun run;
  while (engine.has_work()) {
    for (auto& seq : engine.Step()) run.done[seq->id()] = std::move(seq);
    ++run.steps;
  }
  return run;
}

class EngineGoldenTest : public ::testing::TestWithParam<std::string> {};

// A 48-token budget splits the 130-token prompt over three steps while the short ones
// decode beside it; every layer's states must still equal the cold golden.
TEST_P(EngineGoldenTest, ChunkedPrefillGreedyAndHiddenStatesMatchGolden) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir(GetParam()), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir(GetParam()) + "/golden.safetensors");
  EngineConfig config;
  config.scheduler.max_num_batched_tokens = 48;
  config.num_blocks = 64;
  config.capture_dtype = DType::kF32;
  for (int i = 0; i <= (*model)->config().num_layers; ++i) config.capture_layers.push_back(i);
  Engine engine(**model, config);
  EngineRun run = RunAll(engine, golden, 8);
  ASSERT_EQ(run.done.size(), 3u);
  EXPECT_GE(run.steps, 3u);
  for (int k = 0; k < 3; ++k) {
    const Sequence& seq = *run.done["p" + std::to_string(k)];
    EXPECT_EQ(seq.generated(), test::AsIds(golden.Get("greedy_" + std::to_string(k)).value())) << "prompt " << k;
    EXPECT_LE(test::RelativeMaxError(test::AsFloats(seq.hidden_states),
                                     test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value())),
              1e-4)
        << "prompt " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, EngineGoldenTest, ::testing::ValuesIn(test::FixtureModels()),
                         [](const auto& info) { return info.param; });

// With KV room for about one long sequence at a time, sequences are preempted and
// recomputed, and the outputs stay exact.
TEST(EngineTest, PreemptionByRecomputeKeepsGreedyExact) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  SafetensorsFile golden = test::Golden(test::ModelDir("qwen3") + "/golden.safetensors");
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 36;  // 144 slots: the 138-token sequence alone nearly fills it
  config.scheduler.max_num_batched_tokens = 32;
  Engine engine(**model, config);
  EngineRun run = RunAll(engine, golden, 8);
  ASSERT_EQ(run.done.size(), 3u);
  EXPECT_GT(engine.num_preemptions(), 0u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(run.done["p" + std::to_string(k)]->generated(),
              test::AsIds(golden.Get("greedy_" + std::to_string(k)).value()));
  }
}

TEST(EngineTest, RejectsBadRequestsAlone) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  EngineConfig config;
  config.num_blocks = 8;
  Engine engine(**model, config);
  Status empty = engine.Add({"e", {}, 0});
  EXPECT_NE(empty.message().find("request 'e': empty prompt"), std::string::npos) << empty.message();
  Status oov = engine.Add({"o", {1, 2, 512}, 0});
  EXPECT_NE(oov.message().find("token id 512 at position 2 is outside the vocabulary [0, 512)"), std::string::npos)
      << oov.message();
  Status huge = engine.Add({"h", std::vector<int32_t>(200, 5), 0});
  EXPECT_NE(huge.message().find("do not fit the KV cache"), std::string::npos) << huge.message();
  EXPECT_TRUE(engine.Add({"ok", {1, 2, 3}, 2}).ok());
  std::vector<std::unique_ptr<Sequence>> done;
  while (engine.has_work())
    for (auto& s : engine.Step()) done.push_back(std::move(s));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->num_generated(), 2);
}

}  // namespace
}  // namespace hsx

namespace hsx {
namespace {

// A cancelled request (its client went away) comes back marked aborted and its KV
// blocks return to the pool, mid-prefill as well as while queued.
TEST(EngineTest, AbortFreesBlocksAndReportsTheRequest) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  EngineConfig config;
  config.num_blocks = 32;
  config.scheduler.max_num_batched_tokens = 16;
  config.capture_layers = {1};
  Engine engine(**model, config);
  const int baseline = engine.num_free_blocks();
  ASSERT_TRUE(engine.Add({"long", std::vector<int32_t>(200, 7), 0}).ok());
  ASSERT_TRUE(engine.Add({"queued", std::vector<int32_t>(50, 9), 0}).ok());
  engine.Step();  // "long" is partway through its prefill
  EXPECT_LT(engine.num_free_blocks(), baseline);
  EXPECT_TRUE(engine.Abort("long"));
  EXPECT_TRUE(engine.Abort("queued"));
  EXPECT_FALSE(engine.Abort("never-added"));
  std::vector<std::unique_ptr<Sequence>> done;
  while (engine.has_work())
    for (auto& s : engine.Step()) done.push_back(std::move(s));
  ASSERT_EQ(done.size(), 2u);
  for (const auto& s : done) EXPECT_TRUE(s->aborted) << s->id();
  EXPECT_EQ(engine.num_free_blocks(), baseline);
}

}  // namespace
}  // namespace hsx
