// Token-tree speculative decoding (engine/token_tree.h, backend/verification.h's trees,
// SequenceSlice's tree mask): the option is read as vLLM reads speculative_token_tree and
// bad trees are refused by name; a tree row attends to its ancestors only (a sibling's KV,
// poisoned, changes nothing; its output is the one of its path laid out as a plain
// sequence); greedy tree verification walks SGLang's verify_tree_greedy and accepts a
// second-ranked child a chain cannot; random tree verification is lossless (chi-square on
// the first token and the first two jointly, with a wrong rejection rule as a control that
// fails); an EAGLE-3 engine drafting trees emits exactly the plain greedy decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/sampling_math.h"
#include "engine/engine.h"
#include "engine/speculative_config.h"
#include "engine/token_tree.h"
#include "model/eagle3_draft.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "sampling_reference.h"
#include "engine_runs.h"
#include "test_util.h"

namespace hsx {
namespace {

using Rows = std::vector<std::vector<float>>;

// ---------------------------------------------------------------- the option

TEST(TokenTree, ParsesVllmsLiteralInVllmsOrder) {
  auto t = TokenTree::Parse("[(1,), (0, 0), (0,), (0, 1), (1, 0), (0, 0, 0),]", "tree");
  ASSERT_TRUE(t.ok()) << t.status().message();
  // sorted by (length, path)
  const std::vector<std::vector<int>> want = {{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}};
  EXPECT_EQ(t->paths, want);
  EXPECT_EQ(t->parent, (std::vector<int32_t>{-1, -1, 0, 0, 1, 2}));
  EXPECT_EQ(t->depth, (std::vector<int32_t>{1, 1, 2, 2, 2, 3}));
  EXPECT_EQ(t->rank, (std::vector<int32_t>{0, 1, 0, 1, 0, 0}));
  EXPECT_EQ(t->max_depth, 3);
  EXPECT_FALSE(t->is_chain());
  EXPECT_EQ(t->NodesUpToDepth(1), 2);
  EXPECT_EQ(t->NodesUpToDepth(2), 5);
  EXPECT_EQ(t->AncestorMask(5), 0b100101u);  // node 5 <- node 2 <- node 0
  EXPECT_EQ(t->AncestorMask(4), 0b10010u);
  // tuples of lists, lists of lists, spaces: what ast.literal_eval reads
  ASSERT_TRUE(TokenTree::Parse("((0,),[1],( 0 , 0 ))", "tree").ok());
  auto chain = TokenTree::Parse("[(0,), (0, 0), (0, 0, 0)]", "tree");
  ASSERT_TRUE(chain.ok());
  EXPECT_TRUE(chain->is_chain());
  EXPECT_EQ(chain->paths, TokenTree::Chain(3).paths);
}

TEST(TokenTree, RefusesBadTreesNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[]", "has no nodes"},
      {"[(0,), (1, 1)]", "path (1, 1) has no parent (1,)"},
      {"[(1,), (1, 0, 0)]", "has no parent (1, 0)"},
      {"[(0,), (0,)]", "is given twice"},
      {"[(0)]", "is not a tuple"},
      {"[(0,), (-1,)]", "expected a child rank"},
      {"[(0,), ()]", "an empty path"},
      {"[(0,) (1,)]", "expected ',' or the list's end"},
      {"[(0,)] x", "unexpected text"},
      {"{0: 1}", "expected a list of paths"},
  };
  for (const auto& [text, message] : cases) {
    auto t = TokenTree::Parse(text, "FIELD");
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_NE(t.status().message().find("FIELD"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(message), std::string::npos) << text << ": " << t.status().message();
  }
  std::string big = "[";
  for (int i = 0; i < 64; ++i) big += "(" + std::to_string(i) + ",),";
  big += "]";
  auto t = TokenTree::Parse(big, "FIELD");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("64 nodes, at most 63"), std::string::npos) << t.status().message();
}

TEST(TokenTree, SpeculativeConfigTakesTheTreeForEagle3Only) {
  auto c = ParseSpeculativeConfig(R"({"method": "eagle3", "model": "d", "speculative_token_tree": "[(0,), (1,), (0, 0)]"})", 4);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->token_tree.has_value());
  EXPECT_EQ(c->num_speculative_tokens, 3);  // vLLM: one verified draft per node
  auto same = ParseSpeculativeConfig(
      R"({"method": "eagle3", "model": "d", "num_speculative_tokens": 3, "speculative_token_tree": "[(0,), (1,), (0, 0)]"})", 4);
  EXPECT_TRUE(same.ok());
  auto chain = ParseSpeculativeConfig(R"({"method": "eagle3", "model": "d", "speculative_token_tree": "[(0,), (0, 0)]"})", 4);
  ASSERT_TRUE(chain.ok());
  EXPECT_FALSE(chain->token_tree.has_value());  // a chain drafts as the chain
  EXPECT_EQ(chain->num_speculative_tokens, 2);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"method": "eagle3", "model": "d", "num_speculative_tokens": 2, "speculative_token_tree": "[(0,), (1,), (0, 0)]"})",
       "\"num_speculative_tokens\" (2) must equal the number of nodes of \"speculative_token_tree\" (3)"},
      {R"({"method": "eagle3", "model": "d", "speculative_token_tree": [[0], [1]]})", "must be a string"},
      {R"({"method": "eagle3", "model": "d", "speculative_token_tree": "[(0,), (1, 1)]"})",
       "\"speculative_token_tree\": path (1, 1) has no parent"},
      {R"({"method": "eagle3", "model": "d", "draft_length": "adaptive", "speculative_token_tree": "[(0,), (1,)]"})",
       "does not go with"},
      {R"({"method": "mtp", "model": "d", "num_speculative_tokens": 2, "speculative_token_tree": "[(0,), (1,)]"})",
       "field \"speculative_token_tree\" is not taken by method \"mtp\""},
  };
  for (const auto& [text, message] : bad) {
    auto r = ParseSpeculativeConfig(text, 4);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
}

// ---------------------------------------------------------------- the tree mask

// Attention of one tree (root + nodes of `tree`) over a context of `ctx` keys: each tree
// row's output equals the output of its path laid out as a plain causal sequence, and
// poisoning a row's non-ancestors' KV leaves it unchanged.
TEST(TreeAttention, ARowSeesItsAncestorsOnly) {
  auto tree = TokenTree::Parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)]", "tree");
  ASSERT_TRUE(tree.ok());
  const int n = tree->size(), ctx = 13, heads = 4, kv_heads = 2, d = 8, bs = 4;
  const int slots = 64;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](Shape shape) {
    Tensor t = Tensor::Host(DType::kF32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
    return t;
  };
  Tensor k = random({slots, kv_heads, d}), v = random({slots, kv_heads, d});
  Tensor q = random({n + 1, heads, d});
  std::vector<int32_t> table = {3, 0, 5, 1, 2, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};  // scattered blocks
  AttentionParams params;
  params.scale = 0.35f;
  params.block_size = bs;
  for (bool invariant : {false, true}) {  // both CPU attention paths that take trees
  SCOPED_TRACE(invariant ? "batch-invariant" : "few-query");
  CpuBackend cpu(invariant);
  auto run = [&](const Tensor& kc, const Tensor& vc) {
    SequenceSlice s;
    s.q_start = 0;
    s.q_len = n + 1;
    s.ctx_len = ctx + n + 1;
    s.block_table = table;
    s.tree_base = ctx;
    s.tree_mask.push_back(1);
    for (int i = 0; i < n; ++i) s.tree_mask.push_back(tree->AncestorMask(i) << 1 | 1);
    AttentionBatch batch;
    batch.seqs.push_back(s);
    batch.max_q_len = s.q_len;
    Tensor out = Tensor::Host(DType::kF32, {n + 1, heads, d});
    cpu.Attention(q, kc, vc, batch, params, out);
    return out;
  };
  const Tensor out = run(k, v);
  auto row_of = [&](const Tensor& t, int r) { return std::vector<float>(t.data<float>() + r * heads * d, t.data<float>() + (r + 1) * heads * d); };
  for (int i = 0; i < n; ++i) {
    // Poison every tree row that is not node i's ancestor (or itself, or the root).
    const uint64_t sees = tree->AncestorMask(i) << 1 | 1;
    Tensor kp = Tensor::Host(DType::kF32, {slots, kv_heads, d}), vp = Tensor::Host(DType::kF32, {slots, kv_heads, d});
    std::copy_n(k.data<float>(), k.numel(), kp.data<float>());
    std::copy_n(v.data<float>(), v.numel(), vp.data<float>());
    for (int j = 0; j <= n; ++j) {
      if (sees >> j & 1) continue;
      const int64_t slot = SlotOf(table, ctx + j, bs);
      for (int c = 0; c < kv_heads * d; ++c) {
        kp.data<float>()[slot * kv_heads * d + c] = 1e4f;
        vp.data<float>()[slot * kv_heads * d + c] = 1e6f;
      }
    }
    EXPECT_EQ(row_of(run(kp, vp), i + 1), row_of(out, i + 1)) << "node " << i << " sees a non-ancestor";
    // The same row as the last query of its path laid out contiguously (a plain sequence).
    std::vector<int> path;
    for (int j = i; j >= 0; j = tree->parent[j]) path.insert(path.begin(), j);
    Tensor kc = Tensor::Host(DType::kF32, {slots, kv_heads, d}), vc = Tensor::Host(DType::kF32, {slots, kv_heads, d});
    std::copy_n(k.data<float>(), k.numel(), kc.data<float>());
    std::copy_n(v.data<float>(), v.numel(), vc.data<float>());
    for (size_t dpt = 0; dpt < path.size(); ++dpt) {
      const int64_t from = SlotOf(table, ctx + 1 + path[dpt], bs), to = SlotOf(table, ctx + 1 + dpt, bs);
      for (int c = 0; c < kv_heads * d; ++c) {
        kc.data<float>()[to * kv_heads * d + c] = k.data<float>()[from * kv_heads * d + c];
        vc.data<float>()[to * kv_heads * d + c] = v.data<float>()[from * kv_heads * d + c];
      }
    }
    SequenceSlice plain;
    plain.q_start = 0;
    plain.q_len = 1;
    plain.ctx_len = ctx + 1 + static_cast<int>(path.size());
    plain.block_table = table;
    AttentionBatch batch;
    batch.seqs.push_back(plain);
    batch.max_q_len = 1;
    Tensor q1 = Tensor::Host(DType::kF32, {1, heads, d});
    std::copy_n(q.data<float>() + (i + 1) * heads * d, heads * d, q1.data<float>());
    Tensor o1 = Tensor::Host(DType::kF32, {1, heads, d});
    cpu.Attention(q1, kc, vc, batch, params, o1);
    EXPECT_EQ(row_of(o1, 0), row_of(out, i + 1)) << "node " << i << " differs from its path as a sequence";
  }
  // The control: poisoning a node's own KV changes its row.
  Tensor kp = Tensor::Host(DType::kF32, {slots, kv_heads, d});
  std::copy_n(k.data<float>(), k.numel(), kp.data<float>());
  const int64_t slot = SlotOf(table, ctx + 1 + 3, bs);
  for (int c = 0; c < kv_heads * d; ++c) kp.data<float>()[slot * kv_heads * d + c] = 1e4f;
  EXPECT_NE(row_of(run(kp, v), 1 + 3), row_of(out, 1 + 3));
  }
}

// Accept's KV compaction: every layer's K/V of the source slots land at the destinations,
// with sources read before any destination is written (a destination may be a later source).
TEST(TreeAttention, MoveSlotsCompactsThePath) {
  CpuBackend cpu;
  auto model = Model::Load(test::ModelDir("llama"), cpu);
  ASSERT_TRUE(model.ok());
  KVCache cache((*model)->config(), cpu, 4, 4);
  std::vector<Tensor*> tensors;
  for (int l = 0; l < (*model)->config().num_layers; ++l) tensors.insert(tensors.end(), {&cache.k(l), &cache.v(l)});
  auto at = [](Tensor& t, int64_t slot) { return t.data<float>() + slot * (t.numel() / t.size(0)); };
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (int64_t e = 0; e < tensors[i]->numel(); ++e) tensors[i]->data<float>()[e] = static_cast<float>(i * 100000 + e);
  }
  std::vector<std::vector<float>> before;
  for (Tensor* t : tensors) before.emplace_back(t->data<float>(), t->data<float>() + t->numel());
  // The path of nodes 1 and 3 under a root at slot 4: slot 6 -> 5, slot 8 -> 6.
  cache.MoveSlots(cpu, {6, 8}, {5, 6});
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor& t = *tensors[i];
    const int64_t w = t.numel() / t.size(0);
    EXPECT_TRUE(std::equal(at(t, 5), at(t, 5) + w, before[i].begin() + 6 * w)) << i;
    EXPECT_TRUE(std::equal(at(t, 6), at(t, 6) + w, before[i].begin() + 8 * w)) << i;
    EXPECT_TRUE(std::equal(at(t, 7), at(t, 7) + w, before[i].begin() + 7 * w)) << i;  // untouched
  }
}

// ---------------------------------------------------------------- verification

void AddTree(VerificationBatch& batch, Rows& logits, const Rows& rows, const std::vector<int32_t>& drafts,
             const std::vector<int32_t>& parents, SamplingRow row) {
  ASSERT_EQ(rows.size(), drafts.size() + 1);
  batch.num_drafts.push_back(static_cast<int32_t>(drafts.size()));
  batch.drafts.insert(batch.drafts.end(), drafts.begin(), drafts.end());
  batch.parents.insert(batch.parents.end(), parents.begin(), parents.end());
  for (size_t j = 0; j < rows.size(); ++j) {
    logits.push_back(rows[j]);
    // A node's draw is its depth's output position: siblings share it.
    int depth = 0;
    for (int i = static_cast<int>(j) - 1; i >= 0; i = parents[i]) ++depth;
    row.draw = static_cast<uint32_t>(depth);
    batch.sampling.rows.push_back(row);
  }
}

std::vector<float> OneHotish(int vocab, int best) {
  std::vector<float> r(vocab, 0.0f);
  r[best] = 5.0f;
  return r;
}

// Scripted: the target's argmax after the root is the draft's 2nd-ranked token, then its
// child's. The chain (rank-0 children only) accepts nothing; the tree accepts two.
TEST(TreeVerification, GreedyAcceptsTheSecondRankedChild) {
  CpuBackend cpu;
  const int vocab = 10;
  SamplingRow greedy;
  greedy.temperature = 0.0f;
  // nodes: 0 (rank 0, token 4), 1 (rank 1, token 7), 2 (child of 0, token 1), 3 (child of 1, token 2)
  const std::vector<int32_t> drafts = {4, 7, 1, 2}, parents = {-1, -1, 0, 1};
  const Rows rows = {OneHotish(vocab, 7), OneHotish(vocab, 1), OneHotish(vocab, 2), OneHotish(vocab, 3), OneHotish(vocab, 9)};
  VerificationBatch tree;
  Rows logits;
  AddTree(tree, logits, rows, drafts, parents, greedy);
  const VerifiedTokens v = cpu.VerifyDrafts(test::Logits(logits), nullptr, tree, nullptr);
  ASSERT_EQ(v.num_accepted, std::vector<int32_t>{2});
  EXPECT_EQ(std::vector<int32_t>(v.path.begin(), v.path.begin() + 2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(std::vector<int32_t>(v.emitted.tokens.begin(), v.emitted.tokens.begin() + 3),
            (std::vector<int32_t>{7, 2, 9}));  // the accepted nodes, then node 3's row's bonus
  EXPECT_EQ(v.emitted.tokens[3], -1);
  // The chain of the rank-0 drafts on the same rows (root, node 0, node 2).
  VerificationBatch chain;
  Rows chain_logits;
  AddTree(chain, chain_logits, {rows[0], rows[1], rows[3]}, {4, 1}, {-1, 0}, greedy);
  chain.parents.clear();  // as a chain
  const VerifiedTokens c = cpu.VerifyDrafts(test::Logits(chain_logits), nullptr, chain, nullptr);
  EXPECT_EQ(c.num_accepted, std::vector<int32_t>{0});
  EXPECT_EQ(c.emitted.tokens[0], 7);
  // A single-path tree verifies as the chain, greedy and random.
  for (float temperature : {0.0f, 1.0f}) {
    SamplingRow row;
    row.temperature = temperature;
    row.seed_lo = 11;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int trial = 0; trial < 200; ++trial) {
      Rows r(4, std::vector<float>(vocab));
      for (auto& x : r)
        for (float& y : x) y = normal(rng);
      std::vector<int32_t> d = {static_cast<int32_t>(rng() % vocab), static_cast<int32_t>(rng() % vocab),
                                static_cast<int32_t>(rng() % vocab)};
      if (trial % 3 == 0) d[0] = static_cast<int32_t>(std::max_element(r[0].begin(), r[0].end()) - r[0].begin());
      row.seed_hi = static_cast<uint32_t>(trial);
      VerificationBatch a, b;
      Rows la, lb;
      AddTree(a, la, r, d, {-1, 0, 1}, row);
      AddTree(b, lb, r, d, {-1, 0, 1}, row);
      b.parents.clear();
      const VerifiedTokens x = cpu.VerifyDrafts(test::Logits(la), nullptr, a, nullptr);
      const VerifiedTokens y = cpu.VerifyDrafts(test::Logits(lb), nullptr, b, nullptr);
      EXPECT_EQ(x.num_accepted, y.num_accepted);
      EXPECT_EQ(x.emitted.tokens, y.emitted.tokens);
    }
  }
}

// Greedy trees verified from the Sample op's greedy tokens alone (what the CUDA backend
// downloads instead of the rows' logits) give the reference's counts, paths, tokens and
// logprobs, bit for bit: trees whose paths run to various depths (drafts set to the rows'
// argmax with some probability, invalid ids among them), requested logprobs, penalties.
TEST(TreeVerification, GreedyTreesFromSampledTokensAreTheReference) {
  CpuBackend cpu;
  const int vocab = 50;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const std::vector<int32_t> parents = {-1, -1, -1, 0, 0, 1, 3, 3, 6};
  int accepted_nodes = 0;
  for (int trial = 0; trial < 60; ++trial) {
    VerificationBatch batch;
    batch.sampling.max_logprobs = 3;
    Rows logits;
    for (int r = 0; r < 4; ++r) {
      SamplingRow row;
      row.temperature = 0.0f;
      row.num_logprobs = (trial + r) % 4;
      if (r == 2) {  // penalties move the argmax off the raw logits' (the Sample op processes the row)
        row.repetition_penalty = 1.5f;
        row.adjust_begin = static_cast<int32_t>(batch.sampling.adjust.size());
        for (int32_t t = 0; t < vocab; t += 3) batch.sampling.adjust.push_back({t, 0, TokenAdjust::kInPrompt});
        row.adjust_end = static_cast<int32_t>(batch.sampling.adjust.size());
      }
      Rows rows(parents.size() + 1, std::vector<float>(vocab));
      for (auto& x : rows)
        for (float& y : x) y = normal(rng);
      std::vector<int32_t> drafts(parents.size());
      for (size_t i = 0; i < drafts.size(); ++i) {
        const std::vector<float>& at = rows[parents[i] + 1];  // the row that verifies node i
        const int32_t best = static_cast<int32_t>(std::max_element(at.begin(), at.end()) - at.begin());
        const uint32_t pick = rng() % 4;
        drafts[i] = pick < 2 ? best : pick == 2 ? static_cast<int32_t>(rng() % vocab) : -1;
      }
      AddTree(batch, logits, rows, drafts, parents, row);
    }
    ASSERT_TRUE(IsGreedyTree(batch));
    const Tensor l = test::Logits(logits);
    const VerifiedTokens want = VerifyDraftsOnHost(l, nullptr, batch, nullptr);
    const VerifiedTokens got = VerifyGreedyTree(cpu.Sample(l, batch.sampling), batch);
    EXPECT_EQ(got.num_accepted, want.num_accepted) << trial;
    EXPECT_EQ(got.path, want.path) << trial;
    EXPECT_EQ(got.emitted.tokens, want.emitted.tokens) << trial;
    EXPECT_EQ(got.emitted.logprobs, want.emitted.logprobs) << trial;
    EXPECT_EQ(got.emitted.top_ids, want.emitted.top_ids) << trial;
    EXPECT_EQ(got.emitted.top_logprobs, want.emitted.top_logprobs) << trial;
    for (int32_t n : want.num_accepted) accepted_nodes += n;
  }
  EXPECT_GT(accepted_nodes, 60);  // paths past the root's children were walked
  VerificationBatch random;
  Rows logits;
  SamplingRow row;
  row.temperature = 1.0f;
  AddTree(random, logits, Rows(3, std::vector<float>(vocab)), {1, 2}, {-1, 0}, row);
  EXPECT_FALSE(IsGreedyTree(random));
}

// The tree of the lossless tests: the root's three children, each with two children.
const std::vector<int32_t> kParents = {-1, -1, -1, 0, 0, 1, 1, 2, 2};

// k distinct tokens drawn from q without replacement (a draft's top-k is distinct).
std::vector<int32_t> Distinct(const std::vector<double>& q, int k, std::mt19937& rng) {
  std::vector<double> w = q;
  std::vector<int32_t> out;
  for (int i = 0; i < k; ++i) {
    const int32_t t = static_cast<int32_t>(std::discrete_distribution<int32_t>(w.begin(), w.end())(rng));
    out.push_back(t);
    w[t] = 0.0;
  }
  return out;
}

std::vector<double> DraftQ(int vocab, int shift) {
  std::vector<double> q(vocab);
  double z = 0;
  for (int i = 0; i < vocab; ++i) z += q[i] = std::exp(-0.6 * ((i + shift) % vocab));
  for (double& x : q) x /= z;
  return q;
}

SamplingRow Params(float temperature, int top_k, float top_p, float min_p) {
  SamplingRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.min_p = min_p;
  return r;
}

// A wrong multi-candidate rule for the control: on rejection, draw from p without only the
// first child (the chain's residual), which over-weights the other children.
int32_t WrongFirstToken(const std::vector<double>& p, const std::vector<int32_t>& kids, std::mt19937& rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double u = uniform(rng);
  double acc = 0.0;
  for (int32_t t : kids) {
    acc += p[t];
    if (u <= acc && p[t] > 0) return t;
  }
  std::vector<double> rest = p;
  rest[kids[0]] = 0.0;
  return static_cast<int32_t>(std::discrete_distribution<int32_t>(rest.begin(), rest.end())(rng));
}

// The first two emitted tokens of a width-3, depth-2 tree follow the processed target
// jointly (over a toy model whose next-token logits depend on the previous token), for
// each sampling configuration; so does the first token alone; the wrong rule fails.
TEST(TreeVerificationLossless, FirstTwoTokensFollowTheTarget) {
  CpuBackend cpu;
  const int n = 60000, vocab = 6;
  std::mt19937 table_rng(23);
  std::normal_distribution<float> normal(0.0f, 0.9f);
  auto random_row = [&] {
    std::vector<float> r(vocab);
    for (float& x : r) x = normal(table_rng);
    return r;
  };
  const std::vector<float> first = random_row();
  Rows second(vocab);
  for (auto& r : second) r = random_row();
  const std::vector<float> bonus = random_row();
  const struct {
    const char* name;
    SamplingRow row;
  } configs[] = {{"temperature 1", Params(1.0f, 0, 1.0f, 0.0f)},
                 {"temperature 0.7, top-k 4", Params(0.7f, 4, 1.0f, 0.0f)},
                 {"top-p 0.8", Params(1.0f, 0, 0.8f, 0.0f)},
                 {"min-p 0.2", Params(1.0f, 0, 1.0f, 0.2f)}};
  for (size_t c = 0; c < std::size(configs); ++c) {
    std::mt19937 rng(200 + static_cast<uint32_t>(c));
    VerificationBatch batch;
    Rows logits;
    for (int trial = 0; trial < n; ++trial) {
      const std::vector<int32_t> top = Distinct(DraftQ(vocab, 2), 3, rng);
      std::vector<int32_t> drafts = top;
      Rows rows = {first};
      for (int32_t t : top) rows.push_back(second[t]);
      for (int32_t t : top) {
        const std::vector<int32_t> grand = Distinct(DraftQ(vocab, t + 1), 2, rng);
        drafts.insert(drafts.end(), grand.begin(), grand.end());
        rows.push_back(bonus);
        rows.push_back(bonus);
      }
      SamplingRow row = configs[c].row;
      row.seed_lo = static_cast<uint32_t>(trial);
      row.seed_hi = static_cast<uint32_t>(300 + c);
      AddTree(batch, logits, rows, drafts, kParents, row);
    }
    const VerifiedTokens v = cpu.VerifyDrafts(test::Logits(logits), nullptr, batch, nullptr);
    // Requests whose root rejected every child: their second token from the next step's
    // plain row (the first token's conditional, at draw 1).
    VerificationBatch next;
    Rows next_logits;
    std::vector<int> next_of(n, -1);
    const int per = 1 + static_cast<int>(kParents.size());
    for (int trial = 0; trial < n; ++trial) {
      if (v.num_accepted[trial] > 0) continue;
      next_of[trial] = static_cast<int>(next.num_drafts.size());
      SamplingRow row = batch.sampling.rows[trial * per];
      row.draw = 1;
      next.num_drafts.push_back(0);
      next.sampling.rows.push_back(row);
      next_logits.push_back(second[v.emitted.tokens[trial * per]]);
    }
    ASSERT_GT(next.num_drafts.size(), 1000u);
    const VerifiedTokens w = cpu.VerifyDrafts(test::Logits(next_logits), nullptr, next, nullptr);
    std::vector<int> joint(vocab * vocab, 0), firsts(vocab, 0), wrong(vocab, 0);
    const std::vector<double> p1 = test::Expected(first, configs[c].row);
    std::mt19937 wrong_rng(900 + static_cast<uint32_t>(c));
    for (int trial = 0; trial < n; ++trial) {
      const int32_t x1 = v.emitted.tokens[trial * per];
      const int32_t x2 = next_of[trial] < 0 ? v.emitted.tokens[trial * per + 1] : w.emitted.tokens[next_of[trial]];
      ++joint[x1 * vocab + x2];
      ++firsts[x1];
      const std::vector<int32_t> kids(batch.drafts.begin() + trial * 9, batch.drafts.begin() + trial * 9 + 3);
      ++wrong[WrongFirstToken(p1, kids, wrong_rng)];
    }
    std::vector<double> want(vocab * vocab);
    for (int x1 = 0; x1 < vocab; ++x1) {
      const std::vector<double> p2 = test::Expected(second[x1], configs[c].row);
      for (int x2 = 0; x2 < vocab; ++x2) want[x1 * vocab + x2] = p1[x1] * p2[x2];
    }
    int dof = 0;
    const double chi = test::ChiSquare(joint, want, n, &dof);
    EXPECT_LT(chi, test::ChiSquareBound(std::max(dof, 1))) << configs[c].name << ": joint";
    const double chi1 = test::ChiSquare(firsts, p1, n, &dof);
    EXPECT_LT(chi1, test::ChiSquareBound(std::max(dof, 1))) << configs[c].name << ": first token";
    const double control = test::ChiSquare(wrong, p1, n, &dof);
    EXPECT_GT(control, test::ChiSquareBound(std::max(dof, 1))) << configs[c].name << ": the wrong rule passed";
    // Trees accept: more than a chain of the rank-0 child would on the same draws.
    int accepted = 0;
    for (int trial = 0; trial < n; ++trial) accepted += v.num_accepted[trial];
    std::printf("[tree] %-26s mean accepted %.3f, chi %.1f (control %.1f)\n", configs[c].name,
                static_cast<double>(accepted) / n, chi, control);
  }
}

// ---------------------------------------------------------------- the engine

using test::Generation;

// The golden file's three prompts, batched.
Generation Generate(Model& model, const SafetensorsFile& golden, const EngineConfig& config, int max_new_tokens) {
  return test::Generate(model, test::GoldenPrompts(golden), config, max_new_tokens);
}

// Greedy output with tree drafts is the plain decode's, on every EAGLE-3 fixture (llama_copy
// proposes the current token again, so some get accepted; the random drafts rarely are).
class TreeEngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TreeEngineTest, TreeDraftsLeaveGreedyOutputUnchanged) {
  CpuBackend backend(/*batch_invariant=*/true);
  const std::string variant = GetParam();
  const std::string target = test::Eagle3Target(variant);
  auto model = Model::Load(test::ModelDir(target), backend);
  ASSERT_TRUE(model.ok());
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir(target) + "/golden.safetensors");
  EngineConfig plain;
  plain.scheduler.max_num_batched_tokens = 64;
  const Generation reference = Generate(**model, golden, plain, 24);
  for (const char* text : {"[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]", "[(0,), (1,), (1, 0), (1, 0, 0)]"}) {
    auto tree = TokenTree::Parse(text, "tree");
    ASSERT_TRUE(tree.ok());
    EngineConfig speculative = plain;
    speculative.eagle3 = {draft->get(), tree->size(), *tree};
    const Generation run = Generate(**model, golden, speculative, 24);
    EXPECT_EQ(run.tokens, reference.tokens) << variant << " " << text;
    EXPECT_GT(run.stats.num_draft_tokens, 0u);
    if (variant == "llama_copy") {
      EXPECT_GT(run.stats.num_accepted_tokens, 0u);
    }
    std::printf("[tree] %-13s %s accepted %lu of %lu drafts, %lu steps (plain %lu)\n", variant.c_str(), text,
                static_cast<unsigned long>(run.stats.num_accepted_tokens),
                static_cast<unsigned long>(run.stats.num_draft_tokens), static_cast<unsigned long>(run.stats.steps),
                static_cast<unsigned long>(reference.stats.steps));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, TreeEngineTest, ::testing::Values("llama_legacy", "qwen3_default", "llama_copy"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace hsx
