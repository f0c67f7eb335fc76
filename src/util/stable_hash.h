// A hash of bytes that every build and host computes alike (std::hash promises neither):
// FNV-1a 64, then MurmurHash3's 64-bit finalizer, without which FNV's low bits depend
// only on the inputs' low bits and `hash % n` would not spread.
#pragma once

#include <cstdint>
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

}  // namespace hsx
