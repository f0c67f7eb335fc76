// The CUDA sampling kernel against the CPU reference (skipped without a GPU): the same
// rows, seeds and draws must give the same tokens, logprobs and top logprobs, at a real
// vocabulary size and on a small one drawn many times; GreedyTokens (on the device, with and
// without an offset map) gives the CPU's greedy tokens.
#ifdef HSX_HAS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "sampling_reference.h"

namespace hsx {
namespace {

struct Compared {
  int rows = 0, same_tokens = 0;
  double max_logprob_error = 0;
  bool same_top_ids = true;
};

Compared CompareWithCpu(CudaBackend& gpu, const Tensor& logits, const SamplingBatch& batch) {
  CpuBackend cpu;
  const SampledTokens want = cpu.Sample(logits, batch);
  const SampledTokens got = gpu.Sample(gpu.Upload(logits), batch);
  Compared c;
  c.rows = static_cast<int>(batch.rows.size());
  for (int r = 0; r < c.rows; ++r) {
    c.same_tokens += got.tokens[r] == want.tokens[r];
    if (got.tokens[r] == want.tokens[r]) {
      c.max_logprob_error = std::max<double>(c.max_logprob_error, std::abs(got.logprobs[r] - want.logprobs[r]));
    }
  }
  for (size_t i = 0; i < want.top_ids.size(); ++i) {
    c.same_top_ids &= got.top_ids[i] == want.top_ids[i];
    if (want.top_ids[i] >= 0) {
      c.max_logprob_error = std::max<double>(c.max_logprob_error, std::abs(got.top_logprobs[i] - want.top_logprobs[i]));
    }
  }
  return c;
}

TEST(CudaSampling, MatchesTheCpuReferenceAtARealVocabulary) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 96, vocab = 151936;
  Tensor logits = Tensor::Host(DType::kF32, {rows, vocab});
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t i = 0; i < rows * vocab; ++i) logits.data<float>()[i] = normal(rng);
  SamplingBatch batch;
  batch.max_logprobs = 5;
  for (int r = 0; r < rows; ++r) {
    SamplingRow row = test::MixedRow(r, static_cast<uint32_t>(1000 + r));
    const int kind = r % 8;
    row.draw = r * 7;
    row.num_logprobs = r % 6;
    row.adjust_begin = static_cast<int32_t>(batch.adjust.size());
    if (kind >= 5) {
      for (int a = 0; a < 40; ++a) batch.adjust.push_back({(r * 131 + a * 977) % static_cast<int32_t>(vocab), a % 3, a % 2});
      batch.adjust.push_back({r, 0, TokenAdjust::kBanned});
    }
    row.adjust_end = static_cast<int32_t>(batch.adjust.size());
    batch.rows.push_back(row);
  }
  const Compared c = CompareWithCpu(**gpu, logits, batch);
  EXPECT_GE(c.same_tokens, c.rows - 1) << "of " << c.rows;
  EXPECT_TRUE(c.same_top_ids);
  EXPECT_LT(c.max_logprob_error, 1e-4);
  std::printf("[sampling] %d/%d tokens equal to the CPU's, logprob error %.2e\n", c.same_tokens, c.rows,
              c.max_logprob_error);
}

TEST(CudaSampling, ManyDrawsOfASmallVocabularyMatchTheCpu) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> l = {1.0f, 2.5f, 0.3f, 2.4f, -1.0f, 1.7f, 0.0f, 2.5f, -3.0f, 1.2f};
  const int64_t rows = 4096;
  Tensor logits = Tensor::Host(DType::kF32, {rows, 10});
  SamplingBatch batch;
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(l.begin(), l.end(), logits.data<float>() + r * 10);
    SamplingRow row;
    row.temperature = 0.8f;
    row.top_p = r % 2 ? 0.9f : 1.0f;
    row.top_k = r % 3 ? 6 : 0;
    row.seed_lo = 5;
    row.draw = static_cast<uint32_t>(r);
    batch.rows.push_back(row);
  }
  const Compared c = CompareWithCpu(**gpu, logits, batch);
  EXPECT_GE(c.same_tokens, c.rows - 4) << "of " << c.rows;
}

TEST(CudaSampling, GreedyTokensMatchTheCpu) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  CudaBackend& g = **gpu;
  CpuBackend cpu;
  const int64_t rows = 37, vocab = 151936;  // a real vocabulary: many entries per thread
  Tensor logits = Tensor::Host(DType::kF32, {rows, vocab});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t i = 0; i < rows * vocab; ++i) logits.data<float>()[i] = normal(rng);
  for (int64_t r = 0; r < rows; r += 3) {  // ties for the maximum: the lowest id wins
    float* row = logits.data<float>() + r * vocab;
    const float top = *std::max_element(row, row + vocab);
    row[vocab - 1 - r] = top;
    row[r * 1000 + 5] = top;
  }
  Tensor offsets = Tensor::Host(DType::kI32, {vocab});
  for (int64_t i = 0; i < vocab; ++i) offsets.data<int32_t>()[i] = static_cast<int32_t>(i % 11) - 5;
  for (const bool mapped : {false, true}) {
    Tensor want = cpu.Empty(DType::kI32, {rows});
    cpu.GreedyTokens(logits, mapped ? &offsets : nullptr, want);
    const Tensor device_offsets = g.Upload(offsets);
    Tensor poison = Tensor::Host(DType::kI32, {rows});
    std::fill_n(poison.data<int32_t>(), rows, -7);
    Tensor got = g.Upload(poison);
    g.GreedyTokens(g.Upload(logits), mapped ? &device_offsets : nullptr, got);
    const Tensor host = g.Download(got);
    EXPECT_EQ(std::vector<int32_t>(host.data<int32_t>(), host.data<int32_t>() + rows),
              std::vector<int32_t>(want.data<int32_t>(), want.data<int32_t>() + rows))
        << (mapped ? "with" : "without") << " offsets";
  }
}

}  // namespace
}  // namespace hsx
#endif
