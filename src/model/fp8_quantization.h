// --quantization fp8: the target's decoder projections as FP8 E4M3 with per-channel
// scales, quantized at load from the checkpoint's weights (the Backend's rule). The
// matmuls that carry nearly all of the FLOPs and bytes run on FP8 tensor cores;
// embeddings, norms and the LM head stay in the compute dtype, as vLLM's fp8 does.
#pragma once

#include "backend/backend.h"
#include "model/weights.h"
#include "util/status.h"

namespace hsx {

// Quantizes q/k/v/o and the dense MLP's gate/up/down of every layer. MoE experts and
// Gemma 4's per-layer-input projections stay unquantized (named in the docs).
Status QuantizeLinearWeightsFp8(ModelWeights& weights, Backend& backend);

}  // namespace hsx
