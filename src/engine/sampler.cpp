#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace hsx {
namespace {

int32_t Argmax(const float* row, int vocab) { return static_cast<int32_t>(std::max_element(row, row + vocab) - row); }

}  // namespace

int32_t Sample(const float* logits, int vocab, const SamplingParams& params, std::mt19937_64& rng) {
  if (params.greedy()) return Argmax(logits, vocab);
  // Candidates by descending logit, cut to top_k.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int k = params.top_k > 0 ? std::min(params.top_k, vocab) : vocab;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
  order.resize(static_cast<size_t>(k));
  // Softmax at the temperature, then the nucleus: the shortest prefix reaching top_p.
  std::vector<double> prob(order.size());
  const double top = logits[order[0]];
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += (prob[i] = std::exp((logits[order[i]] - top) / params.temperature));
  size_t keep = order.size();
  if (params.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      mass += prob[i] / sum;
      if (mass >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += prob[i];
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng);
  for (size_t i = 0; i < keep; ++i) {
    if ((u -= prob[i]) <= 0) return order[i];
  }
  return order[keep - 1];
}

void SuppressTokens(float* logits, int vocab, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace hsx
