// The S = Q K^T step of the mma.sync attention kernels (attention.cu, attention_decode.cu):
// one warp's 16 query rows against kBlocks blocks of 8 keys held in shared memory.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.cuh"

namespace hsx::cuda {

// s[j] (zeroed here) takes the scores of the warp's rows against keys first_key + 8j..
// (rows of k_s, kLd elements apart). Q comes from q_frag (D / 16 A fragments) when
// kQInRegisters, else from shared memory at q_lane, this lane's ldmatrix row of the
// warp's Q (mma_sync.cuh's layouts). K rows are B's columns, so plain ldmatrix gives B
// fragments. D a multiple of 32, or 16.
template <int D, int kBlocks, bool kQInRegisters, int kLd, int kFragments>
__device__ __forceinline__ void QueryKeyScores(float (&s)[kBlocks][4], const uint32_t (&q_frag)[kFragments][4],
                                               const bf16* q_lane, const bf16* k_s, int first_key, int lane) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  if constexpr (D % 32 == 0) {
#pragma unroll
    for (int p = 0; p < D / 32; ++p) {
      uint32_t qa[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kQInRegisters) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[h][i] = q_frag[2 * p + h][i];
        } else {
          LoadMatrixX4(qa[h], q_lane + 32 * p + 16 * h);
        }
      }
#pragma unroll
      for (int j = 0; j < kBlocks; ++j) {
        uint32_t b[4];  // keys first_key + 8j.., dims 32p + {0, 8, 16, 24}
        LoadMatrixX4(b, k_s + (first_key + 8 * j + lane % 8) * kLd + 32 * p + 8 * (lane / 8));
        Mma(s[j], qa[0], b[0], b[1]);
        Mma(s[j], qa[1], b[2], b[3]);
      }
    }
  } else {  // D == 16
    static_assert(D == 16, "head dims are multiples of 32, or 16");
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      uint32_t b[2];
      LoadMatrixX2(b, k_s + (first_key + 8 * j + lane % 8) * kLd + 8 * ((lane / 8) % 2));
      Mma(s[j], q_frag[0], b[0], b[1]);
    }
  }
}

}  // namespace hsx::cuda
