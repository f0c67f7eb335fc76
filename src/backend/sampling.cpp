#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/sampling_math.h"

namespace hsx {

using sampling::Before;
using sampling::FloatBits;
using sampling::OrderedKey;
using sampling::ToFixed;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The first entry of `v` in Before order that comes after (after_v, after_i); after_i < 0:
// the first of all.
int32_t NextBest(const float* v, int32_t n, float after_v, int32_t after_i) {
  int32_t best = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (after_i >= 0 && !Before(after_v, after_i, v[i], i)) continue;
    if (best < 0 || Before(v[i], i, v[best], best)) best = i;
  }
  return best;
}

// The largest bit pattern t with measure(t) >= need, for a measure that falls as t
// grows: a search from the top bit down, which the device runs with team-wide sums.
template <class Measure>
uint32_t LargestThreshold(int first_bit, double need, Measure measure) {
  uint32_t t = 0;
  for (int bit = first_bit; bit >= 0; --bit) {
    const uint32_t candidate = t | (1u << bit);
    if (measure(candidate) >= need) t = candidate;
  }
  return t;
}

}  // namespace

float RawLogprobsOnHost(const float* logits, int32_t vocab, int32_t num_logprobs, int32_t* top_ids,
                        float* top_logprobs) {
  float top = kNegInf;
  for (int32_t i = 0; i < vocab; ++i) top = std::fmax(top, logits[i]);
  const int shift = sampling::FixedShift(vocab);
  uint64_t sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += sampling::ExpToFixed(logits[i], top, shift);
  const float lse = sampling::LogSumExp(top, sum, shift);
  for (int32_t n = 0, prev = -1; n < num_logprobs; ++n) {
    prev = n == 0 || prev >= 0 ? NextBest(logits, vocab, prev >= 0 ? logits[prev] : 0.0f, prev) : -1;
    top_ids[n] = prev;  // -1 once nothing is ordered (past a NaN)
    top_logprobs[n] = prev >= 0 ? logits[prev] - lse : kNegInf;
  }
  return lse;
}

void TopIdsOnHost(const float* logits, int32_t vocab, int32_t k, int32_t* ids) {
  for (int32_t n = 0, prev = -1; n < k; ++n) {
    prev = NextBest(logits, vocab, prev >= 0 ? logits[prev] : 0.0f, prev);
    ids[n] = prev;
  }
}

ProcessedRow ProcessRowOnHost(const float* logits, int32_t vocab, const SamplingRow& row, const TokenAdjust* adjust) {
  ProcessedRow p;
  // Bans and penalties, one entry per distinct token.
  std::vector<float>& l = p.scaled;
  l.assign(logits, logits + vocab);
  for (int32_t a = row.adjust_begin; a < row.adjust_end; ++a) {
    const TokenAdjust& adj = adjust[a];
    float& x = l[adj.token];
    if (adj.flags & TokenAdjust::kBanned) {
      x = kNegInf;
      continue;
    }
    if (row.repetition_penalty != 1.0f && ((adj.flags & TokenAdjust::kInPrompt) || adj.output_count > 0)) {
      x = x > 0 ? x / row.repetition_penalty : x * row.repetition_penalty;
    }
    if (adj.output_count > 0) x -= row.frequency_penalty * static_cast<float>(adj.output_count) + row.presence_penalty;
  }

  const bool greedy = row.temperature <= 0.0f || !(*std::max_element(l.begin(), l.end()) > kNegInf);
  if (!greedy) {
    float lmax = kNegInf;
    for (int32_t i = 0; i < vocab; ++i) lmax = std::fmax(lmax, l[i] /= row.temperature);
    // e = exp(l - max): the probabilities up to one factor; e = 0 marks a dropped token.
    std::vector<float>& e = p.weight;
    e.resize(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) {
      e[i] = std::exp(l[i] - lmax);
      if (e[i] < row.min_p) e[i] = 0.0f;  // min-p: p_i / p_max = e_i
    }
    if (row.top_k > 0) {
      const uint32_t kth = LargestThreshold(31, row.top_k, [&](uint32_t t) {
        double count = 0;
        for (int32_t i = 0; i < vocab; ++i) count += e[i] > 0.0f && OrderedKey(l[i]) >= t;
        return count;
      });
      for (int32_t i = 0; i < vocab; ++i) {
        if (OrderedKey(l[i]) < kth) e[i] = 0.0f;
      }
    }
    if (row.top_p < 1.0f) {  // masses in sampling_math.h's fixed point
      const int shift = sampling::FixedShift(vocab);
      uint64_t kept = 0;
      for (int32_t i = 0; i < vocab; ++i) kept += ToFixed(e[i], shift);
      const uint32_t cut = LargestThreshold(30, row.top_p * static_cast<double>(kept), [&](uint32_t t) {
        uint64_t mass = 0;
        for (int32_t i = 0; i < vocab; ++i) mass += FloatBits(e[i]) >= t ? ToFixed(e[i], shift) : 0u;
        return static_cast<double>(mass);
      });
      for (int32_t i = 0; i < vocab; ++i) {
        if (FloatBits(e[i]) < cut) e[i] = 0.0f;
      }
    }
    if (std::none_of(e.begin(), e.end(), [](float x) { return x > 0.0f; })) e.clear();  // parameters that keep nothing
  }
  p.argmax = NextBest(l.data(), vocab, 0.0f, -1);
  return p;
}

int32_t DrawOnHost(const ProcessedRow& p, const SamplingRow& row, int32_t excluded) {
  if (p.greedy()) return p.argmax;
  float best = kNegInf;
  int32_t token = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(p.weight.size()); ++i) {
    if (p.weight[i] <= 0.0f || i == excluded) continue;
    const float score = p.scaled[i] + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i);
    if (token < 0 || score > best) best = score, token = i;
  }
  return token >= 0 ? token : p.argmax;
}

int32_t SampleRowOnHost(const float* logits, int32_t vocab, const SamplingRow& row, const TokenAdjust* adjust,
                        float* logprob, int32_t* top_ids, float* top_logprobs) {
  const float lse = RawLogprobsOnHost(logits, vocab, row.num_logprobs, top_ids, top_logprobs);
  const int32_t token = DrawOnHost(ProcessRowOnHost(logits, vocab, row, adjust), row, -1);
  *logprob = logits[token] - lse;
  return token;
}

}  // namespace hsx
