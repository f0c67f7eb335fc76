// The pieces of the weight-streaming GEMV (gemv.cu) that its fused variants share
// (gated_gemv.cu): a block's dot products of kRows weight rows with up to 8 x rows, each
// weight read once, in a fixed reduction order. See gemv.cu for the scheme.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/programmatic_launch.cuh"

namespace hsx::cuda::gemv {

constexpr int kRows = 4;  // weight rows per block
constexpr int kMaxWarps = 8;
// 16-byte chunks of each row a thread loads before using any; with the launch's
// k / 512 warps (at most 8) a 4096-wide row is one pass.
constexpr int kUnroll = 2;

// 16 bytes of weights that are read once: no L1 allocation, 256-byte L2 prefetch.
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Eight bf16 (little-endian pairs) to f32: a bf16 is the high half of its f32.
__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Sums each of kWidth values (a power of two <= 32) over the warp; afterwards lane l
// holds value l / (32 / kWidth) in v[0]. Each step hands half of the remaining values to
// the partner lane, so the warp spends kWidth - 1 + 5 - log2(kWidth) shuffles, not 5 per value.
template <int kWidth, int kOffset = 16, int N>
__device__ __forceinline__ void WarpReduceScatter(float (&v)[N], int lane) {
  static_assert((kWidth & (kWidth - 1)) == 0 && kWidth <= 32 && kWidth <= N);
  if constexpr (kOffset > 0) {
    if constexpr (kWidth > 1) {
      constexpr int kHalf = kWidth / 2;
      const bool upper = lane & kOffset;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
      }
      WarpReduceScatter<kHalf, kOffset / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kOffset);
      WarpReduceScatter<1, kOffset / 2>(v, lane);
    }
  }
}

// Accumulators per thread for M x rows: M padded to a power of two (for the
// reduce-scatter), times kRows.
constexpr int Values(int m) { return (m == 1 ? 1 : m == 2 ? 2 : m <= 4 ? 4 : 8) * kRows; }

// Threads per block for rows of k elements: kUnroll chunks per thread per row at least,
// so short rows take fewer warps. Set by k alone, so a row's chunk order and reduction
// tree are the same for every m.
inline int Threads(int64_t k) { return 32 * static_cast<int>(std::clamp<int64_t>(k / 8 / (32 * kUnroll), 1, kMaxWarps)); }

// The thread's chunks c0, c0 + threads, ... (kUnroll of them) of every weight row; zeros past the row.
__device__ __forceinline__ void LoadChunks(const uint4* const (&wrow)[kRows], int64_t c0, int64_t chunks,
                                           uint4 (&wv)[kUnroll][kRows]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t c = c0 + int64_t(u) * blockDim.x;
#pragma unroll
    for (int r = 0; r < kRows; ++r) wv[u][r] = c < chunks ? LoadStreaming(wrow[r] + c) : make_uint4(0, 0, 0, 0);
  }
}

// The block's dot products of weight rows wrow[r] (k elements, 16-byte aligned) with the
// M rows of x [M, k]: afterwards (the block synchronized) totals[i * kRows + r] = x_i . w_r.
template <int M>
__device__ __forceinline__ void BlockDots(const bf16* __restrict__ x, const uint4* const (&wrow)[kRows], int64_t k,
                                          float* totals) {
  static_assert(M >= 1 && M <= 8);
  constexpr int kValues = Values(M);
  const int64_t chunks = k / 8;
  const uint4* xs = reinterpret_cast<const uint4*>(x);

  float acc[kValues] = {};
  uint4 wv[kUnroll][kRows];
  // Weights are never written by the kernel before (programmatic_launch.cuh); x is.
  LoadChunks(wrow, threadIdx.x, chunks, wv);
  WaitForPriorGrid();
  for (int64_t c0 = threadIdx.x; c0 < chunks; c0 += int64_t(kUnroll) * blockDim.x) {
    if (c0 != threadIdx.x) LoadChunks(wrow, c0, chunks, wv);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + int64_t(u) * blockDim.x;
      if (c >= chunks) break;
      float wf[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) Unpack(wv[u][r], wf[r]);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float xf[8];
        Unpack(__ldg(xs + i * chunks + c), xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[i * kRows + r] = fmaf(wf[r][e], xf[e], acc[i * kRows + r]);
      }
    }
  }

  __shared__ float partial[kMaxWarps][kValues];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  WarpReduceScatter<kValues>(acc, lane);
  constexpr int kLanesPerValue = 32 / kValues;
  if (lane % kLanesPerValue == 0) partial[warp][lane / kLanesPerValue] = acc[0];
  __syncthreads();
  if (threadIdx.x < kValues) {
    float total = 0.0f;
    for (int j = 0; j < int(blockDim.x / 32); ++j) total += partial[j][threadIdx.x];
    totals[threadIdx.x] = total;
  }
  __syncthreads();
}

}  // namespace hsx::cuda::gemv
