// A request's sampling parameters (vLLM's names and defaults) and the per-step row the
// backend's Sample op takes for a sequence (backend/sampling.h holds the rules).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backend/sampling.h"

namespace hsx {

class Sequence;

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy
  float top_p = 1.0f;               // in (0, 1]
  int top_k = 0;                    // 0 or -1: all tokens
  float min_p = 0.0f;               // in [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1: none
  float frequency_penalty = 0.0f;   // in [-2, 2]
  float presence_penalty = 0.0f;    // in [-2, 2]
  std::optional<uint64_t> seed;     // none: a random one per request
  int logprobs = -1;                // >= 0: keep each generated token's raw logprob and this many top ones
  bool penalized() const { return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f; }
};

// The Sample op's row for seq's next token: its parameters, its seed and the draw index
// (the token's output position, so a recompute draws the same). Appends to `adjust` the
// tokens its penalties touch, and bans `banned` (stop tokens before min_tokens).
SamplingRow MakeSamplingRow(const Sequence& seq, const std::vector<int32_t>& banned, std::vector<TokenAdjust>& adjust);

// The same row for the token after `drafts` (speculative decoding's verification row j,
// drafts = the first j drafts): the draw index and the penalties as if the drafts had
// been generated. MakeSamplingRow is this with no drafts.
SamplingRow MakeSamplingRowAfter(const Sequence& seq, std::span<const int32_t> drafts,
                                 const std::vector<int32_t>& banned, std::vector<TokenAdjust>& adjust);

}  // namespace hsx
