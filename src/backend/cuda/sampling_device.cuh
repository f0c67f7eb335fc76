// Device pieces of the sampling rules (backend/sampling.h) that the Sample and
// VerifyDrafts kernels share, one block of kThreads per logit row: block-wide
// reductions, raw logprobs, the row's processing (bans, penalties, temperature, min-p,
// top-k, top-p) and the Gumbel-max draw. Thresholds are found by the host reference's
// bit-by-bit search, with block-wide counts and f64 sums, so both backends cut at the
// same places.
#pragma once

#include <cfloat>

#include "backend/sampling.h"
#include "backend/sampling_math.h"

namespace hsx::cuda::sampler {

using sampling::Before;
using sampling::FloatBits;
using sampling::OrderedKey;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

struct Best {
  float value;
  int32_t id;
};

__device__ __forceinline__ Best Better(Best a, Best b) {
  if (a.id < 0) return b;
  if (b.id < 0) return a;
  return Before(a.value, a.id, b.value, b.id) ? a : b;
}

// Shared memory of the block-wide reductions; each reduction syncs before reusing it.
struct Scratch {
  double sums[kWarps];
  float maxes[kWarps];
  Best bests[kWarps];
};

// Block-wide reductions; every thread gets the result.
__device__ inline double BlockSum(double v, Scratch& s) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.sums[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.sums[w];  // the same order in every thread
  return total;
}

__device__ inline float BlockMax(float v, Scratch& s) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.maxes[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s.maxes[w]);
  return m;
}

__device__ inline Best BlockBest(Best b, Scratch& s) {
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.value, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
    b = Better(b, other);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.bests[threadIdx.x >> 5] = b;
  __syncthreads();
  Best r{0.0f, -1};
  for (int w = 0; w < kWarps; ++w) r = Better(r, s.bests[w]);
  return r;
}

// The best of row[0, n) that comes after `after` (after.id < 0: no bound).
__device__ inline Best BestAfter(const float* row, int32_t n, Best after, Scratch& s) {
  Best b{0.0f, -1};
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    if (after.id >= 0 && !Before(after.value, after.id, row[i], i)) continue;
    b = Better(b, Best{row[i], i});
  }
  return BlockBest(b, s);
}

// The log-softmax normaliser of the raw logits; thread 0 writes the num_logprobs highest
// raw logprobs to top_ids / top_lps, and -1 / -inf in the columns up to max_logprobs.
__device__ inline float RawLogprobs(const float* raw, int32_t vocab, int32_t num_logprobs, int32_t max_logprobs,
                                    int32_t* top_ids, float* top_lps, Scratch& s) {
  float top = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) top = fmaxf(top, raw[i]);
  top = BlockMax(top, s);
  double part = 0;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) part += exp(static_cast<double>(raw[i]) - top);
  const float lse = top + static_cast<float>(log(BlockSum(part, s)));
  Best prev{0.0f, -1};
  for (int n = 0; n < max_logprobs; ++n) {
    if (n < num_logprobs) prev = BestAfter(raw, vocab, prev, s);
    if (threadIdx.x == 0) {
      top_ids[n] = n < num_logprobs ? prev.id : -1;
      top_lps[n] = n < num_logprobs ? prev.value - lse : -INFINITY;
    }
  }
  return lse;
}

// A row after the rules that precede the draw: l holds the penalized logits (divided by
// the temperature unless greedy); Weight(i) is exp(l_i - max) for a kept token, else 0.
struct Processed {
  const float* l;
  bool greedy;
  float lmax, min_p;
  uint32_t kth, cut;  // top-k's lowest kept logit key, top-p's lowest kept weight bits
  __device__ float Weight(int32_t i) const {
    const float e = expf(l[i] - lmax);
    if (e < min_p || OrderedKey(l[i]) < kth || FloatBits(e) < cut) return 0.0f;
    return e;
  }
};

// `work` is the row's f32 [2, vocab] scratch in global memory: the processed logits, then
// the weights the top-p search sums (computed once instead of in each of its 31 passes).
__device__ inline Processed ProcessRow(const float* raw, int32_t vocab, const SamplingRow& row,
                                       const TokenAdjust* adjust, float* work, Scratch& s) {
  float* l = work;
  // Bans and penalties (distinct tokens, so threads never collide).
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) l[i] = raw[i];
  __syncthreads();
  for (int32_t a = row.adjust_begin + threadIdx.x; a < row.adjust_end; a += kThreads) {
    const TokenAdjust adj = adjust[a];
    float x = l[adj.token];
    if (adj.flags & TokenAdjust::kBanned) {
      x = -INFINITY;
    } else {
      if (row.repetition_penalty != 1.0f && ((adj.flags & TokenAdjust::kInPrompt) || adj.output_count > 0)) {
        x = x > 0 ? x / row.repetition_penalty : x * row.repetition_penalty;
      }
      if (adj.output_count > 0) x -= row.frequency_penalty * static_cast<float>(adj.output_count) + row.presence_penalty;
    }
    l[adj.token] = x;
  }
  __syncthreads();

  Processed p{l, false, -INFINITY, row.min_p, 0u, 0u};
  float lmax = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) lmax = fmaxf(lmax, l[i]);
  lmax = BlockMax(lmax, s);
  if (row.temperature <= 0.0f || !(lmax > -INFINITY)) {
    p.greedy = true;
    return p;
  }
  lmax = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) lmax = fmaxf(lmax, l[i] /= row.temperature);
  p.lmax = BlockMax(lmax, s);
  // The thresholds are searched with the ones not yet found at 0 (keeping everything).
  if (row.top_k > 0) {
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t candidate = p.kth | (1u << bit);
      double count = 0;
      for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
        count += p.Weight(i) > 0.0f && OrderedKey(l[i]) >= candidate;
      }
      if (BlockSum(count, s) >= row.top_k) p.kth = candidate;
    }
  }
  if (row.top_p < 1.0f) {
    float* w = work + vocab;  // each thread reads back only the entries it wrote
    double kept = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) kept += w[i] = p.Weight(i);
    const double need = row.top_p * BlockSum(kept, s);
    uint32_t cut = 0;
    for (int bit = 30; bit >= 0; --bit) {
      const uint32_t candidate = cut | (1u << bit);
      double mass = 0;
      for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
        const float e = w[i];
        mass += FloatBits(e) >= candidate ? e : 0.0f;
      }
      if (BlockSum(mass, s) >= need) cut = candidate;
    }
    p.cut = cut;
  }
  return p;
}

// The highest processed logit (lowest id on ties): a greedy row's token.
__device__ inline int32_t Argmax(const Processed& p, int32_t vocab, Scratch& s) {
  return BestAfter(p.l, vocab, Best{0.0f, -1}, s).id;
}

// The Sample op's draw: the Gumbel-max over the kept tokens other than `excluded` (-1:
// none) with the noise of (seed, draw); the argmax for greedy rows or when none is left.
__device__ inline int32_t Draw(const Processed& p, int32_t vocab, const SamplingRow& row, int32_t excluded,
                               Scratch& s) {
  if (p.greedy) return Argmax(p, vocab, s);
  Best b{0.0f, -1};
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    if (i == excluded || p.Weight(i) <= 0.0f) continue;
    b = Better(b, Best{p.l[i] + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i), i});
  }
  const int32_t token = BlockBest(b, s).id;
  return token >= 0 ? token : Argmax(p, vocab, s);  // parameters that keep nothing
}

}  // namespace hsx::cuda::sampler
