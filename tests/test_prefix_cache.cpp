// Prefix caching keeps captured hidden states with their blocks: a request whose
// prompt starts like an earlier one computes only the rest, yet its file holds the full
// [T, L, H], equal to a cold run (vLLM returns short files here: vllm issue #44485).
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "test_util.h"

namespace hsx {
namespace {

class PrefixCacheTest : public test::Qwen3FixtureTest {
 protected:

  EngineConfig Config(bool prefix_caching, int num_blocks = 64) {
    EngineConfig c;
    c.enable_prefix_caching = prefix_caching;
    c.num_blocks = num_blocks;
    c.capture_dtype = DType::kF32;
    c.capture_layers = {0, 2, 4};
    return c;
  }

  std::unique_ptr<Sequence> Run(Engine& engine, const std::string& id, std::vector<int32_t> prompt, int new_tokens = 0) {
    EXPECT_TRUE(engine.Add({id, std::move(prompt), new_tokens}).ok());
    std::unique_ptr<Sequence> out;
    while (engine.has_work())
      for (auto& s : engine.Step()) out = std::move(s);
    return out;
  }


};

TEST_F(PrefixCacheTest, SharedPrefixGetsFullColdStatesAndComputesOnlyTheRest) {
  // B shares A's first 100 tokens (6 full blocks of 16), then goes its own way.
  const std::vector<int32_t> a = Prompt(2);
  std::vector<int32_t> b(a.begin(), a.begin() + 100);
  const std::vector<int32_t> tail = Prompt(1);
  b.insert(b.end(), tail.begin(), tail.begin() + 20);

  Engine cold(*model_, Config(false));
  const auto cold_b = Run(cold, "b", b);

  Engine warm(*model_, Config(true));
  Run(warm, "a", a);
  const uint64_t before = warm.stats().tokens_computed;
  const auto warm_b = Run(warm, "b", b);
  EXPECT_EQ(warm.stats().tokens_computed - before, 120u - 96u) << "the 96 cached tokens were computed again";
  EXPECT_GT(warm.prefix_cache_hit_rate(), 0.0);
  ASSERT_EQ(warm_b->hidden_states.shape(), (Shape{120, 3, 64}));
  EXPECT_LE(test::RelativeMaxError(test::AsFloats(warm_b->hidden_states), test::AsFloats(cold_b->hidden_states)), 1e-5);
}

TEST_F(PrefixCacheTest, RepeatedPromptRecomputesOnlyItsLastBlockAndGeneratesTheSame) {
  Engine engine(*model_, Config(true));
  const auto first = Run(engine, "p", Prompt(2), 8);
  const uint64_t before = engine.stats().tokens_computed;
  const auto second = Run(engine, "p-again", Prompt(2), 8);
  // 130 tokens: 8 full blocks (128) are reused; 2 prompt tokens and 7 decode steps run.
  EXPECT_EQ(engine.stats().tokens_computed - before, 2u + 7u);
  EXPECT_EQ(second->generated(), test::AsIds(golden_->Get("greedy_2").value()));
  // The last two rows ran in a 2-token batch instead of 130: equal up to f32 GEMM rounding.
  EXPECT_LE(test::RelativeMaxError(test::AsFloats(second->hidden_states), test::AsFloats(first->hidden_states)), 1e-5);
}

TEST_F(PrefixCacheTest, EvictedBlocksAreRecomputedCorrectly) {
  // Room for about one long prompt: each new prompt evicts the previous one's blocks.
  Engine engine(*model_, Config(true, 10));
  const auto first = Run(engine, "a", Prompt(2));
  Run(engine, "b", Prompt(1));
  std::vector<int32_t> other = Prompt(2);
  for (int32_t& t : other) t = (t + 1) % 512;
  Run(engine, "c", other);
  const uint64_t before = engine.stats().tokens_computed;
  const auto again = Run(engine, "a-again", Prompt(2));
  EXPECT_EQ(engine.stats().tokens_computed - before, 130u) << "expected a cold recompute after eviction";
  EXPECT_EQ(test::AsFloats(again->hidden_states), test::AsFloats(first->hidden_states));
}

}  // namespace
}  // namespace hsx
