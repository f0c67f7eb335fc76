// The MoE expert pass at decode sizes with no host synchronization (cuda_moe.cpp), so a
// step with MoE layers can be recorded as a CUDA graph: the experts' row ranges are a
// prefix sum on the device, and the expert GEMMs are grouped GEMVs whose grid is (output
// tile, active expert) and whose blocks read their expert's rows from those offsets.
//
// A block owns one tile of an expert's weight rows (gemv.cuh's BlockTileDots, on mma.sync)
// and runs it over all of that expert's rows, 8 at a time: the first 8 stream the tile from
// memory, further ones find it in L2. So a step reads each expert it uses once, however many
// of its tokens chose it (batch 32 of 32 experts top-4: each expert once, not once a pair).
// A row's sums involve only its own x row, in an order fixed by the tile's shape: a token's
// result does not depend on the other tokens or their routing (batch invariant).
#include "backend/cuda/activation.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/moe_gemv.h"

namespace hsx::cuda {
namespace {

// counts [E] -> offsets [E + 1] (exclusive prefix sum), cursor [E] (= offsets, for
// MoePermute), active [E] (the experts with rows, in id order) and active[E] = how many.
// One warp: each lane sums a run of consecutive experts, a warp scan joins the runs.
__global__ void MoeOffsetsKernel(const int32_t* counts, int experts, int32_t* offsets, int32_t* cursor,
                                 int32_t* active) {
  const int lane = threadIdx.x;
  const int per = (experts + 31) / 32, begin = min(experts, lane * per), end = min(experts, begin + per);
  int sum = 0, used = 0;
  for (int e = begin; e < end; ++e) {
    sum += counts[e];
    used += counts[e] > 0;
  }
  int rows = sum, slots = used;  // inclusive scans over the lanes
  for (int o = 1; o < 32; o <<= 1) {
    const int r = __shfl_up_sync(0xffffffff, rows, o), s = __shfl_up_sync(0xffffffff, slots, o);
    if (lane >= o) {
      rows += r;
      slots += s;
    }
  }
  int row = rows - sum, slot = slots - used;
  for (int e = begin; e < end; ++e) {
    offsets[e] = row;
    cursor[e] = row;
    if (counts[e] > 0) active[slot++] = e;
    row += counts[e];
  }
  if (lane == 31) {
    offsets[experts] = rows;
    active[experts] = slots;
  }
}

// The expert of grid row blockIdx.y and its rows [begin, end); false: no such expert.
__device__ __forceinline__ bool ExpertRows(const int32_t* offsets, const int32_t* active, int experts, int& e,
                                           int& begin, int& end) {
  if (static_cast<int>(blockIdx.y) >= active[experts]) return false;
  e = active[blockIdx.y];
  begin = offsets[e];
  end = offsets[e + 1];
  return true;
}

// out[r, c] = act(bf16(x_r . gate_e[c]) (+ bias), bf16(x_r . up_e[c]) (+ bias)) for the rows r
// of each expert e: tile rows 0-7 are 8 gate rows, 8-15 the same rows of up (gated_gemv.cu's
// tile). Roundings as the grouped-GEMM path's: each product to bf16, then each bias sum,
// then the activation.
__global__ void __launch_bounds__(gemv::kThreads, 2)
    MoeGatedGemvKernel(const bf16* __restrict__ xs, MoeExpertPointers gate, MoeExpertPointers up,
                       const bf16* gate_bias, const bf16* up_bias, const int32_t* offsets, const int32_t* active,
                       int experts, int64_t n, int64_t k, MoeActivation act, bf16* __restrict__ out) {
  constexpr int kOut = gemv::kTileRows / 2, kCols = 8;
  int e, begin, end;
  if (!ExpertRows(offsets, active, experts, e, begin, end)) return;
  const int64_t col0 = int64_t(blockIdx.x) * kOut;
  const int g = threadIdx.x % 32 / 4;
  const int64_t col = col0 + g < n ? col0 + g : n - 1;  // past n: a real row, never written
  __shared__ float totals[gemv::kTileRows * kCols];
  for (int r0 = begin; r0 < end; r0 += kCols) {
    const int m = min(kCols, end - r0);
    gemv::BlockTileDots(xs + int64_t(r0) * k, m, gate.w[e] + col * k, up.w[e] + col * k, k, totals);
    for (int i = threadIdx.x; i < kOut * kCols; i += gemv::kThreads) {
      const int c = i / kCols, row = i % kCols;
      if (row >= m || col0 + c >= n) continue;
      float gv = __bfloat162float(__float2bfloat16(totals[i]));
      float uv = __bfloat162float(__float2bfloat16(totals[kOut * kCols + i]));
      if (gate_bias != nullptr) gv = __bfloat162float(__float2bfloat16(gv + __bfloat162float(gate_bias[e * n + col0 + c])));
      if (up_bias != nullptr) uv = __bfloat162float(__float2bfloat16(uv + __bfloat162float(up_bias[e * n + col0 + c])));
      const float y = act.swiglu_limit > 0.0f ? ClampedSwigluValue(gv, uv, act.swiglu_limit, act.swiglu_alpha)
                                              : Activation(act.act, gv) * uv;
      out[(int64_t(r0) + row) * n + col0 + c] = __float2bfloat16(y);
    }
  }
}

// y[r, c] = bf16(x_r . w_e[c]) (+ bias, rounded again) for the rows r of each expert e.
__global__ void __launch_bounds__(gemv::kThreads, 2)
    MoeGemvKernel(const bf16* __restrict__ xs, MoeExpertPointers w, const bf16* bias, const int32_t* offsets,
                  const int32_t* active, int experts, int64_t n, int64_t k, bf16* __restrict__ y) {
  constexpr int kCols = 8, kOut = gemv::kTileRows * kCols;
  int e, begin, end;
  if (!ExpertRows(offsets, active, experts, e, begin, end)) return;
  const int64_t row0 = int64_t(blockIdx.x) * gemv::kTileRows;
  const int g = threadIdx.x % 32 / 4;
  const int64_t lo = row0 + g < n ? row0 + g : n - 1, hi = row0 + g + 8 < n ? row0 + g + 8 : n - 1;
  __shared__ float totals[kOut];
  for (int r0 = begin; r0 < end; r0 += kCols) {
    const int m = min(kCols, end - r0);
    gemv::BlockTileDots(xs + int64_t(r0) * k, m, w.w[e] + lo * k, w.w[e] + hi * k, k, totals);
    for (int i = threadIdx.x; i < kOut; i += gemv::kThreads) {
      const int c = i / kCols, row = i % kCols;
      if (row >= m || row0 + c >= n) continue;
      float v = __bfloat162float(__float2bfloat16(totals[i]));
      if (bias != nullptr) v += __bfloat162float(bias[e * n + row0 + c]);
      y[(int64_t(r0) + row) * n + row0 + c] = __float2bfloat16(v);
    }
  }
}

unsigned Tiles(int64_t n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

bool MoeGemvSupports(int experts, int64_t hidden, int64_t inter) {
  return experts >= 1 && experts <= kMoeGemvMaxExperts && hidden > 0 && hidden % 8 == 0 && inter > 0 &&
         inter % 8 == 0;
}

void MoeOffsets(const int32_t* counts, int experts, int32_t* offsets, int32_t* cursor, int32_t* active,
                cudaStream_t stream) {
  MoeOffsetsKernel<<<1, 32, 0, stream>>>(counts, experts, offsets, cursor, active);
}

void MoeGatedGemv(const bf16* xs, const MoeExpertPointers& gate, const MoeExpertPointers& up, const bf16* gate_bias,
                  const bf16* up_bias, const int32_t* offsets, const int32_t* active, int experts, int64_t pairs,
                  int64_t n, int64_t k, const MoeActivation& act, bf16* out, cudaStream_t stream) {
  const int64_t slots = pairs < experts ? pairs : experts;  // at most this many experts have rows
  if (slots == 0 || n == 0) return;
  const dim3 grid(Tiles(n, gemv::kTileRows / 2), static_cast<unsigned>(slots));
  MoeGatedGemvKernel<<<grid, gemv::kThreads, 0, stream>>>(xs, gate, up, gate_bias, up_bias, offsets, active, experts,
                                                          n, k, act, out);
}

void MoeGemv(const bf16* xs, const MoeExpertPointers& w, const bf16* bias, const int32_t* offsets,
             const int32_t* active, int experts, int64_t pairs, int64_t n, int64_t k, bf16* y, cudaStream_t stream) {
  const int64_t slots = pairs < experts ? pairs : experts;
  if (slots == 0 || n == 0) return;
  const dim3 grid(Tiles(n, gemv::kTileRows), static_cast<unsigned>(slots));
  MoeGemvKernel<<<grid, gemv::kThreads, 0, stream>>>(xs, w, bias, offsets, active, experts, n, k, y);
}

}  // namespace hsx::cuda
