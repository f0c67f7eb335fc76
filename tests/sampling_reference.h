// What the sampling tests compare draws with: vLLM's processed distribution computed the
// plain, sort-based way (independent of the bit-search thresholds of the op), and
// Pearson's chi-square against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/sampling.h"
#include "tensor/tensor.h"

namespace hsx::test {

// A host f32 [rows, vocab] tensor of equally long rows.
inline Tensor Logits(const std::vector<std::vector<float>>& rows) {
  Tensor t = Tensor::Host(DType::kF32, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), t.data<float>() + r * rows[0].size());
  return t;
}

// The probabilities vLLM's sampler gives: softmax at the temperature, min-p against the
// top probability, top-k by sorting, then top-p as the shortest prefix of the sorted
// renormalized probabilities reaching p.
inline std::vector<double> Expected(std::vector<float> logits, const SamplingRow& row) {
  const size_t v = logits.size();
  std::vector<double> p(v);
  double top = -INFINITY;
  for (float& l : logits) top = std::max<double>(top, l /= row.temperature);
  double z = 0;
  for (size_t i = 0; i < v; ++i) z += p[i] = std::exp(logits[i] - top);
  for (double& x : p) x /= z;
  const double pmax = *std::max_element(p.begin(), p.end());
  for (double& x : p) x = x < row.min_p * pmax ? 0 : x;
  std::vector<size_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  if (row.top_k > 0) {
    for (size_t i = row.top_k; i < v; ++i) p[order[i]] = 0;
  }
  double kept = std::accumulate(p.begin(), p.end(), 0.0), mass = 0;
  size_t i = 0;
  for (; i < v && mass < row.top_p * kept; ++i) mass += p[order[i]];
  for (; i < v; ++i) p[order[i]] = 0;
  kept = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= kept;
  return p;
}

// Pearson's statistic of `counts` against `expected`; a token expected never must never come.
inline double ChiSquare(const std::vector<int>& counts, const std::vector<double>& expected, int n, int* dof) {
  double chi = 0;
  *dof = -1;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) {
      if (counts[i] > 0) return INFINITY;
      continue;
    }
    const double e = expected[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++*dof;
  }
  return chi;
}

// The chi-square quantile at z standard deviations (Wilson-Hilferty); z = 4.5: p ~ 3e-6.
inline double ChiSquareBound(int dof, double z = 4.5) {
  const double a = 2.0 / (9.0 * dof);
  return dof * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Row r of a batch that mixes every option: greedy, temperatures, top-k, top-p, min-p and
// the penalties (r % 8 picks which), with its own seed.
inline SamplingRow MixedRow(int r, uint32_t seed_lo) {
  SamplingRow row;
  const int kind = r % 8;
  row.temperature = kind == 0 ? 0.0f : 0.5f + 0.25f * (r % 5);
  row.top_k = kind == 2 || kind == 7 ? 50 : 0;
  row.top_p = kind == 3 || kind == 7 ? 0.9f : 1.0f;
  row.min_p = kind == 4 ? 0.05f : 0.0f;
  row.repetition_penalty = kind == 5 ? 1.2f : 1.0f;
  row.frequency_penalty = kind == 6 ? 0.5f : 0.0f;
  row.presence_penalty = kind == 6 ? 0.25f : 0.0f;
  row.seed_lo = seed_lo;
  return row;
}

}  // namespace hsx::test
