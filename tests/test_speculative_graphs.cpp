// Speculative decoding on graphs, on both backends: CUDA records and replays them (skipped
// without a GPU); the CPU runs the same graph shapes eagerly (bucket padding, fixed inputs:
// RunnerConfig::graph_shapes_without_recording), so CI covers what the graphs compute.
// With verification steps (every sequence K + 1 rows) and the drafters' rounds (EAGLE-3's
// first pass and chained steps, MTP's steps) on graphs, the engine's tokens and acceptance counts are its
// eager ones, greedy and seeded, with n-gram, EAGLE-3 and Gemma 4 MTP drafts, over batches
// that shrink through the buckets (padding in most steps) and drafts cut short near the end
// (other rows-per-sequence graphs; steps mixing draft counts padded on them); and the graphs were
// replayed. Under forced acceptance the output is made of the drafts themselves, so equal
// output there means equal drafts.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#ifdef HSX_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "engine/draft_length.h"
#include "engine/engine.h"
#include "engine/token_tree.h"
#include "model/eagle3_draft.h"
#include "model/mtp_drafter.h"
#include "engine_runs.h"
#include "test_util.h"

namespace hsx {
namespace {

using test::LoadEagle3;

struct Run {
  std::map<std::string, std::vector<int32_t>> tokens;
  uint64_t accepted = 0, drafted = 0;
  int64_t verify_replays = 0, draft_replays = 0, first_pass_replays = 0, kv_only_replays = 0, eager_first_passes = 0;
  int64_t recorded_later = 0;  // step graphs recorded after the engine started
  int64_t kv_passes_ahead = 0;
};

// Five prompts of staggered lengths repeating a short loop (so prompt lookup and copy-style
// drafts find matches), each generating a different number of tokens.
Run Generate(Model& model, EngineConfig config, bool graphs, float temperature) {
  config.graphs = graphs;
  config.graph_shapes_without_recording = true;  // the CPU's; CUDA records
  config.num_blocks = 128;
  config.scheduler.max_num_seqs = 8;  // the five requests' buckets: 1, 2, 4, 8 (each recorded at start-up)
  Engine engine(model, config);
  const int64_t recorded_at_start = engine.runner().graphs_recorded();
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
  out.draft_replays = engine.drafter() ? engine.drafter()->graph_replays() : 0;
  out.first_pass_replays = engine.drafter() ? engine.drafter()->first_pass_graph_replays() : 0;
  out.eager_first_passes = engine.drafter() ? engine.drafter()->eager_first_passes() : 0;
  out.recorded_later = engine.runner().graphs_recorded() - recorded_at_start;
  out.kv_only_replays = engine.drafter() ? engine.drafter()->kv_only_graph_replays() : 0;
  out.kv_passes_ahead = engine.drafter() ? engine.drafter()->kv_passes_ahead() : 0;
  return out;
}

// Verification steps must have replayed graphs: a step whose sequences verify different
// numbers of drafts (prompt lookup's, which often finds fewer than K: this workload never
// had an even n-gram step) runs padded on one. draft_graphs: whether draft rounds must
// have (EAGLE-3, MTP).
void ExpectGraphsGiveTheEagerRun(Model& model, const EngineConfig& config, const std::string& what, bool draft_graphs) {
  for (float temperature : {0.0f, 1.0f}) {
    const Run eager = Generate(model, config, false, temperature);
    const Run graphs = Generate(model, config, true, temperature);
    EXPECT_EQ(eager.verify_replays + eager.draft_replays, 0);
    EXPECT_GT(graphs.drafted, 0u) << what;
    EXPECT_GT(graphs.verify_replays, 0) << what << ": verification steps did not replay graphs";
    if (draft_graphs) {
      EXPECT_GT(graphs.draft_replays, 0) << what << ": draft rounds did not replay graphs";
    }
    ASSERT_EQ(eager.tokens.size(), 5u);
    EXPECT_EQ(graphs.tokens, eager.tokens) << what << " at temperature " << temperature;
    EXPECT_EQ(graphs.accepted, eager.accepted) << what << " at temperature " << temperature;
    EXPECT_EQ(graphs.drafted, eager.drafted) << what << " at temperature " << temperature;
  }
}

// The backend a case runs on: "cpu" or "cuda" (null without a device).
std::unique_ptr<Backend> MakeBackend(const std::string& kind) {
  if (kind == "cpu") return std::make_unique<CpuBackend>();
#ifdef HSX_HAS_CUDA
  auto b = CudaBackend::Create(0);
  if (b.ok()) return std::move(b).value();
#endif
  return nullptr;
}

class SpeculativeGraphs : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = MakeBackend(GetParam());
    if (!backend_) GTEST_SKIP() << "no CUDA device";
  }
  std::unique_ptr<Backend> backend_;
};

TEST_P(SpeculativeGraphs, NgramVerificationOnGraphsGivesTheEagerTokens) {
  Backend& backend = *backend_;
  for (const std::string name : {"llama", "qwen3", "gemma4"}) {
    auto model = Model::Load(test::ModelDir(name), backend);
    ASSERT_TRUE(model.ok()) << model.status().message();
    EngineConfig config;
    config.ngram = {3, 1, 2};
    ExpectGraphsGiveTheEagerRun(**model, config, "ngram " + name, false);
  }
}

TEST_P(SpeculativeGraphs, Eagle3StepsOnGraphsGiveTheEagerTokens) {
  Backend& backend = *backend_;
  for (const std::string variant : {"llama_copy", "qwen3_default"}) {
    auto [model, draft] = LoadEagle3(backend, variant);
    ASSERT_TRUE(draft);
    for (int k : {1, 3}) {
      EngineConfig config;
      config.eagle3 = {draft.get(), k};
      ExpectGraphsGiveTheEagerRun(*model, config, "eagle3 " + variant + " K=" + std::to_string(k), true);
    }
  }
}

// The same over a gpt-oss target (MoE verification steps on graphs where MoeRecordable
// holds) with the drafts speculators writes for it (a llama layer with yarn RoPE).
TEST_P(SpeculativeGraphs, Eagle3OverGptOssOnGraphsGivesTheEagerTokens) {
  Backend& backend = *backend_;
  auto model = Model::Load(test::ModelDir("gpt_oss"), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  for (const std::string variant : {"gpt_oss_lookup", "gpt_oss_default"}) {
    auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), **model, backend);
    ASSERT_TRUE(draft.ok()) << draft.status().message();
    for (int k : {1, 3}) {
      EngineConfig config;
      config.eagle3 = {draft->get(), k};
      ExpectGraphsGiveTheEagerRun(**model, config, "eagle3 " + variant + " K=" + std::to_string(k), true);
    }
  }
}

// Adaptive draft lengths (a fixed cost model, so both runs choose alike): at forced
// acceptance 0 most steps draft nothing, and the EAGLE-3 draft keeps its KV by a KV-only
// first pass on a graph; lossless runs mix draft counts in a step (padded graphs). The
// tokens and counts are the eager run's.
TEST_P(SpeculativeGraphs, AdaptiveDraftLengthsOnGraphsGiveTheEagerTokens) {
  Backend& backend = *backend_;
  auto [model, draft] = LoadEagle3(backend, "llama_copy");
  ASSERT_TRUE(draft);
  DraftCostModel cost;  // a draft step a tenth of a target step; more rows cost a little more
  cost.SetTarget(1, 1.0);
  cost.SetTarget(64, 1.2);
  cost.SetDraft(1, 1, 0.1);
  cost.SetDraft(64, 1, 0.15);
  for (float rate : {0.0f, -1.0f}) {
    EngineConfig config;
    config.eagle3 = {draft.get(), 3};
    config.draft_length.adaptive = true;
    config.draft_length.policy.probe_interval = 8;
    config.draft_length.cost_model = &cost;
    config.spec_bench_accept_rate = rate;
    const std::string what = "adaptive eagle3 at forced rate " + std::to_string(rate);
    for (float temperature : {0.0f, 1.0f}) {
      const hsx::Run eager = Generate(*model, config, false, temperature);
      const hsx::Run graphs = Generate(*model, config, true, temperature);
      ASSERT_EQ(eager.tokens.size(), 5u);
      EXPECT_EQ(graphs.tokens, eager.tokens) << what << " at temperature " << temperature;
      EXPECT_EQ(graphs.accepted, eager.accepted) << what;
      EXPECT_EQ(graphs.drafted, eager.drafted) << what;
      EXPECT_GT(graphs.drafted, 0u) << what;
      EXPECT_EQ(eager.kv_only_replays, 0);
      if (rate == 0.0f) {
        EXPECT_GT(graphs.kv_only_replays, 0) << what << ": no KV-only first pass replayed";
      }
    }
  }
}

// Forced acceptance makes the output the drafts (all of them at rate 1; at 0.5, first passes
// of every width 1..K + 1, padded on graphs): drafts on graphs (EAGLE-3 with and without a
// d2t map, MTP) equal eager drafts, and every EAGLE-3 first pass but the prompts' ran in the
// rounds' graphs.
// Negative control: a random draft's forced output differs from the lossless output, so the
// comparison sees the drafts.
TEST_P(SpeculativeGraphs, DraftsOnGraphsEqualEagerDrafts) {
  Backend& backend = *backend_;
  for (float rate : {1.0f, 0.5f}) {
    for (const std::string variant : {"qwen3_default", "llama_legacy"}) {
      auto [model, draft] = LoadEagle3(backend, variant);
      ASSERT_TRUE(draft);
      EngineConfig config;
      config.eagle3 = {draft.get(), 3};
      config.spec_bench_accept_rate = rate;
      const auto eager = Generate(*model, config, false, 0.0f);
      const auto graphs = Generate(*model, config, true, 0.0f);
      const std::string what = variant + " at forced rate " + std::to_string(rate);
      ASSERT_EQ(eager.tokens.size(), 5u);
      EXPECT_EQ(graphs.tokens, eager.tokens) << what;
      EXPECT_EQ(graphs.accepted, eager.accepted) << what;
      EXPECT_GT(graphs.first_pass_replays, 0) << what << ": first passes did not replay graphs";
      // Only the round after the prompts' prefill (its first pass runs the prompts, wider
      // than a verification step) runs its first pass eagerly; rounds that mix in a
      // sequence drafting nothing (no room left: its last token next; just finished) pad
      // it onto the graph too (at rate 1 most rounds are such).
      EXPECT_EQ(graphs.eager_first_passes, 1) << what;
      EXPECT_EQ(eager.draft_replays + eager.first_pass_replays, 0);
      if (rate == 1.0f) {
        EngineConfig lossless = config;
        lossless.spec_bench_accept_rate = -1.0f;
        EXPECT_NE(Generate(*model, lossless, true, 0.0f).tokens, graphs.tokens) << what << ": the target's output";
      }
    }
    auto target = Model::Load(test::DataPath("mtp/gemma4_target"), backend);
    ASSERT_TRUE(target.ok()) << target.status().message();
    auto mtp = MtpDrafter::Load(test::DataPath("mtp/gemma4_assistant_copy"), **target, backend);
    ASSERT_TRUE(mtp.ok()) << mtp.status().message();
    EngineConfig config;
    config.mtp = {mtp->get(), 3};
    config.spec_bench_accept_rate = rate;
    const auto eager = Generate(**target, config, false, 0.0f);
    const auto graphs = Generate(**target, config, true, 0.0f);
    EXPECT_EQ(graphs.tokens, eager.tokens) << "mtp at forced rate " << rate;
    EXPECT_GT(graphs.draft_replays, 0) << "mtp rounds did not replay graphs";
    EXPECT_EQ(eager.draft_replays + graphs.first_pass_replays, 0);
  }
}

// A decode step after which no request drafts has its draft KV-only pass queued on the
// sampled tokens before the host has them (Eagle3Drafter::DecodeSampled); the eager run
// writes the same rows after the download. A cost model under which only a batch of one or
// two gains from drafts keeps the five requests plain until the two longest are left, which
// then draft over the KV the passes ahead wrote. Forced acceptance makes the output those
// drafts (a random draft's: its attention reads that KV), so they must equal the eager run's.
TEST_P(SpeculativeGraphs, KvOnlyPassesAheadOfTheDownloadGiveTheEagerDrafts) {
  Backend& backend = *backend_;
  const std::string variant = "qwen3_default";
  auto [model, draft] = LoadEagle3(backend, variant);
  ASSERT_TRUE(draft);
  DraftCostModel cost;  // up to 3 rows a step costs 1, past them 1 a row
  for (int rows = 1; rows <= 64; ++rows) cost.SetTarget(rows, std::max(1, rows - 2));
  cost.SetDraft(1, 1, 0.01);
  EngineConfig config;
  config.eagle3 = {draft.get(), 2};
  config.draft_length.adaptive = true;
  config.draft_length.cost_model = &cost;
  config.spec_bench_accept_rate = 1.0f;
  const hsx::Run eager = Generate(*model, config, false, 0.0f);
  const hsx::Run graphs = Generate(*model, config, true, 0.0f);
  EXPECT_EQ(eager.kv_passes_ahead, 0);
  EXPECT_GT(graphs.kv_passes_ahead, 10);
  EXPECT_GT(graphs.accepted, 5u);
  ASSERT_EQ(eager.tokens.size(), 5u);
  EXPECT_EQ(graphs.tokens, eager.tokens);
  EXPECT_EQ(graphs.accepted, eager.accepted);
  config.spec_bench_accept_rate = -1.0f;  // negative control: the output is the drafts
  EXPECT_NE(Generate(*model, config, true, 0.0f).tokens, graphs.tokens);
}

TEST_P(SpeculativeGraphs, MtpVerificationOnGraphsGivesTheEagerTokens) {
  Backend& backend = *backend_;
  auto model = Model::Load(test::DataPath("mtp/gemma4_target"), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto drafter = MtpDrafter::Load(test::DataPath("mtp/gemma4_assistant_copy"), **model, backend);
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  EngineConfig config;
  config.mtp = {drafter->get(), 3};
  ExpectGraphsGiveTheEagerRun(**model, config, "mtp", true);
}

// A verification step of 60 sequences whose draft counts differ (prompt lookup finds
// matches in the prompts that repeat a loop, none in the others) would pad to 64 x 4 rows,
// past kMaxPaddedGraphRows: it runs packed instead (its draft rows rounded up, padding at
// the sequences' fronts), with the eager run's tokens and acceptance, greedy and seeded.
TEST_P(SpeculativeGraphs, MixedDraftCountsPastThePaddedRowsRunPackedGraphs) {
  Backend& backend = *backend_;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const int vocab = (*model)->config().vocab_size;
  auto run = [&](bool graphs, float temperature) {
    EngineConfig config;
    config.ngram = {3, 1, 2};
    config.graphs = graphs;
    config.graph_shapes_without_recording = true;
    config.num_blocks = 512;
    config.scheduler.max_num_seqs = 64;
    Engine engine(**model, config);
    for (int i = 0; i < 60; ++i) {
      Request r;
      r.id = "r" + std::to_string(i);
      const int period = i % 2 == 0 ? 3 + i % 5 : 1000;  // odd requests: no repeats to look up
      for (int t = 0; t < 12 + i % 7; ++t) r.prompt.push_back((37 * (t % period) + 11 * i + 5) % vocab);
      r.max_new_tokens = 6 + i % 9;
      r.sampling.temperature = temperature;
      r.sampling.seed = 500 + i;
      EXPECT_TRUE(engine.Add(std::move(r)).ok());
    }
    hsx::Run out;
    while (engine.has_work()) {
      for (auto& seq : engine.Step()) out.tokens[seq->id()] = seq->generated();
    }
    out.accepted = engine.stats().num_accepted_tokens;
    out.drafted = engine.stats().num_draft_tokens;
    out.verify_replays = engine.runner().packed_graph_steps();
    return out;
  };
  for (float temperature : {0.0f, 1.0f}) {
    const hsx::Run eager = run(false, temperature), graphs = run(true, temperature);
    ASSERT_EQ(eager.tokens.size(), 60u);
    EXPECT_GT(graphs.drafted, 0u);
    EXPECT_GT(graphs.verify_replays, 0) << "no step ran packed";
    EXPECT_EQ(graphs.tokens, eager.tokens) << "at temperature " << temperature;
    EXPECT_EQ(graphs.accepted, eager.accepted) << "at temperature " << temperature;
  }
}

// Token-tree verification steps on graphs (the tree's mask words in the fixed inputs;
// requests near their end verify smaller trees, padded at their front) and tree rounds on
// graphs (every request taking the whole tree, the first pass padded as a chain's; slots
// that draft nothing take trees of their own) give the eager tokens and acceptance, greedy
// and seeded.
TEST_P(SpeculativeGraphs, TreeVerificationOnGraphsGivesTheEagerTokens) {
  Backend& backend = *backend_;
  auto [model, draft] = LoadEagle3(backend, "llama_copy");
  ASSERT_TRUE(draft);
  auto tree = TokenTree::Parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]", "tree");
  ASSERT_TRUE(tree.ok());
  EngineConfig config;
  config.eagle3 = {draft.get(), tree->size(), *tree};
  for (float temperature : {0.0f, 1.0f}) {
    const hsx::Run eager = Generate(*model, config, false, temperature);
    const hsx::Run graphs = Generate(*model, config, true, temperature);
    ASSERT_EQ(eager.tokens.size(), 5u);
    if (temperature == 0.0f) {
      EXPECT_GT(graphs.accepted, 0u);  // llama_copy's drafts match greedy rows
    }
    EXPECT_GT(graphs.verify_replays, 0) << "tree verification steps did not replay graphs";
    EXPECT_GT(graphs.draft_replays, 0) << "tree rounds did not replay graphs";
    EXPECT_GT(graphs.first_pass_replays, 0) << "no tree round's first pass was on its graph";
    EXPECT_EQ(eager.draft_replays, 0);
    EXPECT_EQ(graphs.tokens, eager.tokens) << "at temperature " << temperature;
    EXPECT_EQ(graphs.accepted, eager.accepted) << "at temperature " << temperature;
  }
}

// A tree round's tokens stay on the device from depth to depth (each node's gathered from
// its parent's row of top tokens). Forced acceptance takes each node's first child, so the
// output is the path of rank-0 children, which must be the chain's greedy drafts: a tree
// of width 3 and depth 3 against the chain of 3, on a random draft (the drafts are never
// the target's greedy tokens: the negative control shows the output is the drafts).
TEST_P(SpeculativeGraphs, TreeRoundsFirstChildrenAreTheChainsDrafts) {
  Backend& backend = *backend_;
  const std::string variant = "qwen3_default";
  auto [model, draft] = LoadEagle3(backend, variant);
  ASSERT_TRUE(draft);
  auto tree = TokenTree::Parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]", "tree");
  ASSERT_TRUE(tree.ok());
  EngineConfig chain;
  chain.eagle3 = {draft.get(), 3};
  chain.spec_bench_accept_rate = 1.0f;
  EngineConfig trees = chain;
  trees.eagle3 = {draft.get(), tree->size(), *tree};
  const hsx::Run chained = Generate(*model, chain, true, 0.0f);
  const hsx::Run treed = Generate(*model, trees, true, 0.0f);
  ASSERT_EQ(chained.tokens.size(), 5u);
  EXPECT_GT(treed.accepted, 10u);
  EXPECT_EQ(treed.tokens, chained.tokens);
  EXPECT_EQ(treed.accepted, chained.accepted);
  chain.spec_bench_accept_rate = -1.0f;  // negative control: the output is the drafts
  EXPECT_NE(Generate(*model, chain, true, 0.0f).tokens, chained.tokens);
}

// EAGLE-2's dynamic trees under forced acceptance, where the output is the drafts: the
// first children of a top-3 tree of 2 depths with every candidate verified are the root's
// best and its best child, the chain of 2's drafts; a top-1 tree of 4 depths is the chain
// of 4 (its depths chained through the expanded nodes' scratch KV). Verification steps of
// the trees' rows replay graphs with the eager tokens, greedy and seeded.
TEST_P(SpeculativeGraphs, DynamicTreesFirstChildrenAreTheChainsDrafts) {
  Backend& backend = *backend_;
  auto [model, draft] = LoadEagle3(backend, "qwen3_default");
  ASSERT_TRUE(draft);
  struct Case {
    int topk, depth, nodes, chain;
  };
  for (const Case c : {Case{3, 2, 12, 2}, Case{1, 4, 4, 4}}) {
    EngineConfig chain;
    chain.eagle3 = {draft.get(), c.chain};
    chain.spec_bench_accept_rate = 1.0f;
    EngineConfig trees = chain;
    trees.eagle3 = {draft.get(), c.nodes, std::nullopt, DynamicTreeConfig{c.topk, c.depth}};
    const hsx::Run chained = Generate(*model, chain, true, 0.0f);
    const hsx::Run treed = Generate(*model, trees, true, 0.0f);
    ASSERT_EQ(chained.tokens.size(), 5u);
    EXPECT_GT(treed.accepted, 10u);
    EXPECT_EQ(treed.tokens, chained.tokens) << "topk " << c.topk << " depth " << c.depth;
    EXPECT_EQ(treed.accepted, chained.accepted);
  }
  EngineConfig trees;
  trees.eagle3 = {draft.get(), 8, std::nullopt, DynamicTreeConfig{3, 3}};
  ExpectGraphsGiveTheEagerRun(*model, trees, "eagle3 dynamic tree", false);
}

// Every decode and verification shape of the buckets up to max_num_seqs is recorded when the
// engine starts (where the backend records), and a run of mixed draft counts then records
// none: its steps replay graphs recorded over padding-only inputs, with the eager tokens.
TEST_P(SpeculativeGraphs, StepGraphsAreRecordedAtStartUp) {
  Backend& backend = *backend_;
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EngineConfig config;
  config.ngram = {3, 1, 2};
  config.scheduler.max_num_seqs = 8;
  config.num_blocks = 128;
  const int64_t expected = backend.can_record() ? 4 * 4 : 0;  // buckets 1, 2, 4, 8 at q = 1..K + 1
  EXPECT_EQ(Engine(**model, config).runner().graphs_recorded(), expected);
  config.graphs = false;
  EXPECT_EQ(Engine(**model, config).runner().graphs_recorded(), 0);
  const hsx::Run eager = Generate(**model, config, false, 0.0f);
  const hsx::Run graphs = Generate(**model, config, true, 0.0f);
  EXPECT_GT(graphs.verify_replays, 0);
  EXPECT_EQ(graphs.tokens, eager.tokens);
  EXPECT_EQ(graphs.recorded_later, 0);
  // An adaptive EAGLE-3 drafter's rounds too: per bucket, first passes of q = 1..K + 1 rows
  // with 0 (KV-only) to K drafts, and the chained steps alone of 2..K drafts.
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/llama_copy"), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  EngineConfig eagle = config;
  eagle.ngram = {};
  eagle.graphs = true;
  eagle.eagle3 = {draft->get(), 3};
  eagle.draft_length.adaptive = true;
  Engine engine(**model, eagle);
  EXPECT_EQ(engine.drafter()->rounds_recorded(), backend.can_record() ? 4 * (4 * 4 + 2) : 0);
  EXPECT_EQ(engine.drafter()->graph_replays() + engine.drafter()->kv_only_graph_replays(), 0);
  // A token tree's rounds: per bucket, the whole tree after first passes of q = 1..depth + 1
  // rows and its depths alone (q = 0); then a run records none.
  auto tree = TokenTree::Parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]", "tree");
  ASSERT_TRUE(tree.ok());
  EngineConfig trees = eagle;
  trees.draft_length.adaptive = false;
  trees.eagle3 = {draft->get(), tree->size(), *tree};
  const int64_t tree_rounds = backend.can_record() ? 4 * (tree->max_depth + 2) : 0;
  EXPECT_EQ(Engine(**model, trees).drafter()->rounds_recorded(), tree_rounds);
  Engine serving(**model, trees);
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.id = "t" + std::to_string(i);
    for (int t = 0; t < 12 + 3 * i; ++t) r.prompt.push_back((7 * t + i) % (**model).config().vocab_size);
    r.max_new_tokens = 20;
    ASSERT_TRUE(serving.Add(std::move(r)).ok());
  }
  while (serving.has_work()) serving.Step();
  EXPECT_EQ(serving.drafter()->rounds_recorded(), tree_rounds) << "tree rounds recorded while serving";
  if (backend.can_record()) {
    EXPECT_GT(serving.drafter()->graph_replays(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SpeculativeGraphs, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace hsx
