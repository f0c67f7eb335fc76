// CpuBackend::Sample and GreedyTokens: the host reference, row by row.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace hsx {

SampledTokens CpuBackend::Sample(const Tensor& logits, const SamplingBatch& batch, const SampledAhead& ahead) {
  const int64_t rows = logits.size(0);
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const int64_t width = batch.max_logprobs;
  SampledTokens out;
  out.tokens.resize(rows);
  out.logprobs.resize(rows);
  out.top_ids.assign(rows * width, -1);
  out.top_logprobs.assign(rows * width, -std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    out.tokens[r] = SampleRowOnHost(logits.data<float>() + r * vocab, vocab, batch.rows[r], batch.adjust.data(),
                                    &out.logprobs[r], out.top_ids.data() + r * width,
                                    out.top_logprobs.data() + r * width);
  }
  if (ahead) {
    Tensor tokens = Tensor::Host(DType::kI32, {rows});
    std::copy(out.tokens.begin(), out.tokens.end(), tokens.data<int32_t>());
    ahead(tokens);
  }
  return out;
}

void CpuBackend::GreedyTokens(const Tensor& logits, const Tensor* offsets, Tensor& tokens) {
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const auto k = static_cast<int32_t>(tokens.dim() > 1 ? tokens.size(1) : 1);
  if (k > vocab) {
    std::fprintf(stderr, "hsx: GreedyTokens: %d tokens asked of a row of %d\n", k, vocab);
    std::abort();
  }
  const SamplingRow greedy;  // temperature 0
  for (int64_t r = 0; r < logits.size(0); ++r) {
    const float* row = logits.data<float>() + r * vocab;
    int32_t* ids = tokens.data<int32_t>() + r * k;
    if (k == 1) {
      float logprob = 0;
      ids[0] = SampleRowOnHost(row, vocab, greedy, nullptr, &logprob, nullptr, nullptr);
    } else {
      TopIdsOnHost(row, vocab, k, ids);
      // Past a NaN nothing is ordered (-1): the last id found stands in, so every token is one.
      for (int32_t j = 0; j < k; ++j) {
        if (ids[j] < 0) ids[j] = j > 0 ? ids[j - 1] : 0;
      }
    }
    for (int32_t j = 0; offsets != nullptr && j < k; ++j) ids[j] += offsets->data<int32_t>()[ids[j]];
  }
}

}  // namespace hsx
