// Launcher of the draft verification kernels (verification.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/sampling.h"

namespace hsx::cuda {

// The rules of backend/verification.h on logits f32 [rows, vocab] of `requests` requests.
// `index` (int32): row begins [requests + 1], then each row's draft index [rows] (-1:
// the request's bonus row), then the draft tokens. draft_probs f32 [drafts, vocab] or
// null; target_probs f32 [rows, vocab] or null; forced_accept_rate: VerificationBatch's; `work` f32 [rows, 2, vocab] scratch.
// `out` (4-byte words): accepted counts [requests], tokens [rows], their raw logprobs
// (f32) [rows], top ids [rows, max_logprobs], top logprobs (f32) [rows, max_logprobs],
// then [rows] words of scratch.
// The blocks (a thread block cluster) that take each row when VerifyDrafts gets `rows`
// rows on the current device: several when the rows are few, 1 when they are many.
int VerifyBlocksPerRow(int32_t rows);

void VerifyDrafts(const float* logits, int32_t rows, int32_t requests, int32_t vocab, const SamplingRow* params,
                  const TokenAdjust* adjust, int32_t max_logprobs, const int32_t* index, const float* draft_probs,
                  float* target_probs, float forced_accept_rate, float* work, int32_t* out, cudaStream_t stream);

// Token trees (every request's drafts are tree nodes; one-hot drafts, no probabilities
// out): `index` (int32): row begins [requests + 1], each row's first child [rows + 1] (its
// children: the drafts whose parent is that row's node, in draft order), the children's
// tokens [drafts], then their node indices [drafts]. by_row: [rows] tokens, logprobs,
// top ids and top logprobs, and choices (4-byte words, 2 rows + 2 rows max_logprobs +
// rows): each row's outcome. `out` as VerifyDrafts's, then the accepted nodes' path [rows].
void VerifyTree(const float* logits, int32_t rows, int32_t requests, int32_t vocab, const SamplingRow* params,
                const TokenAdjust* adjust, int32_t max_logprobs, const int32_t* index, float forced_accept_rate,
                float* work, int32_t* by_row, int32_t* out, cudaStream_t stream);

}  // namespace hsx::cuda
