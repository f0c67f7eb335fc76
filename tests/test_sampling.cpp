// The sampling op (backend/sampling.h) on the CPU backend: each option's draws follow the
// distribution an independent sort-based reading of vLLM's rules gives (chi-square, with
// a negative control), a row's token does not depend on its batch, logprobs are the
// log-softmax, bans and penalties change what is drawn, and GreedyTokens gives the greedy
// Sample token (through an offset map where given) without a host copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/sampling_math.h"
#include "sampling_reference.h"

namespace hsx {
namespace {

using test::ChiSquare;
using test::ChiSquareBound;
using test::Expected;
using test::Logits;

std::vector<int> Draw(CpuBackend& cpu, const std::vector<float>& logits, SamplingRow row, int n) {
  std::vector<int> counts(logits.size(), 0);
  SamplingBatch batch;
  for (int i = 0; i < n; ++i) {
    row.draw = static_cast<uint32_t>(i);
    batch.rows.push_back(row);
  }
  const Tensor t = Logits(std::vector<std::vector<float>>(n, logits));
  for (int32_t token : cpu.Sample(t, batch).tokens) ++counts[token];
  return counts;
}

const std::vector<float> kLogits = {1.0f, 2.5f, 0.3f, 2.4f, -1.0f, 1.7f, 0.0f, 2.5f, -3.0f, 1.2f};

TEST(SamplingOp, EachOptionFollowsItsDistribution) {
  CpuBackend cpu;
  struct Case {
    const char* name;
    SamplingRow row;
  };
  auto make = [](float t, float top_p, int top_k, float min_p) {
    SamplingRow r;
    r.temperature = t;
    r.top_p = top_p;
    r.top_k = top_k;
    r.min_p = min_p;
    r.seed_lo = 12345;
    r.seed_hi = 6;
    return r;
  };
  const Case cases[] = {{"temperature 1", make(1.0f, 1.0f, 0, 0.0f)},   {"temperature 0.6", make(0.6f, 1.0f, 0, 0.0f)},
                        {"temperature 2", make(2.0f, 1.0f, 0, 0.0f)},   {"top-k 4", make(1.0f, 1.0f, 4, 0.0f)},
                        {"top-p 0.7", make(1.0f, 0.7f, 0, 0.0f)},       {"min-p 0.3", make(1.0f, 1.0f, 0, 0.3f)},
                        {"all", make(0.8f, 0.9f, 6, 0.05f)}};
  const int n = 40000;
  for (const Case& c : cases) {
    const std::vector<int> counts = Draw(cpu, kLogits, c.row, n);
    int dof = 0;
    const double chi = ChiSquare(counts, Expected(kLogits, c.row), n, &dof);
    EXPECT_LT(chi, ChiSquareBound(std::max(dof, 1))) << c.name;
    // Negative control: the same draws against the untruncated softmax at temperature 1
    // must fail, so the test can tell the options apart.
    SamplingRow plain = make(1.0f, 1.0f, 0, 0.0f);
    if (std::string(c.name) != "temperature 1") {
      const double wrong = ChiSquare(counts, Expected(kLogits, plain), n, &dof);
      EXPECT_GT(wrong, ChiSquareBound(std::max(dof, 1))) << c.name << ": the control did not fail";
    }
  }
}

TEST(SamplingOp, ARowsTokenDoesNotDependOnItsBatch) {
  CpuBackend cpu;
  std::vector<float> a(500), b(500);
  for (int i = 0; i < 500; ++i) a[i] = std::sin(i * 0.37f) * 4, b[i] = std::cos(i * 1.3f) * 3;
  SamplingRow row;
  row.temperature = 1.0f;
  row.top_p = 0.95f;
  row.seed_lo = 99;
  SamplingRow other = row;
  other.seed_lo = 7;
  other.top_k = 5;
  for (uint32_t draw = 0; draw < 50; ++draw) {
    row.draw = other.draw = draw;
    SamplingBatch alone{{row}, {}, 0};
    SamplingBatch mixed{{other, other, row}, {}, 0};
    const int32_t t1 = cpu.Sample(Logits({a}), alone).tokens[0];
    const int32_t t2 = cpu.Sample(Logits({b, a, a}), mixed).tokens[2];
    EXPECT_EQ(t1, t2) << "draw " << draw;
  }
  // Different draws of one seed differ (the stream advances).
  std::vector<int> seen(500, 0);
  for (int token : Draw(cpu, a, row, 200)) seen[token] = 1;
  EXPECT_GT(std::accumulate(seen.begin(), seen.end(), 0), 5);
}

TEST(SamplingOp, LogprobsAreTheRawLogSoftmax) {
  CpuBackend cpu;
  std::vector<float> l(300);
  for (int i = 0; i < 300; ++i) l[i] = std::sin(i * 0.91f) * 6;
  l[17] = l[42] = 9.0f;  // a tie at the top: lower id first
  double z = 0;
  for (float x : l) z += std::exp(static_cast<double>(x));
  SamplingRow row;
  row.temperature = 0.7f;
  row.repetition_penalty = 1.3f;  // penalties change the draw, not the reported logprobs
  row.num_logprobs = 5;
  row.adjust_end = 1;
  SamplingBatch batch{{row}, {{17, 2, 0}}, 8};
  const SampledTokens s = cpu.Sample(Logits({l}), batch);
  std::vector<int> order(300);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(s.top_ids[k], order[k]);
    EXPECT_NEAR(s.top_logprobs[k], l[order[k]] - std::log(z), 1e-4);
  }
  for (int k = 5; k < 8; ++k) EXPECT_EQ(s.top_ids[k], -1);
  EXPECT_NEAR(s.logprobs[0], l[s.tokens[0]] - std::log(z), 1e-4);
}

TEST(SamplingOp, GreedyBansAndPenalties) {
  CpuBackend cpu;
  const std::vector<float> l = {0.5f, 3.0f, 3.0f, 2.9f, -1.0f};
  SamplingRow greedy;
  EXPECT_EQ(cpu.Sample(Logits({l}), {{greedy}, {}, 0}).tokens[0], 1);  // lowest id of the tie
  // Banning 1 and 2 (min_tokens holding back stop tokens) leaves 3.
  greedy.adjust_end = 2;
  EXPECT_EQ(cpu.Sample(Logits({l}), {{greedy}, {{1, 0, TokenAdjust::kBanned}, {2, 0, TokenAdjust::kBanned}}, 0}).tokens[0], 3);
  // Repetition penalty 2 on prompt token 1: 3.0 / 2 = 1.5 < 3.0, so 2 wins.
  SamplingRow rep;
  rep.repetition_penalty = 2.0f;
  rep.adjust_end = 1;
  EXPECT_EQ(cpu.Sample(Logits({l}), {{rep}, {{1, 0, TokenAdjust::kInPrompt}}, 0}).tokens[0], 2);
  // Frequency 0.05 * 3 outputs and presence 0.01 take token 1 to 2.84 and token 2 stays: 2.
  SamplingRow freq;
  freq.frequency_penalty = 0.05f;
  freq.presence_penalty = 0.01f;
  freq.adjust_end = 1;
  EXPECT_EQ(cpu.Sample(Logits({l}), {{freq}, {{1, 3, 0}}, 0}).tokens[0], 2);
  // Sampling never draws a banned token.
  SamplingRow hot;
  hot.temperature = 5.0f;
  hot.adjust_end = 1;
  SamplingBatch banned;
  for (uint32_t d = 0; d < 2000; ++d) {
    hot.draw = d;
    banned.rows.push_back(hot);
  }
  banned.adjust = {{3, 0, TokenAdjust::kBanned}};
  for (auto& r : banned.rows) r.adjust_begin = 0;
  const SampledTokens s = cpu.Sample(Logits(std::vector<std::vector<float>>(2000, l)), banned);
  EXPECT_EQ(std::count(s.tokens.begin(), s.tokens.end(), 3), 0);
  EXPECT_GT(std::count(s.tokens.begin(), s.tokens.end(), 4), 0);  // hot enough to reach the worst token
}

// Each row's temperature-0 Sample token (ties to the lowest id, -inf rows too), plus the
// offset of that token where a map is given (an EAGLE-3 draft's d2t).
TEST(SamplingOp, GreedyTokensAreTheGreedySampleTokens) {
  CpuBackend cpu;
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor logits = Logits({{0.5f, 3.0f, 3.0f, 2.9f, -1.0f}, {-inf, -inf, -inf, -inf, -inf},
                                {0.0f, -1.0f, 0.0f, 7.0f, 6.9f}, {-2.0f, -inf, -1.5f, -3.0f, -1.5f}});
  const std::vector<int32_t> greedy = cpu.Sample(logits, {std::vector<SamplingRow>(4), {}, 0}).tokens;
  EXPECT_EQ(greedy, (std::vector<int32_t>{1, 0, 3, 2}));
  Tensor tokens = cpu.Empty(DType::kI32, {4});
  std::fill_n(tokens.data<int32_t>(), 4, -7);  // poisoned
  cpu.GreedyTokens(logits, nullptr, tokens);
  EXPECT_EQ(std::vector<int32_t>(tokens.data<int32_t>(), tokens.data<int32_t>() + 4), greedy);
  Tensor offsets = cpu.Empty(DType::kI32, {5});
  std::copy_n(std::vector<int32_t>{10, 20, 30, 40, 50}.begin(), 5, offsets.data<int32_t>());
  cpu.GreedyTokens(logits, &offsets, tokens);
  EXPECT_EQ(std::vector<int32_t>(tokens.data<int32_t>(), tokens.data<int32_t>() + 4),
            (std::vector<int32_t>{21, 10, 43, 32}));
}

// tokens [R, k]: each row's k highest, highest first, lowest id on ties: the ids of the
// Sample op's top logprobs, each plus its offset where a map is given.
TEST(SamplingOp, GreedyTokensOfKColumnsAreTheTopLogprobIds) {
  CpuBackend cpu;
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor logits = Logits({{0.5f, 3.0f, 3.0f, 2.9f, -1.0f}, {-inf, 1.0f, -inf, 2.0f, -inf},
                                {0.0f, -1.0f, 0.0f, 7.0f, 6.9f}, {-2.0f, -inf, -1.5f, -3.0f, -1.5f}});
  SamplingBatch batch{std::vector<SamplingRow>(4), {}, 3};
  for (auto& row : batch.rows) row.num_logprobs = 3;
  const std::vector<int32_t> top = cpu.Sample(logits, batch).top_ids;
  EXPECT_EQ(top, (std::vector<int32_t>{1, 2, 3, 3, 1, 0, 3, 4, 0, 2, 4, 0}));
  Tensor tokens = cpu.Empty(DType::kI32, {4, 3});
  std::fill_n(tokens.data<int32_t>(), 12, -7);  // poisoned
  cpu.GreedyTokens(logits, nullptr, tokens);
  EXPECT_EQ(std::vector<int32_t>(tokens.data<int32_t>(), tokens.data<int32_t>() + 12), top);
  Tensor offsets = cpu.Empty(DType::kI32, {5});
  std::copy_n(std::vector<int32_t>{10, 20, 30, 40, 50}.begin(), 5, offsets.data<int32_t>());
  cpu.GreedyTokens(logits, &offsets, tokens);
  EXPECT_EQ(std::vector<int32_t>(tokens.data<int32_t>(), tokens.data<int32_t>() + 12),
            (std::vector<int32_t>{21, 32, 43, 43, 21, 10, 43, 54, 10, 32, 54, 10}));
  // A row of NaN orders nothing past its first: every column is still a token (a draft
  // with broken weights must not index outside its vocabulary).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  cpu.GreedyTokens(Logits({{nan, nan, 1.0f, nan, nan}}), &offsets, tokens);
  for (int j = 0; j < 3; ++j) {
    EXPECT_GE(tokens.data<int32_t>()[j], 10) << j;
    EXPECT_LE(tokens.data<int32_t>()[j], 54) << j;
  }
}

// The fixed-point sums (sampling_math.h) both backends take: n terms of at most 1 cannot
// overflow, f32 weights of 2^-21 and above are kept exactly, float and double terms agree,
// and terms below 2^-shift count as 0.
TEST(SamplingOp, FixedPointSumsCannotOverflowAndKeepWeightsExactly) {
  for (int64_t n : {1, 2, 3, 1000, 151936, 262144, 262145}) {
    const int shift = sampling::FixedShift(n);
    EXPECT_LE(static_cast<double>(n) * std::ldexp(1.0, shift), std::ldexp(1.0, 63)) << n;
    EXPECT_EQ(sampling::ToFixed(1.0f, shift), uint64_t{1} << shift) << n;
  }
  const int shift = sampling::FixedShift(151936);
  EXPECT_EQ(shift, 45);
  for (float x : {1.0f, 0.5f, 0.123456f, 1.2345f * std::ldexp(1.0f, -21), 5e-7f}) {
    EXPECT_EQ(sampling::FromFixed(sampling::ToFixed(x, shift), shift), x) << x;
    EXPECT_EQ(sampling::ToFixed(x, shift), sampling::ToFixed(static_cast<double>(x), shift)) << x;
  }
  EXPECT_EQ(sampling::ToFixed(1e-14f, shift), 0u);
}

}  // namespace
}  // namespace hsx
