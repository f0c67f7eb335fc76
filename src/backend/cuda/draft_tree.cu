// EAGLE-2's dynamic-tree kernels: the top logprobs of each draft row (sampling_device.cuh's,
// as the Sample op computes them), each slot's expansion (backend/draft_tree.h's rule, the
// host's code compiled here, one thread a slot: k^2 <= 256 candidates) and its final tree
// (a block a slot: each place's rank among the slot's candidates, then the chosen in place
// order by one thread).
#include "backend/cuda/draft_tree_kernel.h"
#include "backend/cuda/sampling_device.cuh"
#include "backend/draft_tree.h"

#include <cstdio>
#include <cstdlib>

namespace hsx::cuda {
namespace {

using sampler::kThreads;

__global__ void __launch_bounds__(kThreads) TopLogprobsKernel(const float* logits, int32_t vocab, int32_t k,
                                                              const int32_t* offsets, int32_t* ids, float* logprobs) {
  __shared__ sampler::Scratch scratch;
  sampler::Team team(scratch);
  const float* raw = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  int32_t* id = ids + static_cast<int64_t>(blockIdx.x) * k;
  float* lp = logprobs + static_cast<int64_t>(blockIdx.x) * k;
  sampler::RawLogprobs(raw, vocab, k, k, id, lp, team);
  if (team.Leader()) {
    bool unordered = false;  // past a NaN nothing is ordered: -1 from there, as on the host
    for (int32_t j = 0; j < k; ++j) {
      unordered = unordered || id[j] < 0;
      if (unordered || !isfinite(lp[j])) {
        id[j] = -1;
        lp[j] = -INFINITY;
      } else if (offsets != nullptr) {
        id[j] += offsets[id[j]];
      }
    }
  }
}

__global__ void ExpandKernel(const int32_t* ids, const float* logprobs, int32_t slots, int32_t k, int32_t d,
                             int64_t places, int32_t* tokens, float* scores, int32_t* parents, int32_t* frontier,
                             uint64_t* masks, int32_t* next_ids, int32_t* next_rows, uint64_t* next_masks) {
  const int32_t s = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (s >= slots) return;
  const int32_t f = d == 1 ? 1 : k;
  int32_t* rows = next_rows != nullptr ? next_rows + s * k : nullptr;
  ExpandDraftTreeSlot(ids + static_cast<int64_t>(s) * f * k, logprobs + static_cast<int64_t>(s) * f * k, k, d,
                      tokens + s * places, scores + s * places, parents + s * places, frontier + s * k, masks + s * k,
                      next_ids != nullptr ? next_ids + s * k : nullptr, rows,
                      next_masks != nullptr ? next_masks + s * k : nullptr);
  for (int32_t j = 0; rows != nullptr && j < k; ++j) rows[j] += s * f;
}

constexpr int kSelectThreads = 256;
constexpr int kMaxPlaces = 16 + 63 * 16;  // k + (depth - 1) k^2 with (depth - 1) k <= 63, k <= 16

__global__ void __launch_bounds__(kSelectThreads) SelectKernel(const int32_t* tokens, const float* scores,
                                                               const int32_t* parents, int64_t places,
                                                               const int32_t* limits, int32_t n, int32_t* out) {
  __shared__ int32_t node_of[kMaxPlaces];  // -2: chosen, later its node index; -1: not chosen
  const int32_t s = static_cast<int32_t>(blockIdx.x);
  const int64_t used = limits[2 * s] < places ? limits[2 * s] : places;
  const int32_t budget = min(limits[2 * s + 1], n);
  const int32_t* tok = tokens + s * places;
  const float* score = scores + s * places;
  for (int64_t p = threadIdx.x; p < used; p += blockDim.x) {
    int32_t rank = 0;  // the candidates with a token that beat p
    for (int64_t q = 0; q < used && tok[p] >= 0; ++q) rank += tok[q] >= 0 && DraftBeats(score[q], q, score[p], p);
    node_of[p] = tok[p] >= 0 && rank < budget ? -2 : -1;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int32_t* row = out + static_cast<int64_t>(s) * 2 * n;
  int32_t nodes = 0;
  for (int64_t p = 0; p < used; ++p) {
    if (node_of[p] != -2) continue;
    const int32_t parent = parents[s * places + p];
    if (parent >= 0 && node_of[parent] < 0) {  // unreachable while scores only fall along a path
      node_of[p] = -1;
      continue;
    }
    row[nodes] = tok[p];
    row[n + nodes] = parent >= 0 ? node_of[parent] : -1;
    node_of[p] = nodes++;
  }
  for (int32_t i = nodes; i < n; ++i) row[i] = row[n + i] = -1;
}

}  // namespace

void TopLogprobs(const float* logits, int32_t rows, int32_t vocab, int32_t k, const int32_t* offsets, int32_t* ids,
                 float* logprobs, cudaStream_t stream) {
  if (rows > 0) TopLogprobsKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, k, offsets, ids, logprobs);
}

void ExpandDraftTrees(const int32_t* ids, const float* logprobs, int32_t slots, int32_t k, int32_t d, int64_t places,
                      int32_t* tokens, float* scores, int32_t* parents, int32_t* frontier, uint64_t* masks,
                      int32_t* next_ids, int32_t* next_rows, uint64_t* next_masks, cudaStream_t stream) {
  constexpr int kSlotsPerBlock = 64;
  if (slots > 0) {
    ExpandKernel<<<(slots + kSlotsPerBlock - 1) / kSlotsPerBlock, kSlotsPerBlock, 0, stream>>>(
        ids, logprobs, slots, k, d, places, tokens, scores, parents, frontier, masks, next_ids, next_rows, next_masks);
  }
}

void SelectDraftTrees(const int32_t* tokens, const float* scores, const int32_t* parents, int32_t slots, int64_t places,
                      const int32_t* limits, int32_t n, int32_t* out, cudaStream_t stream) {
  if (places > kMaxPlaces) {
    std::fprintf(stderr, "hsx: SelectDraftTrees: %ld places, at most %d\n", static_cast<long>(places), kMaxPlaces);
    std::abort();
  }
  if (slots > 0) SelectKernel<<<slots, kSelectThreads, 0, stream>>>(tokens, scores, parents, places, limits, n, out);
}

}  // namespace hsx::cuda
