// The CUDA sampling kernel against the CPU reference (skipped without a GPU): the same
// rows, seeds and draws must give the same tokens, logprobs and top logprobs, at a real
// vocabulary size and on a small one drawn many times, and a row sampled by several
// blocks (few rows) gives what one block (many rows) gives, to the bit. (GreedyTokens and
// greedy Sample rows: test_backend_ops.cpp's table.)
#ifdef HSX_HAS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/sampling_kernel.h"
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

// Probe rows at a real vocabulary, each kind drawn twice: top-p 0.9 at temperature 1 (the
// decode bench's setting) on peaked and on flat logits (top-p then keeps most of the row,
// so its sums span every block), top-k, min-p, all three, greedy, penalties with bans;
// each kind twice. The filler rows only make batches larger.
SamplingBatch ProbeRows(int probes, int fillers, int64_t vocab, Tensor& logits) {
  logits = Tensor::Host(DType::kF32, {fillers + probes, vocab});
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  SamplingBatch batch;
  batch.max_logprobs = 4;
  for (int r = 0; r < fillers + probes; ++r) {
    const int p = r - fillers, kind = p / 2;  // p < 0: a filler
    const float scale = kind == 1 ? 0.3f : 3.0f;
    for (int64_t i = 0; i < vocab; ++i) logits.data<float>()[r * vocab + i] = scale * normal(rng);
    SamplingRow row = test::MixedRow(r, static_cast<uint32_t>(500 + r));
    if (p >= 0) {
      row = SamplingRow{};
      row.temperature = kind == 7 ? 0.0f : kind == 6 ? 0.7f : 1.0f;
      row.top_p = kind <= 1 || kind == 5 ? 0.9f : kind == 8 ? 0.5f : 1.0f;
      row.top_k = kind == 2 ? 50 : kind == 3 ? 1 : kind == 5 ? 2000 : 0;
      row.min_p = kind == 4 ? 0.05f : kind == 5 ? 0.001f : 0.0f;
      row.repetition_penalty = kind == 9 ? 1.3f : 1.0f;
      row.frequency_penalty = kind == 9 ? 0.5f : 0.0f;
      row.seed_lo = static_cast<uint32_t>(77 + kind);
      row.draw = static_cast<uint32_t>(p % 2);
      row.num_logprobs = p % 5;
    }
    row.adjust_begin = static_cast<int32_t>(batch.adjust.size());
    if (p >= 0 && kind == 9) {  // penalize the top tokens, ban the highest
      std::vector<int32_t> order(vocab);
      const float* l = logits.data<float>() + r * vocab;
      for (int32_t i = 0; i < vocab; ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + 20, order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
      batch.adjust.push_back({order[0], 0, TokenAdjust::kBanned});
      for (int a = 1; a < 20; ++a) batch.adjust.push_back({order[a], a % 3, a % 2});
    }
    row.adjust_end = static_cast<int32_t>(batch.adjust.size());
    batch.rows.push_back(row);
  }
  return batch;
}

// The first `rows` rows of a batch (filler rows first), probes and their penalty entries kept.
SamplingBatch Last(const SamplingBatch& all, int rows, int64_t vocab, const Tensor& logits, Tensor& out_logits) {
  const auto total = static_cast<int>(all.rows.size());
  SamplingBatch b;
  b.max_logprobs = all.max_logprobs;
  b.adjust = all.adjust;
  b.rows.assign(all.rows.end() - rows, all.rows.end());
  out_logits = Tensor::Host(DType::kF32, {rows, vocab});
  std::memcpy(out_logits.data<float>(), logits.data<float>() + (total - rows) * vocab, rows * vocab * sizeof(float));
  return b;
}

TEST(CudaSampling, RowsSplitOverBlocksGiveTheSameResultsAtEveryBatchSize) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  CudaBackend& g = **gpu;
  const int64_t vocab = 151936;
  const int probes = 20, fillers = 140;
  Tensor logits;
  const SamplingBatch all = ProbeRows(probes, fillers, vocab, logits);
  const int width = all.max_logprobs;

  // Each probe alone: the most blocks per row.
  SampledTokens alone;
  for (int p = 0; p < probes; ++p) {
    Tensor one;
    SamplingBatch b = Last(all, probes - p, vocab, logits, one);
    b.rows.resize(1);
    const SampledTokens got = g.Sample(g.Upload(one.Rows(0, 1)), b);
    alone.tokens.push_back(got.tokens[0]);
    alone.logprobs.push_back(got.logprobs[0]);
    alone.top_ids.insert(alone.top_ids.end(), got.top_ids.begin(), got.top_ids.end());
    alone.top_logprobs.insert(alone.top_logprobs.end(), got.top_logprobs.begin(), got.top_logprobs.end());
  }
  // The CPU's tokens (one may differ: expf and std::exp can differ in the last bit).
  {
    Tensor probe_logits;
    const SamplingBatch b = Last(all, probes, vocab, logits, probe_logits);
    const SampledTokens want = CpuBackend().Sample(probe_logits, b);
    int same = 0;
    double error = 0;
    for (int p = 0; p < probes; ++p) {
      same += alone.tokens[p] == want.tokens[p];
      if (alone.tokens[p] == want.tokens[p]) error = std::max<double>(error, std::abs(alone.logprobs[p] - want.logprobs[p]));
    }
    EXPECT_GE(same, probes - 1) << "of " << probes;
    EXPECT_EQ(alone.top_ids, want.top_ids);
    EXPECT_LT(error, 1e-4);
  }
  // In batches of more rows, fewer blocks per row: the same bits.
  std::set<int> blocks = {cuda::SampleBlocksPerRow(1, static_cast<int32_t>(vocab))};
  for (int rows : {4, 20, 33, 66, 100, 160}) {
    blocks.insert(cuda::SampleBlocksPerRow(rows, static_cast<int32_t>(vocab)));
    Tensor batch_logits;
    const SamplingBatch b = Last(all, rows, vocab, logits, batch_logits);
    const SampledTokens got = g.Sample(g.Upload(batch_logits), b);
    for (int p = std::max(0, probes - rows); p < probes; ++p) {
      const int r = rows - probes + p;
      EXPECT_EQ(got.tokens[r], alone.tokens[p]) << rows << " rows, probe " << p;
      EXPECT_EQ(std::memcmp(&got.logprobs[r], &alone.logprobs[p], sizeof(float)), 0) << rows << " rows, probe " << p;
      for (int c = 0; c < width; ++c) {
        EXPECT_EQ(got.top_ids[r * width + c], alone.top_ids[p * width + c]) << rows << " rows, probe " << p;
        EXPECT_EQ(std::memcmp(&got.top_logprobs[r * width + c], &alone.top_logprobs[p * width + c], sizeof(float)), 0)
            << rows << " rows, probe " << p;
      }
    }
  }
  // The batches above used one block per row and several (the point of the test).
  std::string used;
  for (int n : blocks) used += " " + std::to_string(n);
  EXPECT_TRUE(blocks.count(1) && *blocks.rbegin() > 1) << "blocks per row:" << used;
  std::printf("[sampling] blocks per row used:%s\n", used.c_str());
}

}  // namespace
}  // namespace hsx
#endif
