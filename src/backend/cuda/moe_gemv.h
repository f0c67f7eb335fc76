// The MoE expert pass at decode sizes with no host synchronization (moe_gemv.cu), for
// cuda_moe.cpp; the experts' weights are separate tensors whose pointers travel by value in
// the launches (CUDA 12.1+ takes kernel parameters of up to 32 KB).
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace hsx::cuda {

constexpr int kMoeGemvMaxExperts = 256;
struct MoeExpertPointers {
  const bf16* w[kMoeGemvMaxExperts];
};
struct MoeActivation {
  int act;                          // GatedActivation's: 0 SiLU, 1 GELU (tanh)
  float swiglu_limit, swiglu_alpha;  // limit > 0: gpt-oss's clamped SwiGLU instead (MoeSpec)
};
// Whether the grouped GEMVs take a layer: experts <= kMoeGemvMaxExperts, widths multiples of 8.
bool MoeGemvSupports(int experts, int64_t hidden, int64_t inter);
// counts int32 [E] (MoeRoute's) -> offsets [E + 1] (exclusive prefix sum), cursor [E]
// (MoePermute's, = offsets), active [E + 1]: the experts with rows in id order, then how many.
void MoeOffsets(const int32_t* counts, int experts, int32_t* offsets, int32_t* cursor, int32_t* active,
                cudaStream_t stream);
// For the rows of each active expert e (xs [pairs, k] sorted by expert, e's from
// offsets[e]): out [pairs, n] = act(bf16(x gate_e^T) + gate_bias[e], bf16(x up_e^T) +
// up_bias[e]), each sum rounded to bf16 as the grouped-GEMM path's kernels round them
// (biases may be null). Gate and up [n, k] per expert; 16-byte aligned.
void MoeGatedGemv(const bf16* xs, const MoeExpertPointers& gate, const MoeExpertPointers& up, const bf16* gate_bias,
                  const bf16* up_bias, const int32_t* offsets, const int32_t* active, int experts, int64_t pairs,
                  int64_t n, int64_t k, const MoeActivation& act, bf16* out, cudaStream_t stream);
// y [pairs, n] = bf16(x w_e^T) + bias[e] (rounded again; bias may be null), w_e [n, k].
void MoeGemv(const bf16* xs, const MoeExpertPointers& w, const bf16* bias, const int32_t* offsets,
             const int32_t* active, int experts, int64_t pairs, int64_t n, int64_t k, bf16* y, cudaStream_t stream);

#ifdef __CUDACC__
// gpt-oss's clamped SwiGLU of one (gate, up) pair (backend.h's MoeSpec), for both MoE paths.
__device__ __forceinline__ float ClampedSwigluValue(float gate, float up, float limit, float alpha) {
  const float g = gate > limit ? limit : gate;
  const float u = up < -limit ? -limit : (up > limit ? limit : up);
  return (u + 1.0f) * (g / (1.0f + __expf(-alpha * g)));
}
#endif

}  // namespace hsx::cuda
