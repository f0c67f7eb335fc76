// Token-tree attention masks on the device (backend.h's SequenceSlice, AttentionArgs'
// tree_base / tree_mask): a query row with mask word m != 0 sees every key before its
// sequence's tree_base that its window allows, measured from its logical position
// tree_base + popcount(m) - 1, and of the tree's keys [tree_base, tree_base + 64) those
// whose bit is set. A row of word 0 is causal as usual. Every tree row's visible keys lie
// at or before its own position in the packed step (ancestors come first in the tree's
// order), so the kernels keep their causal tile bounds and only narrow what a tile shows.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace hsx::cuda {

// One query row's sight: its physical position (the causal bound), its tree word and base.
struct RowSight {
  int pos = 0;         // the row's position in the step: keys after it are never seen
  uint64_t word = 0;   // 0: causal
  int base = -1;
  int window = 0;
  // The row's logical position: where its window is measured from.
  __device__ __forceinline__ int logical() const { return word == 0 ? pos : base + __popcll(word) - 1; }
  __device__ __forceinline__ bool Sees(int p) const {
    if (p > pos) return false;
    if (word == 0) return window <= 0 || pos - p < window;
    if (p >= base) return p - base < 64 && (word >> (p - base) & 1);
    return window <= 0 || base + __popcll(word) - 1 - p < window;
  }
};

// The sight of query row `row` (packed index) of sequence `seq` at physical position pos.
__device__ __forceinline__ RowSight SightOf(const AttentionArgs& a, int seq, int row, int pos) {
  RowSight s;
  s.pos = pos;
  s.window = a.sliding_window;
  if (a.tree_base != nullptr) {
    s.base = a.tree_base[seq];
    if (s.base >= 0) s.word = a.tree_mask[row];
  }
  return s;
}

// The sequence's tree base, or a large value when it has none: min(first_pos, this) is the
// earliest logical position of its rows (their windows start from there).
__device__ __forceinline__ int TreeBaseOr(const AttentionArgs& a, int seq, int none) {
  if (a.tree_base == nullptr) return none;
  const int base = a.tree_base[seq];
  return base >= 0 ? base : none;
}

// Bit j set where some row of [q0, q0 + rows) sees tree key base + j (a causal row past
// base sees the tree keys up to itself). The block's threads all call it.
__device__ __forceinline__ uint64_t BlockTreeKeys(const AttentionArgs& a, int seq, int base, int row0, int first_pos, int rows) {
  __shared__ unsigned long long keys;
  if (threadIdx.x == 0) keys = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    uint64_t w = a.tree_mask[row0 + r];
    const int pos = first_pos + r;
    if (w == 0 && pos >= base) w = pos - base >= 63 ? ~0ull : (2ull << (pos - base)) - 1;
    atomicOr(&keys, static_cast<unsigned long long>(w));
  }
  __syncthreads();
  const uint64_t k = keys;
  __syncthreads();  // every thread has read it before the next call overwrites it
  return k;
}

// Whether key p loads: not a tree key no row of the block sees.
__device__ __forceinline__ bool LoadsKey(int p, int base, uint64_t block_keys) {
  return base < 0 || p < base || p - base >= 64 || (block_keys >> (p - base) & 1);
}

}  // namespace hsx::cuda
