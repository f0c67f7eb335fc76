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

// Depth 1 from the root's row, then depth 2 from both frontier rows: candidates at their
// places with path scores, the frontier the k best (a tie to the earlier place, -1 tokens
// at -inf), masks of the scratch slots, and the next rows' inputs.
TEST(DynamicTree, ExpansionScoresChoosesAndMasks) {
  const int k = 2, places = 2 + 4;
  std::vector<int32_t> tokens(places, 99), parents(places, 99), frontier(k, 99), next_ids(k), next_rows(k);
  std::vector<float> scores(places, 99.0f);
  std::vector<uint64_t> masks(k, 99), next_masks(k);
  const std::vector<int32_t> root_ids = {5, 7};
  const std::vector<float> root_lps = {-0.25f, -2.0f};
  ExpandDraftTreeSlot(root_ids.data(), root_lps.data(), k, 1, tokens.data(), scores.data(), parents.data(),
                      frontier.data(), masks.data(), next_ids.data(), next_rows.data(), next_masks.data());
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.begin() + 2), (std::vector<int32_t>{5, 7}));
  EXPECT_EQ(std::vector<float>(scores.begin(), scores.begin() + 2), (std::vector<float>{-0.25f, -2.0f}));
  EXPECT_EQ(std::vector<int32_t>(parents.begin(), parents.begin() + 2), (std::vector<int32_t>{-1, -1}));
  EXPECT_EQ(frontier, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(masks, (std::vector<uint64_t>{1, 2}));  // scratch slots 0 and 1
  EXPECT_EQ(next_ids, (std::vector<int32_t>{5, 7}));
  EXPECT_EQ(next_rows, (std::vector<int32_t>{0, 0}));
  // Row 0 (token 5, score -0.25) drafts 10 (-1.75) and 11 (-1.75: a tie); row 1 (token 7,
  // -2.0) drafts 12 (+0: still -2.0) and none (-1). The frontier: places 2 and 3.
  const std::vector<int32_t> ids = {10, 11, 12, -1};
  const std::vector<float> lps = {-1.5f, -1.5f, 0.0f, -0.5f};
  ExpandDraftTreeSlot(ids.data(), lps.data(), k, 2, tokens.data(), scores.data(), parents.data(), frontier.data(),
                      masks.data(), next_ids.data(), next_rows.data(), next_masks.data());
  EXPECT_EQ(std::vector<int32_t>(tokens.begin() + 2, tokens.end()), (std::vector<int32_t>{10, 11, 12, -1}));
  EXPECT_EQ(std::vector<int32_t>(parents.begin() + 2, parents.end()), (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(scores[4], -2.0f);
  EXPECT_EQ(scores[5], -INFINITY);
  EXPECT_EQ(frontier, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(masks, (std::vector<uint64_t>{0b0101, 0b1001}));  // scratch 2 and 3, each with node 0's slot
  EXPECT_EQ(next_ids, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(next_rows, (std::vector<int32_t>{0, 0}));
  // Depth 3 with both depth-2 frontier rows drafting nothing (NaN scores rank as -inf; ties
  // to the earlier place): the frontier is the first two places, and their tokens feed 0.
  const std::vector<int32_t> none = {-1, -1, -1, -1};
  tokens.resize(2 + 2 * 4);
  scores.resize(tokens.size());
  parents.resize(tokens.size());
  ExpandDraftTreeSlot(none.data(), lps.data(), k, 3, tokens.data(), scores.data(), parents.data(), frontier.data(),
                      masks.data(), next_ids.data(), next_rows.data(), next_masks.data());
  EXPECT_EQ(frontier, (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(next_ids, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(masks, (std::vector<uint64_t>{0b010101, 0b100101}));
}

TEST(DynamicTree, SelectionKeepsParentsFirstAndRenumbers) {
  // Root children 0 (-0.1) and 1 (-2.0); node 0's children 2 (-0.3) and 3 (-5.1), node 2's
  // child 4 (-0.3 exactly: a child may tie its parent; the parent wins on its place); 5 has
  // no token.
  const std::vector<int32_t> tokens = {100, 101, 102, 103, 104, -1}, parents = {-1, -1, 0, 0, 2, 2};
  const std::vector<float> scores = {-0.1f, -2.0f, -0.3f, -5.1f, -0.3f, 0.0f};
  auto select = [&](int places, int budget) {
    return SelectDraftTreeSlot(tokens.data(), scores.data(), parents.data(), places, budget);
  };
  DraftTree t = select(6, 3);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{100, 102, 104}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1}));
  t = select(6, 4);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{100, 101, 102, 104}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, -1, 0, 2}));
  t = select(6, 9);
  EXPECT_EQ(t.tokens.size(), 5u);  // not the place without a token
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, -1, 0, 0, 2}));
  t = select(4, 9);  // places past a request's depths are not its
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{100, 101, 102, 103}));
  EXPECT_TRUE(select(6, 0).tokens.empty());
  // A child scored above its parent (logprobs <= 0 cannot make one) is not taken without it.
  const std::vector<int32_t> bad_tokens = {1, 2, 3}, bad_parents = {-1, -1, 0};
  const std::vector<float> bad_scores = {-3.0f, -1.0f, -0.5f};
  t = SelectDraftTreeSlot(bad_tokens.data(), bad_scores.data(), bad_parents.data(), 3, 2);
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
    test::Eagle3Fixture f = test::LoadEagle3(backend, variant);
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

// The round on graph shapes (every depth's inputs fixed, the device writing each depth's
// tokens, parents' rows and masks; the CPU runs them eagerly) drafts the trees the eager
// round does, which brings each depth's choices home: two engines in lockstep (forced
// rejection), five requests of staggered prompts (first passes after a prefill run eagerly,
// then the depths on the bucket's shapes) and lengths (near its end a request's depth is
// its room: padding rows on the graph). Then greedy output on graph shapes is plain decode's.
TEST(DynamicTree, GraphRoundsDraftTheEagerTrees) {
  CpuBackend backend(/*batch_invariant=*/true);
  test::Eagle3Fixture f = test::LoadEagle3(backend, "qwen3_default");
  ASSERT_TRUE(f.draft);
  EngineConfig eager;
  eager.scheduler.max_num_seqs = 8;
  eager.num_blocks = 128;
  eager.graphs = false;
  eager.spec_bench_accept_rate = 0.0f;
  // Every candidate verified: the random draft's deeper paths score too low to be chosen
  // otherwise, and the depths' expansions would go unseen.
  eager.eagle3 = {f.draft.get(), 21, std::nullopt, DynamicTreeConfig{3, 3}};
  EngineConfig graphs = eager;
  graphs.graphs = true;
  graphs.graph_shapes_without_recording = true;
  const int vocab = f.model->config().vocab_size;
  std::vector<Request> requests;
  for (int i = 0; i < 5; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    for (int t = 0; t < 9 + 5 * i; ++t) r.prompt.push_back((31 * (t % (3 + i)) + 17 * i + 3) % vocab);
    r.max_new_tokens = 4 + 3 * i;
    requests.push_back(std::move(r));
  }
  auto run = [&](EngineConfig config, bool check) {
    Engine a(*f.model, eager), b(*f.model, config);
    for (const Request& r : requests) {
      EXPECT_TRUE(a.Add(r).ok());
      EXPECT_TRUE(b.Add(r).ok());
    }
    int compared = 0;
    std::map<std::string, std::vector<int32_t>> out_a, out_b;
    while (a.has_work() || b.has_work()) {
      for (auto& seq : a.Step()) out_a[seq->id()] = seq->generated();
      for (auto& seq : b.Step()) out_b[seq->id()] = seq->generated();
      const auto &ra = a.scheduler().running(), &rb = b.scheduler().running();
      EXPECT_EQ(ra.size(), rb.size());
      for (size_t i = 0; check && i < std::min(ra.size(), rb.size()); ++i) {
        EXPECT_EQ(rb[i]->drafts, ra[i]->drafts) << ra[i]->id();
        EXPECT_EQ(rb[i]->draft_parents, ra[i]->draft_parents) << ra[i]->id();
        compared += !ra[i]->drafts.empty();
      }
    }
    EXPECT_EQ(out_b, out_a);
    EXPECT_GT(b.drafter()->graph_replays(), 0);
    EXPECT_GT(b.drafter()->eager_first_passes(), 0);
    return compared;
  };
  EXPECT_GT(run(graphs, true), 20);
  graphs.spec_bench_accept_rate = -1.0f;  // greedy verification: the plain decode's tokens
  eager.spec_bench_accept_rate = -1.0f;
  run(graphs, false);
}

// Greedy output with dynamic trees is the plain decode's on every EAGLE-3 fixture, for
// widths, depths and budgets from the chain (top-1) to trees pruned well below their
// candidates, over blocks of 4 (top 5: a padding slot's rows span two); llama_copy's
// drafts get accepted.
TEST(DynamicTree, GreedyOutputIsThePlainDecode) {
  CpuBackend backend(/*batch_invariant=*/true);
  struct Case {
    int topk, depth, nodes;
  };
  for (const std::string variant : {"llama_legacy", "qwen3_default", "llama_copy"}) {
    test::Eagle3Fixture f = test::LoadEagle3(backend, variant);
    ASSERT_TRUE(f.draft);
    SafetensorsFile golden = test::Golden(test::ModelDir(test::Eagle3Target(variant)) + "/golden.safetensors");
    EngineConfig plain;
    plain.scheduler.max_num_batched_tokens = 64;
    plain.block_size = 4;  // a depth's k rows and the scratch slots span blocks
    const test::Generation reference = test::Generate(*f.model, test::GoldenPrompts(golden), plain, 24);
    for (const Case c : {Case{1, 3, 3}, Case{2, 2, 6}, Case{3, 3, 8}, Case{4, 4, 16}, Case{2, 5, 5}, Case{5, 3, 12}}) {
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
