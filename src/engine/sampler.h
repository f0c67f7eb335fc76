// Picks the next token from a row of logits: greedy, or temperature / top-k / top-p
// sampling with a per-request seeded generator.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace hsx {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // keep the smallest set of tokens whose probability reaches top_p
  int top_k = 0;             // 0 or -1: all tokens
  std::optional<uint64_t> seed;
  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
};

// One token from one row of `vocab` logits; greedy ties go to the lowest id, as torch.argmax.
int32_t Sample(const float* logits, int vocab, const SamplingParams& params, std::mt19937_64& rng);

// Makes `ids` unsampleable in a row of logits (min_tokens holds back stop tokens this way).
void SuppressTokens(float* logits, int vocab, const std::vector<int32_t>& ids);

}  // namespace hsx
