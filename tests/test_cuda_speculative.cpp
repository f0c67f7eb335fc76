// Speculative decoding on CUDA graphs (skipped without a GPU): with verification steps (every
// sequence K + 1 rows) and EAGLE-3's chained draft steps replaying recorded graphs, the
// engine's tokens and acceptance counts are its eager ones, greedy and seeded, with n-gram,
// EAGLE-3 and Gemma 4 MTP drafts, over batches that shrink through the buckets (padding in
// most steps) and drafts cut short near the end (other rows-per-sequence graphs, and mixed
// steps that stay eager); and the graphs were replayed.
#ifdef HSX_HAS_CUDA
#include <gtest/gtest.h>

#include <map>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"
#include "model/eagle3_draft.h"
#include "model/mtp_drafter.h"
#include "test_util.h"

namespace hsx {
namespace {

struct Run {
  std::map<std::string, std::vector<int32_t>> tokens;
  uint64_t accepted = 0, drafted = 0;
  int64_t verify_replays = 0, draft_replays = 0;
};

// Five prompts of staggered lengths repeating a short loop (so prompt lookup and copy-style
// drafts find matches), each generating a different number of tokens.
Run Generate(Model& model, EngineConfig config, bool graphs, float temperature) {
  config.graphs = graphs;
  config.num_blocks = 128;
  Engine engine(model, config);
  const int vocab = model.config().vocab_size;
  for (int i = 0; i < 5; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    for (int t = 0; t < 9 + 5 * i; ++t) r.prompt.push_back((31 * (t % (3 + i)) + 17 * i + 3) % vocab);
    r.max_new_tokens = 8 + 7 * i;
    r.sampling.temperature = temperature;
    r.sampling.seed = 1000 + i;
    EXPECT_TRUE(engine.Add(std::move(r)).ok());
  }
  Run out;
  while (engine.has_work()) {
    for (auto& seq : engine.Step()) out.tokens[seq->id()] = seq->generated();
  }
  out.accepted = engine.stats().num_accepted_tokens;
  out.drafted = engine.stats().num_draft_tokens;
  out.verify_replays = engine.runner().verify_graph_replays();
  out.draft_replays = engine.runner().draft_graph_replays();
  return out;
}

// verify_graphs: whether verification steps must have replayed graphs. A graph takes a step
// whose sequences all verify K drafts; prompt lookup often proposes fewer, so n-gram runs
// may verify eagerly throughout (measured: this workload never had an even n-gram step).
void ExpectGraphsGiveTheEagerRun(Model& model, const EngineConfig& config, const std::string& what, bool eagle3,
                                 bool verify_graphs = true) {
  for (float temperature : {0.0f, 1.0f}) {
    const Run eager = Generate(model, config, false, temperature);
    const Run graphs = Generate(model, config, true, temperature);
    EXPECT_EQ(eager.verify_replays + eager.draft_replays, 0);
    EXPECT_GT(graphs.drafted, 0u) << what;
    if (verify_graphs) {
      EXPECT_GT(graphs.verify_replays, 0) << what << ": verification steps did not replay graphs";
    }
    if (eagle3) {
      EXPECT_GT(graphs.draft_replays, 0) << what << ": draft steps did not replay graphs";
    }
    ASSERT_EQ(eager.tokens.size(), 5u);
    EXPECT_EQ(graphs.tokens, eager.tokens) << what << " at temperature " << temperature;
    EXPECT_EQ(graphs.accepted, eager.accepted) << what << " at temperature " << temperature;
    EXPECT_EQ(graphs.drafted, eager.drafted) << what << " at temperature " << temperature;
  }
}

std::unique_ptr<CudaBackend> Gpu() {
  auto b = CudaBackend::Create(0);
  return b.ok() ? std::move(b).value() : nullptr;
}

TEST(CudaSpeculativeGraphs, NgramVerificationOnGraphsGivesTheEagerTokens) {
  auto gpu = Gpu();
  if (!gpu) GTEST_SKIP() << "no CUDA device";
  for (const std::string name : {"llama", "qwen3", "gemma4"}) {
    auto model = Model::Load(test::ModelDir(name), *gpu);
    ASSERT_TRUE(model.ok()) << model.status().message();
    EngineConfig config;
    config.ngram = {3, 1, 2};
    ExpectGraphsGiveTheEagerRun(**model, config, "ngram " + name, false, /*verify_graphs=*/false);
  }
}

TEST(CudaSpeculativeGraphs, Eagle3StepsOnGraphsGiveTheEagerTokens) {
  auto gpu = Gpu();
  if (!gpu) GTEST_SKIP() << "no CUDA device";
  for (const std::string variant : {"llama_copy", "qwen3_default"}) {
    auto model = Model::Load(test::ModelDir(variant == "qwen3_default" ? "qwen3" : "llama"), *gpu);
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), **model, *gpu);
    ASSERT_TRUE(draft.ok()) << draft.status().message();
    for (int k : {1, 3}) {
      EngineConfig config;
      config.eagle3 = {draft->get(), k};
      ExpectGraphsGiveTheEagerRun(**model, config, "eagle3 " + variant + " K=" + std::to_string(k), k > 1);
    }
  }
}

TEST(CudaSpeculativeGraphs, MtpVerificationOnGraphsGivesTheEagerTokens) {
  auto gpu = Gpu();
  if (!gpu) GTEST_SKIP() << "no CUDA device";
  auto model = Model::Load(test::DataPath("mtp/gemma4_target"), *gpu);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto drafter = MtpDrafter::Load(test::DataPath("mtp/gemma4_assistant_copy"), **model, *gpu);
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  EngineConfig config;
  config.mtp = {drafter->get(), 3};
  ExpectGraphsGiveTheEagerRun(**model, config, "mtp", false);
}

}  // namespace
}  // namespace hsx

#endif  // HSX_HAS_CUDA
