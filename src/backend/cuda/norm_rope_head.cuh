// One attention head's input made ready by one warp: its RMSNorm (the sum taken in a fixed
// order) and rotate-half RoPE. norm_rope_store.cu and the split-KV decode kernel's fused
// inputs (attention_decode.cu) both compute a head this way, so a layer's q, k and v have
// the same bits whichever of the two made them. Lane l holds elements l, l + 32, ... of
// the head, kPerLane of them.
#pragma once

#include "backend/cuda/kernels.h"

namespace hsx::cuda {

// r = r * rsqrt(mean(r^2) + eps) * scale over a head of `dim`, rounded to bf16 (as the
// separate norm op rounds its output).
template <int kPerLane>
__device__ __forceinline__ void NormHeadInWarp(float (&r)[kPerLane], const float (&scale)[kPerLane], int dim,
                                               float eps) {
  const int lane = threadIdx.x % 32;
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < dim) ss += r[j] * r[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = rsqrtf(ss / dim + eps);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < dim) r[j] = __bfloat162float(__float2bfloat16(r[j] * inv * scale[j]));
}

// cos and sin of the rotation of frequency `freq` at position `pos`.
__device__ __forceinline__ void RopeCosSin(float pos, float freq, float* sin, float* cos) {
  sincosf(__fmul_rn(pos, freq), sin, cos);
}

// Rotates the first 2 * half elements of the head: element i < half pairs with i + half.
// row: the head's values before rotation, in the warp's own shared memory (the caller
// writes it and syncs the warp); cos_s / sin_s [half]. The products are spelled out so
// that no compiler contraction differs between the kernels that share this.
template <int kPerLane>
__device__ __forceinline__ void RotateHeadInWarp(float (&r)[kPerLane], const float* row, const float* cos_s,
                                                 const float* sin_s, int half) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i >= 2 * half) continue;
    if (i < half) {
      r[j] = __fmaf_rn(r[j], cos_s[i], -__fmul_rn(row[i + half], sin_s[i]));
    } else {
      r[j] = __fmaf_rn(r[j], cos_s[i - half], __fmul_rn(row[i - half], sin_s[i - half]));
    }
  }
}

// A head made ready: normed if `norm`, then rotated if `rope` and half > 0, through `row`,
// the warp's own f32 row in shared memory (free again for the warp's next head on return).
template <int kPerLane>
__device__ __forceinline__ void MakeHeadReady(float (&r)[kPerLane], const float (&scale)[kPerLane], bool norm,
                                              bool rope, float* row, const float* cos_s, const float* sin_s, int dim,
                                              int half, float eps) {
  if (norm) NormHeadInWarp(r, scale, dim, eps);
  if (!rope || half == 0) return;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < dim) row[lane + 32 * j] = r[j];
  __syncwarp();
  RotateHeadInWarp(r, row, cos_s, sin_s, half);
  __syncwarp();
}

}  // namespace hsx::cuda
