// Speculative decoding in the engine, held to losslessness: with n-gram drafts verified
// by the VerifyDrafts op, greedy output is token for token the plain decode's, on every
// fixture model, under chunked prefill, batching and preemption. The batch-invariant CPU
// backend gives a row the same logits whether it runs alone or beside drafts, so any
// difference is the engine's; and the speculative config's errors name their field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "engine/draft_length.h"
#include "engine/engine.h"
#include "engine/speculative_config.h"
#include "model/eagle3_draft.h"
#include "model/kv_cache.h"
#include "model/mtp_drafter.h"
#include "engine_runs.h"
#include "sampling_reference.h"
#include "test_util.h"

namespace hsx {
namespace {

using test::Generation;
using test::RunAll;

// The three golden prompts and one that repeats itself (so prompt lookup finds matches
// from the start), batched.
Generation Generate(Model& model, const SafetensorsFile& golden, const EngineConfig& config, int max_new_tokens) {
  return test::Generate(model, test::GoldenPrompts(golden, /*with_loop=*/true), config, max_new_tokens);
}

class SpeculativeGreedyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeGreedyTest, NgramDraftsLeaveGreedyOutputUnchanged) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir(GetParam()), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir(GetParam()) + "/golden.safetensors");
  EngineConfig plain;
  plain.scheduler.max_num_batched_tokens = 48;  // chunked prefill beside decodes and verifications
  const Generation reference = Generate(**model, golden, plain, 40);
  for (int k : {1, 3, 5}) {
    EngineConfig speculative = plain;
    speculative.ngram = {k, 1, 3};
    const Generation run = Generate(**model, golden, speculative, 40);
    EXPECT_EQ(run.tokens, reference.tokens) << GetParam() << " K=" << k;
    EXPECT_GT(run.stats.num_draft_tokens, 0u) << "no drafts were verified";
    std::printf("[ngram] %-15s K=%d accepted %lu of %lu drafts, %lu steps (plain %lu)\n", GetParam().c_str(), k,
                static_cast<unsigned long>(run.stats.num_accepted_tokens),
                static_cast<unsigned long>(run.stats.num_draft_tokens), static_cast<unsigned long>(run.stats.steps),
                static_cast<unsigned long>(reference.stats.steps));
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, SpeculativeGreedyTest, ::testing::ValuesIn(test::FixtureModels()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(GptOss, SpeculativeGreedyTest, ::testing::ValuesIn(test::GptOssFixtureModels()),
                         [](const auto& info) { return info.param; });

// KV room for about one long sequence: sequences are preempted (their drafts dropped) and
// recomputed, and the output stays the plain decode's.
TEST(SpeculativeEngineTest, PreemptionKeepsGreedyExact) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  SafetensorsFile golden = test::Golden(test::ModelDir("qwen3") + "/golden.safetensors");
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 48;
  config.scheduler.max_num_batched_tokens = 32;
  const Generation reference = Generate(**model, golden, config, 16);
  config.ngram = {4, 1, 2};
  const Generation run = Generate(**model, golden, config, 16);
  EXPECT_EQ(run.tokens, reference.tokens);
  EXPECT_GT(run.stats.num_draft_tokens, 0u);
}

// One request alone: its tokens are run.tokens.at("alone").
Generation RunAlone(Model& model, const EngineConfig& config, std::vector<int32_t> prompt, int max_new_tokens) {
  Request r;
  r.id = "alone";
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new_tokens;
  std::vector<Request> one;
  one.push_back(std::move(r));
  return RunAll(model, config, std::move(one));
}

// EAGLE-3 drafts from speculators' checkpoints: the greedy output is the plain decode's,
// whatever the draft (llama_copy proposes the current token again, so the target's
// repetitions get accepted; the random drafts are never accepted), with K = 1 and 3.
class Eagle3EngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Eagle3EngineTest, DraftsLeaveGreedyOutputUnchanged) {
  CpuBackend backend(/*batch_invariant=*/true);
  const std::string variant = GetParam();
  const std::string target = test::Eagle3Target(variant);
  auto model = Model::Load(test::ModelDir(target), backend);
  ASSERT_TRUE(model.ok());
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir(target) + "/golden.safetensors");
  EngineConfig plain;
  plain.scheduler.max_num_batched_tokens = 48;
  const Generation reference = Generate(**model, golden, plain, 24);
  for (int k : {1, 3}) {
    EngineConfig speculative = plain;
    speculative.eagle3 = {draft->get(), k};
    const Generation run = Generate(**model, golden, speculative, 24);
    EXPECT_EQ(run.tokens, reference.tokens) << variant << " K=" << k;
    EXPECT_GT(run.stats.num_draft_tokens, 0u);
    if (variant == "llama_copy") {
      EXPECT_GT(run.stats.num_accepted_tokens, 0u);
    }
    std::printf("[eagle3] %-13s K=%d accepted %lu of %lu drafts, %lu steps (plain %lu)\n", variant.c_str(), k,
                static_cast<unsigned long>(run.stats.num_accepted_tokens),
                static_cast<unsigned long>(run.stats.num_draft_tokens), static_cast<unsigned long>(run.stats.steps),
                static_cast<unsigned long>(reference.stats.steps));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Eagle3EngineTest, ::testing::Values("llama_legacy", "qwen3_default", "llama_copy"),
                         [](const auto& info) { return info.param; });

// hsx bench --spec-bench-accept-rate through the engine: with llama_copy (whose drafts the
// target partly accepts) a = 0 accepts none and a = 1 every one, whatever the target says.
TEST(Eagle3EngineTest, ForcedAcceptanceRateOverridesVerification) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/llama_copy"), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir("llama") + "/golden.safetensors");
  EngineConfig config;
  config.eagle3 = {draft->get(), 3};
  ASSERT_GT(Generate(**model, golden, config, 24).stats.num_accepted_tokens, 0u);
  config.spec_bench_accept_rate = 0.0f;
  const Generation none = Generate(**model, golden, config, 24);
  EXPECT_GT(none.stats.num_draft_tokens, 0u);
  EXPECT_EQ(none.stats.num_accepted_tokens, 0u);
  config.spec_bench_accept_rate = 1.0f;
  const Generation all = Generate(**model, golden, config, 24);
  EXPECT_GT(all.stats.num_draft_tokens, 0u);
  EXPECT_EQ(all.stats.num_accepted_tokens, all.stats.num_draft_tokens);
}

// The KV budget pays for the draft's cache too: an EAGLE-3 engine given the bytes of N
// blocks of target KV gets fewer blocks, exactly budget / (target + draft bytes per block).
TEST(Eagle3EngineTest, DraftKvCountsInTheKvBudget) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/llama_legacy"), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  EngineConfig config;
  config.block_size = 16;
  const size_t target = KVCache::BytesPerToken((*model)->config(), backend.compute_dtype()) * 16;
  const size_t drafted = KVCache::BytesPerToken((*draft)->decoder(), backend.compute_dtype()) * 16;
  ASSERT_GT(drafted, 0u);
  config.kv_cache_bytes = 100 * target;
  EXPECT_EQ(Engine(**model, config).num_blocks(), 100);
  config.eagle3 = {draft->get(), 3};
  EXPECT_EQ(Engine(**model, config).num_blocks(), static_cast<int>(100 * target / (target + drafted)));
  EXPECT_LT(Engine(**model, config).num_blocks(), 100);
}

// EAGLE-3 with prefix caching: a request served from cached blocks (filled by a request that
// finished in the step it filled them) decodes greedily like the plain engine; and with every
// draft accepted (the benchmark's forced rate 1, so the output is the random draft's own
// chain) it gives the tokens it gives in a fresh engine, so the draft's KV of the cached
// blocks is what it would have computed. A block is reused only where the token after it
// matches too (the draft's KV at its last position was computed from it): a prompt that
// leaves the first one right after a block boundary gets one block fewer.
TEST(Eagle3EngineTest, PrefixCacheHitRestoresTheDraftsKv) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  SafetensorsFile golden = test::Golden(test::ModelDir("llama") + "/golden.safetensors");
  const std::vector<int32_t> base = test::AsIds(golden.Get("prompt_0").value());
  std::vector<int32_t> first;  // 23 tokens: 5 full blocks of 4 before the last
  for (int i = 0; i < 23; ++i) first.push_back(base[i % base.size()]);
  auto diverging_at = [&](int at) {
    std::vector<int32_t> p(first.begin(), first.begin() + at);
    for (int i = at; i < 23; ++i) p.push_back((first[i] + 1 + i) % (*model)->config().vocab_size);
    return p;
  };
  EngineConfig plain;
  plain.block_size = 4;
  for (const std::string variant : {"llama_copy", "llama_legacy"}) {
    auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), **model, backend);
    ASSERT_TRUE(draft.ok()) << draft.status().message();
    EngineConfig speculative = plain;
    speculative.eagle3 = {draft->get(), 3};
    const bool forced = variant == "llama_legacy";
    if (forced) speculative.spec_bench_accept_rate = 1.0f;
    // (the second prompt, its tokens served from the cache of 23 + 23 looked up)
    for (const auto& [second, hit] : std::vector<std::pair<std::vector<int32_t>, int>>{
             {first, 20}, {diverging_at(13), 12}, {diverging_at(12), 8}}) {
      Engine engine(**model, speculative);
      std::map<std::string, std::vector<int32_t>> tokens;
      for (const auto& [id, prompt] : {std::pair{"first", first}, std::pair{"second", second}}) {
        Request r;
        r.id = id;
        r.prompt = prompt;
        r.max_new_tokens = id == std::string("first") ? 1 : 12;
        ASSERT_TRUE(engine.Add(std::move(r)).ok());
        // One after the other: the second finds the first's blocks.
        while (engine.has_work())
          for (auto& seq : engine.Step()) tokens[seq->id()] = seq->generated();
      }
      EXPECT_EQ(engine.prefix_cache_hit_rate(), hit / 46.0) << variant << " hit " << hit;
      const EngineConfig& reference = forced ? speculative : plain;
      EXPECT_EQ(tokens.at("second"), RunAlone(**model, reference, second, 12).tokens.at("alone")) << variant << " hit " << hit;
    }
  }
}

// EAGLE-3 decode on the CPU without copying the context: once the prompt has run, no step
// of a round (verification of K + 1 rows, the draft's first pass and chained steps) copies
// keys out of the paged cache, whatever the context's length. Copying every key and value
// of the context per KV head, layer and step (attention's gather for prefill) made a
// never-accepted round cost several plain decode steps and grow with the context. The
// default (not batch-invariant) backend: the one `hsx serve` and `generate` run.
TEST(Eagle3EngineTest, DecodeCopiesNoContextOutOfTheKvCache) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/qwen3_default"), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  std::mt19937 rng(7);
  for (int prompt_len : {64, 1500}) {
    EngineConfig config;
    config.scheduler.max_num_batched_tokens = 2048;  // the prompt in one step
    config.eagle3 = {draft->get(), 3};
    Engine engine(**model, config);
    Request r;
    r.id = "long";
    for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(3 + static_cast<int32_t>(rng() % 500));
    r.max_new_tokens = 12;
    ASSERT_TRUE(engine.Add(std::move(r)).ok());
    engine.Step();  // the prompt, the draft's first pass over it and the first round
    const int64_t after_prompt = backend.gathered_keys();
    EXPECT_GT(after_prompt, 0);  // prefill does gather (the counter counts)
    uint64_t decode_steps = 0;
    for (; engine.has_work(); ++decode_steps) engine.Step();
    EXPECT_GT(decode_steps, 0u);
    EXPECT_GT(engine.stats().num_draft_tokens, 0u);
    EXPECT_EQ(backend.gathered_keys() - after_prompt, 0)
        << "keys copied out of the KV cache by " << decode_steps << " decode steps at a " << prompt_len
        << "-token context";
  }
}

// Verification rows in default mode: a step of few queries a sequence reads the cache in
// place, each row over its own keys, so a verification step's K + 1 rows get exactly the
// bits each would get as a decode step alone, and agree with the row-wise reference.
TEST(Eagle3EngineTest, VerificationRowsGetDecodeRowsBits) {
  CpuBackend backend, reference(/*batch_invariant=*/true);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  constexpr int kBlock = 16, kCtx = 700;
  struct Case { int64_t d; int window; float softcap; int64_t heads, kv_heads; };
  for (const Case& c : std::vector<Case>{{16, 0, 0, 4, 2}, {64, 100, 0, 8, 2}, {20, 0, 30, 4, 4}, {256, 0, 0, 2, 1}}) {
    std::vector<int32_t> table((kCtx + kBlock - 1) / kBlock);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    auto random = [&](Shape shape) {
      Tensor t = Tensor::Host(DType::kF32, std::move(shape));
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
      return t;
    };
    const int64_t slots = static_cast<int64_t>(table.size()) * kBlock;
    const Tensor kc = random({slots, c.kv_heads, c.d}), vc = random({slots, c.kv_heads, c.d});
    constexpr int kRows = 4;  // K = 3 drafts and the last known token
    const Tensor q = random({kRows, c.heads, c.d});
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    params.sliding_window = c.window;
    params.softcap = c.softcap;
    params.block_size = kBlock;
    auto attend = [&](Backend& b, const Tensor& rows, int q_len, int ctx_len) {
      Tensor out = Tensor::Host(DType::kF32, rows.shape());
      b.Attention(rows, kc, vc, MakeAttentionBatch(b, {SequenceSlice{0, q_len, ctx_len, table}}), params, out);
      return out;
    };
    const Tensor verified = attend(backend, q, kRows, kCtx), expected = attend(reference, q, kRows, kCtx);
    const int64_t row_floats = c.heads * c.d;
    for (int i = 0; i < kRows; ++i) {
      Tensor one = Tensor::Host(DType::kF32, {1, c.heads, c.d});
      std::copy_n(q.data<float>() + i * row_floats, row_floats, one.data<float>());
      const Tensor alone = attend(backend, one, 1, kCtx - kRows + 1 + i);
      const float* row = verified.data<float>() + i * row_floats;
      EXPECT_TRUE(std::equal(alone.data<float>(), alone.data<float>() + row_floats, row))
          << "row " << i << " d=" << c.d << " window=" << c.window;
      for (int64_t j = 0; j < row_floats; ++j) {
        ASSERT_NEAR(verified.data<float>()[i * row_floats + j], expected.data<float>()[i * row_floats + j], 1e-5f)
            << "row " << i << " d=" << c.d << " window=" << c.window << " softcap=" << c.softcap;
      }
    }
  }
}

// The drafts are speculators': run alone with K = 3 for 8 tokens, each llama_copy prompt
// accepts exactly as many drafts as the golden's end-to-end rounds (spec_rounds_k, made
// with speculators' own forward): 3 (a full round) for prompt 0, 1 for prompt 3, else 0.
TEST(Eagle3EngineTest, AcceptsWhatSpeculatorsRoundsAccept) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/llama_copy"), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  SafetensorsFile golden = test::Golden(test::DataPath("eagle3/llama_copy/golden.safetensors"));
  for (int k = 0; k < 4; ++k) {
    const std::string n = std::to_string(k);
    EngineConfig config;
    config.eagle3 = {draft->get(), 3};
    const Generation run = RunAlone(**model, config, test::AsIds(golden.Get("prompt_" + n).value()), 8);
    EXPECT_EQ(run.tokens.at("alone"), test::AsIds(golden.Get("greedy_" + n).value())) << "prompt " << k;
    const Tensor rounds = golden.Get("spec_rounds_" + n).value();  // [R, K + 1]
    uint64_t accepted = 0;
    for (int64_t i = 0; i < rounds.size(0); ++i) accepted += rounds.data<int64_t>()[i * rounds.size(1) + 3];
    EXPECT_EQ(run.stats.num_accepted_tokens, accepted) << "prompt " << k;
  }
}

// Gemma 4 MTP drafts, driven as vLLM drives them: run alone with K = 4 for 16 tokens, each
// prompt of golden_mtp_vllm_copy gives the target's greedy tokens and accepts what the
// golden's rounds accept (the last round cut to the tokens left, as the engine cuts it);
// with the random centroid-head assistant nothing is accepted, and the output is the same.
TEST(MtpEngineTest, AcceptsWhatVllmDrivenRoundsAccept) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::DataPath("mtp/gemma4_target"), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  for (const std::string variant : {"gemma4_assistant_copy", "gemma4_assistant"}) {
    auto drafter = MtpDrafter::Load(test::DataPath("mtp/" + variant), **model, backend);
    ASSERT_TRUE(drafter.ok()) << drafter.status().message();
    const bool copy = variant == "gemma4_assistant_copy";
    SafetensorsFile golden = test::Golden(test::DataPath(copy ? "mtp/golden_mtp_vllm_copy.safetensors"
                                                                : "mtp/golden_mtp_vllm.safetensors"));
    for (int k = 0; k < (copy ? 4 : 3); ++k) {
      const std::string n = std::to_string(k);
      EngineConfig config;
      config.mtp = {drafter->get(), 4};
      const Generation run = RunAlone(**model, config, test::AsIds(golden.Get("prompt_" + n).value()), 16);
      EXPECT_EQ(run.tokens.at("alone"), test::AsIds(golden.Get("greedy_" + n).value())) << variant << " prompt " << k;
      // The golden's rounds, each cut to the drafts the engine lets a round have.
      const Tensor rounds = golden.Get("accepted_" + n).value();
      uint64_t accepted = 0;
      int generated = 1;  // the prefill's token
      for (int64_t i = 0; i < rounds.numel() && generated < 16; ++i) {
        const int room = std::min<int>(4, 16 - generated - 1);
        const int a = std::min<int>(static_cast<int>(rounds.data<int64_t>()[i]), room);
        accepted += a;
        generated += a + 1;
      }
      EXPECT_EQ(run.stats.num_accepted_tokens, accepted) << variant << " prompt " << k;
      EXPECT_GT(run.stats.num_draft_tokens, 0u);
    }
  }
}

// The target's processed distribution (temperature 1, top-k 8) of the token after `tokens`,
// from a forward of its own.
std::vector<double> NextTokenDistribution(Model& model, const std::vector<int32_t>& tokens, const SamplingRow& row) {
  const int n = static_cast<int>(tokens.size()), bs = 16;
  KVCache cache(model.config(), model.backend(), (n + bs - 1) / bs, bs);
  ForwardBatch batch;
  SequenceSlice slice;
  slice.q_len = slice.ctx_len = n;
  for (int b = 0; b < (n + bs - 1) / bs; ++b) slice.block_table.push_back(b);
  for (int p = 0; p < n; ++p) {
    batch.token_ids.push_back(tokens[p]);
    batch.positions.push_back(p);
    batch.slot_mapping.push_back(p);
  }
  batch.seqs.push_back(slice);
  batch.logit_rows = {n - 1};
  const Tensor logits = model.Forward(batch, cache, {}).logits;
  return test::Expected(std::vector<float>(logits.data<float>(), logits.data<float>() + logits.size(1)), row);
}

// The whole speculative engine is lossless at temperature 1 (top-k 8): over 800 seeded
// requests of one prompt holding every token once (so prompt lookup always drafts after the
// first token), the first two generated tokens, the second verified against a draft,
// follow the target's joint distribution (64 cells, from the target's own forwards) by a
// chi-square test, as the plain engine's do; wrong acceptance rules (the bench's forced
// rates: every draft in, every draft out) fail the same test.
TEST(SpeculativeEngineTest, SampledTokensFollowTheTargetsDistribution) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  const int vocab = (*model)->config().vocab_size, n = 800;
  std::vector<int32_t> permutation(vocab);
  for (int i = 0; i < vocab; ++i) permutation[i] = (i * 193 + 7) % vocab;
  SamplingRow row;
  row.temperature = 1.0f;
  row.top_k = 8;
  // The expected joint over (x1, x2), x1 in the first token's support. The prompt starts
  // with pairs (x1, the likeliest x2 after it), so that the draft, the token after x1's first
  // occurrence, is often a likely one; rebuilt a few times, as the pairs move the distributions.
  std::vector<int32_t> prompt = permutation;
  std::vector<double> joint;
  for (int round = 0; round < 3; ++round) {
    const std::vector<double> p1 = NextTokenDistribution(**model, prompt, row);
    joint.assign(static_cast<size_t>(vocab) * vocab, 0.0);
    std::vector<int32_t> pairs;
    for (int x1 = 0; x1 < vocab; ++x1) {
      if (p1[x1] == 0) continue;
      std::vector<int32_t> longer = prompt;
      longer.push_back(x1);
      const std::vector<double> p2 = NextTokenDistribution(**model, longer, row);
      for (int x2 = 0; x2 < vocab; ++x2) joint[x1 * vocab + x2] = p1[x1] * p2[x2];
      pairs.push_back(x1);
      pairs.push_back(static_cast<int32_t>(std::max_element(p2.begin(), p2.end()) - p2.begin()));
    }
    if (round == 2) break;
    prompt = pairs;
    prompt.insert(prompt.end(), permutation.begin(), permutation.end());
  }
  auto statistic = [&](const EngineConfig& config, uint64_t* drafts, uint64_t* accepted) {
    std::vector<Request> requests;
    for (int i = 0; i < n; ++i) {
      Request r;
      r.id = std::to_string(i);
      r.prompt = prompt;
      r.max_new_tokens = 3;  // room for one draft after the first token
      r.sampling.temperature = 1.0f;
      r.sampling.top_k = 8;
      r.sampling.seed = 77000 + i;
      requests.push_back(std::move(r));
    }
    const Generation run = RunAll(**model, config, std::move(requests));
    *drafts = run.stats.num_draft_tokens;
    *accepted = run.stats.num_accepted_tokens;
    std::vector<int> counts(joint.size(), 0);
    for (const auto& [id, tokens] : run.tokens) ++counts[tokens.at(0) * vocab + tokens.at(1)];
    int dof = 0;
    return std::pair{test::ChiSquare(counts, joint, n, &dof), test::ChiSquareBound(dof)};
  };
  EngineConfig plain;
  plain.scheduler.max_num_seqs = 512;
  plain.scheduler.max_num_batched_tokens = 8192;
  EngineConfig speculative = plain;
  speculative.ngram = {1, 1, 1};
  uint64_t drafts = 0, accepted = 0;
  const auto [plain_chi, plain_bound] = statistic(plain, &drafts, &accepted);
  EXPECT_LT(plain_chi, plain_bound) << "the control: plain sampling";
  const auto [chi, bound] = statistic(speculative, &drafts, &accepted);
  EXPECT_EQ(drafts, static_cast<uint64_t>(n)) << "every request verifies one draft";
  EXPECT_GT(accepted, static_cast<uint64_t>(n / 20)) << "drafts are accepted, and rejected";
  EXPECT_LT(accepted, static_cast<uint64_t>(n / 2));
  EXPECT_LT(chi, bound) << "speculative sampling";
  const uint64_t accepted_right = accepted;
  // Adaptive draft lengths, costs injected so that a step's first 600 rows cost alike and
  // more cost 20 times as much: a step of hundreds of decoding requests drafts for some and
  // not for the others (K = 1 and K = 0 side by side), still lossless.
  DraftCostModel cost;
  cost.SetTarget(1, 1.0);
  cost.SetTarget(600, 1.0);
  cost.SetTarget(700, 20.0);
  EngineConfig adaptive = speculative;
  adaptive.draft_length.adaptive = true;
  adaptive.draft_length.cost_model = &cost;
  const auto [adaptive_chi, adaptive_bound] = statistic(adaptive, &drafts, &accepted);
  EXPECT_GT(drafts, static_cast<uint64_t>(n / 20)) << "adaptive: some requests draft";
  EXPECT_LT(drafts, static_cast<uint64_t>(n - n / 20)) << "adaptive: and some do not";
  EXPECT_LT(adaptive_chi, adaptive_bound) << "speculative sampling with adaptive draft lengths";
  speculative.spec_bench_accept_rate = 1.0f;
  const auto [all_chi, all_bound] = statistic(speculative, &drafts, &accepted);
  EXPECT_GT(all_chi, all_bound) << "every draft accepted must be told apart";
  speculative.spec_bench_accept_rate = 0.0f;
  const auto [none_chi, none_bound] = statistic(speculative, &drafts, &accepted);
  EXPECT_GT(none_chi, none_bound) << "every draft rejected must be told apart";
  std::printf("[lossless] chi-square plain %.1f, speculative %.1f (%lu of %d drafts accepted), adaptive %.1f, "
              "all accepted %.1f, none accepted %.1f (bound %.1f)\n", plain_chi, chi,
              static_cast<unsigned long>(accepted_right), n, adaptive_chi, all_chi, none_chi, bound);
}

TEST(SpeculativeConfigTest, ParsesVllmShapesAndNamesBadFields) {
  auto ngram = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})", 4);
  ASSERT_TRUE(ngram.ok()) << ngram.status().message();
  EXPECT_EQ(ngram->method, SpeculativeConfig::Method::kNgram);
  EXPECT_EQ(ngram->ngram.num_speculative_tokens, 4);
  EXPECT_EQ(ngram->ngram.prompt_lookup_min, 3);  // vLLM: the one given serves for both
  EXPECT_EQ(ngram->ngram.prompt_lookup_max, 3);
  auto defaults = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 2})", 4);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->ngram.prompt_lookup_min, 5);
  EXPECT_EQ(defaults->ngram.prompt_lookup_max, 5);
  auto extract = ParseSpeculativeConfig(
      R"({"method": "extract_hidden_states", "num_speculative_tokens": 1,
          "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [4, 0, 2]}}})", 4);
  ASSERT_TRUE(extract.ok()) << extract.status().message();
  EXPECT_EQ(extract->capture_layers, (std::vector<int>{0, 2, 4}));

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[1]", "not a JSON object"},
      {R"({"num_speculative_tokens": 2})", "\"method\""},
      {R"({"method": "medusa"})", "unknown method \"medusa\""},
      {R"({"method": "mtp", "model": "d"})", "\"num_speculative_tokens\" is required"},
      {R"({"method": "eagle3", "num_speculative_tokens": 3})", "\"model\" (the draft's directory) is required"},
      {R"({"method": "eagle3", "model": "d", "prompt_lookup_max": 3})", "field \"prompt_lookup_max\" is not taken"},
      {R"({"method": "ngram"})", "\"num_speculative_tokens\" is required"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "[1, 64]"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2})",
       "prompt_lookup_min (4) must be <= prompt_lookup_max (2)"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "model": "x"})", "field \"model\" is not taken"},
      {R"({"method": "extract_hidden_states", "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [5]}}})",
       "layer id 5 is out of range [0, 4]"},
      {R"({"method": "extract_hidden_states", "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 1]}}})",
       "given twice"},
  };
  for (const auto& [text, expected] : bad) {
    auto r = ParseSpeculativeConfig(text, 4);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(expected), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("--speculative-config"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace hsx
