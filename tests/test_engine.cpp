// The engine against the goldens: greedy continuations token for token and hidden
// states row for row, under chunked prefill, batching and preemption.
#include <gtest/gtest.h>

#include <cstring>
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
INSTANTIATE_TEST_SUITE_P(GptOss, EngineGoldenTest, ::testing::ValuesIn(test::GptOssFixtureModels()),
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

// A seeded request draws the same tokens alone and in a batch of others (chunked, with
// penalties and top-p). The batch-invariant backend gives bit-identical logits whatever the
// batch, so what is tested is that the draw depends on nothing but the row and its seed.
TEST(EngineTest, SeededSamplingIsTheSameInAnyBatch) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  SafetensorsFile golden = test::Golden(test::ModelDir("qwen3") + "/golden.safetensors");
  auto request = [&](const std::string& id, int prompt, uint64_t seed) {
    Request r;
    r.id = id;
    r.prompt = test::AsIds(golden.Get("prompt_" + std::to_string(prompt)).value());
    r.max_new_tokens = 24;
    r.sampling.temperature = 1.3f;
    r.sampling.top_p = 0.9f;
    r.sampling.presence_penalty = 0.5f;
    r.sampling.seed = seed;
    return r;
  };
  auto run = [&](std::vector<Request> requests, int budget) {
    EngineConfig config;
    config.scheduler.max_num_batched_tokens = budget;
    Engine engine(**model, config);
    for (Request& r : requests) EXPECT_TRUE(engine.Add(std::move(r)).ok());
    std::map<std::string, std::vector<int32_t>> out;
    while (engine.has_work())
      for (auto& seq : engine.Step()) out[seq->id()] = seq->generated();
    return out;
  };
  std::vector<Request> alone;
  alone.push_back(request("a", 1, 42));
  const auto a = run(std::move(alone), 256);
  std::vector<Request> crowd;
  crowd.push_back(request("x", 2, 7));
  crowd.push_back(request("a", 1, 42));
  crowd.push_back(request("y", 0, 42));  // the same seed on another prompt: its own draws
  const auto b = run(std::move(crowd), 40);
  ASSERT_EQ(a.at("a").size(), 24u);
  EXPECT_EQ(b.at("a"), a.at("a"));
  // Not a constant sequence: the draws are random (a broken sampler returning argmax passes
  // nothing else here).
  std::vector<Request> reseeded;
  reseeded.push_back(request("a", 1, 43));
  EXPECT_NE(run(std::move(reseeded), 256).at("a"), a.at("a"));
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


// prompt + max_new_tokens in int wrapped for max_new_tokens near INT32_MAX, passed the
// length check and then allocated rows for 2^31 tokens (issue 9.1): now 64-bit.
TEST(EngineTest, MaxNewTokensNearInt32MaxIsRejectedNotWrapped) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  EngineConfig config;
  config.num_blocks = 8;
  config.capture_layers = {1};
  Engine engine(**model, config);
  for (bool include_output_tokens : {false, true}) {
    Request r{"big", {1, 2}, INT32_MAX};
    r.include_output_tokens = include_output_tokens;
    Status s = engine.Validate(r);
    EXPECT_NE(s.message().find("2 prompt tokens + 2147483647 new tokens exceed max_model_len 4096"), std::string::npos)
        << s.message();
    EXPECT_FALSE(engine.Add(std::move(r)).ok());
  }
  Status negative = engine.Add({"neg", {1, 2}, -1});
  EXPECT_NE(negative.message().find("min_new_tokens (0) <= max_new_tokens (-1)"), std::string::npos)
      << negative.message();
  Status stop = engine.Add({"stop", {1, 2}, 2, true, false, {512}});
  EXPECT_NE(stop.message().find("stop token id 512 at position 0 is outside the vocabulary"), std::string::npos)
      << stop.message();
  EXPECT_FALSE(engine.has_work());
}

std::unique_ptr<Sequence> RunOne(Engine& engine, Request r) {
  Status s = engine.Add(std::move(r));
  EXPECT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Sequence> done;
  while (engine.has_work())
    for (auto& seq : engine.Step()) done = std::move(seq);
  return done;
}

// min_new_tokens keeps stop tokens from being sampled until then (vLLM's min_tokens);
// on_token hands each token over and cannot end the sequence (the server's stop strings
// end it with FinishAt, below).
TEST(EngineTest, MinNewTokensHoldsStopTokensBackAndOnTokenSeesEachToken) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  SafetensorsFile golden = test::Golden(test::ModelDir("qwen3") + "/golden.safetensors");
  const std::vector<int32_t> prompt = test::AsIds(golden.Get("prompt_1").value());
  const std::vector<int32_t> greedy = test::AsIds(golden.Get("greedy_1").value());
  EngineConfig config;
  config.num_blocks = 64;
  Engine engine(**model, config);

  auto stopped_at_once = RunOne(engine, {"a", prompt, 8, true, false, {greedy[0]}});
  EXPECT_EQ(stopped_at_once->generated(), std::vector<int32_t>{greedy[0]});
  EXPECT_TRUE(stopped_at_once->stopped());

  Request held{"b", prompt, 8, true, false, {greedy[0]}};
  held.min_new_tokens = 3;
  auto seq = RunOne(engine, held);
  ASSERT_GE(seq->num_generated(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NE(seq->generated()[i], greedy[0]) << i;

  Request watched{"c", prompt, 8};
  std::vector<int32_t> seen;
  watched.on_token = [&](int32_t token) { seen.push_back(token); };
  seq = RunOne(engine, watched);
  EXPECT_EQ(seen, greedy);
  EXPECT_EQ(seq->generated(), greedy);
  EXPECT_FALSE(seq->stopped());
}

// FinishAt (a stop string the server found while the engine ran on) ends a request as if
// it had stopped at that token: its tokens, logprobs and, with include_output_tokens, its
// rows are those of the same request cut off there by max_new_tokens, value for value,
// and it counts as stopped. With capture on, the step in flight still names the sequence
// (it finishes after that step's rows are stored); without, it goes at once.
TEST(EngineTest, FinishAtCutsARunningRequestBackToAToken) {
  CpuBackend backend(/*batch_invariant=*/true);  // rows compare bit for bit, batched or alone
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  SafetensorsFile golden = test::Golden(test::ModelDir("qwen3") + "/golden.safetensors");
  const std::vector<int32_t> prompt = test::AsIds(golden.Get("prompt_1").value());
  const std::vector<int32_t> greedy = test::AsIds(golden.Get("greedy_1").value());
  for (bool capture : {true, false}) {
    SCOPED_TRACE(capture ? "capture" : "no capture");
    EngineConfig config;
    config.num_blocks = 64;
    if (capture) config.capture_layers = {0, 2};
    Engine engine(**model, config);
    auto request = [&](const std::string& id, int max_new_tokens) {
      Request r{id, prompt, max_new_tokens};
      r.include_output_tokens = true;
      r.sampling.logprobs = 2;
      return r;
    };
    // The reference: the same request ending at its third token by max_new_tokens.
    std::unique_ptr<Sequence> want = RunOne(engine, request("want", 3));
    ASSERT_EQ(want->generated(), std::vector<int32_t>(greedy.begin(), greedy.begin() + 3));

    // Another request beside it, so the cut one finishes within a batch.
    ASSERT_TRUE(engine.Add(request("other", 8)).ok());
    ASSERT_TRUE(engine.Add(request("cut", 8)).ok());
    std::map<std::string, std::unique_ptr<Sequence>> done;
    int steps = 0;
    bool asked = false;
    while (engine.has_work()) {
      for (auto& seq : engine.Step()) done[seq->id()] = std::move(seq);
      // Once it has run on two tokens past the third, it is cut back to the third.
      if (++steps == 6) {
        ASSERT_FALSE(done.count("cut"));
        EXPECT_TRUE(engine.FinishAt("cut", 3));
        asked = true;
      }
    }
    ASSERT_TRUE(asked);
    EXPECT_FALSE(engine.FinishAt("cut", 3));  // finished already
    ASSERT_TRUE(done.count("cut") && done.count("other"));
    const Sequence& cut = *done["cut"];
    EXPECT_TRUE(cut.error.ok()) << cut.error.message();
    EXPECT_FALSE(cut.aborted);
    EXPECT_TRUE(cut.stopped());
    EXPECT_EQ(cut.tokens(), want->tokens());
    ASSERT_EQ(cut.logprobs.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(cut.logprobs[i].logprob, want->logprobs[i].logprob) << i;
      EXPECT_EQ(cut.logprobs[i].top, want->logprobs[i].top) << i;
    }
    EXPECT_EQ(done["other"]->generated(), greedy);  // its neighbour runs on undisturbed
    if (capture) {
      ASSERT_TRUE(cut.hidden_states.defined());
      ASSERT_EQ(cut.hidden_states.size(0), static_cast<int64_t>(prompt.size()) + 2);  // the third token never ran
      ASSERT_EQ(cut.hidden_states.nbytes(), want->hidden_states.nbytes());
      EXPECT_EQ(std::memcmp(cut.hidden_states.raw(), want->hidden_states.raw(), cut.hidden_states.nbytes()), 0);
    } else {
      EXPECT_FALSE(cut.hidden_states.defined());
    }
    EXPECT_EQ(engine.num_free_blocks(), engine.num_blocks());  // its blocks went back
  }
}

// FinishAt at a count the request has not reached (or none) fails it with a message that
// says so, rather than finishing it with rows that never ran; an unknown id is false.
TEST(EngineTest, FinishAtPastTheGeneratedTokensFailsTheRequest) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(model.ok());
  EngineConfig config;
  config.num_blocks = 64;
  config.capture_layers = {1};
  Engine engine(**model, config);
  EXPECT_FALSE(engine.FinishAt("nobody", 1));
  ASSERT_TRUE(engine.Add({"queued", {1, 2, 3}, 8}).ok());
  ASSERT_TRUE(engine.FinishAt("queued", 1));  // nothing generated yet
  std::unique_ptr<Sequence> seq;
  while (engine.has_work())
    for (auto& s : engine.Step()) seq = std::move(s);
  ASSERT_TRUE(seq);
  EXPECT_NE(seq->error.message().find("cannot finish it at 1 generated tokens (it has 0)"), std::string::npos)
      << seq->error.message();
  EXPECT_EQ(engine.num_free_blocks(), engine.num_blocks());
}

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


// include_output_tokens (vLLM's semantics): the rows of prompt + generated[:-1], each
// equal to what a cold prefill of exactly those tokens captures.
class IncludeOutputTokensTest : public test::Qwen3FixtureTest {
 protected:

  static EngineConfig Config() {
    EngineConfig c;
    c.num_blocks = 64;
    c.capture_dtype = DType::kF32;
    c.capture_layers = {0, 2, 4};
    return c;
  }

  std::vector<int32_t> Greedy(int k) const { return test::AsIds(golden_->Get("greedy_" + std::to_string(k)).value()); }

  // Runs the three golden prompts with include_output_tokens and 8 new tokens.
  std::map<std::string, std::unique_ptr<Sequence>> RunAll(Engine& engine) {
    for (int k = 0; k < 3; ++k) {
      Request r{"p" + std::to_string(k), Prompt(k), 8};
      r.include_output_tokens = true;
      EXPECT_TRUE(engine.Add(std::move(r)).ok());
    }
    std::map<std::string, std::unique_ptr<Sequence>> done;
    while (engine.has_work())
      for (auto& s : engine.Step()) done[s->id()] = std::move(s);
    return done;
  }

  // The rows a cold, prefill-only run captures for `tokens`.
  Tensor ColdRows(const std::vector<int32_t>& tokens) {
    EngineConfig c = Config();
    c.enable_prefix_caching = false;
    Engine engine(*model_, c);
    EXPECT_TRUE(engine.Add({"cold", tokens, 0}).ok());
    Tensor rows;
    while (engine.has_work())
      for (auto& s : engine.Step()) rows = s->hidden_states;
    return rows;
  }

  // Each sequence's file content: T = prompt + 7 rows, equal to a cold prefill.
  void ExpectColdRows(const std::map<std::string, std::unique_ptr<Sequence>>& done) {
    ASSERT_EQ(done.size(), 3u);
    for (int k = 0; k < 3; ++k) {
      const Sequence& seq = *done.at("p" + std::to_string(k));
      ASSERT_EQ(seq.generated(), Greedy(k)) << "prompt " << k;
      std::vector<int32_t> fed = seq.tokens();
      fed.pop_back();  // the last generated token never ran through the model
      ASSERT_EQ(seq.hidden_states.shape(), (Shape{static_cast<int64_t>(fed.size()), 3, 64})) << "prompt " << k;
      EXPECT_LE(test::RelativeMaxError(test::AsFloats(seq.hidden_states), test::AsFloats(ColdRows(fed))), 1e-5)
          << "prompt " << k;
    }
  }

};

TEST_F(IncludeOutputTokensTest, GeneratedRowsEqualAColdPrefillOfPromptAndOutput) {
  Engine engine(*model_, Config());
  ExpectColdRows(RunAll(engine));
  // Off (the default), the same request keeps only its prompt rows.
  ASSERT_TRUE(engine.Add({"prompt-only", Prompt(1), 8}).ok());
  std::unique_ptr<Sequence> plain;
  while (engine.has_work())
    for (auto& s : engine.Step()) plain = std::move(s);
  EXPECT_EQ(plain->hidden_states.size(0), static_cast<int64_t>(Prompt(1).size()));
}

TEST_F(IncludeOutputTokensTest, StopTokenTrimsTheRowsToWhatRan) {
  Engine engine(*model_, Config());
  Request r{"stops", Prompt(0), 8};
  r.include_output_tokens = true;
  r.stop_token_ids = {Greedy(0)[2]};  // the third greedy token (the first two differ from it)
  ASSERT_TRUE(engine.Add(std::move(r)).ok());
  std::unique_ptr<Sequence> seq;
  while (engine.has_work())
    for (auto& s : engine.Step()) seq = std::move(s);
  ASSERT_EQ(seq->num_generated(), 3);
  std::vector<int32_t> fed = Prompt(0);
  const std::vector<int32_t> greedy = Greedy(0);
  fed.insert(fed.end(), greedy.begin(), greedy.begin() + 2);
  ASSERT_EQ(seq->hidden_states.size(0), static_cast<int64_t>(fed.size()));
  EXPECT_LE(test::RelativeMaxError(test::AsFloats(seq->hidden_states), test::AsFloats(ColdRows(fed))), 1e-5);
}

// The three prompts fit the KV cache (45 of 46 blocks of 4) but their outputs do not:
// the newest is preempted mid-generation and later re-prefills prompt + generated
// tokens (with prefix caching, only what its cached blocks lack). Its rows are
// rewritten in place, none lost or doubled.
class IncludeOutputTokensPreemptionTest : public IncludeOutputTokensTest, public ::testing::WithParamInterface<bool> {};

TEST_P(IncludeOutputTokensPreemptionTest, RecomputeKeepsEveryRow) {
  EngineConfig config = Config();
  config.block_size = 4;
  config.num_blocks = 46;
  config.enable_prefix_caching = GetParam();
  Engine engine(*model_, config);
  auto done = RunAll(engine);
  EXPECT_GT(engine.num_preemptions(), 0u);
  EXPECT_GT(done.at("p2")->preemptions, 0);
  uint64_t rows = 0;
  for (const auto& [id, seq] : done) rows += seq->hidden_states.size(0);
  EXPECT_GT(engine.stats().tokens_computed, rows) << "expected some tokens to be recomputed";
  ExpectColdRows(done);
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, IncludeOutputTokensPreemptionTest, ::testing::Bool());

// A prompt whose blocks are cached computes only its tail and generated tokens, yet
// its rows are the full cold ones.
TEST_F(IncludeOutputTokensTest, PrefixCachedPromptStillGetsEveryRow) {
  Engine engine(*model_, Config());
  RunAll(engine);
  const uint64_t before = engine.stats().tokens_computed;
  ExpectColdRows(RunAll(engine));
  EXPECT_LT(engine.stats().tokens_computed - before, 3u * 8u + 3u * 16u) << "expected the prompts' blocks to be reused";
}

}  // namespace
}  // namespace hsx
