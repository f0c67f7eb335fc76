// Flash attention's online softmax, per tile of keys, for rows whose scores are spread
// over one quad of lanes (the mma.sync and wgmma accumulator layouts); scores are in
// log2 units.
#pragma once

#include <cuda_runtime.h>

namespace hsx::cuda {

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Folds a tile's row maximum (this lane's part of it) into the row's running max m and
// sum l. Returns the factor the row's output accumulator must be scaled by; `base` is
// what the tile's scores are exponentiated against (0 while every key so far is masked).
__device__ __forceinline__ float OnlineSoftmaxStep(float tile_max, float& m, float& l, float& base) {
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
  const float m_new = fmaxf(m, tile_max);
  // Exactly 1 when the max holds (a tile this row sees nothing of leaves it untouched,
  // whichever rows share its block), and while every key so far is masked.
  const float alpha = m_new == m ? 1.0f : Exp2(m - m_new);
  base = m_new == -INFINITY ? 0.0f : m_new;
  m = m_new;
  l *= alpha;
  return alpha;
}

}  // namespace hsx::cuda
