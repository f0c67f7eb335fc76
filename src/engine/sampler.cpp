#include "engine/sampler.h"

#include <algorithm>
#include <unordered_map>

#include "engine/sequence.h"

namespace hsx {

SamplingRow MakeSamplingRow(const Sequence& seq, const std::vector<int32_t>& banned, std::vector<TokenAdjust>& adjust) {
  return MakeSamplingRowAfter(seq, {}, banned, adjust);
}

SamplingRow MakeSamplingRowAfter(const Sequence& seq, std::span<const int32_t> drafts,
                                 const std::vector<int32_t>& banned, std::vector<TokenAdjust>& adjust) {
  const SamplingParams& p = seq.request().sampling;
  SamplingRow row;
  row.temperature = p.top_k == 1 ? 0.0f : p.temperature;
  row.top_p = p.top_p;
  row.top_k = p.top_k;
  row.min_p = p.min_p;
  row.repetition_penalty = p.repetition_penalty;
  row.frequency_penalty = p.frequency_penalty;
  row.presence_penalty = p.presence_penalty;
  row.seed_lo = static_cast<uint32_t>(seq.seed());
  row.seed_hi = static_cast<uint32_t>(seq.seed() >> 32);
  row.draw = static_cast<uint32_t>(seq.num_generated() + drafts.size());
  row.num_logprobs = std::max(0, p.logprobs);
  row.adjust_begin = static_cast<int32_t>(adjust.size());
  // One entry per distinct token: generated counts, prompt membership, bans.
  std::unordered_map<int32_t, TokenAdjust> entries;
  if (p.penalized()) {
    const std::vector<int32_t>& tokens = seq.tokens();
    for (int i = 0; i < seq.num_tokens(); ++i) {
      TokenAdjust& e = entries[tokens[i]];
      e.token = tokens[i];
      if (i < seq.turn_start()) {  // earlier turns are this answer's prompt, as when asked turn by turn
        e.flags |= TokenAdjust::kInPrompt;
      } else {
        ++e.output_count;
      }
    }
    for (int32_t t : drafts) {
      TokenAdjust& e = entries[t];
      e.token = t;
      ++e.output_count;
    }
  }
  for (int32_t t : banned) {
    TokenAdjust& e = entries[t];
    e.token = t;
    e.flags |= TokenAdjust::kBanned;
  }
  for (const auto& [token, e] : entries) adjust.push_back(e);
  row.adjust_end = static_cast<int32_t>(adjust.size());
  return row;
}

}  // namespace hsx
