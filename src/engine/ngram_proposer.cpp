#include "engine/ngram_proposer.h"

#include <algorithm>
#include <string>

namespace hsx {

Result<NgramProposer> NgramProposer::Create(const NgramConfig& config, int64_t max_model_len) {
  if (config.num_speculative_tokens < 1) {
    return Error("speculative-config: num_speculative_tokens must be >= 1, got " +
                 std::to_string(config.num_speculative_tokens));
  }
  if (config.prompt_lookup_min < 1) {
    return Error("speculative-config: prompt_lookup_min must be >= 1, got " + std::to_string(config.prompt_lookup_min));
  }
  if (config.prompt_lookup_max < config.prompt_lookup_min) {
    return Error("speculative-config: prompt_lookup_min=" + std::to_string(config.prompt_lookup_min) +
                 " must be <= prompt_lookup_max=" + std::to_string(config.prompt_lookup_max));
  }
  return NgramProposer(config, max_model_len);
}

std::vector<int32_t> NgramProposer::Propose(std::span<const int32_t> tokens) const {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t k = std::min<int64_t>(config_.num_speculative_tokens, max_model_len_ - n);
  // The pattern is the suffix read backwards; an occurrence must end before the last
  // token, so it is at most n - 1 long.
  const int64_t m = std::min<int64_t>(config_.prompt_lookup_max, n - 1);
  if (k <= 0 || m < config_.prompt_lookup_min) return {};
  auto pattern = [&](int64_t t) { return tokens[n - 1 - t]; };  // pattern(t) = text(t)

  // border[t]: the longest proper prefix of pattern[0, t] that is also its suffix.
  std::vector<int32_t> border(static_cast<size_t>(m), 0);
  for (int64_t t = 1, len = 0; t < m;) {
    if (pattern(t) == pattern(len)) {
      border[t++] = static_cast<int32_t>(++len);
    } else if (len > 0) {
      len = border[len - 1];
    } else {
      border[t++] = 0;
    }
  }

  // Scan the reversed tokens from the second on: `len` is the longest prefix of the
  // pattern ending at i, i.e. the longest suffix of `tokens` occurring at n - 1 - i.
  // Later i are earlier occurrences, so ">=" keeps the earliest of the longest.
  int64_t best = 0, best_i = 0;
  for (int64_t i = 1, len = 0; i < n; ++i) {
    while (len > 0 && pattern(len) != pattern(i)) len = border[len - 1];
    if (pattern(len) != pattern(i)) continue;
    if (++len >= best) best = len, best_i = i;
    if (len == m) len = border[m - 1];
  }
  if (best < config_.prompt_lookup_min) return {};
  const int64_t next = n - 1 - best_i + best;  // the first token after the occurrence
  const int64_t count = std::min(k, n - next);
  return {tokens.begin() + next, tokens.begin() + next + count};
}

}  // namespace hsx
