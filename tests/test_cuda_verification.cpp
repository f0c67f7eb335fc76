// The CUDA draft verification kernels against the CPU reference (skipped without a GPU):
// the same requests give the same accepted counts, tokens, logprobs and target
// probabilities, at a real vocabulary and on a small one over many seeds, with one-hot
// and probabilistic drafts, with rows split over several blocks (few rows) or not; and a
// request's outcome does not depend on its batch.
#ifdef HSX_HAS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/verification_kernel.h"
#include "sampling_reference.h"

namespace hsx {
namespace {

struct Case {
  Tensor logits;       // host f32 [rows, vocab]
  Tensor draft_probs;  // host f32 [drafts, vocab], or undefined
  VerificationBatch batch;
};

// Requests of K = 0..4 drafts over random logits; drafts mostly each row's argmax (so
// many are accepted), sometimes any token, sometimes the -1 placeholder; every kind of
// sampling parameter, penalties and bans.
Case MakeCase(int requests, int64_t vocab, bool with_probs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Case c;
  c.batch.sampling.max_logprobs = 3;
  std::vector<float> logits, probs;
  for (int r = 0; r < requests; ++r) {
    const int k = r % 5;
    c.batch.num_drafts.push_back(k);
    SamplingRow row = test::MixedRow(r, static_cast<uint32_t>(seed * 1000 + r));
    const int kind = r % 8;
    row.num_logprobs = r % 4;
    for (int j = 0; j <= k; ++j) {
      const size_t base = logits.size();
      for (int64_t i = 0; i < vocab; ++i) logits.push_back(normal(rng));
      const auto top = static_cast<int32_t>(std::max_element(logits.begin() + base, logits.end()) - logits.begin() - base);
      if (j < k) {
        const uint32_t pick = rng() % 8;
        c.batch.drafts.push_back(pick == 0 ? -1 : pick < 3 ? static_cast<int32_t>(rng() % vocab) : top);
      }
      if (j < k && with_probs) {
        // A draft distribution putting half its mass on the draft, the rest spread.
        const int32_t d = c.batch.drafts.back();
        for (int64_t i = 0; i < vocab; ++i) probs.push_back((i == d ? 0.5f : 0.0f) + 0.5f / vocab);
      }
      row.draw = 20 + j;
      row.adjust_begin = static_cast<int32_t>(c.batch.sampling.adjust.size());
      if (kind >= 5) {  // distinct tokens, as the op requires
        const auto n = static_cast<int32_t>(std::min<int64_t>(30, vocab - 1)), base = r * 131 + j * 7;
        for (int32_t a = 0; a < n; ++a) {
          c.batch.sampling.adjust.push_back({static_cast<int32_t>((base + a) % vocab), a % 3, a % 2});
        }
        c.batch.sampling.adjust.push_back({static_cast<int32_t>((base + n) % vocab), 0, TokenAdjust::kBanned});
      }
      row.adjust_end = static_cast<int32_t>(c.batch.sampling.adjust.size());
      c.batch.sampling.rows.push_back(row);
    }
  }
  const auto rows = static_cast<int64_t>(c.batch.sampling.rows.size());
  c.logits = Tensor::Host(DType::kF32, {rows, vocab});
  std::copy(logits.begin(), logits.end(), c.logits.data<float>());
  if (with_probs) {
    c.draft_probs = Tensor::Host(DType::kF32, {static_cast<int64_t>(c.batch.drafts.size()), vocab});
    std::copy(probs.begin(), probs.end(), c.draft_probs.data<float>());
  }
  return c;
}

struct Compared {
  int requests = 0, same_requests = 0;
  int rows_keeping_other_tokens = 0;  // target_probs > 0 somewhere the CPU's is 0, or the reverse
  double max_logprob_error = 0, max_prob_error = 0;
  bool probs_written = true;
};

// Requests whose accepted count and emitted tokens all match; logprob and probability
// errors over the rows that match. The device target_probs is poisoned with NaN first.
Compared CompareWithCpu(CudaBackend& gpu, const Case& c) {
  CpuBackend cpu;
  const int64_t rows = c.logits.size(0), vocab = c.logits.size(1);
  Tensor want_probs = Tensor::Host(DType::kF32, {rows, vocab});
  const VerifiedTokens want =
      cpu.VerifyDrafts(c.logits, c.draft_probs.defined() ? &c.draft_probs : nullptr, c.batch, &want_probs);
  Tensor poison = Tensor::Host(DType::kF32, {rows, vocab});
  std::fill_n(poison.data<float>(), rows * vocab, std::numeric_limits<float>::quiet_NaN());
  Tensor got_probs = gpu.Upload(poison);
  const Tensor q = c.draft_probs.defined() ? gpu.Upload(c.draft_probs) : Tensor();
  const VerifiedTokens got =
      gpu.VerifyDrafts(gpu.Upload(c.logits), c.draft_probs.defined() ? &q : nullptr, c.batch, &got_probs);
  const Tensor probs = gpu.Download(got_probs);
  Compared out;
  out.requests = static_cast<int>(c.batch.num_drafts.size());
  const int width = c.batch.sampling.max_logprobs;
  for (int r = 0, g = 0; r < out.requests; g += c.batch.num_drafts[r] + 1, ++r) {
    bool same = got.num_accepted[r] == want.num_accepted[r];
    for (int j = 0; j <= c.batch.num_drafts[r]; ++j) {
      const int row = g + j;
      same &= got.emitted.tokens[row] == want.emitted.tokens[row];
      for (int col = 0; col < width; ++col) same &= got.emitted.top_ids[row * width + col] == want.emitted.top_ids[row * width + col];
      if (!same) break;
      if (want.emitted.tokens[row] >= 0) {
        out.max_logprob_error =
            std::max<double>(out.max_logprob_error, std::abs(got.emitted.logprobs[row] - want.emitted.logprobs[row]));
      } else {
        same &= got.emitted.logprobs[row] == -std::numeric_limits<float>::infinity();
      }
      bool same_kept = true;
      for (int64_t i = 0; i < vocab; ++i) {
        const float p = probs.data<float>()[row * vocab + i], want_p = want_probs.data<float>()[row * vocab + i];
        out.probs_written &= std::isfinite(p);
        out.max_prob_error = std::max<double>(out.max_prob_error, std::abs(p - want_p));
        same_kept &= (p > 0.0f) == (want_p > 0.0f);
      }
      out.rows_keeping_other_tokens += !same_kept;
    }
    out.same_requests += same;
  }
  return out;
}

TEST(CudaVerification, MatchesTheCpuReferenceAtARealVocabulary) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  for (bool with_probs : {false, true}) {
    const Compared c = CompareWithCpu(**gpu, MakeCase(40, 151936, with_probs, 1 + with_probs));
    EXPECT_GE(c.same_requests, c.requests - 1) << "of " << c.requests << (with_probs ? " (draft probs)" : "");
    EXPECT_LT(c.max_logprob_error, 1e-4);
    EXPECT_LT(c.max_prob_error, 1e-6);
    EXPECT_TRUE(c.probs_written);
    std::printf("[verification] %d/%d requests equal to the CPU's, logprob error %.2e, probability error %.2e\n",
                c.same_requests, c.requests, c.max_logprob_error, c.max_prob_error);
  }
}

// Few rows: each split over several blocks (a cluster), and still the CPU's thresholds
// (the same tokens kept, by target_probs), tokens and logprobs.
TEST(CudaVerification, RowsSplitOverBlocksMatchTheCpu) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  for (bool with_probs : {false, true}) {
    const Case c = MakeCase(8, 151936, with_probs, 40 + with_probs);  // 21 rows, every kind of parameter
    EXPECT_GT(cuda::VerifyBlocksPerRow(static_cast<int32_t>(c.logits.size(0))), 1);
    const Compared got = CompareWithCpu(**gpu, c);
    EXPECT_GE(got.same_requests, got.requests - 1) << "of " << got.requests << (with_probs ? " (draft probs)" : "");
    EXPECT_LE(got.rows_keeping_other_tokens, 1);
    EXPECT_LT(got.max_logprob_error, 1e-4);
    EXPECT_LT(got.max_prob_error, 1e-6);
    EXPECT_TRUE(got.probs_written);
    std::printf("[verification] split rows (%d blocks each): %d/%d requests equal to the CPU's, %d rows keeping other tokens\n",
                cuda::VerifyBlocksPerRow(static_cast<int32_t>(c.logits.size(0))), got.same_requests, got.requests,
                got.rows_keeping_other_tokens);
  }
}

// Forced acceptance (hsx bench --spec-bench-accept-rate) draws the same Bernoulli outcomes
// on the device as on the CPU, for a = 0, 0.5, 1.
TEST(CudaVerification, ForcedAcceptanceMatchesTheCpu) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  for (float a : {0.0f, 0.5f, 1.0f}) {
    Case c = MakeCase(400, 1000, /*with_probs=*/false, 31);
    c.batch.forced_accept_rate = a;
    const Compared got = CompareWithCpu(**gpu, c);
    EXPECT_GE(got.same_requests, got.requests - 1) << "a=" << a;
  }
}

TEST(CudaVerification, ManyRequestsOfASmallVocabularyMatchTheCpu) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  for (bool with_probs : {false, true}) {
    const Compared c = CompareWithCpu(**gpu, MakeCase(4000, 10, with_probs, 7 + with_probs));
    EXPECT_GE(c.same_requests, c.requests - 4) << "of " << c.requests << (with_probs ? " (draft probs)" : "");
    EXPECT_TRUE(c.probs_written);
    EXPECT_LT(c.max_prob_error, 1e-6);
  }
}

// At a real vocabulary the requests alone take more blocks per row than together.
TEST(CudaVerification, SeededResultsDoNotDependOnTheBatch) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [requests, vocab] : {std::pair<int, int64_t>{16, 1000}, {40, 151936}}) {
    const Case all = MakeCase(requests, vocab, false, 3);
    const VerifiedTokens together = (*gpu)->VerifyDrafts((*gpu)->Upload(all.logits), nullptr, all.batch, nullptr);
    // Each request alone: its rows, drafts and parameters (penalty entries re-based).
    for (int r = 0, g = 0, d = 0; r < requests; g += all.batch.num_drafts[r] + 1, d += all.batch.num_drafts[r], ++r) {
      const int k = all.batch.num_drafts[r];
      VerificationBatch one;
      one.num_drafts = {k};
      one.drafts.assign(all.batch.drafts.begin() + d, all.batch.drafts.begin() + d + k);
      one.sampling.max_logprobs = all.batch.sampling.max_logprobs;
      for (int j = 0; j <= k; ++j) {
        SamplingRow row = all.batch.sampling.rows[g + j];
        const int32_t begin = static_cast<int32_t>(one.sampling.adjust.size());
        one.sampling.adjust.insert(one.sampling.adjust.end(), all.batch.sampling.adjust.begin() + row.adjust_begin,
                                   all.batch.sampling.adjust.begin() + row.adjust_end);
        row.adjust_begin = begin;
        row.adjust_end = static_cast<int32_t>(one.sampling.adjust.size());
        one.sampling.rows.push_back(row);
      }
      const VerifiedTokens alone =
          (*gpu)->VerifyDrafts((*gpu)->Upload(all.logits.Rows(g, g + k + 1)), nullptr, one, nullptr);
      EXPECT_EQ(alone.num_accepted[0], together.num_accepted[r]) << "vocab " << vocab << " request " << r;
      for (int j = 0; j <= k; ++j) {
        EXPECT_EQ(alone.emitted.tokens[j], together.emitted.tokens[g + j])
            << "vocab " << vocab << " request " << r << " row " << j;
        EXPECT_EQ(std::memcmp(&alone.emitted.logprobs[j], &together.emitted.logprobs[g + j], sizeof(float)), 0)
            << "vocab " << vocab << " request " << r << " row " << j;
      }
    }
  }
}

}  // namespace
}  // namespace hsx
#endif
