// Gemma 4 MTP's centroid-masked LM head: only the tokens of each row's top_k clusters
// get a logit (a dot product with their lm_head row), the rest the lowest float. For
// E2B's head this reads 4096 of 262144 embedding rows per draft row.
#include <cfloat>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace hsx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTopK = 256;
constexpr int kMaxClusters = 8192;  // 32 KiB of scores: within the 48 KiB a block gets without opting in

__global__ void FillKernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

// Whether (va, a) ranks above (vb, b): higher value first (NaN lowest), then lower index.
__device__ bool Above(float va, int a, float vb, int b) {
  va = isnan(va) ? -INFINITY : va;
  vb = isnan(vb) ? -INFINITY : vb;
  return va > vb || (va == vb && a < b);
}

// Grid (rows, splits). Every block of a row finds the same top_k clusters (the scores sit
// in shared memory; top_k rounds of a block-wide arg max), then its warps take every
// (splits * kWarps)-th selected token.
__global__ void CentroidLogitsKernel(const bf16* x, const float* centroid_logits, const int32_t* ordering,
                                     const bf16* lm_head, int hidden, int clusters, int per_cluster, int top_k,
                                     int64_t vocab, float* logits) {
  extern __shared__ float scores[];  // [clusters]
  __shared__ int selected[kMaxTopK];
  __shared__ float warp_value[kWarps];
  __shared__ int warp_index[kWarps];
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int c = threadIdx.x; c < clusters; c += blockDim.x) scores[c] = centroid_logits[row * clusters + c];
  __syncthreads();
  for (int k = 0; k < top_k; ++k) {
    float best = 0.0f;
    int best_index = -1;
    for (int c = threadIdx.x; c < clusters; c += blockDim.x) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= selected[j] == c;
      if (!taken && (best_index < 0 || Above(scores[c], c, best, best_index))) {
        best = scores[c];
        best_index = c;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float v = __shfl_down_sync(0xffffffffu, best, offset);
      const int i = __shfl_down_sync(0xffffffffu, best_index, offset);
      if (i >= 0 && (best_index < 0 || Above(v, i, best, best_index))) {
        best = v;
        best_index = i;
      }
    }
    if (lane == 0) {
      warp_value[warp] = best;
      warp_index[warp] = best_index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kWarps; ++w) {
        if (warp_index[w] >= 0 && (best_index < 0 || Above(warp_value[w], warp_index[w], best, best_index))) {
          best = warp_value[w];
          best_index = warp_index[w];
        }
      }
      selected[k] = best_index;
    }
    __syncthreads();
  }
  const bf16* xr = x + row * hidden;
  const int64_t count = int64_t(top_k) * per_cluster;
  for (int64_t s = int64_t(blockIdx.y) * kWarps + warp; s < count; s += int64_t(gridDim.y) * kWarps) {
    const int32_t token = ordering[int64_t(selected[s / per_cluster]) * per_cluster + s % per_cluster];
    const bf16* e = lm_head + int64_t(token) * hidden;
    float dot = 0.0f;
    for (int i = lane; i < hidden; i += 32) dot += __bfloat162float(xr[i]) * __bfloat162float(e[i]);
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_down_sync(0xffffffffu, dot, offset);
    if (lane == 0) logits[row * vocab + token] = dot;
  }
}

}  // namespace

bool CentroidMaskedLogits(const bf16* x, const float* centroid_logits, const int32_t* token_ordering,
                          const bf16* lm_head, int64_t rows, int hidden, int clusters, int per_cluster, int top_k,
                          int64_t vocab, float* logits, cudaStream_t stream) {
  const size_t shared = size_t(clusters) * sizeof(float);
  if (top_k < 1 || top_k > kMaxTopK || top_k > clusters || clusters > kMaxClusters) return false;
  if (rows == 0) return true;
  const int64_t n = rows * vocab;
  const int64_t fill_blocks = (n + kThreads - 1) / kThreads;
  FillKernel<<<static_cast<unsigned>(fill_blocks < 4096 ? fill_blocks : 4096), kThreads, 0, stream>>>(logits, n, -FLT_MAX);
  // About 64 selected tokens per block (8 per warp): E2B's 4096 give 64 blocks a row.
  const int64_t count = int64_t(top_k) * per_cluster;
  const int64_t splits = (count + 63) / 64;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(splits < 1 ? 1 : (splits > 256 ? 256 : splits)));
  CentroidLogitsKernel<<<grid, kThreads, shared, stream>>>(x, centroid_logits, token_ordering, lm_head, hidden,
                                                           clusters, per_cluster, top_k, vocab, logits);
  return true;
}

}  // namespace hsx::cuda
