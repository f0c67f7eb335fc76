// Sampling on the device: a team of blocks per row (sampling_device.cuh: several for a few
// rows, one for many), the rules of backend/sampling.h through the pieces in
// sampling_device.cuh (the same bit-by-bit threshold searches as the host reference, and
// the Gumbel-max over the kept tokens with the shared Philox noise), so a row's token
// depends on nothing but the row.
#include "backend/cuda/sampling_device.cuh"
#include "backend/cuda/sampling_kernel.h"

namespace hsx::cuda {
namespace {

using sampler::kThreads;

__global__ void __launch_bounds__(kThreads) SampleKernel(const float* logits, int32_t vocab, const SamplingRow* params,
                                                         const TokenAdjust* adjust, int32_t max_logprobs,
                                                         float* work, int32_t* out) {
  __shared__ sampler::Scratch scratch;
  sampler::Team team(scratch);
  const int r = static_cast<int>(blockIdx.x) / team.Blocks();
  const int num_rows = static_cast<int>(gridDim.x) / team.Blocks();
  const SamplingRow row = params[r];
  const float* raw = logits + static_cast<int64_t>(r) * vocab;
  int32_t* top_ids = out + 2 * num_rows + r * max_logprobs;
  float* top_lps = reinterpret_cast<float*>(out + 2 * num_rows + num_rows * max_logprobs) + r * max_logprobs;
  const float lse = sampler::RawLogprobs(raw, vocab, row.num_logprobs, max_logprobs, top_ids, top_lps, team);
  int32_t token;
  if (row.temperature <= 0.0f && row.adjust_begin == row.adjust_end) {
    // Greedy with nothing to ban or penalize: ProcessRow would copy the row unchanged and
    // Draw take its argmax, two more passes and a write of the row for the same token.
    token = sampler::BestAfter(raw, vocab, sampler::Best{0.0f, -1}, team).id;
  } else {
    const sampler::Processed p =
        sampler::ProcessRow(raw, vocab, row, adjust, work + static_cast<int64_t>(r) * 2 * vocab, team);
    token = sampler::Draw(p, vocab, row, -1, team);
  }
  if (team.Leader()) {
    out[r] = token;
    reinterpret_cast<float*>(out)[num_rows + r] = raw[token] - lse;
  }
}

// Row r's k best in Before order, each found after the last (the Sample op's top logprobs).
// Past a NaN nothing is ordered: the last id found stands in, so every token is one.
__global__ void __launch_bounds__(kThreads) GreedyTokensKernel(const float* logits, int32_t vocab, int32_t k,
                                                               const int32_t* offsets, int32_t* tokens) {
  __shared__ sampler::Scratch scratch;
  sampler::Team team(scratch);
  const float* raw = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  sampler::Best prev{0.0f, -1};
  int32_t id = 0;
  for (int32_t j = 0; j < k; ++j) {
    const sampler::Best next = sampler::BestAfter(raw, vocab, prev, team);
    if (next.id >= 0) prev = next, id = next.id;
    if (threadIdx.x == 0) tokens[blockIdx.x * k + j] = id + (offsets != nullptr ? offsets[id] : 0);
  }
}

}  // namespace

int SampleBlocksPerRow(int32_t rows, int32_t vocab) { return sampler::BlocksPerRow(SampleKernel, rows, vocab); }

void GreedyTokens(const float* logits, int32_t rows, int32_t vocab, int32_t k, const int32_t* offsets, int32_t* tokens,
                  cudaStream_t stream) {
  if (rows > 0) GreedyTokensKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, k, offsets, tokens);
}

void Sample(const float* logits, int32_t rows, int32_t vocab, const SamplingRow* params, const TokenAdjust* adjust,
            int32_t max_logprobs, float* work, int32_t* out, cudaStream_t stream) {
  if (rows > 0) {
    const int blocks = SampleBlocksPerRow(rows, vocab);
    sampler::LaunchRows(SampleKernel, rows, blocks, sampler::WeightBytes(vocab, blocks), stream, logits, vocab, params,
                        adjust, max_logprobs, work, out);
  }
}

}  // namespace hsx::cuda
