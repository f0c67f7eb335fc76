#include "model/fp8_quantization.h"

#include <string>

namespace hsx {

Status QuantizeLinearWeightsFp8(ModelWeights& weights, Backend& backend) {
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    LayerWeights& layer = weights.layers[l];
    const std::pair<const char*, Tensor*> projections[] = {
        {"qkv_proj", &layer.qkv_proj}, {"o_proj", &layer.o_proj}, {"gate_up_proj", &layer.gate_up_proj},
        {"down_proj", &layer.down_proj}};
    for (const auto& [name, w] : projections) {
      if (!w->defined() || w->dtype() == DType::kF8E4M3) continue;  // absent, or FP8 in the checkpoint
      // FP8 GEMMs read 16-byte rows (cuBLASLt's requirement on Hopper).
      if (w->size(1) % 16 != 0) {
        return Error("--quantization fp8: layer " + std::to_string(l) + " " + name + " has " +
                     std::to_string(w->size(1)) + " input features, which FP8 GEMMs need as a multiple of 16");
      }
      *w = backend.QuantizeRowsFp8(*w);
    }
  }
  return Status();
}

}  // namespace hsx
