// GGUF tensor data to f32: plain floats and ggml's block quantizations, computed exactly as
// the `gguf` Python package's `gguf.quants.dequantize` does (same f32 operations in the same
// order, no fused multiply-adds), so both give the same bits.
#pragma once

#include <cstdint>

#include "model/gguf_file.h"

namespace hsx {

// Dequantizes `n` elements of `type` (a whole number of its blocks, as GgufFile checks) at
// `src` (any alignment) into dst.
void DequantizeToF32(GgmlType type, const char* src, int64_t n, float* dst);

}  // namespace hsx
