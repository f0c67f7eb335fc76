// The n-gram (prompt lookup) proposer against cases worked by hand from vLLM's
// semantics (longest suffix in [min, max], its earliest occurrence, up to K tokens after
// it) and against a brute-force reading of the same rule on random sequences.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/ngram_proposer.h"

namespace hsx {
namespace {

using Tokens = std::vector<int32_t>;

Tokens Propose(const Tokens& tokens, int k, int lo, int hi, int64_t max_model_len = 1 << 20) {
  auto proposer = NgramProposer::Create({k, lo, hi}, max_model_len);
  EXPECT_TRUE(proposer.ok()) << proposer.status().message();
  return proposer->Propose(tokens);
}

// vLLM's older loop, written plainly: n from max down to min, the first occurrence that
// ends before the last token.
Tokens BruteForce(const Tokens& t, int k, int lo, int hi, int64_t max_model_len) {
  const auto n = static_cast<int64_t>(t.size());
  k = static_cast<int>(std::min<int64_t>(k, max_model_len - n));
  if (k <= 0) return {};
  for (int64_t v = hi; v >= lo; --v) {
    for (int64_t s = 0; s + v <= n - 1; ++s) {
      if (std::equal(t.begin() + s, t.begin() + s + v, t.end() - v)) {
        return {t.begin() + s + v, t.begin() + std::min<int64_t>(s + v + k, n)};
      }
    }
  }
  return {};
}

TEST(NgramProposer, VllmsDocstringExample) {
  // The last 3 tokens [4, 2, 3] occur nowhere else; [2, 3] does, and 3 tokens follow it.
  EXPECT_EQ(Propose({1, 2, 3, 4, 2, 3}, 4, 2, 3), (Tokens{4, 2, 3}));
}

TEST(NgramProposer, NoMatch) {
  EXPECT_EQ(Propose({1, 2, 3, 4, 5}, 3, 1, 3), Tokens{});
  EXPECT_EQ(Propose({1, 2, 3, 4, 2}, 3, 2, 3), Tokens{});  // 2 matches, but only n >= 2 counts
  EXPECT_EQ(Propose({}, 3, 1, 3), Tokens{});
  EXPECT_EQ(Propose({7}, 3, 1, 3), Tokens{});    // the suffix itself is no occurrence
  EXPECT_EQ(Propose({7, 7}, 3, 2, 3), Tokens{});  // shorter than what a match needs
}

TEST(NgramProposer, MatchAtTheStart) {
  EXPECT_EQ(Propose({7, 8, 9, 1, 7, 8}, 4, 2, 2), (Tokens{9, 1, 7, 8}));
  EXPECT_EQ(Propose({7, 8, 9, 1, 7, 8}, 2, 2, 2), (Tokens{9, 1}));
}

TEST(NgramProposer, OverlappingOccurrences) {
  // [5 5 5] occurs at 0, overlapping the suffix; one token follows it.
  EXPECT_EQ(Propose({5, 5, 5, 5}, 2, 2, 3), (Tokens{5}));
  // [1 2 1] at 0 (overlapping the suffix at 2); K = 5 is more than the 2 that follow.
  EXPECT_EQ(Propose({1, 2, 1, 2, 1}, 5, 2, 3), (Tokens{2, 1}));
}

TEST(NgramProposer, TheEarliestOfTheLongest) {
  // [1 2] at 0 and at 3: vLLM takes the earliest, so 9 (the latest would give 8).
  EXPECT_EQ(Propose({1, 2, 9, 1, 2, 8, 1, 2}, 1, 2, 2), (Tokens{9}));
  // A longer match wins over an earlier shorter one: [3 1 2] at 3, not [1 2] at 0.
  EXPECT_EQ(Propose({1, 2, 5, 3, 1, 2, 6, 3, 1, 2}, 2, 2, 3), (Tokens{6, 3}));
  // ... but only up to prompt_lookup_max: with max 2 the earliest [1 2] wins.
  EXPECT_EQ(Propose({1, 2, 5, 3, 1, 2, 6, 3, 1, 2}, 2, 2, 2), (Tokens{5, 3}));
}

TEST(NgramProposer, NeverPastMaxModelLen) {
  EXPECT_EQ(Propose({7, 8, 9, 1, 7, 8}, 4, 2, 2, 8), (Tokens{9, 1}));
  EXPECT_EQ(Propose({7, 8, 9, 1, 7, 8}, 4, 2, 2, 6), Tokens{});
}

TEST(NgramProposer, AgreesWithBruteForceOnRandomSequences) {
  std::mt19937 rng(11);
  int matched = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int n = static_cast<int>(rng() % 40), alphabet = 2 + static_cast<int>(rng() % 4);
    const int lo = 1 + static_cast<int>(rng() % 4), hi = lo + static_cast<int>(rng() % 5);
    const int k = 1 + static_cast<int>(rng() % 6);
    const int64_t max_model_len = n + static_cast<int64_t>(rng() % 8);
    Tokens t(static_cast<size_t>(n));
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % alphabet);
    const Tokens want = BruteForce(t, k, lo, hi, max_model_len);
    ASSERT_EQ(Propose(t, k, lo, hi, max_model_len), want) << "trial " << trial;
    matched += !want.empty();
  }
  EXPECT_GT(matched, 5000);  // the comparison covered matches, not only misses
}

TEST(NgramProposer, AHundredThousandTokenContext) {
  // Random tokens from a large vocabulary with one planted repeat of the last 4 tokens:
  // one linear scan finds it (the test's time is the cost of one call at this length).
  std::mt19937 rng(5);
  Tokens t(100000);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 150000);
  const Tokens tail(t.end() - 4, t.end());
  std::copy(tail.begin(), tail.end(), t.begin() + 1234);
  EXPECT_EQ(Propose(t, 3, 2, 4), (Tokens{t[1238], t[1239], t[1240]}));
}

TEST(NgramProposer, RefusesBadConfigsByField) {
  auto bad_k = NgramProposer::Create({0, 1, 2}, 100);
  ASSERT_FALSE(bad_k.ok());
  EXPECT_NE(bad_k.status().message().find("num_speculative_tokens"), std::string::npos);
  auto bad_min = NgramProposer::Create({3, 0, 2}, 100);
  ASSERT_FALSE(bad_min.ok());
  EXPECT_NE(bad_min.status().message().find("prompt_lookup_min"), std::string::npos);
  auto bad_max = NgramProposer::Create({3, 4, 2}, 100);
  ASSERT_FALSE(bad_max.ok());
  EXPECT_NE(bad_max.status().message().find("prompt_lookup_max"), std::string::npos);
}

}  // namespace
}  // namespace hsx
