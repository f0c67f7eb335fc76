// tensor/float8.h's per-row FP8 rule on the device, for every kernel that writes E4M3 rows
// (fp8_quantize.cu, and the norm and gated activation that write an FP8 GEMM's input
// directly in kernels.cu): the row's largest magnitude maps to 448, each value rounds to
// nearest even and saturates, and the row keeps absmax / 448 to multiply its codes back.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace hsx::cuda {

// The block's largest value of v (any block size up to 1024 threads). Max is exact, so the
// result does not depend on the reduction order.
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float warp_max[32];
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // warp_max may still be read by a previous call
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0.0f;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) v = fmaxf(v, warp_max[w]);
  return v;
}

// What multiplies a value into code range, and the scale that multiplies its code back.
__device__ __forceinline__ float Fp8Inverse(float absmax) { return absmax > 0.0f ? 448.0f / absmax : 1.0f; }
__device__ __forceinline__ float Fp8Scale(float absmax) { return absmax > 0.0f ? absmax / 448.0f : 1.0f; }

__device__ __forceinline__ uint8_t Fp8Code(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }

// The largest magnitude of 8 bf16 held in one 16-byte register group.
__device__ __forceinline__ float AbsMax8(const uint4& packed) {
  const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&packed);
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(__bfloat162float(e[j])));
  return m;
}

// 8 bf16 as 8 codes in one 8-byte store (out 8-byte aligned).
__device__ __forceinline__ void StoreCodes8(const uint4& packed, float inverse, uint8_t* out) {
  const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&packed);
  uint32_t word[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) word[j / 4] |= uint32_t(Fp8Code(__bfloat162float(e[j]) * inverse)) << (8 * (j % 4));
  *reinterpret_cast<uint2*>(out) = make_uint2(word[0], word[1]);
}

// A block's row of `cols` values as codes and a scale, from the packed bf16 values each
// thread holds (chunk c at element (threadIdx.x + c * blockDim.x) * 8) and the largest
// magnitude among them: the block's largest sets the scale.
template <int kChunks>
__device__ __forceinline__ void StoreRowCodes(const uint4 (&packed)[kChunks], float absmax, int64_t cols,
                                              uint8_t* codes, float* scale) {
  absmax = BlockMax(absmax);
  const float to_code = Fp8Inverse(absmax);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
    if (i < cols) StoreCodes8(packed[c], to_code, codes + i);
  }
  if (threadIdx.x == 0) *scale = Fp8Scale(absmax);
}

}  // namespace hsx::cuda
