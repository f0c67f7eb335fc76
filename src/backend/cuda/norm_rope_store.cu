// A layer's attention inputs made ready in one launch (Backend::NormRopeStoreKV, and
// RoPE with or without the q/k norm alone): one warp per (token, head) of q, k and v, so
// a decode step of one token still spreads its 40-odd heads over several SMs, where a
// block per token ran them on one. A block's warps share a token, whose cos/sin the block
// computes once. A warp holds its head in registers (lane l has elements l, l + 32, ...),
// takes the norm's sum in that order with a butterfly over the warp, rounds the normed
// value to bf16 (as the separate norm op does), rotates through a per-warp f32 row in
// shared memory (each lane reads its rotate-half partner there), and writes a q head to q,
// a k or v head into the cache at the token's slot. Heads are read with row strides, so q,
// k and v come straight from the fused q/k/v GEMM's output.
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/kernels.h"

namespace hsx::cuda {
namespace {

constexpr int kMaxDim = 512;
constexpr int kPerLane = kMaxDim / 32;
constexpr int kWarps = 8;

// Grid: (token, group of kWarps heads).
__global__ void __launch_bounds__(kWarps * 32) NormRopeStoreKernel(NormRopeStoreArgs a) {
  __shared__ float rows[kWarps][kMaxDim];
  __shared__ float cos_s[kMaxDim / 2], sin_s[kMaxDim / 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t token = blockIdx.x;
  const int half = a.rotary_dims / 2;
  const float pos = static_cast<float>(a.positions[token]);
  for (int f = threadIdx.x; f < half; f += blockDim.x) sincosf(pos * a.inv_freq[f], &sin_s[f], &cos_s[f]);
  __syncthreads();
  const int per_token = a.q_heads + (a.k != nullptr ? 2 * a.kv_heads : 0);
  int head = static_cast<int>(blockIdx.y) * kWarps + warp;
  if (head >= per_token) return;  // whole warps leave; only __syncwarp follows

  // Which head this warp owns: a q head, a k head or a v head.
  const bf16* x;
  bf16* q_out = nullptr;
  const bf16* w = nullptr;
  bool norm, rope;
  bf16* cache = nullptr;
  if (head < a.q_heads) {
    x = a.q_in + token * a.q_stride + head * a.dim;
    q_out = a.q + (token * a.q_heads + head) * a.dim;
    w = a.q_norm;
    norm = w != nullptr;
    rope = true;
  } else if ((head -= a.q_heads) < a.kv_heads) {
    x = a.k + token * a.kv_stride + head * a.dim;
    w = a.k_norm;
    norm = w != nullptr;
    rope = true;
    cache = a.k_cache;
  } else {
    head -= a.kv_heads;
    x = a.v + token * a.kv_stride + head * a.dim;
    norm = a.v_norm;
    rope = false;
    cache = a.v_cache;
  }

  float r[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    r[j] = i < a.dim ? __bfloat162float(x[i]) : 0.0f;
  }
  if (norm) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < a.dim) ss += r[j] * r[j];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / a.dim + a.eps);
    const float plus = a.one_plus_weight ? 1.0f : 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < a.dim) r[j] = __bfloat162float(__float2bfloat16(r[j] * inv * (w != nullptr ? __bfloat162float(w[i]) + plus : 1.0f)));
    }
  }
  if (rope && half > 0) {
    float* row = rows[warp];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < a.dim) row[lane + 32 * j] = r[j];
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i >= 2 * half) continue;
      if (i < half) {
        r[j] = r[j] * cos_s[i] - row[i + half] * sin_s[i];
      } else {
        r[j] = r[j] * cos_s[i - half] + row[i - half] * sin_s[i - half];
      }
    }
  }
  const int64_t slot = cache != nullptr ? a.slots[token] : -1;  // negative: a padding row
  bf16* stored = slot >= 0 ? cache + (slot * a.kv_heads + head) * a.dim : nullptr;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i >= a.dim) continue;
    const bf16 out = __float2bfloat16(r[j]);
    if (q_out != nullptr) q_out[i] = out;
    if (stored != nullptr) stored[i] = out;
  }
}

}  // namespace

void NormRopeStore(const NormRopeStoreArgs& a, cudaStream_t stream) {
  if (a.dim > kMaxDim || a.rotary_dims > a.dim) {
    std::fprintf(stderr, "hsx: NormRopeStore supports head dims up to %d (got %d, rotary %d)\n", kMaxDim, a.dim,
                 a.rotary_dims);
    std::abort();
  }
  const int per_token = a.q_heads + (a.k != nullptr ? 2 * a.kv_heads : 0);
  const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>((per_token + kWarps - 1) / kWarps));
  if (a.tokens > 0 && per_token > 0) NormRopeStoreKernel<<<grid, kWarps * 32, 0, stream>>>(a);
}

}  // namespace hsx::cuda
