// OCP FP8 E4M3 ("e4m3fn": no infinities, one NaN pattern per sign, max finite 448), the
// format of H100/H200 FP8 tensor cores and of torch.float8_e4m3fn. Conversions from f32
// round to nearest even and saturate to +-448, as CUDA's __nv_cvt_float_to_fp8 with
// __NV_SATFINITE does, so host and device quantize identically.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace hsx {

inline constexpr float kF8E4M3Max = 448.0f;

inline float F8E4M3ToF32(uint8_t v) {
  const float sign = (v & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (v >> 3) & 0xf;
  const int mantissa = v & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m * 2^-9
  return sign * std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);     // (1 + m/8) * 2^(e-7)
}

inline uint8_t F32ToF8E4M3(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  // Every case is computed and one is selected, with no branch, so loops over rows
  // vectorize (with -fno-trapping-math, which the quantizing files build with).
  // Below the first normal (2^-6): units of the subnormal spacing 2^-9; a * 512 is exact
  // and adding then subtracting 2^23 rounds it to nearest even (the default mode); 8 units
  // is the first normal's code.
  float a;
  std::memcpy(&a, &magnitude, 4);
  const float scaled = a * 512.0f;
  const float units = scaled < 16.0f ? scaled : 16.0f;  // bounded (NaN too) so the conversion is defined
  const uint32_t subnormal = static_cast<uint32_t>(static_cast<int32_t>((units + 8388608.0f) - 8388608.0f));
  // A normal: the f32 exponent and top 3 mantissa bits, rounded to nearest even on the
  // 20 bits dropped (a carry moves into the exponent, as it should), exponent rebiased
  // from 127 to 7, clamped to 448.
  const uint32_t rounded = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20;
  const uint32_t unclamped = rounded - ((127u - 7u) << 3);
  const uint32_t normal = unclamped > 0x7eu ? 0x7eu : unclamped;  // (std::min, by reference, does not vectorize)
  uint32_t code = magnitude < 0x3c800000u ? subnormal : normal;
  code = magnitude >= 0x43e00000u ? 0x7eu : code;  // >= 448 and infinities saturate
  code = magnitude > 0x7f800000u ? 0x7fu : code;   // NaN
  return static_cast<uint8_t>(sign | code);
}

// Quantizes one row for an FP8 GEMM (per-channel weights, per-token activations), the
// rule the CPU and CUDA backends share: the row's largest magnitude maps to 448.
// Writes n codes and returns the scale that multiplies them back (absmax / 448; 1 for an
// all-zero row).
inline float QuantizeRowF8E4M3(const float* x, int64_t n, uint8_t* q) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
  const float inv = absmax > 0.0f ? kF8E4M3Max / absmax : 1.0f;
  for (int64_t i = 0; i < n; ++i) q[i] = F32ToF8E4M3(x[i] * inv);
  return absmax > 0.0f ? absmax / kF8E4M3Max : 1.0f;
}

}  // namespace hsx
