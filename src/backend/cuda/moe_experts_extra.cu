// gpt-oss's additions to the MoE expert pass (cuda_moe.cpp): per-expert biases on the
// grouped GEMMs' outputs, and the clamped SwiGLU (backend.h's MoeSpec).
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_gemv.h"

namespace hsx::cuda {
namespace {

constexpr int kThreads = 256;

// Row r of the expert-sorted rows belongs to the expert e with offsets[e] <= r < offsets[e + 1].
__device__ int ExpertOfRow(const int32_t* offsets, int experts, int64_t r) {
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__global__ void AddExpertBiasKernel(bf16* y, int64_t rows, int64_t cols, const int32_t* offsets, int experts,
                                    const bf16* bias) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bf16* b = bias + int64_t(ExpertOfRow(offsets, experts, r)) * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      y[r * cols + c] = __float2bfloat16(__bfloat162float(y[r * cols + c]) + __bfloat162float(b[c]));
    }
  }
}

__global__ void ClampedSwigluKernel(const bf16* gate, const bf16* up, int64_t n, float limit, float alpha, bf16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16(ClampedSwigluValue(__bfloat162float(gate[i]), __bfloat162float(up[i]), limit, alpha));
  }
}

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

}  // namespace

void MoeAddExpertBias(bf16* y, int64_t rows, int64_t cols, const int32_t* offsets, int experts, const bf16* bias,
                      cudaStream_t stream) {
  if (rows == 0) return;
  const int blocks = static_cast<int>(rows < 65535 ? rows : 65535);
  AddExpertBiasKernel<<<blocks, kThreads, 0, stream>>>(y, rows, cols, offsets, experts, bias);
}

void ClampedSwiglu(const bf16* gate, const bf16* up, int64_t n, float limit, float alpha, bf16* out,
                   cudaStream_t stream) {
  if (n == 0) return;
  ClampedSwigluKernel<<<Blocks(n), kThreads, 0, stream>>>(gate, up, n, limit, alpha, out);
}

}  // namespace hsx::cuda
