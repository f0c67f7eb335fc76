// A hash of bytes that every build and host computes alike (std::hash promises neither):
// FNV-1a 64, then MurmurHash3's 64-bit finalizer, without which FNV's low bits depend
// only on the inputs' low bits and `hash % n` would not spread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace hsx {

inline uint64_t StableHash(std::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

// StableHash as 16 lower-case hex digits: the fingerprints files carry (layer contracts).
inline std::string StableHashHex(std::string_view bytes) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(StableHash(bytes)));
  return out;
}

}  // namespace hsx
