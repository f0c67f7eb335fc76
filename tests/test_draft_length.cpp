// Draft length per request per step ("draft_length": "adaptive"): the policy, on an injected
// cost model and acceptance history, drops K to 0 for a request whose drafts are never
// accepted and at a batch where verification rows cost what they yield, raises it to K_max
// for one whose drafts are always accepted; through the engine, greedy output stays the
// plain decode's (K changes only how many drafts are proposed) and forced acceptance of 0
// or 1 moves the drafts proposed the way the policy says.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "engine/draft_length.h"
#include "engine/engine.h"
#include "engine/speculative_config.h"
#include "model/eagle3_draft.h"
#include "model/mtp_drafter.h"
#include "engine_runs.h"
#include "test_util.h"

namespace hsx {
namespace {

// Memory-bound up to 64 rows (a step costs the same), then compute-bound (linear in rows);
// a draft step costs 5% of a target step at batch 1, a round at batch 128 30%.
DraftCostModel H200Like() {
  DraftCostModel cost;
  cost.SetTarget(1, 1.0);
  cost.SetTarget(64, 1.0);
  cost.SetTarget(128, 2.0);
  cost.SetTarget(1024, 16.0);
  cost.SetDraft(1, 1, 0.05);
  cost.SetDraft(128, 1, 0.3);
  return cost;
}

DraftLengthConfig Config(int k_max) {
  DraftLengthConfig c;
  c.k_max = k_max;
  return c;
}

TEST(DraftLengthPolicy, NeverAcceptedDraftsGoToZero) {
  const DraftLengthPolicy policy(Config(4));
  const DraftCostModel cost = H200Like();
  DraftHistory h;
  // Before any history the prior drafts.
  EXPECT_GT(policy.Choose({4}, {policy.Acceptance(h)}, cost)[0], 0);
  int k = 4;
  for (int step = 0; step < 40 && k > 0; ++step) {
    policy.Record(h, k, 0);
    k = policy.Choose({4}, {policy.Acceptance(h)}, cost)[0];
  }
  EXPECT_EQ(k, 0) << "acceptance " << policy.Acceptance(h);
  // Idle, it probes again after probe_interval steps: the prior comes back.
  for (int step = 0; step < policy.config().probe_interval; ++step) policy.Record(h, 0, 0);
  EXPECT_GT(policy.Choose({4}, {policy.Acceptance(h)}, cost)[0], 0);
}

// A step costs no more for fewer rows: a plain step's figure inflated by a first-use cost
// is capped by a verification step's measured at more rows.
TEST(DraftCostModel, FewerRowsNeverCostMore) {
  DraftCostModel cost;
  cost.SetTarget(32, 8.0);   // inflated
  cost.SetTarget(64, 6.1);
  cost.SetTarget(128, 10.0);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(32), 6.1);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(48), 6.1);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(96), 8.05);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(16), 3.05);  // in proportion below the least, capped too
}

// Nor does a draft round cost more for fewer requests or drafts than one measured.
TEST(DraftCostModel, FewerRequestsOrDraftsNeverCostMore) {
  DraftCostModel cost;
  cost.SetTarget(32, 5.93);
  cost.SetDraft(31, 3, 10.75);  // inflated (new GEMM shapes)
  cost.SetDraft(32, 3, 0.94);
  cost.SetDraft(32, 1, 0.42);
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(31, 3), 0.94);
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(31, 2), 0.94);
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(32, 2), 0.84);  // from the nearest k (1; lower on a tie): 2 x 0.42
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(32, 4), 0.94 * 4 / 3);  // nothing measured above: scaled
  // A draft step never costs more than 0.3 of a plain step (the only figure inflated).
  DraftCostModel only;
  only.SetTarget(32, 5.93);
  only.SetDraft(31, 3, 11.44);
  EXPECT_DOUBLE_EQ(only.DraftSeconds(32, 4), 0.3 * 4 * 5.93);
  EXPECT_DOUBLE_EQ(only.DraftSeconds(31, 1), 0.3 * 5.93 * 31 / 32);  // below 32 rows: in proportion
}

// The H200's trap at batch 32 (0.89x plain at zero acceptance): the plain step's figure was
// measured inflated, drafting K=1 for every request looked cheaper than a plain step, and
// plain steps were never run again to correct it. With the cap, a draft that is never
// accepted goes to K=0 and stays there but for its probes.
TEST(DraftLengthPolicy, InflatedPlainFigureDoesNotKeepAUselessDraft) {
  const DraftLengthPolicy policy(Config(3));
  const auto target = [](int rows) { return 5.8e-3 + std::max(0, rows - 32) * (1.1e-3 / 128); };
  DraftCostModel cost;
  cost.ObserveTarget(32, 1.0);     // the first sight: skipped
  cost.ObserveTarget(32, 8.0e-3);  // a plain step at 32 rows, inflated
  std::vector<DraftHistory> histories(32);
  std::vector<int> ks(32, 0);
  std::map<int, int> chosen;
  for (int step = 0; step < 300; ++step) {
    int rows = 32, drafting = 0, round_k = 0;
    for (int k : ks) rows += k, drafting += k > 0, round_k = std::max(round_k, k);
    if (step > 0) cost.ObserveTarget(rows, target(rows));
    if (round_k > 0) cost.ObserveDraft(drafting, round_k, 0.15e-3 + 0.2e-3 * round_k);
    for (size_t i = 0; i < ks.size(); ++i) policy.Record(histories[i], ks[i], 0);
    std::vector<double> acceptance;
    for (const DraftHistory& h : histories) acceptance.push_back(policy.Acceptance(h, step));
    ks = policy.Choose(std::vector<int>(32, 3), acceptance, cost);
    if (step >= 100)
      for (int k : ks) ++chosen[k];
  }
  EXPECT_GE(chosen[0], 200 * 32 * 9 / 10) << "K=1: " << chosen[1] << ", K=2: " << chosen[2] << ", K=3: " << chosen[3];
}

// A runner's rule with eager steps: padded on a graph up to 192 rows, eager past
// (ModelRunner::ShapeFor's before its packed graphs).
StepShape RunnerLike(int seqs, int q, int rows) {
  const int bucket = seqs <= 4 ? (seqs <= 1 ? 1 : seqs <= 2 ? 2 : 4) : (seqs + 7) / 8 * 8;
  if (rows != seqs * q && bucket * q > 192) return {rows, false};
  return {bucket * q, true};
}

// Eager steps cost the graph step of their rows plus what the eager ones measured over it.
TEST(DraftCostModel, EagerStepsCostTheGraphStepPlusAMeasuredPenalty) {
  DraftCostModel cost(0.1, RunnerLike);
  cost.SetTarget(128, 10.0);
  cost.SetTarget(512, 17.0);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(140, false), 10.0 + 7.0 * 12 / 384);  // unmeasured: no penalty
  cost.ObserveTarget(140, 99.0, false);  // the first sight: skipped
  cost.ObserveTarget(140, 11.2, false);
  const double penalty = 11.2 - (10.0 + 7.0 * 12 / 384);
  EXPECT_NEAR(cost.eager_penalty(), penalty, 1e-12);
  EXPECT_NEAR(cost.TargetSeconds(150, false), 10.0 + 7.0 * 22 / 384 + penalty, 1e-12);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(150), 10.0 + 7.0 * 22 / 384);  // a graph step: none
  cost.ObserveTarget(160, 1.0, false);  // the first sight: skipped
  cost.ObserveTarget(160, 9.0, false);  // below the graph figure at 160 rows: no negative penalty
  EXPECT_DOUBLE_EQ(cost.eager_penalty(), 0.0);
  // The rule's shapes: 128 requests, 10 of them with 3 drafts, run eagerly; all 128 with 3
  // on the graph of 512 rows; 16 requests with mixed drafts padded on the graph of 64.
  EXPECT_NEAR(cost.StepSeconds(128, 4, 158), cost.TargetSeconds(158, false), 1e-12);
  EXPECT_DOUBLE_EQ(cost.StepSeconds(128, 4, 512), 17.0);
  EXPECT_DOUBLE_EQ(cost.StepSeconds(16, 4, 20), cost.TargetSeconds(64));
}

// n-gram at batch 128 (0.91x plain on the H200): a few requests have a match, so the step
// mixes draft counts, runs eagerly, and pays the eager penalty; the policy weighs it.
TEST(DraftLengthPolicy, MixedDraftsPastThePaddedGraphsPayTheEagerPenalty) {
  const DraftLengthPolicy policy(Config(3));
  std::vector<int> rooms(128, 0);
  std::fill_n(rooms.begin(), 10, 3);  // ten matches
  const std::vector<double> acceptance(128, 0.9);
  auto drafted = [&](const DraftCostModel& cost) {
    int total = 0;
    for (int k : policy.Choose(rooms, acceptance, cost)) total += k;
    return total;
  };
  DraftCostModel cost(0.1, RunnerLike);
  cost.SetTarget(128, 10.0);
  cost.SetTarget(512, 17.0);
  cost.SetDraft(10, 3, 0.0);  // prompt lookup: no device round
  EXPECT_GT(drafted(cost), 0);  // without a penalty the matches pay (24 tokens for 30 rows: +13%)
  cost.SetEagerPenalty(1.0);    // 10% of the step: +3% left, under min_gain
  EXPECT_EQ(drafted(cost), 0);
}

// A plan is taken only where it beats plain decoding by min_gain (5%): a 3% gain is left.
TEST(DraftLengthPolicy, MarginalGainsAreNotTaken) {
  DraftCostModel cost;
  cost.SetTarget(1, 1.0);
  cost.SetTarget(2, 1.0);
  cost.SetDraft(1, 1, 0.0);
  // One draft at acceptance a costs a second row (free here) and yields a: a 3% gain at 0.03.
  DraftLengthConfig config = Config(1);
  EXPECT_EQ(DraftLengthPolicy(config).Choose({1}, {0.03}, cost)[0], 0);
  EXPECT_EQ(DraftLengthPolicy(config).Choose({1}, {0.06}, cost)[0], 1);
  config.min_gain = 0;
  EXPECT_EQ(DraftLengthPolicy(config).Choose({1}, {0.03}, cost)[0], 1);
}

// Idle requests probe on the same steps (multiples of probe_interval), whenever each went
// idle: a probe is one verification step of equal draft counts, not a mixed one every step.
TEST(DraftLengthPolicy, IdleRequestsProbeTogether) {
  const DraftLengthPolicy policy(Config(4));
  const int interval = policy.config().probe_interval;
  DraftHistory early, late;
  for (DraftHistory* h : {&early, &late}) {
    for (int i = 0; i < 40; ++i) policy.Record(*h, 4, 0);
  }
  for (int i = 0; i < interval + 5; ++i) policy.Record(early, 0, 0);
  for (int i = 0; i < interval + 1; ++i) policy.Record(late, 0, 0);
  const double prior = policy.config().prior_acceptance;
  for (int64_t step = 3 * interval + 1; step < 4 * interval; ++step) {
    ASSERT_LT(policy.Acceptance(early, step), 0.1) << "step " << step;
    ASSERT_LT(policy.Acceptance(late, step), 0.1) << "step " << step;
  }
  EXPECT_EQ(policy.Acceptance(early, 4 * interval), prior);
  EXPECT_EQ(policy.Acceptance(late, 4 * interval), prior);
  // Not yet idle for a whole interval: no probe on that step.
  DraftHistory recent = late;
  policy.Record(recent, 4, 0);
  policy.Record(recent, 0, 0);
  EXPECT_LT(policy.Acceptance(recent, 4 * interval), 0.1);
}

TEST(DraftLengthPolicy, AlwaysAcceptedDraftsRiseToKMax) {
  const DraftLengthPolicy policy(Config(4));
  const DraftCostModel cost = H200Like();
  DraftHistory h;
  int k = 1;
  for (int step = 0; step < 10; ++step) {
    policy.Record(h, k, k);
    k = policy.Choose({4}, {policy.Acceptance(h)}, cost)[0];
  }
  EXPECT_EQ(k, 4);
  // Its room bounds it (tokens left less one).
  EXPECT_EQ(policy.Choose({2}, {policy.Acceptance(h)}, cost)[0], 2);
}

TEST(DraftLengthPolicy, MixedBatchDraftsOnlyWhereItPays) {
  const DraftLengthPolicy policy(Config(4));
  const DraftCostModel cost = H200Like();
  const std::vector<int> ks = policy.Choose({4, 4, 0}, {0.95, 0.02, 0.95}, cost);
  EXPECT_EQ(ks, (std::vector<int>{4, 0, 0}));
}

TEST(DraftLengthPolicy, LargeComputeBoundBatchDecodesPlainly) {
  const DraftLengthPolicy policy(Config(4));
  const DraftCostModel cost = H200Like();
  const std::vector<int> ks = policy.Choose(std::vector<int>(128, 4), std::vector<double>(128, 0.9), cost);
  EXPECT_EQ(ks, std::vector<int>(128, 0));
  // The same requests at batch 8 (memory-bound) draft.
  const std::vector<int> small = policy.Choose(std::vector<int>(8, 4), std::vector<double>(8, 0.9), cost);
  EXPECT_EQ(small, std::vector<int>(8, 4));
}

TEST(DraftLengthPolicy, SameMeasurementsSameChoice) {
  const DraftLengthPolicy policy(Config(6));
  DraftCostModel a, b;
  for (DraftCostModel* m : {&a, &b}) {
    m->ObserveTarget(4, 0.010);
    m->ObserveTarget(16, 0.011);
    m->ObserveDraft(4, 3, 0.002);
  }
  const std::vector<int> rooms = {6, 6, 3, 6};
  const std::vector<double> acc = {0.7, 0.7, 0.4, 0.1};
  EXPECT_EQ(policy.Choose(rooms, acc, a), policy.Choose(rooms, acc, b));
}

TEST(DraftCostModel, InterpolatesAndExtrapolates) {
  DraftCostModel cost;
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(7), 1.0);  // the prior
  cost.SetTarget(8, 2.0);
  cost.SetTarget(16, 4.0);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(12), 3.0);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(4), 1.0);  // in proportion below the least
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(24), 6.0);
  cost.SetDraft(8, 2, 1.0);
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(8, 4), 2.0);
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(8, 0), 0.0);
  cost.ObserveTarget(8, 3.0);  // the first step of a size is no measurement (graph capture)
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(8), 2.0);
  cost.ObserveTarget(8, 3.0);  // smoothed toward it
  EXPECT_GT(cost.TargetSeconds(8), 2.0);
  EXPECT_LT(cost.TargetSeconds(8), 3.0);
}

// A large batch whose steps have all been verifications of K+1 rows a sequence: the plain
// step, never measured, is estimated in proportion to rows, so the policy runs one (and so
// measures it) rather than keep drafting on a guess that plain costs as much.
TEST(DraftLengthPolicy, UnmeasuredPlainStepIsTriedAtALargeBatch) {
  const DraftLengthPolicy policy(Config(4));
  DraftCostModel cost;
  cost.SetTarget(640, 26.0);  // batch 128, K = 4: compute-bound
  cost.SetDraft(128, 4, 7.0);
  const std::vector<int> rooms(128, 4);
  const std::vector<double> acceptance(128, 0.745);
  std::vector<int> ks = policy.Choose(rooms, acceptance, cost);
  EXPECT_EQ(*std::max_element(ks.begin(), ks.end()), 0);
  // Measured at what a memory-bound plain step costs, drafting pays again.
  cost.SetTarget(128, 9.4);
  cost.SetTarget(256, 11.0);
  ks = policy.Choose(rooms, acceptance, cost);
  EXPECT_GT(*std::max_element(ks.begin(), ks.end()), 0);
}

TEST(DraftCostModel, FirstStepOfEachKindIsNoMeasurement) {
  DraftCostModel cost;
  cost.ObserveTarget(1, 1.0);
  cost.ObserveTarget(1, 1.0);
  cost.ObserveDraft(1, 4, 100.0);  // the round that captured its graph: skipped
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(1, 4), 0.1 * 4);  // still the prior
  cost.ObserveDraft(1, 4, 0.5);
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(1, 4), 0.5);
  cost.ObserveDraft(1, 4, 1.5);  // a slower one moves it part of the way
  EXPECT_GT(cost.DraftSeconds(1, 4), 0.5);
  EXPECT_LT(cost.DraftSeconds(1, 4), 1.5);
  cost.ObserveDraft(1, 4, 0.2);  // a faster one replaces it
  EXPECT_DOUBLE_EQ(cost.DraftSeconds(1, 4), 0.2);
}

// A step graph recorded at start-up planned its GEMMs there: its first served step counts
// (at batch 128 on the H200 each new verification size took two steps of 16.7-18.1 ms,
// against 10.75 plain, before its cost was known).
TEST(DraftCostModel, StepsOfGraphsRecordedAtStartUpCountAtOnce) {
  DraftCostModel cost;
  cost.ObserveTarget(128, 10.0);
  cost.ObserveTarget(128, 10.0);
  cost.MarkWarm(512);
  cost.ObserveTarget(512, 18.0);
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(512), 18.0);
  cost.ObserveTarget(256, 99.0);  // not recorded at start-up: its first sight is skipped
  EXPECT_DOUBLE_EQ(cost.TargetSeconds(256), 10.0 + 8.0 / 3);  // between 128 and 512
}

// A scripted draft, useless for 2,000 steps and then always right: its probes (one draft
// each, on multiples of the wait) come ever further apart while they fail (the wait doubles
// from 32 to 128 steps), and once the draft is right again the next probe brings the
// request back to K_max.
TEST(DraftLengthPolicy, FailedProbesBackOffAndARightDraftComesBack) {
  DraftLengthConfig config = Config(4);
  config.probe_drafts = 1;
  const DraftLengthPolicy policy(config);
  const DraftCostModel cost = H200Like();
  const int most = policy.config().max_probe_interval;
  ASSERT_EQ(most, 4 * policy.config().probe_interval);
  DraftHistory h;
  constexpr int kUseless = 2000;
  std::vector<int> probes;  // steps where an idle request drafted
  int back_at = -1, full_at = -1;
  for (int step = 0; step < kUseless + 600 && full_at < 0; ++step) {
    const bool probe = policy.Probing(h, step);
    const int room = probe ? 1 : 4;
    const int k = policy.Choose({room}, {policy.Acceptance(h, step)}, cost)[0];
    if (probe) {
      EXPECT_LE(k, 1) << "a probe drafts one token, step " << step;
      if (k > 0) probes.push_back(step);
    }
    policy.Record(h, k, step < kUseless ? 0 : k);
    if (step >= kUseless && k > 0 && back_at < 0) back_at = step;
    if (step >= kUseless && k == 4 && full_at < 0) full_at = step;
  }
  std::vector<int> gaps;
  for (size_t i = 1; i < probes.size() && probes[i] < kUseless; ++i) gaps.push_back(probes[i] - probes[i - 1]);
  ASSERT_GE(gaps.size(), 5u);
  EXPECT_GE(gaps[0], 64) << "after the first failed probe the wait doubles";
  for (size_t i = 1; i < gaps.size(); ++i) EXPECT_GE(gaps[i], gaps[i - 1]) << "gap " << i;
  for (size_t i = 0; i < gaps.size(); ++i) EXPECT_LE(gaps[i], most) << "gap " << i;
  EXPECT_EQ(gaps.back(), most);
  EXPECT_LE(static_cast<int>(probes.size()), 5 + kUseless / most) << "probes while useless";
  ASSERT_GE(back_at, 0) << "never drafted again";
  EXPECT_LE(back_at, kUseless + most) << "drafted again only at step " << back_at;
  ASSERT_GE(full_at, 0) << "never back to K_max";
  EXPECT_LE(full_at, back_at + 8);
}

// A first round that captures its CUDA graph can take hundreds of times its cost: as a
// measurement it would keep every later step from drafting, and so from measuring the
// round anew, at any acceptance (the H200's "K=4 adaptive drafts nothing").
TEST(DraftLengthPolicy, GraphCaptureRoundDoesNotStopDrafting) {
  const DraftLengthPolicy policy(Config(4));
  DraftCostModel cost;  // learned, as the engine's
  for (int rows : {1, 5}) {
    cost.ObserveTarget(rows, 1.0);
    cost.ObserveTarget(rows, 1.0);
  }
  DraftHistory h;
  int drafted = 0;
  for (int step = 0; step < 100; ++step) {
    const int k = policy.Choose({4}, {policy.Acceptance(h)}, cost)[0];
    if (k > 0) {
      cost.ObserveDraft(1, k, step == 0 ? 200.0 : 0.2 * k / 4);
      policy.Record(h, k, std::min(k, 3));  // well accepted
      ++drafted;
    } else {
      policy.Record(h, 0, 0);
    }
  }
  EXPECT_EQ(drafted, 100);
}

// The policy against its own measurements: 32 requests whose every draft is accepted with
// probability 0.745 (bench's forced acceptance), step costs shaped as the H200's Qwen3-8B
// figures (5.8 ms at 32 rows, 6.9 ms at 160; a draft round 0.15 ms + 0.2 ms a draft step)
// with 5% noise, everything measured by Observe* from nothing, first sights skipped as in
// the engine. K_max = 4 is the best choice there (12.3 tokens a ms against 11.7 at K=3,
// 10.6 at K=2); after 100 steps of warm-up the policy must choose it for 90% of the
// request-steps over 8 seeds.
TEST(DraftLengthPolicy, MeasuredCostsSettleOnTheBestK) {
  const DraftLengthPolicy policy(Config(4));
  const auto target = [](int rows) { return 5.8e-3 + std::max(0, rows - 32) * (1.1e-3 / 128); };
  const auto round = [](int k) { return k > 0 ? 0.15e-3 + 0.2e-3 * k : 0.0; };
  std::map<int, int> chosen;  // K -> request-steps after the warm-up, all seeds
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    DraftCostModel cost;
    std::mt19937 rng(seed);
    std::bernoulli_distribution accept(0.745);
    std::lognormal_distribution<double> noise(0.0, 0.05);
    std::vector<DraftHistory> histories(32);
    std::vector<int> ks(32, 0);
    for (int step = 0; step < 200; ++step) {
      int rows = 32, drafting = 0, round_k = 0;
      for (int k : ks) rows += k, drafting += k > 0, round_k = std::max(round_k, k);
      cost.ObserveTarget(rows, target(rows) * noise(rng));
      if (round_k > 0) cost.ObserveDraft(drafting, round_k, round(round_k) * noise(rng));
      for (size_t i = 0; i < ks.size(); ++i) {
        int accepted = 0;
        while (accepted < ks[i] && accept(rng)) ++accepted;
        policy.Record(histories[i], ks[i], accepted);
      }
      std::vector<double> acceptance;
      for (const DraftHistory& h : histories) acceptance.push_back(policy.Acceptance(h, step));
      ks = policy.Choose(std::vector<int>(32, 4), acceptance, cost);
      if (step >= 100)
        for (int k : ks) ++chosen[k];
    }
  }
  std::printf("[policy] K chosen after the warm-up, 8 seeds:");
  for (const auto& [k, n] : chosen) std::printf(" K=%d %d", k, n);
  std::printf("\n");
  EXPECT_GE(chosen[4], 8 * 100 * 32 * 9 / 10);
}

using test::Generation;

// The golden file's three prompts, batched.
Generation Generate(Model& model, const SafetensorsFile& golden, const EngineConfig& config, int max_new_tokens) {
  return test::Generate(model, test::GoldenPrompts(golden), config, max_new_tokens);
}

TEST(AdaptiveDraftLength, GreedyOutputIsThePlainDecodes) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(model.ok());
  auto draft = Eagle3Draft::Load(test::DataPath("eagle3/llama_copy"), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir("llama") + "/golden.safetensors");
  EngineConfig plain;
  plain.scheduler.max_num_batched_tokens = 48;
  const Generation reference = Generate(**model, golden, plain, 24);
  const DraftCostModel cost = H200Like();
  EngineConfig fixed = plain;
  fixed.eagle3 = {draft->get(), 3};
  EngineConfig adaptive = fixed;
  adaptive.draft_length.adaptive = true;
  adaptive.draft_length.cost_model = &cost;
  const Generation a = Generate(**model, golden, adaptive, 24);
  EXPECT_EQ(a.tokens, reference.tokens);
  EXPECT_GT(a.stats.num_accepted_tokens, 0u);
  EngineConfig ngram = plain;
  ngram.ngram = {3, 1, 3};
  ngram.draft_length = adaptive.draft_length;
  const Generation lookup = Generate(**model, golden, ngram, 24);
  EXPECT_EQ(lookup.tokens, reference.tokens) << "ngram";
  // The lookup runs before the policy chooses: it gives drafts only where a match has them,
  // so every request-step it chose K > 0 for verified drafts.
  int64_t planned = 0;
  for (size_t k = 1; k < lookup.chosen_lengths.size(); ++k) planned += lookup.chosen_lengths[k];
  EXPECT_GT(planned, 0);
  EXPECT_EQ(planned, static_cast<int64_t>(lookup.stats.num_drafts));

  // Forced acceptance 0: the adaptive run proposes far fewer drafts than the fixed one;
  // forced acceptance 1: as many per verification (K_max each).
  fixed.spec_bench_accept_rate = adaptive.spec_bench_accept_rate = 0.0f;
  const Generation fixed0 = Generate(**model, golden, fixed, 24), adaptive0 = Generate(**model, golden, adaptive, 24);
  EXPECT_LT(adaptive0.stats.num_draft_tokens * 3, fixed0.stats.num_draft_tokens);
  fixed.spec_bench_accept_rate = adaptive.spec_bench_accept_rate = 1.0f;
  const Generation adaptive1 = Generate(**model, golden, adaptive, 24);
  EXPECT_GE(adaptive1.stats.num_draft_tokens, 3 * adaptive1.stats.num_drafts - 3 * 3);  // room cuts the last ones
}

// Greedy output with adaptive draft lengths is the plain decode's with every drafter, on
// every fixture: prompt lookup over each fixture model (the golden prompts and one that
// repeats itself), each EAGLE-3 fixture draft, and both Gemma 4 MTP assistants (the copy's
// drafts accepted, the random one's not), the injected costs mixing K = 0 and K > 0 in steps.
class AdaptiveGreedyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AdaptiveGreedyTest, NgramDraftsLeaveGreedyOutputUnchanged) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir(GetParam()), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir(GetParam()) + "/golden.safetensors");
  const std::vector<std::vector<int32_t>> prompts = test::GoldenPrompts(golden, /*with_loop=*/true);
  EngineConfig plain;
  plain.scheduler.max_num_batched_tokens = 48;
  const Generation reference = test::Generate(**model, prompts, plain, 32);
  const DraftCostModel cost = H200Like();
  EngineConfig adaptive = plain;
  adaptive.ngram = {3, 1, 3};
  adaptive.draft_length.adaptive = true;
  adaptive.draft_length.cost_model = &cost;
  const Generation run = test::Generate(**model, prompts, adaptive, 32);
  EXPECT_EQ(run.tokens, reference.tokens) << GetParam();
  EXPECT_GT(run.stats.num_draft_tokens, 0u) << "no drafts were verified";
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, AdaptiveGreedyTest, ::testing::ValuesIn(test::FixtureModels()),
                         [](const auto& info) { return info.param; });

TEST(AdaptiveDraftLength, Eagle3AndMtpDraftsLeaveGreedyOutputUnchanged) {
  CpuBackend backend(/*batch_invariant=*/true);
  const DraftCostModel cost = H200Like();
  for (const std::string variant : {"llama_legacy", "qwen3_default", "llama_copy"}) {
    const std::string target = test::Eagle3Target(variant);
    auto model = Model::Load(test::ModelDir(target), backend);
    ASSERT_TRUE(model.ok());
    auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), **model, backend);
    ASSERT_TRUE(draft.ok()) << draft.status().message();
    SafetensorsFile golden = test::Golden(test::ModelDir(target) + "/golden.safetensors");
    EngineConfig plain;
    plain.scheduler.max_num_batched_tokens = 48;
    const Generation reference = Generate(**model, golden, plain, 24);
    EngineConfig adaptive = plain;
    adaptive.eagle3 = {draft->get(), 4};
    adaptive.draft_length.adaptive = true;
    adaptive.draft_length.cost_model = &cost;
    const Generation run = Generate(**model, golden, adaptive, 24);
    EXPECT_EQ(run.tokens, reference.tokens) << variant;
    EXPECT_GT(run.stats.num_draft_tokens, 0u) << variant;
    if (variant != "llama_copy") {
      EXPECT_GT(run.chosen_lengths.at(0), 0) << variant << ": a random draft's requests never went to K = 0";
    }
  }
  auto target = Model::Load(test::DataPath("mtp/gemma4_target"), backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  SafetensorsFile golden = test::Golden(test::DataPath("mtp/golden_mtp_vllm_copy.safetensors"));
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < 3; ++k) prompts.push_back(test::AsIds(golden.Get("prompt_" + std::to_string(k)).value()));
  EngineConfig plain;
  plain.scheduler.max_num_batched_tokens = 48;
  const Generation reference = test::Generate(**target, prompts, plain, 24);
  for (const std::string variant : {"gemma4_assistant_copy", "gemma4_assistant"}) {
    auto drafter = MtpDrafter::Load(test::DataPath("mtp/" + variant), **target, backend);
    ASSERT_TRUE(drafter.ok()) << drafter.status().message();
    EngineConfig adaptive = plain;
    adaptive.mtp = {drafter->get(), 4};
    adaptive.draft_length.adaptive = true;
    adaptive.draft_length.cost_model = &cost;
    const Generation run = test::Generate(**target, prompts, adaptive, 24);
    EXPECT_EQ(run.tokens, reference.tokens) << variant;
    EXPECT_GT(run.stats.num_draft_tokens, 0u) << variant;
    if (variant == "gemma4_assistant_copy") {
      EXPECT_GT(run.stats.num_accepted_tokens, 0u);
    } else {
      EXPECT_GT(run.chosen_lengths.at(0), 0) << variant << ": a random draft's requests never went to K = 0";
    }
  }
}

TEST(AdaptiveDraftLength, SpeculativeConfigKey) {
  auto adaptive = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "draft_length": "adaptive"})", 4);
  ASSERT_TRUE(adaptive.ok()) << adaptive.status().message();
  EXPECT_TRUE(adaptive->adaptive_draft_length);
  auto fixed = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})", 4);
  ASSERT_TRUE(fixed.ok());
  EXPECT_FALSE(fixed->adaptive_draft_length);
  auto bad = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "draft_length": "dynamic"})", 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("draft_length"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace hsx
