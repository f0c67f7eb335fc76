// Verification of draft tokens (speculative decoding) as a backend op: per request, K
// drafts and the target's K + 1 logit rows in, the accepted count and the emitted tokens
// out; only those (and requested logprobs) cross to the host. The rules are vLLM's
// rejection sampler over the Sample op's processed distribution (backend/sampling.h):
//  - Row j of a request is processed exactly as the Sample op would process it for the
//    token at that output position (penalties, temperature, min-p, top-k, top-p), giving
//    p_j; its SamplingRow carries the draw index (the output position) and the penalty
//    entries counting the drafts before it.
//  - Greedy rows: draft j is accepted while it equals row j's argmax; the first mismatch
//    emits the argmax.
//  - Random rows: draft d is accepted iff q(d) > 0 and p(d) >= u q(d), with u uniform in
//    (0, 1) from Philox keyed by (seed, draw) (a row's outcome depends on nothing else).
//    One-hot drafts (no draft probabilities, vLLM's default) have q(d) = 1. On rejection
//    the emitted token is drawn from max(p - q, 0) normalised (one-hot: p without d) by a
//    Gumbel-max with the Sample op's noise for that draw, and the request stops there.
//  - A draft outside [0, vocab) (vLLM's -1 placeholder) is rejected.
//  - All K accepted: row K emits a bonus token drawn exactly as the Sample op draws it.
// Every emitted token is thereby distributed as the target's processed distribution at
// its position: verification is lossless (tests/test_verification.cpp checks this).
// Except under forced_accept_rate (hsx bench --spec-bench-accept-rate): a valid draft is
// accepted iff AcceptUniform(seed, draw) < rate, whatever p says, so the output is NOT the
// target's; a rejection emits what the rules above emit on a rejection.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/sampling.h"
#include "tensor/tensor.h"

namespace hsx {

struct VerificationBatch {
  // [requests]: K_r drafts of request r (0 allowed: its one row samples normally).
  // Request r owns logit rows [begin_r, begin_r + K_r + 1), requests in order, no gaps.
  std::vector<int32_t> num_drafts;
  std::vector<int32_t> drafts;  // [sum K_r]: each request's drafts in order
  // One SamplingRow per logit row (sampling.rows[begin_r + j]): the draw index is that
  // position's output index and the TokenAdjust entries count the drafts before it as
  // generated, so penalties see what the plain decode would have seen (the engine's
  // MakeSamplingRowAfter makes such rows).
  SamplingBatch sampling;
  // In [0, 1]: a benchmark's forced acceptance, a Bernoulli(rate) draw per draft position
  // (not lossless); negative: the rules above.
  float forced_accept_rate = -1.0f;
};

struct VerifiedTokens {
  std::vector<int32_t> num_accepted;  // [requests]: drafts accepted, 0..K_r
  // Per logit row: row begin_r + j holds request r's j-th emitted token for
  // j <= num_accepted[r] (the accepted drafts, then the correction or the bonus token),
  // with its raw logprob and top logprobs as the Sample op reports them; rows past those
  // hold token -1, logprob -inf, top ids -1 and top logprobs -inf.
  SampledTokens emitted;
};

// The first row of each request and the total, checked against the batch's sizes:
// aborts with a message naming the mismatch (a caller's bug, not a user's input).
std::vector<int32_t> VerificationRowBegins(const VerificationBatch& batch, int64_t logit_rows, int32_t vocab);

// The reference, on host tensors: logits f32 [rows, vocab]; draft_probs f32 [drafts,
// vocab] or null (one-hot drafts); target_probs f32 [rows, vocab] or null: receives p
// of every row (greedy rows: one-hot at the argmax).
VerifiedTokens VerifyDraftsOnHost(const Tensor& logits, const Tensor* draft_probs, const VerificationBatch& batch,
                                  Tensor* target_probs);

}  // namespace hsx
