// Prefix caching keeps captured hidden states with their blocks: a request whose
// prompt starts like an earlier one computes only the rest, yet its file holds the full
// [T, L, H], equal to a cold run (vLLM returns short files here: vllm issue #44485).
#include <gtest/gtest.h>

#include <map>

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

// Many prompts sharing prefixes, generating, in a cache too small for them all: chunked
// prefill, preemption, re-admission onto cached blocks and eviction interleave. Every
// file and every token must equal the prompt run alone without prefix caching.
TEST_F(PrefixCacheTest, SharedPrefixesUnderPreemptionMatchColdRuns) {
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int32_t> base = Prompt(2);  // 130 tokens
  for (int i = 0; i < 10; ++i) {
    const int shared = 16 * (1 + i % 4) + (i % 3);  // 1-4 blocks, sometimes a partial one
    std::vector<int32_t> p(base.begin(), base.begin() + shared);
    // A tail of its own: 5 to 32 tokens from further on in the same prompt.
    p.insert(p.end(), base.begin() + 70 + i, base.begin() + 70 + i + 5 + 3 * i);
    prompts.push_back(std::move(p));
  }
  constexpr int kNew = 6;
  std::vector<std::unique_ptr<Sequence>> cold;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine engine(*model_, Config(false));
    cold.push_back(Run(engine, "cold", prompts[i], kNew));
  }

  EngineConfig c = Config(true, 14);  // 224 slots for ~540 prompt tokens and 60 new ones
  c.scheduler.max_num_batched_tokens = 48;
  c.scheduler.max_num_seqs = 6;
  Engine engine(*model_, c);
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE(engine.Add({"p" + std::to_string(i), prompts[i], kNew}).ok());
  std::map<std::string, std::unique_ptr<Sequence>> done;
  while (engine.has_work())
    for (auto& s : engine.Step()) done[s->id()] = std::move(s);
  ASSERT_EQ(done.size(), prompts.size());
  EXPECT_GT(engine.prefix_cache_hit_rate(), 0.0);
  int preemptions = 0;
  for (const auto& [id, seq] : done) preemptions += seq->preemptions;
  EXPECT_GT(preemptions, 0) << "the cache was meant to be too small";
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Sequence& seq = *done.at("p" + std::to_string(i));
    EXPECT_EQ(seq.generated(), cold[i]->generated()) << "prompt " << i;
    ASSERT_EQ(seq.hidden_states.shape(), cold[i]->hidden_states.shape()) << "prompt " << i;
    EXPECT_LE(test::RelativeMaxError(test::AsFloats(seq.hidden_states), test::AsFloats(cold[i]->hidden_states)), 1e-5)
        << "prompt " << i;
  }
}

}  // namespace
}  // namespace hsx
