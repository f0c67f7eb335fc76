// MXFP4 (OCP microscaling FP4), the form of gpt-oss's expert weights: blocks of 32 values
// sharing one E8M0 scale (a power of two, 2^(s - 127)), each value an FP4 e2m1 code (sign,
// 2 exponent bits, 1 mantissa bit: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}), two codes a byte with
// the lower-indexed value in the low nibble. Dequantized as transformers'
// convert_moe_packed_tensors does: code value times 2^(s - 127) (ldexp).
#pragma once

#include <cstdint>

namespace hsx {

constexpr int64_t kMxfp4BlockSize = 32;

// out [rows, k] (f32) from blocks [rows, k / 32, 16] and scales [rows, k / 32]; k % 32 == 0.
void DequantizeMxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t k, float* out);

}  // namespace hsx
