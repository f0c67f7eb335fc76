// Element types hsx stores and computes in, and scalar conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace hsx {

// kBool: one byte per element, 0 or 1 (safetensors' BOOL; EAGLE-3's t2d mask).
// kF8E4M3: FP8 weights of --quantization fp8 (tensor/float8.h), each row with its scale.
enum class DType : uint8_t { kF32, kF16, kBF16, kI64, kI32, kBool, kF8E4M3, kU8 };  // kU8: raw bytes (MXFP4 blocks, scales)

size_t DTypeSize(DType dtype);
// Names as safetensors spells them: "F32", "F16", "BF16", "I64", "I32", "BOOL", "F8_E4M3".
std::string_view DTypeName(DType dtype);
std::optional<DType> ParseSafetensorsDType(std::string_view name);
// Names users type on the command line: "float32", "bfloat16", "float16".
std::optional<DType> ParseFloatDTypeName(std::string_view name);

inline float BF16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t F32ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t v);
uint16_t F32ToF16(float f);

// Converts n elements of a float type (F32/F16/BF16) to f32 and back.
void ConvertToF32(DType src_dtype, const void* src, float* dst, size_t n);
void ConvertFromF32(const float* src, DType dst_dtype, void* dst, size_t n);

}  // namespace hsx
