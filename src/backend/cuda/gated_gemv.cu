// The gated MLP's first half at decode sizes in one launch: out[m, n] = act(x gate^T) *
// (x up^T) for m <= kGemvMaxRows, where two GEMVs and the activation kernel were three.
// A block's tile is 8 gate rows (tile rows 0-7) over the same 8 rows of up (8-15), each
// lane's two rows a gate row and its up row, summed exactly as gemv.cu's tiles sum any
// row (gemv.cuh); the products are rounded to bf16 and the activation computed from them
// as the elementwise kernel does: the bits of the unfused path.
#include "backend/cuda/activation.cuh"
#include "backend/cuda/gemv.cuh"

namespace hsx::cuda {
namespace {

constexpr int kOut = gemv::kTileRows / 2;  // output columns per block

__global__ void __launch_bounds__(gemv::kThreads, 2)
    GatedGemvKernel(const bf16* __restrict__ x, int m, const bf16* __restrict__ gate, const bf16* __restrict__ up,
                    int64_t n, int64_t k, int act, bf16* __restrict__ out) {
  AllowDependentLaunch();  // the down projection follows
  constexpr int kCols = 8;
  const int64_t col0 = int64_t(blockIdx.x) * kOut;
  const int g = threadIdx.x % 32 / 4;
  const int64_t col = col0 + g < n ? col0 + g : n - 1;  // past n: a real row, never written
  __shared__ float totals[gemv::kTileRows * kCols];  // gate's rows, then up's
  gemv::BlockTileDots(x, m, gate + col * k, up + col * k, k, totals);
  for (int e = threadIdx.x; e < kOut * kCols; e += gemv::kThreads) {
    const int c = e / kCols, i = e % kCols;
    if (i >= m || col0 + c >= n) continue;
    const float gv = __bfloat162float(__float2bfloat16(totals[e]));
    const float uv = __bfloat162float(__float2bfloat16(totals[kOut * kCols + e]));
    out[i * n + col0 + c] = __float2bfloat16(Activation(act, gv) * uv);
  }
}

void Launch(const bf16* x, int m, const bf16* gate, const bf16* up, int64_t n, int64_t k, int act, bf16* out,
            cudaStream_t stream, bool programmatic) {
  const dim3 grid(static_cast<unsigned>((n + kOut - 1) / kOut)), block(gemv::kThreads);
  LaunchMaybeProgrammatic(GatedGemvKernel, grid, block, 0, programmatic, stream, x, m, gate, up, n, k, act, out);
}

}  // namespace

void GatedGemv(const bf16* x, const bf16* gate_up, int64_t m, int64_t n, int64_t k, int act, bf16* out,
               cudaStream_t stream, bool programmatic) {
  if (n > 0) Launch(x, static_cast<int>(m), gate_up, gate_up + n * k, n, k, act, out, stream, programmatic);
}

}  // namespace hsx::cuda
