#include "model/gguf_dequant.h"

#include <cstring>

#include "tensor/dtype.h"

// Every formula below is gguf.quants' numpy expression written out per element; each f32
// product and sum is rounded on its own (this file is built with -ffp-contract=off).
namespace hsx {
namespace {

constexpr int kQK = 256;  // elements per K-quant super-block

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// Q4_0 / Q4_1: 32 elements, element j < 16 from the low nibble of qs[j], j >= 16 from the
// high nibble of qs[j - 16].
int Nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4; }
// Q5_0 / Q5_1: the fifth bit of element j is bit j of the little-endian qh.
int FifthBit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

void Q4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(Nibble(b + 2, j) - 8);
}
void Q4_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(Nibble(b + 4, j)) + m;
}
void Q5_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>((Nibble(b + 6, j) | FifthBit(b + 2, j) << 4) - 16);
}
void Q5_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(Nibble(b + 8, j) | FifthBit(b + 4, j) << 4) + m;
}
void Q8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K and Q3_K: element e = 128c + 32s + l takes bits 2s..2s+1 of qs[32c + l].
int TwoBits(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3; }

void Q2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = Half(b + 80), dmin = Half(b + 82);
  for (int e = 0; e < kQK; ++e) {
    const float dl = d * static_cast<float>(scales[e / 16] & 0xF);
    const float ml = dmin * static_cast<float>(scales[e / 16] >> 4);
    y[e] = dl * static_cast<float>(TwoBits(qs, e)) - ml;
  }
}

void Q3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* packed = b + 96;
  const float d = Half(b + 108);
  // 16 six-bit scales: low 4 bits from packed[0..7] (low nibbles first), high 2 bits from
  // packed[8..11] (bits 2s..2s+1 of packed[8 + k] for scale 4s + k).
  float dl[16];
  for (int i = 0; i < 16; ++i) {
    const int low = (i < 8 ? packed[i] : packed[i - 8] >> 4) & 0xF;
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    dl[i] = d * static_cast<float>(static_cast<int8_t>(low | high << 4) - 32);
  }
  for (int e = 0; e < kQK; ++e) {
    const int high_bit = (hmask[e % 32] >> (e / 32)) & 1;  // set: no offset of -4
    y[e] = dl[e / 16] * static_cast<float>(TwoBits(qs, e) - ((high_bit ^ 1) << 2));
  }
}

// Q4_K and Q5_K: eight 6-bit scales and mins packed in 12 bytes.
void ScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 0x3F;
    *min = s[j + 4] & 0x3F;
  } else {
    *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    *min = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

// Element e = 32j + l of sub-block j = 2c + h: nibble h of qs[32c + l].
int KNibble(const uint8_t* qs, int e) { return (qs[32 * (e / 64) + e % 32] >> (4 * (e / 32 % 2))) & 0xF; }

void Q4_K(const uint8_t* b, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    ScaleMin(b + 4, j, &sc, &m);
    const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(m);
    for (int e = 32 * j; e < 32 * j + 32; ++e) y[e] = dj * static_cast<float>(KNibble(qs, e)) - mj;
  }
}

void Q5_K(const uint8_t* b, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    ScaleMin(b + 4, j, &sc, &m);
    const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(m);
    for (int e = 32 * j; e < 32 * j + 32; ++e) {
      const int q = KNibble(qs, e) | ((qh[e % 32] >> j) & 1) << 4;
      y[e] = dj * static_cast<float>(q) - mj;
    }
  }
}

void Q6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int e = 0; e < kQK; ++e) {
    const int c = e / 128, r = e % 128;
    const int low = (ql[64 * c + r % 64] >> (4 * (r / 64))) & 0xF;
    const int high = (qh[32 * c + r % 32] >> (2 * (r / 32))) & 3;
    const float ds = d * static_cast<float>(scales[e / 16]);
    y[e] = ds * static_cast<float>(static_cast<int8_t>(low | high << 4) - 32);
  }
}

using BlockFunction = void (*)(const uint8_t*, float*);

BlockFunction BlockFunctionOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return Q4_0;
    case GgmlType::kQ4_1: return Q4_1;
    case GgmlType::kQ5_0: return Q5_0;
    case GgmlType::kQ5_1: return Q5_1;
    case GgmlType::kQ8_0: return Q8_0;
    case GgmlType::kQ2_K: return Q2_K;
    case GgmlType::kQ3_K: return Q3_K;
    case GgmlType::kQ4_K: return Q4_K;
    case GgmlType::kQ5_K: return Q5_K;
    case GgmlType::kQ6_K: return Q6_K;
    default: return nullptr;  // the plain float types
  }
}

}  // namespace

void DequantizeToF32(GgmlType type, const char* src, int64_t n, float* dst) {
  switch (type) {
    case GgmlType::kF32: return ConvertToF32(DType::kF32, src, dst, static_cast<size_t>(n));
    case GgmlType::kF16: return ConvertToF32(DType::kF16, src, dst, static_cast<size_t>(n));
    case GgmlType::kBF16: return ConvertToF32(DType::kBF16, src, dst, static_cast<size_t>(n));
    default: break;
  }
  const BlockFunction block_fn = BlockFunctionOf(type);
  const GgmlBlock block = *GgmlBlockOf(static_cast<uint32_t>(type));
  const auto* b = reinterpret_cast<const uint8_t*>(src);
  for (int64_t k = 0; k < n / block.elements; ++k) block_fn(b + k * block.bytes, dst + k * block.elements);
}

}  // namespace hsx
