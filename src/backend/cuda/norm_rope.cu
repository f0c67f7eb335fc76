// A layer's attention inputs for prefill-sized steps (NormRopeStoreArgs, as NormRopeStore
// takes them): one block per token. The block stages the token's q, k and v heads in
// shared memory with 16-byte cp.async copies (the whole row in flight at once), computes
// the token's cos/sin once, and its warps make each head ready as norm_rope_head.cuh does,
// so the bits are those of norm_rope_store.cu's one-warp-per-head kernel, which wins for
// decode-sized steps. The block then writes q, and the k and v cache rows at the token's
// slot, with 16-byte stores. One kernel in place of four (q's and k's norm and RoPE, v's
// copy out of the fused rows, the KV store): a 16k-token Qwen3-8B step moved 536 MB
// through them at 1.1-1.8 TB/s, 365 us a layer (H200).
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/dynamic_shared_memory.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_rope_head.cuh"

namespace hsx::cuda {
namespace {

constexpr int kWarps = 8;
// Shared memory a block may take (a token's heads, cos/sin, a f32 row per warp); rows
// past it run on NormRopeStore's kernel, which needs none of it.
constexpr size_t kMaxSharedBytes = 160 << 10;

size_t SharedBytes(const NormRopeStoreArgs& a) {
  const int64_t heads = a.q_heads + (a.k != nullptr ? 2 * a.kv_heads : 0);
  return size_t(heads) * a.dim * sizeof(bf16) + (size_t(a.rotary_dims) + size_t(kWarps) * a.dim) * sizeof(float);
}

// Lane l holds elements l, l + 32, ... of a head: kPerLane covers dims up to 32 kPerLane.
template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32) NormRopeStoreRowsKernel(NormRopeStoreArgs a) {
  extern __shared__ __align__(16) unsigned char shared[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int dim = a.dim, half = a.rotary_dims / 2;
  const int kv_heads = a.k != nullptr ? a.kv_heads : 0, heads = a.q_heads + 2 * kv_heads;
  bf16* q_s = reinterpret_cast<bf16*>(shared);  // the token's heads: q's, then k's, then v's
  bf16* k_s = q_s + a.q_heads * dim;
  bf16* v_s = k_s + kv_heads * dim;
  float* cos_s = reinterpret_cast<float*>(v_s + kv_heads * dim);
  float* sin_s = cos_s + half;
  float* row = sin_s + half + warp * dim;  // this warp's head before rotation
  const int64_t token = blockIdx.x;

  const int q_chunks = a.q_heads * dim / 8, kv_chunks = kv_heads * dim / 8;
  const uint4* q_in = reinterpret_cast<const uint4*>(a.q_in + token * a.q_stride);
  for (int i = threadIdx.x; i < q_chunks; i += blockDim.x) CopyAsync16(q_s + 8 * i, q_in + i);
  if (kv_heads > 0) {
    const uint4* k_in = reinterpret_cast<const uint4*>(a.k + token * a.kv_stride);
    const uint4* v_in = reinterpret_cast<const uint4*>(a.v + token * a.kv_stride);
    for (int i = threadIdx.x; i < kv_chunks; i += blockDim.x) {
      CopyAsync16(k_s + 8 * i, k_in + i);
      CopyAsync16(v_s + 8 * i, v_in + i);
    }
  }
  CommitAsync();
  const float pos = static_cast<float>(a.positions[token]);
  const int64_t slot = kv_heads > 0 ? a.slots[token] : -1;  // negative: a padding row
  for (int j = threadIdx.x; j < half; j += blockDim.x) RopeCosSin(pos, a.inv_freq[j], &sin_s[j], &cos_s[j]);
  WaitAsync<0>();
  __syncthreads();

  const float plus = a.one_plus_weight ? 1.0f : 0.0f;
  for (int head = warp; head < heads; head += kWarps) {
    // A q head is normed with q_norm and rotated, a k head with k_norm, a v head normed
    // (without a weight) if v_norm and not rotated.
    const bool is_q = head < a.q_heads, is_k = !is_q && head < a.q_heads + kv_heads;
    const bf16* w = is_q ? a.q_norm : is_k ? a.k_norm : nullptr;
    const bool norm = is_q || is_k ? w != nullptr : a.v_norm, rope = is_q || is_k;
    bf16* x = q_s + head * dim;  // the three are contiguous
    float r[kPerLane], scale[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      r[j] = i < dim ? __bfloat162float(x[i]) : 0.0f;
      scale[j] = w != nullptr && i < dim ? __bfloat162float(w[i]) + plus : 1.0f;
    }
    MakeHeadReady(r, scale, norm, rope, row, cos_s, sin_s, dim, half, a.eps);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < dim) x[lane + 32 * j] = __float2bfloat16(r[j]);
  }
  __syncthreads();

  uint4* q_out = reinterpret_cast<uint4*>(a.q + token * a.q_heads * dim);
  for (int i = threadIdx.x; i < q_chunks; i += blockDim.x) q_out[i] = reinterpret_cast<const uint4*>(q_s)[i];
  if (slot >= 0) {
    uint4* k_out = reinterpret_cast<uint4*>(a.k_cache + slot * kv_heads * dim);
    uint4* v_out = reinterpret_cast<uint4*>(a.v_cache + slot * kv_heads * dim);
    for (int i = threadIdx.x; i < kv_chunks; i += blockDim.x) {
      k_out[i] = reinterpret_cast<const uint4*>(k_s)[i];
      v_out[i] = reinterpret_cast<const uint4*>(v_s)[i];
    }
  }
}

template <int kPerLane>
void Launch(const NormRopeStoreArgs& a, size_t smem, cudaStream_t stream) {
  AllowDynamicSharedMemory<NormRopeStoreRowsKernel<kPerLane>>(kMaxSharedBytes);
  NormRopeStoreRowsKernel<kPerLane><<<a.tokens, kWarps * 32, smem, stream>>>(a);
}

}  // namespace

void NormRopeStoreRows(const NormRopeStoreArgs& a, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // 16-byte chunks of every row (the fused q/k/v rows' widths and offsets are multiples of
  // 8 whenever the head dim is, and activations and caches are whole allocations).
  const bool chunked = a.dim % 8 == 0 && a.q_stride % 8 == 0 && aligned(a.q_in) && aligned(a.q) &&
                       (a.k == nullptr || (a.kv_stride % 8 == 0 && aligned(a.k) && aligned(a.v) &&
                                           aligned(a.k_cache) && aligned(a.v_cache)));
  const size_t smem = SharedBytes(a);
  if (!chunked || a.dim > 512 || a.rotary_dims > a.dim || smem > kMaxSharedBytes) {
    NormRopeStore(a, stream);  // the same bits, one warp a head
    return;
  }
  if (a.tokens <= 0 || a.q_heads + (a.k != nullptr ? a.kv_heads : 0) <= 0) return;  // nothing to launch
  if (a.dim <= 64) {
    Launch<2>(a, smem, stream);
  } else if (a.dim <= 128) {
    Launch<4>(a, smem, stream);
  } else if (a.dim <= 256) {
    Launch<8>(a, smem, stream);
  } else {
    Launch<16>(a, smem, stream);
  }
}

}  // namespace hsx::cuda
