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
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if (std::isnan(f)) return static_cast<uint8_t>(sign | 0x7f);
  const float a = std::fabs(f);
  if (a >= kF8E4M3Max) return static_cast<uint8_t>(sign | 0x7e);  // saturate (infinities too)
  // The spacing of representable values around a: 2^-9 below the first normal (2^-6),
  // else 2^(floor(log2 a) - 3). a / spacing is exact (a power-of-two scaling), and
  // nearbyint rounds it to nearest even under the default rounding mode.
  int exp2 = 0;
  std::frexp(a, &exp2);  // a = frac * 2^exp2, frac in [0.5, 1)
  const int spacing_exp = exp2 - 1 < -6 ? -9 : exp2 - 1 - 3;
  const float units = std::nearbyint(std::ldexp(a, -spacing_exp));  // the value in units of the spacing
  const float rounded = std::ldexp(units, spacing_exp);
  if (rounded >= kF8E4M3Max) return static_cast<uint8_t>(sign | 0x7e);
  if (rounded < std::ldexp(1.0f, -6)) return static_cast<uint8_t>(sign | static_cast<uint8_t>(units));  // subnormal
  int e = 0;
  const float frac = std::frexp(rounded, &e);  // rounded = frac * 2^e, frac in [0.5, 1)
  const int mantissa = static_cast<int>(std::ldexp(frac, 4)) - 8;  // frac * 16 in [8, 16)
  return static_cast<uint8_t>(sign | ((e - 1 + 7) << 3) | mantissa);
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
