#include "engine/sampler.h"

#include <algorithm>

namespace hsx {

std::vector<int32_t> GreedySample(const Tensor& logits) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  std::vector<int32_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data<float>() + r * vocab;
    out.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
  }
  return out;
}

}  // namespace hsx
