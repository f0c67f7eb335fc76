// Device pieces of the sampling rules (backend/sampling.h) that the Sample and
// VerifyDrafts kernels share. A row is taken by a Team: a thread block cluster of 1 to
// kMaxBlocks blocks of kThreads (several when the rows are few, so a small batch still
// spreads over the SMs), each thread taking every stride-th token. Team-wide reductions
// are exact (maxima, the (value, id) order, integer sums: sampling_math.h's fixed point),
// so every thread gets the same result whatever the number of blocks, and a row's result
// depends on nothing but the row. Thresholds are found by the host reference's bit-by-bit
// search with the same sums, so both backends cut at the same places.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>

#include "backend/sampling.h"
#include "backend/sampling_math.h"

namespace hsx::cuda::sampler {

using sampling::Before;
using sampling::FloatBits;
using sampling::OrderedKey;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 8;  // per row: the largest portable cluster
constexpr int32_t kMaxWeightBytes = 200 * 1024;  // of the 227 KiB of shared memory a block may have

// The dynamic shared memory ProcessRow keeps a block's top-p weights in: its share of a
// vocab-token row, kThreads entries at a time, when that fits in kMaxWeightBytes (3 or
// more blocks per row at a 151,936-token vocabulary), else 0 (they stay in global memory).
__host__ __device__ inline int32_t WeightBytes(int32_t vocab, int blocks) {
  const int32_t stride = blocks * kThreads;
  const int64_t bytes = int64_t{(vocab + stride - 1) / stride} * kThreads * static_cast<int64_t>(sizeof(float));
  return bytes <= kMaxWeightBytes ? static_cast<int32_t>(bytes) : 0;
}

struct Best {
  float value;
  int32_t id;
};

__device__ __forceinline__ Best Better(Best a, Best b) {
  if (a.id < 0) return b;
  if (b.id < 0) return a;
  return Before(a.value, a.id, b.value, b.id) ? a : b;
}

// Shared memory of the reductions. Block level: one entry per warp, reused after a sync.
// Team level: each block's result, written into every block of the team, in two sets
// used in turn; a set is written again two reductions later, after the cluster barrier
// of the reduction between, which every block passes only once done reading it.
struct Scratch {
  uint64_t sums[kWarps];
  float maxes[kWarps];
  Best bests[kWarps];
  uint64_t team_sums[2][kMaxBlocks];
  float team_maxes[2][kMaxBlocks];
  Best team_bests[2][kMaxBlocks];
};

// The blocks that take one row: a cluster (a block of a launch without clusters is one).
// Thread t of block b takes tokens first = b * kThreads + t, first + stride, ...; the
// reductions give every thread of the team the team's result.
class Team {
 public:
  // The team of the cluster this block is in.
  __device__ explicit Team(Scratch& s)
      : first(Rank() * kThreads + static_cast<int32_t>(threadIdx.x)), stride(Blocks() * kThreads), s_(s) {
    // Every block started, so its shared memory can be written.
    if (Blocks() > 1) cooperative_groups::this_cluster().sync();
  }

  const int32_t first, stride;
  __device__ static int Blocks() { return static_cast<int>(cooperative_groups::this_cluster().num_blocks()); }
  __device__ static int Rank() { return static_cast<int>(cooperative_groups::this_cluster().block_rank()); }

  // Whether this thread writes the row's results.
  __device__ bool Leader() const { return Rank() == 0 && threadIdx.x == 0; }
  // Whether `token` is one of this block's.
  __device__ bool Owns(int32_t token) const { return (token / kThreads) % Blocks() == Rank(); }

  __device__ uint64_t Sum(uint64_t v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s_.sums[threadIdx.x >> 5] = v;
    __syncthreads();
    uint64_t total = 0;
    for (int w = 0; w < kWarps; ++w) total += s_.sums[w];
    return Across(total, s_.team_sums, [](uint64_t a, uint64_t b) { return a + b; });
  }

  __device__ float Max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s_.maxes[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s_.maxes[w]);
    return Across(m, s_.team_maxes, [](float a, float b) { return fmaxf(a, b); });
  }

  // The first of the threads' entries in Before order (id -1: none).
  __device__ Best First(Best b) {
    for (int o = 16; o > 0; o >>= 1) {
      Best other{__shfl_xor_sync(0xffffffffu, b.value, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
      b = Better(b, other);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s_.bests[threadIdx.x >> 5] = b;
    __syncthreads();
    Best r{0.0f, -1};
    for (int w = 0; w < kWarps; ++w) r = Better(r, s_.bests[w]);
    return Across(r, s_.team_bests, [](Best a, Best c) { return Better(a, c); });
  }

 private:
  // Combines the blocks' values (`mine`: this block's, in every thread) over the cluster.
  template <class T, class Combine>
  __device__ T Across(T mine, T (&slots)[2][kMaxBlocks], Combine combine) {
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int blocks = static_cast<int>(cluster.num_blocks());
    if (blocks == 1) return mine;
    set_ ^= 1;
    if (threadIdx.x == 0) {
      const int rank = static_cast<int>(cluster.block_rank());
      for (int b = 0; b < blocks; ++b) *cluster.map_shared_rank(&slots[set_][rank], b) = mine;
    }
    cluster.sync();
    T r = slots[set_][0];
    for (int b = 1; b < blocks; ++b) r = combine(r, slots[set_][b]);
    return r;
  }

  Scratch& s_;
  int set_ = 0;
};

// The best of row[0, n) that comes after `after` (after.id < 0: no bound).
__device__ inline Best BestAfter(const float* row, int32_t n, Best after, Team& team) {
  Best b{0.0f, -1};
  for (int32_t i = team.first; i < n; i += team.stride) {
    if (after.id >= 0 && !Before(after.value, after.id, row[i], i)) continue;
    b = Better(b, Best{row[i], i});
  }
  return team.First(b);
}

// The log-softmax normaliser of the raw logits; the leader writes the num_logprobs highest
// raw logprobs to top_ids / top_lps, and -1 / -inf in the columns up to max_logprobs.
__device__ inline float RawLogprobs(const float* raw, int32_t vocab, int32_t num_logprobs, int32_t max_logprobs,
                                    int32_t* top_ids, float* top_lps, Team& team) {
  float top = -INFINITY;
  for (int32_t i = team.first; i < vocab; i += team.stride) top = fmaxf(top, raw[i]);
  top = team.Max(top);
  const int shift = sampling::FixedShift(vocab);
  uint64_t part = 0;
  for (int32_t i = team.first; i < vocab; i += team.stride) part += sampling::ExpToFixed(raw[i], top, shift);
  const float lse = sampling::LogSumExp(top, team.Sum(part), shift);
  Best prev{0.0f, -1};
  for (int n = 0; n < max_logprobs; ++n) {
    if (n < num_logprobs) prev = BestAfter(raw, vocab, prev, team);
    if (team.Leader()) {
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

// Top-p's cut: the lowest kept weight bits, by the bit-by-bit search over the weights p
// keeps so far. They are computed once into w, this thread's j-th token's at w[j * step]
// (shared or global memory: a copy of this function for each, inlined, so the loads are
// of that kind), and each thread reads back only the entries it wrote.
__device__ __forceinline__ uint32_t TopPCut(const Processed& p, int32_t vocab, float top_p, float* w, int32_t step,
                                            Team& team) {
  const int shift = sampling::FixedShift(vocab);
  uint64_t kept = 0;
  for (int32_t i = team.first, j = 0; i < vocab; i += team.stride, ++j) {
    kept += sampling::ToFixed(w[j * step] = p.Weight(i), shift);
  }
  const double need = top_p * static_cast<double>(team.Sum(kept));
  uint32_t cut = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const uint32_t candidate = cut | (1u << bit);
    uint64_t mass = 0;
    for (int32_t i = team.first, j = 0; i < vocab; i += team.stride, ++j) {
      const float e = w[j * step];
      mass += FloatBits(e) >= candidate ? sampling::ToFixed(e, shift) : 0u;
    }
    if (static_cast<double>(team.Sum(mass)) >= need) cut = candidate;
  }
  return cut;
}

// `work` is the row's f32 [2, vocab] scratch in global memory: the processed logits, then
// the weights the top-p search sums (unless in shared memory).
// Each block writes only its tokens of it, and the cluster barriers of the reductions
// after the last write make all of l visible to the whole team.
__device__ inline Processed ProcessRow(const float* raw, int32_t vocab, const SamplingRow& row,
                                       const TokenAdjust* adjust, float* work, Team& team) {
  float* l = work;
  // Bans and penalties (distinct tokens, so threads never collide), each by the block
  // that owns the token.
  for (int32_t i = team.first; i < vocab; i += team.stride) l[i] = raw[i];
  __syncthreads();
  for (int32_t a = row.adjust_begin + static_cast<int32_t>(threadIdx.x); a < row.adjust_end; a += kThreads) {
    const TokenAdjust adj = adjust[a];
    if (!team.Owns(adj.token)) continue;
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
  for (int32_t i = team.first; i < vocab; i += team.stride) lmax = fmaxf(lmax, l[i]);
  lmax = team.Max(lmax);
  if (row.temperature <= 0.0f || !(lmax > -INFINITY)) {
    p.greedy = true;
    return p;
  }
  lmax = -INFINITY;
  for (int32_t i = team.first; i < vocab; i += team.stride) lmax = fmaxf(lmax, l[i] /= row.temperature);
  p.lmax = team.Max(lmax);
  // The thresholds are searched with the ones not yet found at 0 (keeping everything).
  if (row.top_k > 0) {
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t candidate = p.kth | (1u << bit);
      uint64_t count = 0;
      for (int32_t i = team.first; i < vocab; i += team.stride) {
        count += p.Weight(i) > 0.0f && OrderedKey(l[i]) >= candidate;
      }
      if (team.Sum(count) >= static_cast<uint64_t>(row.top_k)) p.kth = candidate;
    }
  }
  if (row.top_p < 1.0f) {
    // The weights go to shared memory where the launch gave the block WeightBytes (the 31
    // passes then read no global memory, which every cluster barrier drops from L1).
    extern __shared__ float shared_weights[];
    uint32_t shared_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
    const int32_t bytes = WeightBytes(vocab, team.stride / kThreads);
    p.cut = bytes > 0 && shared_bytes >= static_cast<uint32_t>(bytes)
                ? TopPCut(p, vocab, row.top_p, shared_weights + threadIdx.x, kThreads, team)
                : TopPCut(p, vocab, row.top_p, work + vocab + team.first, team.stride, team);
  }
  return p;
}

// The highest processed logit (lowest id on ties): a greedy row's token.
__device__ inline int32_t Argmax(const Processed& p, int32_t vocab, Team& team) {
  return BestAfter(p.l, vocab, Best{0.0f, -1}, team).id;
}

// The Sample op's draw: the Gumbel-max over the kept tokens other than `excluded` (-1:
// none) with the noise of (seed, draw); the argmax for greedy rows or when none is left.
__device__ inline int32_t Draw(const Processed& p, int32_t vocab, const SamplingRow& row, int32_t excluded,
                               Team& team) {
  if (p.greedy) return Argmax(p, vocab, team);
  Best b{0.0f, -1};
  for (int32_t i = team.first; i < vocab; i += team.stride) {
    if (i == excluded || p.Weight(i) <= 0.0f) continue;
    b = Better(b, Best{p.l[i] + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i), i});
  }
  const int32_t token = team.First(b).id;
  return token >= 0 ? token : Argmax(p, vocab, team);  // parameters that keep nothing
}

// The launch of a kernel written for Team over `rows` rows, a cluster of `blocks` blocks
// each with `shared_bytes` of dynamic shared memory; `attribute` is the cluster attribute
// it points to. One block per row is an ordinary launch: each block is a cluster of its own.
inline cudaLaunchConfig_t RowsConfig(int rows, int blocks, int32_t shared_bytes, cudaStream_t stream,
                                     cudaLaunchAttribute* attribute) {
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = static_cast<unsigned>(blocks);
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows * blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = blocks > 1 ? 1 : 0;
  return config;
}

template <class... Params, class... Args>
void LaunchRows(void (*kernel)(Params...), int rows, int blocks, int32_t shared_bytes, cudaStream_t stream,
                Args... args) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = RowsConfig(rows, blocks, shared_bytes, stream, &attribute);
  cudaLaunchKernelEx(&config, kernel, args...);
}

// Blocks per row for `rows` rows of `kernel`: the most, up to kMaxBlocks, with which every
// row's cluster is resident at once; many rows keep one block each. weight_vocab: the
// vocabulary whose WeightBytes each block gets (0: none). Measured once per device, size
// and shared memory, which is also when the kernel is allowed more than 48 KiB of it.
template <class... Params>
int BlocksPerRow(void (*kernel)(Params...), int rows, int32_t weight_vocab) {
  constexpr int kDevices = 64;
  // Per device and size: the shared bytes measured with (high half), max active clusters + 1.
  static std::atomic<uint64_t> measured[kDevices][kMaxBlocks + 1];
  int device = 0;
  cudaGetDevice(&device);
  if (device >= kDevices) return 1;
  for (int blocks : {8, 4, 3, 2}) {  // 3: room for the top-p weights where 4 do not all fit
    const int32_t bytes = weight_vocab > 0 ? WeightBytes(weight_vocab, blocks) : 0;
    uint64_t m = measured[device][blocks].load(std::memory_order_relaxed);
    if (static_cast<uint32_t>(m) == 0 || (m >> 32) != static_cast<uint64_t>(bytes)) {
      int fit = 0;
      cudaLaunchAttribute attribute;
      const cudaLaunchConfig_t config = RowsConfig(1, blocks, bytes, nullptr, &attribute);
      if ((bytes > 48 * 1024 &&
           cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxWeightBytes) != cudaSuccess) ||
          cudaOccupancyMaxActiveClusters(&fit, kernel, &config) != cudaSuccess) {
        cudaGetLastError();  // clear it: the launch goes ahead with fewer blocks
        fit = 0;
      }
      m = static_cast<uint64_t>(bytes) << 32 | static_cast<uint32_t>(fit + 1);
      measured[device][blocks].store(m, std::memory_order_relaxed);
    }
    if (rows <= static_cast<int>(static_cast<uint32_t>(m)) - 1) return blocks;
  }
  return 1;
}

}  // namespace hsx::cuda::sampler
