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

// tokens[row] = the row's arg max (lowest id on ties) + offsets[arg max] (offsets may be null).
void GreedyTokens(const float* logits, int32_t rows, int32_t vocab, const int32_t* offsets, int32_t* tokens,
                  cudaStream_t stream);

}  // namespace hsx::cuda
