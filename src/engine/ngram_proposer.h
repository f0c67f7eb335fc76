// Prompt lookup ("ngram" speculative decoding, vLLM's NgramProposer): drafts are the
// tokens that followed an earlier occurrence of the sequence's own suffix, so a model
// copying spans of its prompt (or of what it wrote) gets them proposed for free.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "util/status.h"

namespace hsx {

// vLLM's {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": a,
// "prompt_lookup_max": b}.
struct NgramConfig {
  int num_speculative_tokens = 0;
  int prompt_lookup_min = 0;
  int prompt_lookup_max = 0;
};

class NgramProposer {
 public:
  // K >= 1 and 1 <= a <= b, or an error naming the field.
  static Result<NgramProposer> Create(const NgramConfig& config, int64_t max_model_len);

  // vLLM's semantics: the longest suffix of `tokens` of length n in [a, b] that also
  // occurs earlier (an occurrence may overlap the suffix, but must end before the last
  // token); among occurrences of that length the earliest; the up-to-K tokens after it,
  // and never past max_model_len. Empty when nothing matches. O(tokens) time and O(b)
  // memory: a Knuth-Morris-Pratt scan of the reversed tokens for the reversed suffix.
  std::vector<int32_t> Propose(std::span<const int32_t> tokens) const;

 private:
  NgramProposer(const NgramConfig& config, int64_t max_model_len) : config_(config), max_model_len_(max_model_len) {}
  NgramConfig config_;
  int64_t max_model_len_;
};

}  // namespace hsx
