// The core of the decode-sized GEMVs (gemv.cu, gated_gemv.cu): a block's dot
// products of a tile of 16 weight rows with up to 8 rows of x, on mma.sync
// m16n8k16 (bf16 in, f32 accumulate), each weight element read from memory once.
//
// Why tensor cores for a GEMV: with FMAs the work per weight byte grows with the number
// of x rows, and at 4 rows (a verification step of 3 drafts) it limited the kernel below
// the memory's pace; an mma multiplies a 16x16 weight tile by 8 x rows at once, so 1 to
// 8 rows cost the same few instructions per byte.
//
// Weights go straight from memory to the mma's A registers, with no shared memory: a
// dot product may visit k in any order as long as A and B visit it alike, so lane (g, t)
// (g = lane / 4, t = lane % 4) loads 16 contiguous bytes of rows g and g + 8 at k offset
// 8t of each 32-wide k step, and of x row g (B) the same 16 bytes; elements 0-3 feed the
// step's first mma as its k columns 2t, 2t + 1, 8 + 2t, 9 + 2t (mma_sync.cuh's layouts),
// elements 4-7 the second. Four lanes thus read 64 contiguous bytes of a row, and a
// warp's kLoadSteps consecutive steps a whole 128-byte line of each row.
//
// A block's kWarps warps take interleaved groups of kLoadSteps steps, each warp keeping
// the next kStages - 1 groups in flight while it multiplies one.
// Partial tiles are summed over the warps in warp order: fixed, so results never depend
// on timing, and an output element's sum involves only its own x row, so a row's result
// does not depend on how many rows the call has.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.cuh"
#include "backend/cuda/programmatic_launch.cuh"

namespace hsx::cuda::gemv {

// 16 bytes of weights that are read once: no L1 allocation, 256-byte L2 prefetch.
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

constexpr int kTileRows = 16;  // weight rows per mma tile
constexpr int kWarps = 8;      // warps per block, splitting k
constexpr int kThreads = kWarps * 32;

// 32-wide k steps a warp loads per group: each lane 16 bytes of its 2 rows per step,
// the warp a row's 128-byte line per group.
constexpr int kLoadSteps = 2;
// Groups a warp has in flight while it multiplies one (a group: 2 KB of weights).
constexpr int kStages = 4;

// A block's sums over one tile of 16 weight rows, afterwards (the block synchronized) in
// totals[r * 8 + x_row] for x_row < m: tile row r . x row x_row. The caller maps the
// tile's rows to memory: this lane's rows g and g + 8 start at lo and hi (k elements each,
// 16-byte aligned; rows past a matrix should point at a real row, their sums unwritten).
// x: [m, k], 16-byte aligned; k a multiple of 8.
__device__ __forceinline__ void BlockTileDots(const bf16* __restrict__ x, int m, const bf16* lo_row,
                                              const bf16* hi_row, int64_t k, float* totals) {
  constexpr int kSteps = kLoadSteps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t chunks = k / 8;                                     // 16-byte chunks of a row
  const int64_t groups = (chunks + 4 * kSteps - 1) / (4 * kSteps);  // each kSteps steps of 4 chunks
  const uint4* lo = reinterpret_cast<const uint4*>(lo_row);
  const uint4* hi = reinterpret_cast<const uint4*>(hi_row);
  const uint4* xs = reinterpret_cast<const uint4*>(x);
  const uint4 zero = make_uint4(0, 0, 0, 0);

  struct Group {
    uint4 lo[kSteps], hi[kSteps], x[kSteps];
  };
  auto load_weights = [&](int64_t group, Group& b) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t c = (group * kSteps + s) * 4 + t;
      b.lo[s] = c < chunks ? LoadStreaming(lo + c) : zero;
      b.hi[s] = c < chunks ? LoadStreaming(hi + c) : zero;
    }
  };
  auto load_x = [&](int64_t group, Group& b) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t c = (group * kSteps + s) * 4 + t;
      b.x[s] = c < chunks && g < m ? __ldg(xs + g * chunks + c) : zero;
    }
  };

  auto multiply = [&](const Group& b, float (&acc)[4]) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint32_t a0[4] = {b.lo[s].x, b.hi[s].x, b.lo[s].y, b.hi[s].y};
      const uint32_t a1[4] = {b.lo[s].z, b.hi[s].z, b.lo[s].w, b.hi[s].w};
      Mma(acc, a0, b.x[s].x, b.x[s].y);
      Mma(acc, a1, b.x[s].z, b.x[s].w);
    }
  };

  // A ring of kStages groups, indexed by constants (the stage loop is unrolled): a
  // register copied from a pending load would wait for it, and the pipeline with it.
  float acc[4] = {};
  Group ring[kStages];
  // Weights are never written by the kernel before (programmatic_launch.cuh); x is.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_weights(warp + s * kWarps, ring[s]);
  WaitForPriorGrid();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_x(warp + s * kWarps, ring[s]);
  for (int64_t base = warp; base < groups; base += kStages * kWarps) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int64_t group = base + s * kWarps, ahead = group + (kStages - 1) * kWarps;
      Group& refill = ring[(s + kStages - 1) % kStages];
      load_weights(ahead, refill);  // past the last group: zeros, no loads
      load_x(ahead, refill);
      if (group < groups) multiply(ring[s], acc);
    }
  }

  // C layout: acc[0..1] at (row g, x rows 2t, 2t + 1), acc[2..3] at row g + 8.
  constexpr int kPerWarp = kTileRows * 8;
  __shared__ float partial[kWarps][kPerWarp];
  float* tile = partial[warp] + 2 * t;
  tile[g * 8] = acc[0];
  tile[g * 8 + 1] = acc[1];
  tile[(g + 8) * 8] = acc[2];
  tile[(g + 8) * 8 + 1] = acc[3];
  __syncthreads();
  for (int e = threadIdx.x; e < kPerWarp; e += kThreads) {
    if (e % 8 >= m) continue;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += partial[w][e];
    totals[e] = total;
  }
  __syncthreads();
}

}  // namespace hsx::cuda::gemv
