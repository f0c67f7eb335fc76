// A layer's attention inputs made ready in one launch (Backend::NormRopeStoreKV, and
// RoPE with or without the q/k norm alone): one warp per (token, head) of q, k and v, so
// a decode step of one token still spreads its 40-odd heads over several SMs, where a
// block per token ran them on one. A block's warps share a token, whose cos/sin the block
// computes once. A warp holds its head in registers (lane l has elements l, l + 32, ...),
// normalizes and rotates it as norm_rope_head.cuh does (each lane reads its rotate-half
// partner in a per-warp f32 row in shared memory), and writes a q head to q,
// a k or v head into the cache at the token's slot. Heads are read with row strides, so q,
// k and v come straight from the fused q/k/v GEMM's output.
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_rope_head.cuh"
#include "backend/cuda/programmatic_launch.cuh"

namespace hsx::cuda {
namespace {

constexpr int kMaxDim = 512;
constexpr int kPerLane = kMaxDim / 32;
constexpr int kWarps = 8;

// Grid: (token, group of kWarps heads). Every global read is issued before the first
// use of any: a decode step's kernel is all latency, and reading x, then the norm weight,
// then the slot one after another cost three memory round trips where one does.
__global__ void __launch_bounds__(kWarps * 32) NormRopeStoreKernel(NormRopeStoreArgs a) {
  __shared__ float rows[kWarps][kMaxDim];
  __shared__ float cos_s[kMaxDim / 2], sin_s[kMaxDim / 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t token = blockIdx.x;
  const int half = a.rotary_dims / 2;
  const int per_token = a.q_heads + (a.k != nullptr ? 2 * a.kv_heads : 0);
  int head = static_cast<int>(blockIdx.y) * kWarps + warp;
  const bool live = head < per_token;  // dead warps still reach the block's barrier

  // Which head this warp owns: a q head, a k head or a v head.
  const bf16* x = nullptr;
  bf16* q_out = nullptr;
  const bf16* w = nullptr;
  bool norm = false, rope = false;
  bf16* cache = nullptr;
  if (!live) {
  } else if (head < a.q_heads) {
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

  // Model constants (no kernel writes them) may be read before the wait.
  const float plus = a.one_plus_weight ? 1.0f : 0.0f;
  float scale[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    scale[j] = w != nullptr && i < a.dim ? __bfloat162float(w[i]) + plus : 1.0f;
  }
  const float freq = static_cast<int>(threadIdx.x) < half ? a.inv_freq[threadIdx.x] : 0.0f;
  WaitForPriorGrid();  // x, positions and slots come from the kernels before
  // After the wait: triggering before it let whole chains of later kernels take SM room
  // early, and batch 1 decode fell from 210 to 185 tok/s (nvidia-h200, one call).
  AllowDependentLaunch();
  const float pos = static_cast<float>(a.positions[token]);
  const int64_t slot = cache != nullptr ? a.slots[token] : -1;  // negative: a padding row
  float r[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    r[j] = live && i < a.dim ? __bfloat162float(x[i]) : 0.0f;
  }
  if (static_cast<int>(threadIdx.x) < half) RopeCosSin(pos, freq, &sin_s[threadIdx.x], &cos_s[threadIdx.x]);
  __syncthreads();
  if (!live) return;  // whole warps leave; only __syncwarp follows

  MakeHeadReady(r, scale, norm, rope, rows[warp], cos_s, sin_s, a.dim, half, a.eps);
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

void NormRopeStore(const NormRopeStoreArgs& a, cudaStream_t stream, bool programmatic) {
  if (a.dim > kMaxDim || a.rotary_dims > a.dim) {
    std::fprintf(stderr, "hsx: NormRopeStore supports head dims up to %d (got %d, rotary %d)\n", kMaxDim, a.dim,
                 a.rotary_dims);
    std::abort();
  }
  const int per_token = a.q_heads + (a.k != nullptr ? 2 * a.kv_heads : 0);
  const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>((per_token + kWarps - 1) / kWarps));
  if (a.tokens > 0 && per_token > 0)
    LaunchMaybeProgrammatic(NormRopeStoreKernel, grid, dim3(kWarps * 32), 0, programmatic, stream, a);
}

}  // namespace hsx::cuda
