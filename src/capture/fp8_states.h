// hs-connectors' FP8 hidden-state files (hs_connectors.fp8_utils, read back by its
// FP8Transfer): one f32 scale per token over all its layers and features, amax / 448
// clamped to at least 1e-12, and each value x / scale rounded to E4M3 (nearest even).
// A reader multiplies back: about half the bytes of bf16 per token.
#pragma once

#include "tensor/tensor.h"

namespace hsx {

struct Fp8States {
  Tensor values;  // F8_E4M3 [T, L, H]
  Tensor scales;  // F32 [T, 1, 1]
};

// hidden_states: host [T, L, H] in any float dtype, finite (the engine refuses others).
Fp8States QuantizeStatesFp8(const Tensor& hidden_states);

}  // namespace hsx
