// The gated MLP's first half at decode sizes in one launch: out[m, n] = act(x gate^T) *
// (x up^T) for m <= kGemvMaxRows, where two GEMVs and the activation kernel were three.
// A block takes kRows / 2 rows of gate and the same rows of up as its kRows weight rows
// (gemv.cuh), so each product is summed exactly as the plain GEMV sums it (the same
// chunks, launch shape and reduction tree), rounded to bf16, and the activation is
// computed from those as the elementwise kernel does: the bits of the unfused path.
#include "backend/cuda/activation.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/programmatic_launch.cuh"

namespace hsx::cuda {
namespace {

constexpr int kOut = gemv::kRows / 2;  // output columns per block

template <int M>
__global__ void __launch_bounds__(gemv::kMaxWarps * 32)
    GatedGemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ gate, const bf16* __restrict__ up, int64_t n,
                    int64_t k, int act, bf16* __restrict__ out) {
  AllowDependentLaunch();  // the down projection follows
  const int64_t col0 = int64_t(blockIdx.x) * kOut;
  const uint4* wrow[gemv::kRows];
#pragma unroll
  for (int r = 0; r < gemv::kRows; ++r) {
    const int64_t col = col0 + r % kOut < n ? col0 + r % kOut : n - 1;  // past n: a real row, never written
    wrow[r] = reinterpret_cast<const uint4*>((r < kOut ? gate : up) + col * k);
  }
  __shared__ float totals[gemv::Values(M)];
  gemv::BlockDots<M>(x, wrow, k, totals);
  if (threadIdx.x < M * kOut) {
    const int i = threadIdx.x / kOut, c = threadIdx.x % kOut;
    if (col0 + c < n) {
      const float g = __bfloat162float(__float2bfloat16(totals[i * gemv::kRows + c]));
      const float u = __bfloat162float(__float2bfloat16(totals[i * gemv::kRows + kOut + c]));
      out[i * n + col0 + c] = __float2bfloat16(Activation(act, g) * u);
    }
  }
}

template <int M>
void Launch(const bf16* x, const bf16* gate, const bf16* up, int64_t n, int64_t k, int act, bf16* out,
            cudaStream_t stream, bool programmatic) {
  const dim3 grid(static_cast<unsigned>((n + kOut - 1) / kOut)), block(gemv::Threads(k));
  LaunchMaybeProgrammatic(GatedGemvKernel<M>, grid, block, programmatic, stream, x, gate, up, n, k, act, out);
}

}  // namespace

void GatedGemv(const bf16* x, const bf16* gate_up, int64_t m, int64_t n, int64_t k, int act, bf16* out,
               cudaStream_t stream, bool programmatic) {
  using Launcher = void (*)(const bf16*, const bf16*, const bf16*, int64_t, int64_t, int, bf16*, cudaStream_t, bool);
  static constexpr Launcher kByRows[] = {Launch<1>, Launch<2>, Launch<3>, Launch<4>,
                                         Launch<5>, Launch<6>, Launch<7>, Launch<8>};
  static_assert(sizeof kByRows / sizeof kByRows[0] == kGemvMaxRows);
  if (n > 0) kByRows[m - 1](x, gate_up, gate_up + n * k, n, k, act, out, stream, programmatic);
}

}  // namespace hsx::cuda
