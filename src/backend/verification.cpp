#include "backend/verification.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "backend/sampling_math.h"

namespace hsx {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

[[noreturn]] void Fail(const char* what, int64_t got, int64_t want) {
  std::fprintf(stderr, "hsx: VerifyDrafts: %s is %lld, expected %lld\n", what, static_cast<long long>(got),
               static_cast<long long>(want));
  std::abort();
}

// The kept mass of a random row, in sampling_math.h's fixed point as on the device.
double KeptMass(const ProcessedRow& p) {
  const int shift = sampling::FixedShift(static_cast<int64_t>(p.weight.size()));
  uint64_t sum = 0;
  for (float w : p.weight) sum += sampling::ToFixed(w, shift);
  return sampling::FromFixed(sum, shift);
}

struct Verdict {
  int32_t token;
  bool accepted;
};

// One draft position: accept the draft or emit the correction (backend/verification.h).
// q: the draft's probabilities at this position, or null for a one-hot draft; forced: the
// batch's forced_accept_rate.
Verdict VerifyPosition(const ProcessedRow& p, const SamplingRow& row, int32_t draft, const float* q, float forced) {
  const auto vocab = static_cast<int32_t>(p.scaled.size());
  const bool valid = draft >= 0 && draft < vocab;
  if (forced >= 0.0f && valid && sampling::ForcedAccept(row.seed_lo, row.seed_hi, row.draw, forced)) {
    return {draft, true};
  }
  if (p.greedy()) return {p.argmax, forced < 0.0f && valid && draft == p.argmax};
  const double z = KeptMass(p);
  const double q_draft = !valid ? 0.0 : q ? q[draft] : 1.0;
  const double p_draft = valid ? p.weight[draft] / z : 0.0;
  if (forced < 0.0f && q_draft > 0.0 &&
      p_draft >= sampling::AcceptUniform(row.seed_lo, row.seed_hi, row.draw) * q_draft) {
    return {draft, true};
  }
  // Rejected: a draw from max(p - q, 0). One-hot q is p without the draft, which is the
  // Sample op's own draw with the draft excluded.
  if (q == nullptr) return {DrawOnHost(p, row, valid ? draft : -1), false};
  float best = kNegInf;
  int32_t token = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    const double residual = p.weight[i] / z - q[i];
    if (!(residual > 0.0)) continue;
    const float score = static_cast<float>(std::log(residual)) + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i);
    if (token < 0 || score > best) best = score, token = i;
  }
  return {token >= 0 ? token : DrawOnHost(p, row, -1), false};  // p == q up to rounding: draw from p
}

void WriteProbabilities(const ProcessedRow& p, float* out) {
  const auto vocab = static_cast<int32_t>(p.scaled.size());
  if (p.greedy()) {
    for (int32_t i = 0; i < vocab; ++i) out[i] = i == p.argmax ? 1.0f : 0.0f;
    return;
  }
  const double z = KeptMass(p);
  for (int32_t i = 0; i < vocab; ++i) out[i] = static_cast<float>(p.weight[i] / z);
}

}  // namespace

std::vector<int32_t> VerificationRowBegins(const VerificationBatch& batch, int64_t logit_rows, int32_t vocab) {
  std::vector<int32_t> begins;
  begins.reserve(batch.num_drafts.size() + 1);
  int64_t rows = 0, drafts = 0;
  for (int32_t k : batch.num_drafts) {
    if (k < 0) Fail("a request's number of drafts", k, 0);
    begins.push_back(static_cast<int32_t>(rows));
    rows += k + 1;
    drafts += k;
  }
  begins.push_back(static_cast<int32_t>(rows));
  if (logit_rows != rows) Fail("the number of logit rows", logit_rows, rows);
  if (static_cast<int64_t>(batch.sampling.rows.size()) != rows) Fail("the number of sampling rows", batch.sampling.rows.size(), rows);
  if (static_cast<int64_t>(batch.drafts.size()) != drafts) Fail("the number of drafts", batch.drafts.size(), drafts);
  for (const TokenAdjust& a : batch.sampling.adjust) {
    if (a.token < 0 || a.token >= vocab) Fail("a TokenAdjust token", a.token, vocab - 1);
  }
  return begins;
}

VerifiedTokens VerifyDraftsOnHost(const Tensor& logits, const Tensor* draft_probs, const VerificationBatch& batch,
                                  Tensor* target_probs) {
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const std::vector<int32_t> begins = VerificationRowBegins(batch, logits.size(0), vocab);
  if (draft_probs != nullptr && draft_probs->size(0) != static_cast<int64_t>(batch.drafts.size())) {
    Fail("the number of draft probability rows", draft_probs->size(0), batch.drafts.size());
  }
  const int64_t rows = begins.back(), width = batch.sampling.max_logprobs;
  VerifiedTokens out;
  out.num_accepted.assign(batch.num_drafts.size(), 0);
  SampledTokens& e = out.emitted;
  e.tokens.assign(rows, -1);
  e.logprobs.assign(rows, kNegInf);
  e.top_ids.assign(rows * width, -1);
  e.top_logprobs.assign(rows * width, kNegInf);
  for (size_t r = 0; r < batch.num_drafts.size(); ++r) {
    const int32_t num_drafts = batch.num_drafts[r];
    const int64_t first_draft = begins[r] - static_cast<int64_t>(r);
    bool done = false;
    for (int32_t j = 0; j <= num_drafts && !(done && target_probs == nullptr); ++j) {
      const int64_t g = begins[r] + j;
      const float* raw = logits.data<float>() + g * vocab;
      const SamplingRow& row = batch.sampling.rows[g];
      const ProcessedRow p = ProcessRowOnHost(raw, vocab, row, batch.sampling.adjust.data());
      if (target_probs != nullptr) WriteProbabilities(p, target_probs->data<float>() + g * vocab);
      if (done) continue;
      const float* q = draft_probs && j < num_drafts ? draft_probs->data<float>() + (first_draft + j) * vocab : nullptr;
      const Verdict v = j < num_drafts ? VerifyPosition(p, row, batch.drafts[first_draft + j], q, batch.forced_accept_rate)
                                       : Verdict{DrawOnHost(p, row, -1), false};  // the bonus: the Sample op's draw
      const float lse = RawLogprobsOnHost(raw, vocab, row.num_logprobs, e.top_ids.data() + g * width,
                                          e.top_logprobs.data() + g * width);
      e.tokens[g] = v.token;
      e.logprobs[g] = raw[v.token] - lse;
      out.num_accepted[r] += v.accepted;
      done = !v.accepted;
    }
  }
  return out;
}

}  // namespace hsx
