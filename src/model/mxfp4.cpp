#include "model/mxfp4.h"

#include <cmath>

namespace hsx {

void DequantizeMxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t k, float* out) {
  static constexpr float kFp4[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const int64_t groups = k / kMxfp4BlockSize;
  for (int64_t g = 0; g < rows * groups; ++g) {
    const int exponent = static_cast<int>(scales[g]) - 127;
    const uint8_t* b = blocks + g * (kMxfp4BlockSize / 2);
    float* o = out + g * kMxfp4BlockSize;
    for (int64_t i = 0; i < kMxfp4BlockSize / 2; ++i) {
      o[2 * i] = std::ldexp(kFp4[b[i] & 0x0f], exponent);
      o[2 * i + 1] = std::ldexp(kFp4[b[i] >> 4], exponent);
    }
  }
}

}  // namespace hsx
