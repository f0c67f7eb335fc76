// EAGLE-2's dynamic draft trees (engine/dynamic_tree.h): the selection keeps every chosen
// node's parent and orders parents first, ties and NaN included; the option is read as
// SGLang's flags and bad values are refused by name; a dynamic tree's nodes are drafted
// as the static tree of every top-k path drafts them (lockstep engines under forced
// rejection: every node's token path is one of the full tree's); an EAGLE-3 engine drafting
// dynamic trees emits exactly the plain greedy decode.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/dynamic_tree.h"
#include "engine/engine.h"
#include "engine/speculative_config.h"
#include "engine/token_tree.h"
#include "engine_runs.h"
#include "model/eagle3_draft.h"
#include "model/model.h"
#include "test_util.h"

namespace hsx {
namespace {

// ---------------------------------------------------------------- the selection

TEST(DynamicTree, BestCandidatesRankByScoreThenIndex) {
  const std::vector<DraftCandidate> c = {{10, -1.0f, -1}, {11, -0.5f, -1}, {12, -1.0f, -1}, {13, NAN, -1}, {14, -3.0f, -1}};
  EXPECT_EQ(BestCandidates(c, 0, 3), (std::vector<int32_t>{1, 0, 2}));  // the tie at -1 to the lower index
  EXPECT_EQ(BestCandidates(c, 2, 2), (std::vector<int32_t>{2, 4}));     // from index 2; NaN last
  EXPECT_EQ(BestCandidates(c, 0, 9).size(), 5u);
  EXPECT_EQ(BestCandidates(c, 0, 9).back(), 3);
  EXPECT_TRUE(BestCandidates(c, 5, 3).empty());
}

TEST(DynamicTree, SelectionKeepsParentsFirstAndRenumbers) {
  // Root children 0 (-0.1) and 1 (-2.0); node 0's children 2 (-0.3) and 3 (-0.1 - 5), node
  // 2's child 4 (-0.3 exactly: a child may tie its parent; the parent wins on its index).
  const std::vector<DraftCandidate> c = {
      {100, -0.1f, -1}, {101, -2.0f, -1}, {102, -0.3f, 0}, {103, -5.1f, 0}, {104, -0.3f, 2},
  };
  DraftTree t = SelectDraftTree(c, 3);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{100, 102, 104}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1}));
  t = SelectDraftTree(c, 4);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{100, 101, 102, 104}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, -1, 0, 2}));
  t = SelectDraftTree(c, 9);
  EXPECT_EQ(t.tokens.size(), 5u);
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, -1, 0, 0, 2}));
  EXPECT_TRUE(SelectDraftTree(c, 0).tokens.empty());
  // A child scored above its parent (it cannot come from logprobs <= 0) is not taken
  // without it: the tree stays a tree.
  const std::vector<DraftCandidate> bad = {{1, -3.0f, -1}, {2, -1.0f, -1}, {3, -0.5f, 0}};
  t = SelectDraftTree(bad, 2);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{2}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1}));
}

// ---------------------------------------------------------------- the option

TEST(DynamicTree, SpeculativeConfigTakesSglangsFlagsForEagle3) {
  auto c = ParseSpeculativeConfig(
      R"({"method": "eagle3", "model": "d", "num_speculative_tokens": 15, "speculative_eagle_topk": 4, "speculative_num_steps": 3})",
      4);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->dynamic_tree.has_value());
  EXPECT_EQ(c->dynamic_tree->topk, 4);
  EXPECT_EQ(c->dynamic_tree->depth, 3);
  EXPECT_EQ(c->num_speculative_tokens, 15);
  EXPECT_FALSE(c->token_tree.has_value());
  const std::string head = R"({"method": "eagle3", "model": "d", )";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("num_speculative_tokens": 4, "speculative_eagle_topk": 2})", "give both"},
      {R"("num_speculative_tokens": 4, "speculative_num_steps": 2})", "give both"},
      {R"("speculative_eagle_topk": 2, "speculative_num_steps": 2})", "\"num_speculative_tokens\" (the candidates"},
      {R"("num_speculative_tokens": 4, "speculative_eagle_topk": 0, "speculative_num_steps": 2})",
       "\"speculative_eagle_topk\" must be an integer in [1, 64], got 0"},
      {R"("num_speculative_tokens": 4, "speculative_eagle_topk": 17, "speculative_num_steps": 2})",
       "\"speculative_eagle_topk\" must be at most 16, got 17"},
      {R"("num_speculative_tokens": 4, "speculative_eagle_topk": 2, "speculative_num_steps": "3"})",
       "\"speculative_num_steps\" must be an integer"},
      {R"("num_speculative_tokens": 4, "speculative_eagle_topk": 8, "speculative_num_steps": 10})",
       "= 72 nodes expanded, at most 63"},
      {R"("num_speculative_tokens": 7, "speculative_eagle_topk": 2, "speculative_num_steps": 2})",
       "(7) must be at most 6 (the candidates a round scores, 6"},
      {R"("num_speculative_tokens": 4, "speculative_eagle_topk": 2, "speculative_num_steps": 2, "draft_length": "adaptive"})",
       "not with \"draft_length\": \"adaptive\""},
      {R"("num_speculative_tokens": 2, "speculative_eagle_topk": 2, "speculative_num_steps": 2, "speculative_token_tree": "[(0,), (1,)]"})",
       "not with \"speculative_token_tree\""},
  };
  for (const auto& [tail, message] : bad) {
    auto r = ParseSpeculativeConfig(head + tail, 4);
    ASSERT_FALSE(r.ok()) << tail;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
  auto mtp = ParseSpeculativeConfig(
      R"({"method": "mtp", "model": "d", "num_speculative_tokens": 2, "speculative_eagle_topk": 2, "speculative_num_steps": 2})", 4);
  ASSERT_FALSE(mtp.ok());
  EXPECT_NE(mtp.status().message().find("field \"speculative_eagle_topk\" is not taken by method \"mtp\""),
            std::string::npos);
}

// ---------------------------------------------------------------- the engine

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Eagle3Draft> draft;
};

Fixture Load(Backend& backend, const std::string& variant) {
  Fixture f;
  auto model = Model::Load(test::ModelDir(test::Eagle3Target(variant)), backend);
  if (!model.ok()) {
    ADD_FAILURE() << model.status().message();
    return f;
  }
  f.model = std::move(*model);
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), *f.model, backend);
  if (!draft.ok()) {
    ADD_FAILURE() << draft.status().message();
    return f;
  }
  f.draft = std::move(*draft);
  return f;
}

// A tree's token paths (each node's tokens from the root's child down).
std::set<std::vector<int32_t>> Paths(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents) {
  std::set<std::vector<int32_t>> paths;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<int32_t> path;
    for (int j = static_cast<int>(i); j >= 0; j = parents[j]) path.insert(path.begin(), tokens[j]);
    paths.insert(path);
  }
  return paths;
}

// Two engines in lockstep (forced rejection: every step emits the target's token alone, so
// both see the same sequences and draft KV): one drafts the static tree of every path of
// ranks < 2 to depth 3 (14 nodes), the other dynamic trees of top-2 over 3 depths with
// every candidate verified (2 + 4 + 4). Each dynamic node's token path must be one of the
// static tree's (its expansions at depth 3 read the right parents' hidden rows and KV), its
// first depth the static tree's, and it has 2 nodes at depth 3 whose parents differ or
// agree as the scores chose, but always 10 nodes.
TEST(DynamicTree, NodesAreTheFullTreesPathsInLockstep) {
  CpuBackend backend(/*batch_invariant=*/true);
  for (const std::string variant : {"llama_legacy", "qwen3_default"}) {
    Fixture f = Load(backend, variant);
    ASSERT_TRUE(f.draft);
    auto full = TokenTree::Parse(
        "[(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1),"
        " (1, 1, 0), (1, 1, 1)]",
        "tree");
    ASSERT_TRUE(full.ok());
    EngineConfig base;
    base.scheduler.max_num_batched_tokens = 64;
    base.spec_bench_accept_rate = 0.0f;
    EngineConfig fixed = base, dynamic = base;
    fixed.eagle3 = {f.draft.get(), full->size(), *full};
    dynamic.eagle3 = {f.draft.get(), 10, std::nullopt, DynamicTreeConfig{2, 3}};
    Engine a(*f.model, fixed), b(*f.model, dynamic);
    const int vocab = f.model->config().vocab_size;
    for (int i = 0; i < 3; ++i) {
      Request r;
      r.id = "r" + std::to_string(i);
      for (int t = 0; t < 7 + 4 * i; ++t) r.prompt.push_back((29 * t + 11 * i + 5) % vocab);
      r.max_new_tokens = 12;
      Request copy = r;
      ASSERT_TRUE(a.Add(std::move(r)).ok());
      ASSERT_TRUE(b.Add(std::move(copy)).ok());
    }
    int trees = 0;
    while (a.has_work() || b.has_work()) {
      a.Step();
      b.Step();
      const auto &ra = a.scheduler().running(), &rb = b.scheduler().running();
      ASSERT_EQ(ra.size(), rb.size());
      for (size_t i = 0; i < ra.size(); ++i) {
        ASSERT_EQ(ra[i]->tokens(), rb[i]->tokens()) << variant << ": the engines left lockstep";
        const Sequence &s = *ra[i], &d = *rb[i];
        if (d.drafts.empty() || s.drafts.size() != static_cast<size_t>(full->size())) continue;
        ASSERT_EQ(d.drafts.size(), 10u) << variant;
        ASSERT_EQ(d.draft_parents.size(), 10u);
        const std::set<std::vector<int32_t>> all = Paths(s.drafts, s.draft_parents);
        for (const std::vector<int32_t>& path : Paths(d.drafts, d.draft_parents)) {
          EXPECT_TRUE(all.count(path)) << variant << ": a dynamic node's path is no top-2 path";
        }
        // Depth 1: the root's two best, in rank order.
        EXPECT_EQ(std::vector<int32_t>(d.drafts.begin(), d.drafts.begin() + 2),
                  std::vector<int32_t>(s.drafts.begin(), s.drafts.begin() + 2));
        int deepest = 0;
        for (int n = 0; n < 10; ++n) deepest += NodeDepth(d.draft_parents, n) == 3;
        EXPECT_EQ(deepest, 4);  // the two expanded depth-2 nodes' children
        ++trees;
      }
    }
    EXPECT_GT(trees, 10) << variant;
  }
}

// Greedy output with dynamic trees is the plain decode's on every EAGLE-3 fixture, for
// widths, depths and budgets from the chain (top-1) to trees pruned well below their
// candidates; llama_copy's drafts get accepted.
TEST(DynamicTree, GreedyOutputIsThePlainDecode) {
  CpuBackend backend(/*batch_invariant=*/true);
  struct Case {
    int topk, depth, nodes;
  };
  for (const std::string variant : {"llama_legacy", "qwen3_default", "llama_copy"}) {
    Fixture f = Load(backend, variant);
    ASSERT_TRUE(f.draft);
    SafetensorsFile golden = test::Golden(test::ModelDir(test::Eagle3Target(variant)) + "/golden.safetensors");
    EngineConfig plain;
    plain.scheduler.max_num_batched_tokens = 64;
    const test::Generation reference = test::Generate(*f.model, test::GoldenPrompts(golden), plain, 24);
    for (const Case c : {Case{1, 3, 3}, Case{2, 2, 6}, Case{3, 3, 8}, Case{4, 4, 16}, Case{2, 5, 5}}) {
      EngineConfig speculative = plain;
      speculative.eagle3 = {f.draft.get(), c.nodes, std::nullopt, DynamicTreeConfig{c.topk, c.depth}};
      const test::Generation run = test::Generate(*f.model, test::GoldenPrompts(golden), speculative, 24);
      const std::string what = variant + " topk " + std::to_string(c.topk) + " depth " + std::to_string(c.depth) +
                               " nodes " + std::to_string(c.nodes);
      EXPECT_EQ(run.tokens, reference.tokens) << what;
      EXPECT_GT(run.stats.num_draft_tokens, 0u) << what;
      if (variant == "llama_copy") {
        EXPECT_GT(run.stats.num_accepted_tokens, 0u) << what;
      }
      std::printf("[dynamic tree] %-40s accepted %lu of %lu drafts, %lu steps (plain %lu)\n", what.c_str(),
                  static_cast<unsigned long>(run.stats.num_accepted_tokens),
                  static_cast<unsigned long>(run.stats.num_draft_tokens), static_cast<unsigned long>(run.stats.steps),
                  static_cast<unsigned long>(reference.stats.steps));
    }
  }
}

}  // namespace
}  // namespace hsx
