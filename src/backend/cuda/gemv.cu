// Decode-sized Linear: y[m, n] = x[m, k] w[n, k]^T for m <= kGemvMaxRows, streaming each
// weight element from HBM once whatever m. A GEMM library tiles for large m and reaches
// a fraction of the bandwidth here (cuBLASLt ~0.5-2.6 TB/s at m = 1 on an H200).
//
// A block owns kRows consecutive weight rows and splits k over all its threads: thread t
// takes the 16-byte chunks t, t + threads, ... of each row, with kUnroll chunks of every
// row loaded before any is used (kRows * kUnroll loads in flight per thread). Each weight
// chunk is multiplied by the same chunk of every x row, so the m rows share one weight
// load; x (at most 8 x 12288 bf16, too big for shared memory beside a useful occupancy)
// is read through the read-only cache, where the blocks of an SM, sweeping k in the same
// order, share it, while weights bypass L1 (no_allocate) so they do not evict it.
// Partial sums are reduced in a fixed order (warp reduce-scatter, then the warps in
// order), so results never depend on timing; the chunk order, the launch shape (set by k)
// and the reduction tree are the same for every m, so neither does a row on m.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace hsx::cuda {
namespace {

constexpr int kRows = 4;  // weight rows per block
constexpr int kMaxWarps = 8;
// 16-byte chunks of each row a thread loads before using any; with the launch's
// k / 512 warps (at most 8) a 4096-wide row is one pass.
constexpr int kUnroll = 2;

// 16 bytes of weights that are read once: no L1 allocation, 256-byte L2 prefetch.
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Eight bf16 (little-endian pairs) to f32: a bf16 is the high half of its f32.
__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Sums each of kWidth values (a power of two <= 32) over the warp; afterwards lane l
// holds value l / (32 / kWidth) in v[0]. Each step hands half of the remaining values to
// the partner lane, so the warp spends kWidth - 1 + 5 - log2(kWidth) shuffles, not 5 per value.
template <int kWidth, int kOffset = 16, int N>
__device__ __forceinline__ void WarpReduceScatter(float (&v)[N], int lane) {
  static_assert((kWidth & (kWidth - 1)) == 0 && kWidth <= 32 && kWidth <= N);
  if constexpr (kOffset > 0) {
    if constexpr (kWidth > 1) {
      constexpr int kHalf = kWidth / 2;
      const bool upper = lane & kOffset;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
      }
      WarpReduceScatter<kHalf, kOffset / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kOffset);
      WarpReduceScatter<1, kOffset / 2>(v, lane);
    }
  }
}

template <int M, typename Out>
__global__ void __launch_bounds__(kMaxWarps * 32)
    GemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, int64_t n, int64_t k, Out* __restrict__ y) {
  // Accumulators padded to a power of two for the reduce-scatter: acc[i * kRows + r].
  static_assert(M >= 1 && M <= 8);
  constexpr int kValues = (M == 1 ? 1 : M == 2 ? 2 : M <= 4 ? 4 : 8) * kRows;
  const int64_t chunks = k / 8;
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const uint4* wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + r < n ? row0 + r : n - 1;  // past n: a real row, never written
    wrow[r] = reinterpret_cast<const uint4*>(w + row * k);
  }
  const uint4* xs = reinterpret_cast<const uint4*>(x);

  float acc[kValues] = {};
  for (int64_t c0 = threadIdx.x; c0 < chunks; c0 += int64_t(kUnroll) * blockDim.x) {
    uint4 wv[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + int64_t(u) * blockDim.x;
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[u][r] = c < chunks ? LoadStreaming(wrow[r] + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + int64_t(u) * blockDim.x;
      if (c >= chunks) break;
      float wf[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) Unpack(wv[u][r], wf[r]);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float xf[8];
        Unpack(__ldg(xs + i * chunks + c), xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[i * kRows + r] = fmaf(wf[r][e], xf[e], acc[i * kRows + r]);
      }
    }
  }

  __shared__ float partial[kMaxWarps][kValues];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  WarpReduceScatter<kValues>(acc, lane);
  const float sum = acc[0];
  constexpr int kLanesPerValue = 32 / kValues;
  if (lane % kLanesPerValue == 0) partial[warp][lane / kLanesPerValue] = sum;
  __syncthreads();
  if (threadIdx.x < kValues) {
    const int i = threadIdx.x / kRows, r = threadIdx.x % kRows;
    float total = 0.0f;
    for (int j = 0; j < int(blockDim.x / 32); ++j) total += partial[j][threadIdx.x];
    if (i < M && row0 + r < n) {
      if constexpr (sizeof(Out) == sizeof(float))
        y[i * n + row0 + r] = total;
      else
        y[i * n + row0 + r] = __float2bfloat16(total);
    }
  }
}

template <int M>
void Launch(const bf16* x, const bf16* w, int64_t n, int64_t k, void* y, bool y_f32, cudaStream_t stream) {
  // kUnroll chunks per thread per row at least: short rows take fewer warps.
  const int warps = static_cast<int>(std::clamp<int64_t>(k / 8 / (32 * kUnroll), 1, kMaxWarps));
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows)), block(warps * 32);
  if (y_f32)
    GemvKernel<M, float><<<grid, block, 0, stream>>>(x, w, n, k, static_cast<float*>(y));
  else
    GemvKernel<M, bf16><<<grid, block, 0, stream>>>(x, w, n, k, static_cast<bf16*>(y));
}

}  // namespace

bool GemvSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && aligned(x) && aligned(w);
}

void Gemv(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k, void* y, bool y_f32, cudaStream_t stream) {
  using Launcher = void (*)(const bf16*, const bf16*, int64_t, int64_t, void*, bool, cudaStream_t);
  static constexpr Launcher kByRows[] = {Launch<1>, Launch<2>, Launch<3>, Launch<4>,
                                         Launch<5>, Launch<6>, Launch<7>, Launch<8>};
  static_assert(sizeof kByRows / sizeof kByRows[0] == kGemvMaxRows);
  if (n > 0) kByRows[m - 1](x, w, n, k, y, y_f32, stream);
}

}  // namespace hsx::cuda
