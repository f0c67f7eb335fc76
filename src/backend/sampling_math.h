// Arithmetic both sampling implementations share, compiled for host and device, so the
// CPU and CUDA backends draw from the same random numbers and cut at the same thresholds.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define HSX_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HSX_HOST_DEVICE inline
#endif

namespace hsx::sampling {

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): a
// counter-based generator, so token i of draw d of a seed gets its number without any
// state; the first of the four output words.
HSX_HOST_DEVICE uint32_t Philox(uint32_t key0, uint32_t key1, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u, kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ key0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ key1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return c0;
}

// Gumbel noise for `token` of a row's draw: argmax(logit + noise) over the kept tokens is
// an exact draw from their softmax. u is in (0, 1) on a 2^-24 grid.
HSX_HOST_DEVICE float Gumbel(uint32_t seed_lo, uint32_t seed_hi, uint32_t draw, int32_t token) {
  const uint32_t bits = Philox(seed_lo, seed_hi, static_cast<uint32_t>(token), draw, 0x68737821u, 0u);
  const float u = (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(-logf(u));
}

// The uniform of draft verification's accept test at a row's draw, from counters the
// Gumbel noise never uses (so the two are independent): 53 bits, in (0, 1) like
// vLLM's float64 uniforms, never 0, so a token of probability 0 is never accepted.
HSX_HOST_DEVICE double AcceptUniform(uint32_t seed_lo, uint32_t seed_hi, uint32_t draw) {
  const uint32_t hi = Philox(seed_lo, seed_hi, 0u, draw, 0x76657269u, 0u) >> 6;  // 26 bits
  const uint32_t lo = Philox(seed_lo, seed_hi, 0u, draw, 0x76657269u, 1u) >> 5;  // 27 bits
  return (static_cast<double>(hi) * 134217728.0 + static_cast<double>(lo) + 0.5) * (1.0 / 9007199254740992.0);
}

// Benchmark-only forced acceptance (VerificationBatch::forced_accept_rate): a Bernoulli(rate)
// draw from the accept test's uniform, so a given seed accepts the same drafts on any backend.
HSX_HOST_DEVICE bool ForcedAccept(uint32_t seed_lo, uint32_t seed_hi, uint32_t draw, float rate) {
  return AcceptUniform(seed_lo, seed_hi, draw) < static_cast<double>(rate);
}

HSX_HOST_DEVICE uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

// A key whose unsigned order is the float order (-inf lowest); NaN is not expected.
HSX_HOST_DEVICE uint32_t OrderedKey(float f) {
  const uint32_t u = FloatBits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Sums of n terms in [0, 1] that decide a threshold or normalise a distribution are taken
// in fixed point with FixedShift(n) fraction bits (n * 2^shift <= 2^63, so they cannot
// overflow): integer sums are exact, so they come out the same in any order, on either
// backend and however a row is split between threads and blocks. Each term is truncated
// to a multiple of 2^-shift (2^-45 at a 151,936-token vocabulary): an f32 weight above
// 2^-21 is kept exactly, and a sum is off by less than n * 2^-shift (7e-9 there).
HSX_HOST_DEVICE int FixedShift(int64_t n) {
  int bits = 0;
  while ((int64_t{1} << bits) < n) ++bits;
  return 63 - bits;
}

// Both are exact up to the truncation: scaling by a power of two loses nothing.
HSX_HOST_DEVICE uint64_t ToFixed(float x, int shift) {
  return static_cast<uint64_t>(x * static_cast<float>(uint64_t{1} << shift));
}
HSX_HOST_DEVICE uint64_t ToFixed(double x, int shift) {
  return static_cast<uint64_t>(x * static_cast<double>(uint64_t{1} << shift));
}

HSX_HOST_DEVICE double FromFixed(uint64_t sum, int shift) {
  return static_cast<double>(sum) / static_cast<double>(uint64_t{1} << shift);
}

// The log-softmax normaliser's pieces: exp(x - top) of one logit as a fixed-point term,
// and the normaliser from their sum.
HSX_HOST_DEVICE uint64_t ExpToFixed(float x, float top, int shift) {
  return ToFixed(exp(static_cast<double>(x) - top), shift);
}
HSX_HOST_DEVICE float LogSumExp(float top, uint64_t sum, int shift) {
  return top + static_cast<float>(log(FromFixed(sum, shift)));
}

// Whether (a, ia) comes before (b, ib) in "highest value, then lowest id" order.
HSX_HOST_DEVICE bool Before(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

}  // namespace hsx::sampling
