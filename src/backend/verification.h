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
// Token trees (parents not empty): a request's K_r drafts are tree nodes, row begin_r the
// root (the last known token), row begin_r + 1 + i node i, each node after its parent. From
// the root, at each node the children (in draft order) are tried:
//  - Greedy rows: the child equal to the row's argmax is accepted (SGLang's
//    verify_tree_greedy); none: the argmax is emitted and the request stops there.
//  - Random rows (SGLang's tree_speculative_sampling_target_only with thresholds 1, i.e.
//    SpecInfer's multi-candidate verification with one-hot drafts): one uniform u per
//    node; child c is accepted iff u < p(t_1) + ... + p(t_c) over the children up to it
//    (each child with probability p of its token: a draw from p kept if it is a child);
//    none: a draw from p without every child's token, renormalised. With one child this is
//    the chain's rule bit for bit (u from the same stream, the same rejection draw).
//  - A leaf accepted: its row emits the bonus token.
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
  // Empty: chains. Else [sum K_r]: each draft's parent, an index into its request's drafts,
  // or -1 for the root; parents come before their children. (Forced acceptance takes the
  // first child of a node.)
  std::vector<int32_t> parents;
};

struct VerifiedTokens {
  std::vector<int32_t> num_accepted;  // [requests]: drafts accepted, 0..K_r
  // Per logit row: row begin_r + j holds request r's j-th emitted token for
  // j <= num_accepted[r] (the accepted drafts, then the correction or the bonus token),
  // with its raw logprob and top logprobs as the Sample op reports them; rows past those
  // hold token -1, logprob -inf, top ids -1 and top logprobs -inf.
  SampledTokens emitted;
  // Trees only: row begin_r + j, j < num_accepted[r], holds the index (into the request's
  // drafts) of the j-th accepted node; -1 elsewhere.
  std::vector<int32_t> path;
};

// The first row of each request and the total, checked against the batch's sizes:
// aborts with a message naming the mismatch (a caller's bug, not a user's input).
std::vector<int32_t> VerificationRowBegins(const VerificationBatch& batch, int64_t logit_rows, int32_t vocab);

// Greedy token trees (IsGreedyTree: every row at temperature 0, verified losslessly) from
// each row's greedy token as the Sample op reports it, with its logprob and top logprobs:
// what VerifyDraftsOnHost gives for them, without the rows' logits on the host (a device
// samples the rows and sends home only that).
bool IsGreedyTree(const VerificationBatch& batch);
VerifiedTokens VerifyGreedyTree(const SampledTokens& greedy, const VerificationBatch& batch);

// The reference, on host tensors: logits f32 [rows, vocab]; draft_probs f32 [drafts,
// vocab] or null (one-hot drafts); target_probs f32 [rows, vocab] or null: receives p
// of every row (greedy rows: one-hot at the argmax).
VerifiedTokens VerifyDraftsOnHost(const Tensor& logits, const Tensor* draft_probs, const VerificationBatch& batch,
                                  Tensor* target_probs);

}  // namespace hsx
