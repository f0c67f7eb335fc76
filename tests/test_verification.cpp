// Draft verification (backend/verification.h) on the CPU backend. Greedy verification
// gives exactly the plain greedy chain; random verification is lossless: the first
// emitted token, and the first two jointly over a conditional toy model, follow the
// target's processed distribution (chi-square against an independent sort-based reading
// of vLLM's rules), while deliberately wrong acceptance rules fail the same test; a
// request's outcome does not depend on its batch; logprobs and the target
// probabilities are the ones the Sample op's rules give.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/sampling_math.h"
#include "engine/sampler.h"
#include "engine/sequence.h"
#include "sampling_reference.h"

namespace hsx {
namespace {

using test::ChiSquare;
using test::ChiSquareBound;
using test::Expected;
using Rows = std::vector<std::vector<float>>;

// Appends one request: its K drafts and K + 1 logit rows, sampled with `row` at draws
// first_draw, first_draw + 1, ...; `adjust[j]` (if given) is row j's TokenAdjust list.
void AddRequest(VerificationBatch& batch, Rows& logits, const Rows& rows, const std::vector<int32_t>& drafts,
                SamplingRow row, uint32_t first_draw, const std::vector<std::vector<TokenAdjust>>& adjust = {}) {
  ASSERT_EQ(rows.size(), drafts.size() + 1);
  batch.num_drafts.push_back(static_cast<int32_t>(drafts.size()));
  batch.drafts.insert(batch.drafts.end(), drafts.begin(), drafts.end());
  for (size_t j = 0; j < rows.size(); ++j) {
    logits.push_back(rows[j]);
    row.draw = first_draw + static_cast<uint32_t>(j);
    row.adjust_begin = static_cast<int32_t>(batch.sampling.adjust.size());
    if (j < adjust.size()) batch.sampling.adjust.insert(batch.sampling.adjust.end(), adjust[j].begin(), adjust[j].end());
    row.adjust_end = static_cast<int32_t>(batch.sampling.adjust.size());
    batch.sampling.rows.push_back(row);
  }
}

Rows RandomRows(std::mt19937& rng, int n, int vocab, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  Rows rows(n, std::vector<float>(vocab));
  for (auto& r : rows) {
    for (float& x : r) x = normal(rng);
  }
  return rows;
}

SamplingRow Params(float temperature, int top_k, float top_p, float min_p, uint32_t seed_lo, uint32_t seed_hi = 0) {
  SamplingRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.min_p = min_p;
  r.seed_lo = seed_lo;
  r.seed_hi = seed_hi;
  return r;
}

// Greedy verification is the plain greedy chain: for every prefix of correct drafts
// (none, some, all) the accepted count is that prefix, the emitted tokens are the
// argmax of each row up to the first wrong draft (or the bonus row), and nothing after.
TEST(Verification, GreedyIsThePlainGreedyChain) {
  CpuBackend cpu;
  std::mt19937 rng(1);
  const int vocab = 64, k = 4;
  Rows rows = RandomRows(rng, k + 1, vocab, 2.0f);
  rows[2][5] = rows[2][40] = 20.0f;  // a tie at the top: the lowest id is the argmax
  // Row 3 bans its own argmax, as the penalty entries of a draft-aware row would.
  const std::vector<std::vector<TokenAdjust>> adjust = {
      {}, {}, {}, {{static_cast<int32_t>(std::max_element(rows[3].begin(), rows[3].end()) - rows[3].begin()), 0,
                    TokenAdjust::kBanned}}};
  VerificationBatch one;
  Rows one_logits;
  AddRequest(one, one_logits, rows, std::vector<int32_t>(k, 0), SamplingRow{}, 0, adjust);
  const std::vector<int32_t> chain = cpu.Sample(test::Logits(one_logits), one.sampling).tokens;
  ASSERT_EQ(chain[2], 5);

  VerificationBatch batch;
  Rows logits;
  for (int accepted = 0; accepted <= k; ++accepted) {
    std::vector<int32_t> drafts(chain.begin(), chain.begin() + k);  // later drafts right again after a wrong one
    if (accepted < k) drafts[accepted] = (chain[accepted] + 1) % vocab;
    AddRequest(batch, logits, rows, drafts, SamplingRow{}, 0, adjust);
  }
  AddRequest(batch, logits, {rows[0]}, {}, SamplingRow{}, 0);  // no drafts: the plain step
  const VerifiedTokens v = cpu.VerifyDrafts(test::Logits(logits), nullptr, batch, nullptr);
  for (int accepted = 0; accepted <= k; ++accepted) {
    EXPECT_EQ(v.num_accepted[accepted], accepted);
    for (int j = 0; j <= k; ++j) {
      const size_t g = accepted * (k + 1) + j;
      EXPECT_EQ(v.emitted.tokens[g], j <= accepted ? chain[j] : -1) << accepted << " accepted, row " << j;
      if (j > accepted) {
        EXPECT_EQ(v.emitted.logprobs[g], -std::numeric_limits<float>::infinity());
      }
    }
  }
  EXPECT_EQ(v.num_accepted.back(), 0);
  EXPECT_EQ(v.emitted.tokens.back(), chain[0]);
}

// Drafts outside the vocabulary (vLLM's -1 placeholder) are rejected, greedy or not.
TEST(Verification, DraftsOutsideTheVocabularyAreRejected) {
  CpuBackend cpu;
  std::mt19937 rng(2);
  const Rows rows = RandomRows(rng, 2, 16, 1.0f);
  for (int32_t bad : {-1, 16, 1 << 30}) {
    for (float t : {0.0f, 1.0f}) {
      VerificationBatch batch;
      Rows logits;
      AddRequest(batch, logits, rows, {bad}, Params(t, 0, 1.0f, 0.0f, 3), 0);
      const VerifiedTokens v = cpu.VerifyDrafts(test::Logits(logits), nullptr, batch, nullptr);
      EXPECT_EQ(v.num_accepted[0], 0) << bad;
      EXPECT_GE(v.emitted.tokens[0], 0);
      EXPECT_LT(v.emitted.tokens[0], 16);
      EXPECT_EQ(v.emitted.tokens[1], -1);
    }
  }
}

// hsx bench --spec-bench-accept-rate: each draft is accepted with probability a whatever
// the target says. a = 1 accepts every draft (the request emits K + 1 tokens), a = 0 none
// (even a draft that is the greedy argmax), and a = 0.5 gives a mean accepted count of
// a + a^2 + ... + a^K within 6 standard errors over many seeded requests, greedy or not;
// the same seeds accept the same drafts again.
TEST(Verification, ForcedAcceptanceIsABernoulliDrawPerDraft) {
  CpuBackend cpu;
  std::mt19937 rng(11);
  const int vocab = 32, k = 4, requests = 4000;
  for (float t : {0.0f, 1.0f}) {
    VerificationBatch batch;
    Rows logits;
    for (int r = 0; r < requests; ++r) {
      const Rows rows = RandomRows(rng, k + 1, vocab, 2.0f);
      std::vector<int32_t> drafts;
      for (int j = 0; j < k; ++j) {  // the argmax half the time: a = 0 must reject it too
        drafts.push_back(r % 2 ? static_cast<int32_t>(std::max_element(rows[j].begin(), rows[j].end()) - rows[j].begin())
                               : static_cast<int32_t>(rng() % vocab));
      }
      AddRequest(batch, logits, rows, drafts, Params(t, 0, 1.0f, 0.0f, 1000 + r), 7);
    }
    const Tensor all = test::Logits(logits);
    for (float a : {1.0f, 0.0f, 0.5f}) {
      batch.forced_accept_rate = a;
      const VerifiedTokens v = cpu.VerifyDrafts(all, nullptr, batch, nullptr);
      double sum = 0;
      for (int r = 0; r < requests; ++r) {
        sum += v.num_accepted[r];
        for (int j = 0; j < v.num_accepted[r]; ++j) ASSERT_EQ(v.emitted.tokens[r * (k + 1) + j], batch.drafts[r * k + j]);
        ASSERT_GE(v.emitted.tokens[r * (k + 1) + v.num_accepted[r]], 0);
      }
      const double mean = sum / requests;
      if (a == 1.0f) {
        EXPECT_EQ(mean, k) << "t=" << t;
      }
      if (a == 0.0f) {
        EXPECT_EQ(mean, 0) << "t=" << t;
      }
      if (a == 0.5f) {
        // accepted = sum of the K prefix indicators; its variance is below K^2 / 4.
        const double expected = 0.5 + 0.25 + 0.125 + 0.0625, sd = k / 2.0 / std::sqrt(requests);
        EXPECT_NEAR(mean, expected, 6 * sd) << "t=" << t;
        EXPECT_EQ(cpu.VerifyDrafts(all, nullptr, batch, nullptr).num_accepted, v.num_accepted);
      }
    }
  }
}

// Random rows use the Sample op's noise at each row's draw: the bonus token is the Sample
// op's token, an accepted token is the draft, and a rejected one-hot draft gives the
// Sample op's token whenever that token is not the draft.
TEST(Verification, RandomRowsDrawWithTheSampleOpsNoise) {
  CpuBackend cpu;
  std::mt19937 rng(3);
  const int vocab = 12, k = 3;
  const Rows rows = RandomRows(rng, k + 1, vocab, 2.0f);
  VerificationBatch batch;
  Rows logits;
  for (uint32_t seed = 0; seed < 3000; ++seed) {
    std::vector<int32_t> drafts(k);
    for (int j = 0; j < k; ++j) {  // mostly the likeliest token, so many are accepted
      const auto top = static_cast<int32_t>(std::max_element(rows[j].begin(), rows[j].end()) - rows[j].begin());
      drafts[j] = rng() % 4 ? top : static_cast<int32_t>(rng() % vocab);
    }
    AddRequest(batch, logits, rows, drafts, Params(0.9f, 8, 0.95f, 0.0f, seed), 7);
  }
  const Tensor t = test::Logits(logits);
  const std::vector<int32_t> plain = cpu.Sample(t, batch.sampling).tokens;
  const VerifiedTokens v = cpu.VerifyDrafts(t, nullptr, batch, nullptr);
  int bonus = 0, rejected_elsewhere = 0;
  for (size_t r = 0; r < batch.num_drafts.size(); ++r) {
    const int a = v.num_accepted[r];
    for (int j = 0; j < a; ++j) EXPECT_EQ(v.emitted.tokens[r * (k + 1) + j], batch.drafts[r * k + j]);
    const size_t g = r * (k + 1) + a;
    if (a == k) {
      ++bonus;
      EXPECT_EQ(v.emitted.tokens[g], plain[g]);
    } else if (plain[g] != batch.drafts[r * k + a]) {
      ++rejected_elsewhere;
      EXPECT_EQ(v.emitted.tokens[g], plain[g]);
    } else {
      EXPECT_NE(v.emitted.tokens[g], plain[g]);  // the draft itself is never the correction
    }
  }
  EXPECT_GT(bonus, 50);
  EXPECT_GT(rejected_elsewhere, 500);
}

// A request's outcome depends only on its rows, drafts and seed: verified alone or among
// other requests (other K, other parameters, another position) it is the same, bit for bit.
TEST(Verification, SeededResultsDoNotDependOnTheBatch) {
  CpuBackend cpu;
  std::mt19937 rng(4);
  const int vocab = 300;
  struct Request {
    Rows rows;
    std::vector<int32_t> drafts;
    SamplingRow row;
  };
  std::vector<Request> requests;
  for (int i = 0; i < 24; ++i) {
    const int k = i % 5;
    Request r{RandomRows(rng, k + 1, vocab, 3.0f), {}, Params(i % 4 == 0 ? 0.0f : 0.6f + 0.1f * (i % 5), i % 3 ? 0 : 20,
                                                                i % 2 ? 0.9f : 1.0f, 0.0f, 1000 + i, i)};
    r.row.num_logprobs = i % 3;
    for (int j = 0; j < k; ++j) {
      // Mostly the row's argmax (accepted often), sometimes anything.
      const auto& l = r.rows[j];
      r.drafts.push_back(rng() % 4 ? static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin())
                                   : static_cast<int32_t>(rng() % vocab));
    }
    requests.push_back(std::move(r));
  }
  auto verify = [&](const std::vector<int>& order) {
    VerificationBatch batch;
    batch.sampling.max_logprobs = 2;
    Rows logits;
    for (int i : order) AddRequest(batch, logits, requests[i].rows, requests[i].drafts, requests[i].row, 40);
    return cpu.VerifyDrafts(test::Logits(logits), nullptr, batch, nullptr);
  };
  std::vector<int> mixed(requests.size());
  for (size_t i = 0; i < mixed.size(); ++i) mixed[i] = static_cast<int>(mixed.size() - 1 - i);
  const VerifiedTokens all = verify(mixed);
  int accepted = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const VerifiedTokens alone = verify({static_cast<int>(i)});
    const size_t pos = mixed.size() - 1 - i;
    size_t row = 0;
    for (size_t p = 0; p < pos; ++p) row += requests[mixed[p]].drafts.size() + 1;
    EXPECT_EQ(all.num_accepted[pos], alone.num_accepted[0]) << "request " << i;
    accepted += alone.num_accepted[0];
    for (size_t j = 0; j <= requests[i].drafts.size(); ++j) {
      EXPECT_EQ(all.emitted.tokens[row + j], alone.emitted.tokens[j]) << "request " << i << " row " << j;
      EXPECT_EQ(std::memcmp(&all.emitted.logprobs[row + j], &alone.emitted.logprobs[j], sizeof(float)), 0);
      for (int c = 0; c < 2; ++c) {
        EXPECT_EQ(all.emitted.top_ids[(row + j) * 2 + c], alone.emitted.top_ids[j * 2 + c]);
      }
    }
  }
  EXPECT_GT(accepted, 5);
}

// Emitted tokens carry their raw logprobs (the log-softmax of the unprocessed logits) and
// top logprobs; target_probs (poisoned first) receives every row's processed p.
TEST(Verification, LogprobsAndTargetProbabilities) {
  CpuBackend cpu;
  std::mt19937 rng(5);
  const int vocab = 40;
  const Rows rows = RandomRows(rng, 3, vocab, 2.0f);
  VerificationBatch batch;
  batch.sampling.max_logprobs = 4;
  Rows logits;
  SamplingRow random = Params(0.8f, 10, 0.9f, 0.02f, 9);
  random.num_logprobs = 3;
  const auto argmax0 = static_cast<int32_t>(std::max_element(rows[0].begin(), rows[0].end()) - rows[0].begin());
  AddRequest(batch, logits, rows, {argmax0, 0}, random, 0);
  SamplingRow greedy;
  greedy.num_logprobs = 4;
  AddRequest(batch, logits, {rows[1], rows[2]}, {-1}, greedy, 0);
  Tensor probs = Tensor::Host(DType::kF32, {5, vocab});
  std::fill_n(probs.data<float>(), 5 * vocab, std::numeric_limits<float>::quiet_NaN());
  const VerifiedTokens v = cpu.VerifyDrafts(test::Logits(logits), nullptr, batch, &probs);

  for (int g = 0; g < 5; ++g) {
    const std::vector<float>& l = logits[g];
    double z = 0;
    for (float x : l) z += std::exp(static_cast<double>(x));
    const SamplingRow& row = batch.sampling.rows[g];
    const std::vector<double> want = row.temperature > 0 ? Expected(l, row) : std::vector<double>{};
    const auto top = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    for (int i = 0; i < vocab; ++i) {
      const double p = row.temperature > 0 ? want[i] : (i == top ? 1.0 : 0.0);
      EXPECT_NEAR(probs.data<float>()[g * vocab + i], p, 1e-6) << "row " << g << " token " << i;
    }
    const int32_t token = v.emitted.tokens[g];
    if (token < 0) {
      for (int c = 0; c < 4; ++c) EXPECT_EQ(v.emitted.top_ids[g * 4 + c], -1);
      continue;
    }
    EXPECT_NEAR(v.emitted.logprobs[g], l[token] - std::log(z), 1e-5);
    std::vector<int32_t> order(vocab);
    for (int i = 0; i < vocab; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    for (int c = 0; c < 4; ++c) {
      EXPECT_EQ(v.emitted.top_ids[g * 4 + c], c < row.num_logprobs ? order[c] : -1);
      if (c < row.num_logprobs) {
        EXPECT_NEAR(v.emitted.top_logprobs[g * 4 + c], l[order[c]] - std::log(z), 1e-5);
      }
    }
  }
  EXPECT_EQ(v.num_accepted[1], 0);  // the -1 placeholder
  EXPECT_EQ(v.emitted.tokens[3], std::max_element(rows[1].begin(), rows[1].end()) - rows[1].begin());
  EXPECT_EQ(v.emitted.tokens[4], -1);
}

// A later turn of a regenerated conversation (Request::next_turn) penalizes as a request
// asked turn by turn would: what came before the turn (earlier answers and the template's
// known tokens too) is its prompt, and only the turn's own tokens are its output.
TEST(Verification, PenaltiesCountOnlyTheCurrentTurnAsOutput) {
  Request request;
  request.prompt = {1, 2};
  request.sampling.repetition_penalty = 1.3f;
  request.sampling.presence_penalty = 0.5f;
  Sequence seq(request);
  seq.Append(3);                          // the first answer
  seq.BeginTurn({{4, 3}, 5});             // known tokens, then the next answer
  seq.Append(5);
  seq.Append(3);
  std::vector<TokenAdjust> adjust;
  MakeSamplingRow(seq, {}, adjust);
  std::map<int32_t, TokenAdjust> by_token;
  for (const TokenAdjust& a : adjust) by_token[a.token] = a;
  ASSERT_EQ(by_token.size(), 5u);
  for (int32_t t : {1, 2, 4}) {
    EXPECT_EQ(by_token[t].output_count, 0) << t;
    EXPECT_EQ(by_token[t].flags, TokenAdjust::kInPrompt) << t;
  }
  EXPECT_EQ(by_token[3].flags, TokenAdjust::kInPrompt);  // in the first answer and in the turn
  EXPECT_EQ(by_token[3].output_count, 1);
  EXPECT_EQ(by_token[5].flags, 0);
  EXPECT_EQ(by_token[5].output_count, 1);
}

// A sequence's row j for verification is the row the plain decode makes once the first j
// drafts were generated: the same draw index, seed and penalty counts.
TEST(Verification, RowsAfterDraftsAreThoseOfTheLongerSequence) {
  Request request;
  request.prompt = {1, 2, 3, 2};
  request.sampling.temperature = 0.8f;
  request.sampling.repetition_penalty = 1.3f;
  request.sampling.frequency_penalty = 0.2f;
  request.sampling.seed = 77;
  Sequence seq(request);
  seq.Append(4);
  seq.Append(2);
  const std::vector<int32_t> drafts = {4, 9, 4};
  auto sorted = [](std::vector<TokenAdjust> a) {
    std::sort(a.begin(), a.end(), [](const TokenAdjust& x, const TokenAdjust& y) { return x.token < y.token; });
    return a;
  };
  for (size_t j = 0; j <= drafts.size(); ++j) {
    std::vector<TokenAdjust> got_adjust, want_adjust;
    const SamplingRow got = MakeSamplingRowAfter(seq, std::span(drafts).first(j), {7}, got_adjust);
    Sequence longer(request);
    for (int32_t t : {4, 2}) longer.Append(t);
    for (size_t i = 0; i < j; ++i) longer.Append(drafts[i]);
    const SamplingRow want = MakeSamplingRow(longer, {7}, want_adjust);
    EXPECT_EQ(got.draw, 2 + j);
    EXPECT_EQ(got.draw, want.draw);
    EXPECT_EQ(got.seed_lo, want.seed_lo);
    const std::vector<TokenAdjust> a = sorted(got_adjust), b = sorted(want_adjust);
    ASSERT_EQ(a.size(), b.size()) << "row " << j;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].token, b[i].token);
      EXPECT_EQ(a[i].output_count, b[i].output_count) << "row " << j << " token " << a[i].token;
      EXPECT_EQ(a[i].flags, b[i].flags);
    }
  }
}

// ---- Losslessness: statistics over many seeds (SPECULATIVE.md 3.3) ----

const std::vector<float> kTarget = {1.0f, 2.2f, 0.3f, 2.0f, -1.0f, 1.6f, 0.0f, 1.2f};

// The verification rules with a deliberate error, for the negative controls: built from
// the same host pieces, so only the rule differs.
enum class WrongRule { kAcceptEveryDraft, kRecoverFromP, kTruncateAfterTheTest, kAcceptIgnoringDraftProbs };

int32_t WrongFirstToken(WrongRule rule, const std::vector<float>& logits, const SamplingRow& row, int32_t draft,
                        const std::vector<double>* q) {
  if (rule == WrongRule::kAcceptEveryDraft) return draft;
  const auto vocab = static_cast<int32_t>(logits.size());
  const ProcessedRow p = ProcessRowOnHost(logits.data(), vocab, row, nullptr);
  double z = 0;
  for (float w : p.weight) z += w;
  double p_draft = p.weight[draft] / z;
  if (rule == WrongRule::kTruncateAfterTheTest) {  // the test on the softmax at the temperature alone
    double all = 0;
    for (float l : p.scaled) all += std::exp(static_cast<double>(l));
    p_draft = std::exp(static_cast<double>(p.scaled[draft])) / all;
  }
  if (p_draft >= sampling::AcceptUniform(row.seed_lo, row.seed_hi, row.draw)) return draft;
  if (rule == WrongRule::kRecoverFromP) return DrawOnHost(p, row, -1);
  if (rule == WrongRule::kTruncateAfterTheTest) return DrawOnHost(p, row, draft);
  float best = -INFINITY;  // the right recovery from max(p - q, 0), after the wrong test
  int32_t token = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    const double residual = p.weight[i] / z - (*q)[i];
    if (residual <= 0) continue;
    const float score = static_cast<float>(std::log(residual)) + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i);
    if (token < 0 || score > best) best = score, token = i;
  }
  return token;
}

// A draft distribution unlike the target's: likely drafts are often, but not always, right.
std::vector<double> DraftDistribution(int vocab, int shift) {
  std::vector<double> q(vocab);
  double z = 0;
  for (int i = 0; i < vocab; ++i) z += q[i] = std::exp(-0.6 * ((i + shift) % vocab));
  for (double& x : q) x /= z;
  return q;
}

int32_t DrawFrom(const std::vector<double>& q, std::mt19937& rng) {
  return static_cast<int32_t>(std::discrete_distribution<int32_t>(q.begin(), q.end())(rng));
}

Tensor ProbRows(const std::vector<std::vector<double>>& rows) {
  Tensor t = Tensor::Host(DType::kF32, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < rows[r].size(); ++i) t.data<float>()[r * rows[r].size() + i] = static_cast<float>(rows[r][i]);
  }
  return t;
}

struct Config {
  const char* name;
  SamplingRow row;
};

std::vector<Config> Configs() {
  return {{"temperature 1", Params(1.0f, 0, 1.0f, 0.0f, 0)}, {"temperature 0.7", Params(0.7f, 0, 1.0f, 0.0f, 0)},
          {"top-k 3", Params(1.0f, 3, 1.0f, 0.0f, 0)},       {"top-p 0.7", Params(1.0f, 0, 0.7f, 0.0f, 0)},
          {"min-p 0.3", Params(1.0f, 0, 1.0f, 0.3f, 0)},     {"all", Params(0.8f, 5, 0.9f, 0.05f, 0)}};
}

// The first emitted token of K = 3 one-hot or probabilistic drafts follows the target's
// processed distribution; each wrong rule's first tokens, from the same seeds and drafts,
// do not.
TEST(VerificationLossless, FirstTokenFollowsTheTarget) {
  CpuBackend cpu;
  const int n = 60000, k = 3, vocab = static_cast<int>(kTarget.size());
  const std::vector<double> q = DraftDistribution(vocab, 0);
  for (bool with_probs : {false, true}) {
    for (size_t c = 0; c < Configs().size(); ++c) {
      const Config config = Configs()[c];
      std::mt19937 rng(static_cast<uint32_t>(c));
      VerificationBatch batch;
      Rows logits;
      std::vector<std::vector<double>> draft_probs;
      for (int trial = 0; trial < n; ++trial) {
        std::vector<int32_t> drafts(k);
        for (int32_t& d : drafts) d = DrawFrom(q, rng);
        SamplingRow row = config.row;
        row.seed_lo = static_cast<uint32_t>(trial);
        row.seed_hi = static_cast<uint32_t>(c + 10 * with_probs);
        AddRequest(batch, logits, Rows(k + 1, kTarget), drafts, row, 0);
        if (with_probs) draft_probs.insert(draft_probs.end(), k, q);
      }
      const Tensor probs = with_probs ? ProbRows(draft_probs) : Tensor();
      const VerifiedTokens v = cpu.VerifyDrafts(test::Logits(logits), with_probs ? &probs : nullptr, batch, nullptr);
      std::vector<int> counts(vocab, 0);
      for (int trial = 0; trial < n; ++trial) ++counts[v.emitted.tokens[trial * (k + 1)]];
      const std::vector<double> want = Expected(kTarget, config.row);
      int dof = 0;
      const double chi = ChiSquare(counts, want, n, &dof);
      const std::string what = std::string(config.name) + (with_probs ? ", draft probabilities" : ", one-hot drafts");
      EXPECT_LT(chi, ChiSquareBound(std::max(dof, 1))) << what;

      std::vector<WrongRule> wrong = {WrongRule::kAcceptEveryDraft, WrongRule::kRecoverFromP};
      const SamplingRow& r = config.row;
      if (r.top_k > 0 || r.top_p < 1.0f || r.min_p > 0.0f) wrong.push_back(WrongRule::kTruncateAfterTheTest);
      if (with_probs) wrong = {WrongRule::kAcceptIgnoringDraftProbs};
      for (WrongRule rule : wrong) {
        std::vector<int> bad(vocab, 0);
        for (int trial = 0; trial < n; ++trial) {
          const SamplingRow& row = batch.sampling.rows[trial * (k + 1)];
          ++bad[WrongFirstToken(rule, kTarget, row, batch.drafts[trial * k], &q)];
        }
        const double wrong_chi = ChiSquare(bad, want, n, &dof);
        EXPECT_GT(wrong_chi, ChiSquareBound(std::max(dof, 1))) << what << ": wrong rule " << static_cast<int>(rule) << " passed";
      }
    }
  }
}

// The first two emitted tokens jointly, over a toy model whose next-token logits depend on
// the previous token (36 cells): drafts from a conditional draft model, K = 2; when the
// first draft is rejected, the second token comes from the next step (a verification of
// no drafts at draw 1). The joint equals p(x1) p(x2 | x1) of the processed target, and
// accepting every draft fails the same test.
TEST(VerificationLossless, FirstTwoTokensJointlyFollowTheTarget) {
  CpuBackend cpu;
  const int n = 100000, vocab = 6;
  std::mt19937 table_rng(17);
  const Rows first = RandomRows(table_rng, 1, vocab, 0.8f);
  const Rows second = RandomRows(table_rng, vocab, vocab, 0.8f);  // second[x1]: logits after x1
  const Rows third = RandomRows(table_rng, 1, vocab, 0.8f);       // the bonus row (not measured)
  std::vector<std::vector<double>> q2(vocab);
  for (int x = 0; x < vocab; ++x) q2[x] = DraftDistribution(vocab, x + 1);
  const std::vector<double> q1 = DraftDistribution(vocab, 3);
  const Config configs[] = {{"temperature 1", Params(1.0f, 0, 1.0f, 0.0f, 0)},
                            {"top-k 4", Params(1.0f, 4, 1.0f, 0.0f, 0)},
                            {"top-p 0.8", Params(1.0f, 0, 0.8f, 0.0f, 0)},
                            {"min-p 0.2, temperature 0.8", Params(0.8f, 0, 1.0f, 0.2f, 0)}};
  for (bool with_probs : {false, true}) {
    for (size_t c = 0; c < std::size(configs); ++c) {
      const Config& config = configs[c];
      std::mt19937 rng(100 + static_cast<uint32_t>(c));
      VerificationBatch batch;
      Rows logits;
      std::vector<std::vector<double>> draft_probs;
      for (int trial = 0; trial < n; ++trial) {
        const int32_t d1 = DrawFrom(q1, rng), d2 = DrawFrom(q2[d1], rng);
        SamplingRow row = config.row;
        row.seed_lo = static_cast<uint32_t>(trial);
        row.seed_hi = static_cast<uint32_t>(100 + c + 10 * with_probs);
        AddRequest(batch, logits, {first[0], second[d1], third[0]}, {d1, d2}, row, 0);
        if (with_probs) draft_probs.insert(draft_probs.end(), {q1, q2[d1]});
      }
      const Tensor probs = with_probs ? ProbRows(draft_probs) : Tensor();
      const VerifiedTokens v = cpu.VerifyDrafts(test::Logits(logits), with_probs ? &probs : nullptr, batch, nullptr);
      // The next step of the requests whose first draft was rejected.
      VerificationBatch next;
      Rows next_logits;
      std::vector<int> next_of(n, -1);
      for (int trial = 0; trial < n; ++trial) {
        if (v.num_accepted[trial] > 0) continue;
        next_of[trial] = static_cast<int>(next.num_drafts.size());
        AddRequest(next, next_logits, {second[v.emitted.tokens[trial * 3]]}, {}, batch.sampling.rows[trial * 3], 1);
      }
      ASSERT_GT(next.num_drafts.size(), 1000u);
      const VerifiedTokens w = cpu.VerifyDrafts(test::Logits(next_logits), nullptr, next, nullptr);
      std::vector<int> joint(vocab * vocab, 0), accept_all(vocab * vocab, 0);
      for (int trial = 0; trial < n; ++trial) {
        const int32_t x1 = v.emitted.tokens[trial * 3];
        const int32_t x2 = next_of[trial] < 0 ? v.emitted.tokens[trial * 3 + 1] : w.emitted.tokens[next_of[trial]];
        ++joint[x1 * vocab + x2];
        ++accept_all[batch.drafts[trial * 2] * vocab + batch.drafts[trial * 2 + 1]];
      }
      std::vector<double> want(vocab * vocab);
      const std::vector<double> p1 = Expected(first[0], config.row);
      for (int x1 = 0; x1 < vocab; ++x1) {
        const std::vector<double> p2 = Expected(second[x1], config.row);
        for (int x2 = 0; x2 < vocab; ++x2) want[x1 * vocab + x2] = p1[x1] * p2[x2];
      }
      int dof = 0;
      const std::string what = std::string(config.name) + (with_probs ? ", draft probabilities" : ", one-hot drafts");
      const double chi = ChiSquare(joint, want, n, &dof);
      EXPECT_LT(chi, ChiSquareBound(std::max(dof, 1))) << what;
      const double control = ChiSquare(accept_all, want, n, &dof);
      EXPECT_GT(control, ChiSquareBound(std::max(dof, 1))) << what << ": control passed";
    }
  }
}

}  // namespace
}  // namespace hsx
