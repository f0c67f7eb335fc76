// Rows of bf16 to FP8 E4M3 codes and one f32 scale each, by tensor/float8.h's rule (the
// row's largest magnitude maps to 448; round to nearest even, saturating; fp8_rows.cuh),
// which the CPU backend applies too: per-channel for weights at load, per-token for
// activations before each FP8 GEMM whose input no kernel quantized as it wrote it.
//
// One block per row. Rows of a multiple of 8 elements (every projection's input) stay in
// registers between the absmax and the conversion, in 16-byte loads and 8-byte stores, so
// the row is read from HBM once; other widths take a plain two-pass loop.
#include <cstdint>

#include "backend/cuda/fp8_rows.cuh"
#include "backend/cuda/kernels.h"

namespace hsx::cuda {
namespace {

constexpr int kThreads = 256;

// kChunks 8-element chunks per thread: rows of up to kThreads * 8 * kChunks elements.
template <int kChunks>
__global__ void QuantizeRowsInRegisters(const bf16* __restrict__ x, int64_t cols, uint8_t* __restrict__ q,
                                        float* __restrict__ scales) {
  const int64_t row = blockIdx.x;
  const int chunks = static_cast<int>(cols / 8);
  const uint4* in = reinterpret_cast<const uint4*>(x + row * cols);
  uint4 v[kChunks];
  float absmax = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = threadIdx.x + c * kThreads;
    if (i < chunks) {
      v[c] = in[i];
      absmax = fmaxf(absmax, AbsMax8(v[c]));
    }
  }
  absmax = BlockMax(absmax);
  const float inv = Fp8Inverse(absmax);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = threadIdx.x + c * kThreads;
    if (i < chunks) StoreCodes8(v[c], inv, q + row * cols + int64_t(i) * 8);
  }
  if (threadIdx.x == 0) scales[row] = Fp8Scale(absmax);
}

__global__ void QuantizeRowsTwoPass(const bf16* __restrict__ x, int64_t cols, uint8_t* __restrict__ q,
                                    float* __restrict__ scales) {
  const int64_t row = blockIdx.x;
  const bf16* in = x + row * cols;
  float absmax = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += kThreads) absmax = fmaxf(absmax, fabsf(__bfloat162float(in[i])));
  absmax = BlockMax(absmax);
  const float inv = Fp8Inverse(absmax);
  uint8_t* out = q + row * cols;
  for (int64_t i = threadIdx.x; i < cols; i += kThreads) out[i] = Fp8Code(__bfloat162float(in[i]) * inv);
  if (threadIdx.x == 0) scales[row] = Fp8Scale(absmax);
}

}  // namespace

void QuantizeRowsFp8(const bf16* x, int64_t rows, int64_t cols, uint8_t* q, float* scales, cudaStream_t stream) {
  if (rows == 0) return;
  const unsigned grid = static_cast<unsigned>(rows);
  const bool vectors = cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0;
  const int64_t chunks_per_thread = (cols / 8 + kThreads - 1) / kThreads;
  if (!vectors || chunks_per_thread > 16) {
    QuantizeRowsTwoPass<<<grid, kThreads, 0, stream>>>(x, cols, q, scales);
  } else if (chunks_per_thread <= 2) {
    QuantizeRowsInRegisters<2><<<grid, kThreads, 0, stream>>>(x, cols, q, scales);
  } else if (chunks_per_thread <= 4) {
    QuantizeRowsInRegisters<4><<<grid, kThreads, 0, stream>>>(x, cols, q, scales);
  } else if (chunks_per_thread <= 8) {
    QuantizeRowsInRegisters<8><<<grid, kThreads, 0, stream>>>(x, cols, q, scales);
  } else {
    QuantizeRowsInRegisters<16><<<grid, kThreads, 0, stream>>>(x, cols, q, scales);
  }
}

}  // namespace hsx::cuda
