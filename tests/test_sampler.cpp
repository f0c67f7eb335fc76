// Sampling: greedy cases reduce to argmax, a seed reproduces draws, top-k / top-p cut
// the candidates, and draws follow the softmax at the temperature.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/sampler.h"

namespace hsx {
namespace {

TEST(SamplerTest, GreedyCasesAreArgmaxWithLowestIdTies) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  std::mt19937_64 rng(0);
  EXPECT_EQ(Sample(logits.data(), 4, {}, rng), 1);
  SamplingParams top1;
  top1.temperature = 5.0f;
  top1.top_k = 1;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Sample(logits.data(), 4, top1, rng), 1);
}

TEST(SamplerTest, SeedReproducesAndTopPKeepsTheNucleus) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 1.7f) * 3;
  SamplingParams p;
  p.temperature = 1.0f;
  std::mt19937_64 a(42), b(42);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(Sample(logits.data(), 100, p, a), Sample(logits.data(), 100, p, b));
  p.top_p = 1e-6f;  // only the most likely token survives
  const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Sample(logits.data(), 100, p, a), best);
  p.top_p = 1.0f;
  p.top_k = 3;
  std::vector<int32_t> top3(logits.size());
  std::iota(top3.begin(), top3.end(), 0);
  std::sort(top3.begin(), top3.end(), [&](int x, int y) { return logits[x] > logits[y]; });
  top3.resize(3);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = Sample(logits.data(), 100, p, a);
    EXPECT_NE(std::find(top3.begin(), top3.end(), t), top3.end()) << t;
  }
}

TEST(SamplerTest, DrawsFollowTheTemperatureSoftmax) {
  // p(1) = 3/4 at temperature 1; at temperature 2 it is sqrt(3) / (1 + sqrt(3)).
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  std::mt19937_64 rng(7);
  for (auto [temperature, expected] : {std::pair{1.0f, 0.75}, std::pair{2.0f, std::sqrt(3.0) / (1 + std::sqrt(3.0))}}) {
    SamplingParams p;
    p.temperature = temperature;
    int ones = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ones += Sample(logits.data(), 2, p, rng);
    EXPECT_NEAR(static_cast<double>(ones) / n, expected, 0.015) << "temperature " << temperature;
  }
}

}  // namespace
}  // namespace hsx
