// Sampling on the device: one block per row, the rules of backend/sampling.h. Thresholds
// (top-k's k-th logit, top-p's probability cut) are found by the same bit-by-bit search
// as the host reference, with block-wide counts and f64 sums, and the draw is the
// Gumbel-max over the kept tokens with the shared Philox noise, so a row's token depends
// on nothing but the row.
#include <cfloat>

#include "backend/cuda/sampling_kernel.h"
#include "backend/sampling_math.h"

namespace hsx::cuda {
namespace {

using sampling::Before;
using sampling::FloatBits;
using sampling::OrderedKey;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

struct Best {
  float value;
  int32_t id;
};

__device__ Best Better(Best a, Best b) {
  if (a.id < 0) return b;
  if (b.id < 0) return a;
  return Before(a.value, a.id, b.value, b.id) ? a : b;
}

// Block-wide reductions; every thread gets the result. `scratch` must not be in use by
// another reduction of the same block (each call syncs before reusing it).
__device__ double BlockSum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];  // the same order in every thread
  return total;
}

__device__ float BlockMax(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

__device__ Best BlockBest(Best b, Best* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.value, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
    b = Better(b, other);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = b;
  __syncthreads();
  Best r{0.0f, -1};
  for (int w = 0; w < kWarps; ++w) r = Better(r, scratch[w]);
  return r;
}

// The best of row[0, n) that comes after `after` (after.id < 0: no bound).
__device__ Best BestAfter(const float* row, int32_t n, Best after, Best* scratch) {
  Best b{0.0f, -1};
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    if (after.id >= 0 && !Before(after.value, after.id, row[i], i)) continue;
    b = Better(b, Best{row[i], i});
  }
  return BlockBest(b, scratch);
}

__global__ void __launch_bounds__(kThreads) SampleKernel(const float* logits, int32_t vocab, const SamplingRow* rows,
                                                         const TokenAdjust* adjust, int32_t max_logprobs,
                                                         float* work, int32_t* out) {
  __shared__ double sums[kWarps];
  __shared__ float maxes[kWarps];
  __shared__ Best bests[kWarps];
  const int r = blockIdx.x;
  const int num_rows = gridDim.x;
  const SamplingRow row = rows[r];
  const float* raw = logits + static_cast<int64_t>(r) * vocab;
  float* l = work + static_cast<int64_t>(r) * vocab;

  // Raw logprobs.
  float top = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) top = fmaxf(top, raw[i]);
  top = BlockMax(top, maxes);
  double part = 0;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) part += exp(static_cast<double>(raw[i]) - top);
  const float lse = top + static_cast<float>(log(BlockSum(part, sums)));
  int32_t* top_ids = out + 2 * num_rows + r * max_logprobs;
  float* top_lps = reinterpret_cast<float*>(out + 2 * num_rows + num_rows * max_logprobs) + r * max_logprobs;
  Best prev{0.0f, -1};
  for (int n = 0; n < max_logprobs; ++n) {
    if (n < row.num_logprobs) prev = BestAfter(raw, vocab, prev, bests);
    if (threadIdx.x == 0) {
      top_ids[n] = n < row.num_logprobs ? prev.id : -1;
      top_lps[n] = n < row.num_logprobs ? prev.value - lse : -INFINITY;
    }
  }

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

  float lmax = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) lmax = fmaxf(lmax, l[i]);
  lmax = BlockMax(lmax, maxes);
  int32_t token;
  if (row.temperature <= 0.0f || !(lmax > -INFINITY)) {
    token = BestAfter(l, vocab, Best{0.0f, -1}, bests).id;
  } else {
    lmax = -INFINITY;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) lmax = fmaxf(lmax, l[i] /= row.temperature);
    lmax = BlockMax(lmax, maxes);
    // e = exp(l - max), 0 once dropped: min-p first, then the thresholds found below.
    auto e_of = [&](int32_t i) {
      const float e = expf(l[i] - lmax);
      return e < row.min_p ? 0.0f : e;
    };
    uint32_t kth = 0, cut = 0;
    if (row.top_k > 0) {
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t candidate = kth | (1u << bit);
        double count = 0;
        for (int32_t i = threadIdx.x; i < vocab; i += kThreads) count += e_of(i) > 0.0f && OrderedKey(l[i]) >= candidate;
        if (BlockSum(count, sums) >= row.top_k) kth = candidate;
      }
    }
    auto kept_e = [&](int32_t i) { return OrderedKey(l[i]) >= kth ? e_of(i) : 0.0f; };
    if (row.top_p < 1.0f) {
      double kept = 0;
      for (int32_t i = threadIdx.x; i < vocab; i += kThreads) kept += kept_e(i);
      const double need = row.top_p * BlockSum(kept, sums);
      for (int bit = 30; bit >= 0; --bit) {
        const uint32_t candidate = cut | (1u << bit);
        double mass = 0;
        for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
          const float e = kept_e(i);
          mass += FloatBits(e) >= candidate ? e : 0.0f;
        }
        if (BlockSum(mass, sums) >= need) cut = candidate;
      }
    }
    Best b{0.0f, -1};
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float e = kept_e(i);
      if (e <= 0.0f || FloatBits(e) < cut) continue;
      b = Better(b, Best{l[i] + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i), i});
    }
    token = BlockBest(b, bests).id;
    if (token < 0) token = BestAfter(l, vocab, Best{0.0f, -1}, bests).id;  // parameters that keep nothing
  }
  if (threadIdx.x == 0) {
    out[r] = token;
    reinterpret_cast<float*>(out)[num_rows + r] = raw[token] - lse;
  }
}

}  // namespace

void Sample(const float* logits, int32_t rows, int32_t vocab, const SamplingRow* params, const TokenAdjust* adjust,
            int32_t max_logprobs, float* work, int32_t* out, cudaStream_t stream) {
  SampleKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, params, adjust, max_logprobs, work, out);
}

}  // namespace hsx::cuda
