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
// One launch may cover up to three weights of one x (a layer's q, k and v projections):
// the blocks take the weights in turn, so the small k and v matrices add blocks to q's
// wave instead of running as launches of their own with a few blocks per SM.
#include "backend/cuda/gemv.cuh"

namespace hsx::cuda {
namespace {

using gemv::kRows;

template <int M, typename Out>
__global__ void __launch_bounds__(gemv::kMaxWarps * 32)
    GemvKernel(const bf16* __restrict__ x, int64_t k, GemvWeights ws) {
  // The weight this block reads: blocks [first_block[s], first_block[s + 1]) take weight s.
  int s = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxWeights; ++i) s += i < ws.count && blockIdx.x >= ws.first_block[i];
  const bf16* w = s == 0 ? ws.w[0] : s == 1 ? ws.w[1] : ws.w[2];
  Out* y = static_cast<Out*>(s == 0 ? ws.y[0] : s == 1 ? ws.y[1] : ws.y[2]);
  const int64_t n = s == 0 ? ws.n[0] : s == 1 ? ws.n[1] : ws.n[2];
  const int64_t row0 = int64_t(blockIdx.x - (s == 0 ? 0u : s == 1 ? ws.first_block[1] : ws.first_block[2])) * kRows;
  static_assert(kGemvMaxWeights == 3);
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
void Launch(const bf16* x, int64_t k, const GemvWeights& ws, bool y_f32, cudaStream_t stream, bool programmatic) {
  const dim3 grid(ws.first_block[ws.count]), block(gemv::Threads(k));
  if (y_f32)
    LaunchMaybeProgrammatic(GemvKernel<M, float>, grid, block, programmatic, stream, x, k, ws);
  else
    LaunchMaybeProgrammatic(GemvKernel<M, bf16>, grid, block, programmatic, stream, x, k, ws);
}

}  // namespace

bool GemvSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && aligned(x) && aligned(w);
}

void Gemv(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k, void* y, bool y_f32, cudaStream_t stream,
          bool programmatic) {
  GemvWeights ws;
  ws.w[0] = w;
  ws.n[0] = n;
  ws.y[0] = y;
  ws.count = 1;
  GemvMany(x, m, k, ws, y_f32, stream, programmatic);
}

void GemvMany(const bf16* x, int64_t m, int64_t k, GemvWeights ws, bool y_f32, cudaStream_t stream,
              bool programmatic) {
  using Launcher = void (*)(const bf16*, int64_t, const GemvWeights&, bool, cudaStream_t, bool);
  static constexpr Launcher kByRows[] = {Launch<1>, Launch<2>, Launch<3>, Launch<4>,
                                         Launch<5>, Launch<6>, Launch<7>, Launch<8>};
  static_assert(sizeof kByRows / sizeof kByRows[0] == kGemvMaxRows);
  ws.first_block[0] = 0;
  for (int i = 0; i < ws.count; ++i) ws.first_block[i + 1] = ws.first_block[i] + static_cast<unsigned>((ws.n[i] + kRows - 1) / kRows);
  if (ws.first_block[ws.count] > 0) kByRows[m - 1](x, k, ws, y_f32, stream, programmatic);
}

}  // namespace hsx::cuda
