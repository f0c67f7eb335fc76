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
// A layer's q, k and v (and its gate and up) are one weight, concatenated at load, so
// the small k and v matrices add blocks to q's wave instead of launches of their own.
#include "backend/cuda/gemv.cuh"

namespace hsx::cuda {
namespace {

using gemv::kRows;

template <int M, typename Out>
__global__ void __launch_bounds__(gemv::kMaxWarps * 32)
    GemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, int64_t n, int64_t k, Out* y) {
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const uint4* wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + r < n ? row0 + r : n - 1;  // past n: a real row, never written
    wrow[r] = reinterpret_cast<const uint4*>(w + row * k);
  }
  __shared__ float totals[gemv::Values(M)];
  gemv::BlockDots<M>(x, wrow, k, totals);
  if (threadIdx.x < M * kRows) {
    const int i = threadIdx.x / kRows, r = threadIdx.x % kRows;
    if (row0 + r < n) {
      if constexpr (sizeof(Out) == sizeof(float))
        y[i * n + row0 + r] = totals[threadIdx.x];
      else
        y[i * n + row0 + r] = __float2bfloat16(totals[threadIdx.x]);
    }
  }
}

template <int M>
void Launch(const bf16* x, const bf16* w, int64_t n, int64_t k, void* y, bool y_f32, cudaStream_t stream,
            bool programmatic) {
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows)), block(gemv::Threads(k));
  if (y_f32)
    LaunchMaybeProgrammatic(GemvKernel<M, float>, grid, block, programmatic, stream, x, w, n, k, static_cast<float*>(y));
  else
    LaunchMaybeProgrammatic(GemvKernel<M, bf16>, grid, block, programmatic, stream, x, w, n, k, static_cast<bf16*>(y));
}

}  // namespace

bool GemvSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && aligned(x) && aligned(w);
}

void Gemv(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k, void* y, bool y_f32, cudaStream_t stream,
          bool programmatic) {
  using Launcher = void (*)(const bf16*, const bf16*, int64_t, int64_t, void*, bool, cudaStream_t, bool);
  static constexpr Launcher kByRows[] = {Launch<1>, Launch<2>, Launch<3>, Launch<4>,
                                         Launch<5>, Launch<6>, Launch<7>, Launch<8>};
  static_assert(sizeof kByRows / sizeof kByRows[0] == kGemvMaxRows);
  if (n > 0) kByRows[m - 1](x, w, n, k, y, y_f32, stream, programmatic);
}

}  // namespace hsx::cuda
