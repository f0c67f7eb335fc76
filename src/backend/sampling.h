// Sampling as a backend op: a batch of logit rows in, one token per row out, with only
// token ids and requested logprobs crossing to the host. The semantics are vLLM's, in
// its order: raw logprobs; banned tokens and penalties; greedy; temperature; min-p;
// top-k; top-p; a draw. Both backends implement exactly the rules written here
// (SampleRowOnHost is the reference), so a row's token depends only on its logits,
// its parameters and its (seed, draw) pair, never on the batch around it.
#pragma once

#include <cstdint>
#include <vector>

namespace hsx {

// Per-row parameters, uploaded as they are (plain data).
struct SamplingRow {
  float temperature = 0.0f;         // <= 0: greedy (the highest logit, lowest id on ties)
  float top_p = 1.0f;               // keep the smallest most-likely set with this much mass; 1: off
  float min_p = 0.0f;               // keep tokens at least min_p times as likely as the top one; 0: off
  int32_t top_k = 0;                // keep the k highest logits (ties at the k-th kept too); <= 0: off
  float repetition_penalty = 1.0f;  // tokens seen in prompt or output: logit / r if > 0, else * r
  float frequency_penalty = 0.0f;   // logit -= f * times the token was generated
  float presence_penalty = 0.0f;    // logit -= p if the token was generated
  int32_t adjust_begin = 0;         // this row's TokenAdjust entries: [adjust_begin, adjust_end)
  int32_t adjust_end = 0;
  uint32_t seed_lo = 0, seed_hi = 0;  // the row's random stream ...
  uint32_t draw = 0;                // ... and which draw of it (the sequence's output index)
  int32_t num_logprobs = 0;         // top raw logprobs to return, <= SamplingBatch::max_logprobs
};

// A token a row's penalties or bans apply to; one entry per distinct token.
struct TokenAdjust {
  static constexpr int32_t kInPrompt = 1;  // the token occurs in the prompt (repetition penalty)
  static constexpr int32_t kBanned = 2;    // never drawn (min_tokens holds stop tokens back this way)
  int32_t token = 0;
  int32_t output_count = 0;  // times generated so far
  int32_t flags = 0;
};

static_assert(sizeof(SamplingRow) % 4 == 0 && sizeof(TokenAdjust) % 4 == 0, "uploaded as 4-byte words");

struct SamplingBatch {
  std::vector<SamplingRow> rows;
  std::vector<TokenAdjust> adjust;
  int32_t max_logprobs = 0;  // columns of SampledTokens::top_ids / top_logprobs
};

struct SampledTokens {
  std::vector<int32_t> tokens;      // [rows]
  std::vector<float> logprobs;      // [rows]: the drawn token's raw logprob (log-softmax of the logits)
  std::vector<int32_t> top_ids;     // [rows, max_logprobs]: highest raw logprobs, lowest id first on ties;
  std::vector<float> top_logprobs;  // columns past a row's num_logprobs hold -1 / -inf
};

// A row after the rules that precede the draw (bans, penalties, temperature, min-p,
// top-k, top-p), on the host.
struct ProcessedRow {
  std::vector<float> scaled;  // the penalized logits, divided by the temperature unless greedy
  std::vector<float> weight;  // exp(scaled - max) of the kept tokens, 0 for dropped ones; empty: greedy
  int32_t argmax = 0;         // the highest scaled logit, lowest id on ties
  bool greedy() const { return weight.empty(); }
};
ProcessedRow ProcessRowOnHost(const float* logits, int32_t vocab, const SamplingRow& row, const TokenAdjust* adjust);

// The Sample op's draw from a processed row: greedy rows give the argmax, others the
// Gumbel-max over the kept tokens other than `excluded` (-1: none) with the noise of
// (seed, draw); the argmax when none is left.
int32_t DrawOnHost(const ProcessedRow& p, const SamplingRow& row, int32_t excluded);

// The log-softmax normaliser of raw logits; writes the num_logprobs highest raw
// logprobs (lowest id first on ties) to top_ids / top_logprobs.
float RawLogprobsOnHost(const float* logits, int32_t vocab, int32_t num_logprobs, int32_t* top_ids,
                        float* top_logprobs);

// The k highest of `vocab` logits, highest first, lowest id on ties: top_ids of
// RawLogprobsOnHost without the normaliser.
void TopIdsOnHost(const float* logits, int32_t vocab, int32_t k, int32_t* ids);

// The reference: samples one row of `vocab` logits on the host. `adjust` is the batch's
// TokenAdjust array; writes the drawn token's raw logprob and num_logprobs entries of
// top_ids / top_logprobs, and returns the token.
int32_t SampleRowOnHost(const float* logits, int32_t vocab, const SamplingRow& row, const TokenAdjust* adjust,
                        float* logprob, int32_t* top_ids, float* top_logprobs);

}  // namespace hsx
