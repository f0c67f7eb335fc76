// Picks the next token from logits rows.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace hsx {

// Argmax of each row of host f32 logits [R, V]; ties go to the lowest id, as torch.argmax.
std::vector<int32_t> GreedySample(const Tensor& logits);

}  // namespace hsx
