// Decode-sized Linear: y[m, n] = x[m, k] w[n, k]^T for m <= kGemvMaxRows, streaming each
// weight element from HBM once whatever m. A GEMM library tiles for large m and reaches
// a fraction of the bandwidth here (cuBLASLt ~0.5-2.6 TB/s at m = 1 on an H200).
// A block owns one tile of 16 consecutive weight rows (gemv.cuh has the scheme). A
// layer's q, k and v (and its gate and up) are one weight, concatenated at load, so the
// small k and v matrices add blocks to q's wave instead of launches of their own.
#include "backend/cuda/gemv.cuh"

namespace hsx::cuda {
namespace {

template <typename Out>
__global__ void __launch_bounds__(gemv::kThreads, 2)
    GemvKernel(const bf16* __restrict__ x, int m, const bf16* __restrict__ w, int64_t n, int64_t k, Out* y) {
  AllowDependentLaunch();  // the next kernel may get its blocks resident (programmatic_launch.cuh)
  constexpr int kCols = 8, kOut = gemv::kTileRows * kCols;
  const int64_t row0 = int64_t(blockIdx.x) * gemv::kTileRows;
  __shared__ float totals[kOut];
  const int g = threadIdx.x % 32 / 4;
  const int64_t lo = row0 + g < n ? row0 + g : n - 1, hi = row0 + g + 8 < n ? row0 + g + 8 : n - 1;
  gemv::BlockTileDots(x, m, w + lo * k, w + hi * k, k, totals);
  for (int e = threadIdx.x; e < kOut; e += gemv::kThreads) {
    const int r = e / kCols, i = e % kCols;
    if (i >= m || row0 + r >= n) continue;
    if constexpr (sizeof(Out) == sizeof(float))
      y[i * n + row0 + r] = totals[e];
    else
      y[i * n + row0 + r] = __float2bfloat16(totals[e]);
  }
}

void Launch(const bf16* x, int m, const bf16* w, int64_t n, int64_t k, void* y, bool y_f32, cudaStream_t stream,
            bool programmatic) {
  const dim3 grid(static_cast<unsigned>((n + gemv::kTileRows - 1) / gemv::kTileRows)), block(gemv::kThreads);
  if (y_f32)
    LaunchMaybeProgrammatic(GemvKernel<float>, grid, block, 0, programmatic, stream, x, m, w, n, k,
                            static_cast<float*>(y));
  else
    LaunchMaybeProgrammatic(GemvKernel<bf16>, grid, block, 0, programmatic, stream, x, m, w, n, k,
                            static_cast<bf16*>(y));
}

}  // namespace

bool GemvSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && aligned(x) && aligned(w);
}

void Gemv(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k, void* y, bool y_f32, cudaStream_t stream,
          bool programmatic) {
  static_assert(kGemvMaxRows <= 8, "one mma column per x row");
  if (n > 0) Launch(x, static_cast<int>(m), w, n, k, y, y_f32, stream, programmatic);
}

}  // namespace hsx::cuda
