// Rows of bf16 to FP8 E4M3 codes and one f32 scale each, by tensor/float8.h's rule (the
// row's largest magnitude maps to 448; round to nearest even, saturating), which the CPU
// backend applies too: per-channel for weights at load, per-token for activations before
// each FP8 GEMM.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace hsx::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void QuantizeRowsKernel(const bf16* __restrict__ x, int64_t cols, uint8_t* __restrict__ q,
                                   float* __restrict__ scales) {
  const int64_t row = blockIdx.x;
  const bf16* in = x + row * cols;
  float absmax = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += kThreads) absmax = fmaxf(absmax, fabsf(__bfloat162float(in[i])));
  for (int offset = 16; offset > 0; offset /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
  __shared__ float warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = absmax;
  __syncthreads();
  absmax = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) absmax = fmaxf(absmax, warp_max[w]);
  const float inv = absmax > 0.0f ? 448.0f / absmax : 1.0f;
  uint8_t* out = q + row * cols;
  for (int64_t i = threadIdx.x; i < cols; i += kThreads)
    out[i] = __nv_cvt_float_to_fp8(__bfloat162float(in[i]) * inv, __NV_SATFINITE, __NV_E4M3);
  if (threadIdx.x == 0) scales[row] = absmax > 0.0f ? absmax / 448.0f : 1.0f;
}

}  // namespace

void QuantizeRowsFp8(const bf16* x, int64_t rows, int64_t cols, uint8_t* q, float* scales, cudaStream_t stream) {
  if (rows == 0) return;
  QuantizeRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, q, scales);
}

}  // namespace hsx::cuda
