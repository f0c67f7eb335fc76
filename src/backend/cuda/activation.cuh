// The MLP activations on the device, shared by the elementwise kernels and the gated GEMV.
#pragma once

namespace hsx::cuda {

// act 0: SiLU; 1: GELU with the tanh approximation.
__device__ __forceinline__ float Activation(int act, float x) {
  if (act == 0) return x / (1.0f + __expf(-x));
  const float kAlpha = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kAlpha * (x + 0.044715f * x * x * x)));
}

}  // namespace hsx::cuda
