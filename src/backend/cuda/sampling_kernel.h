// Launchers of the sampling kernels (sampling.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/sampling.h"

namespace hsx::cuda {

// One token per row of logits f32 [rows, vocab] under params[row]; `work` is f32
// [rows, 2, vocab] scratch. `out` (4-byte words): tokens [rows], then the drawn tokens' raw
// logprobs (f32) [rows], top ids [rows, max_logprobs], top logprobs (f32) [rows, max_logprobs].
void Sample(const float* logits, int32_t rows, int32_t vocab, const SamplingRow* params, const TokenAdjust* adjust,
            int32_t max_logprobs, float* work, int32_t* out, cudaStream_t stream);

// The blocks (a thread block cluster) that take each row when Sample gets `rows` rows of
// `vocab` logits on the current device: several when the rows are few, 1 when they are many.
int SampleBlocksPerRow(int32_t rows, int32_t vocab);

// tokens[row * k + j] = the row's j-th highest (lowest id on ties; j = 0: the arg max) +
// offsets[that id] (offsets may be null); k <= vocab.
void GreedyTokens(const float* logits, int32_t rows, int32_t vocab, int32_t k, const int32_t* offsets, int32_t* tokens,
                  cudaStream_t stream);

}  // namespace hsx::cuda
