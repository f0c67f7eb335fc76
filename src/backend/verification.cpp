#include "backend/verification.h"

#include <algorithm>
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

// A tree node's children tried against row p (backend/verification.h): the accepted
// child's index into `kids`, or -1 with the emitted token in *token.
int VerifyChildren(const ProcessedRow& p, const SamplingRow& row, const std::vector<int32_t>& kids,
                   const std::vector<int32_t>& tokens, float forced, int32_t* token) {
  const auto vocab = static_cast<int32_t>(p.scaled.size());
  auto valid = [&](int32_t t) { return t >= 0 && t < vocab; };
  if (forced >= 0.0f && valid(tokens[kids[0]]) && sampling::ForcedAccept(row.seed_lo, row.seed_hi, row.draw, forced)) {
    return 0;
  }
  if (p.greedy()) {
    for (size_t c = 0; c < kids.size() && forced < 0.0f; ++c) {
      if (tokens[kids[c]] == p.argmax) return static_cast<int>(c);
    }
    *token = p.argmax;
    return -1;
  }
  const double z = KeptMass(p);
  std::vector<int32_t> tried;  // distinct valid child tokens, each counted once
  if (forced < 0.0f) {
    const double u = sampling::AcceptUniform(row.seed_lo, row.seed_hi, row.draw);
    double acc = 0.0;
    for (size_t c = 0; c < kids.size(); ++c) {
      const int32_t t = tokens[kids[c]];
      if (!valid(t) || std::find(tried.begin(), tried.end(), t) != tried.end()) continue;
      tried.push_back(t);
      acc += p.weight[t] / z;
      if (p.weight[t] > 0.0f && u <= acc) return static_cast<int>(c);
    }
  } else {
    for (int32_t k : kids) {
      if (valid(tokens[k]) && std::find(tried.begin(), tried.end(), tokens[k]) == tried.end()) tried.push_back(tokens[k]);
    }
  }
  // Rejected: a draw from p without the children's tokens. One excluded token is the chain's
  // draw; more, the Sample op's Gumbel-max (scaled logits plus its noise for this draw)
  // over the rest.
  if (tried.size() <= 1) {
    *token = DrawOnHost(p, row, tried.empty() ? -1 : tried[0]);
    return -1;
  }
  float best = kNegInf;
  int32_t pick = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    if (p.weight[i] <= 0.0f || std::find(tried.begin(), tried.end(), i) != tried.end()) continue;
    const float score = p.scaled[i] + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i);
    if (pick < 0 || score > best) best = score, pick = i;
  }
  *token = pick >= 0 ? pick : DrawOnHost(p, row, -1);  // the children hold all of p: draw from p
  return -1;
}

// Nothing accepted and every row unsampled (-1 tokens, -inf logprobs): what a row that
// verification stops before keeps.
VerifiedTokens UnverifiedTokens(size_t seqs, int64_t rows, int64_t width) {
  VerifiedTokens out;
  out.num_accepted.assign(seqs, 0);
  SampledTokens& e = out.emitted;
  e.tokens.assign(rows, -1);
  e.logprobs.assign(rows, kNegInf);
  e.top_ids.assign(rows * width, -1);
  e.top_logprobs.assign(rows * width, kNegInf);
  return out;
}

// A request's tree (n nodes from its first draft): kids[0] the root's children, kids[1 + i]
// node i's, in draft order.
std::vector<std::vector<int32_t>> TreeChildren(const VerificationBatch& batch, int64_t first_draft, int32_t n) {
  std::vector<std::vector<int32_t>> kids(n + 1);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t parent = batch.parents[first_draft + i];
    if (parent < -1 || parent >= i) Fail("a tree node's parent (it must come before the node)", parent, i - 1);
    kids[parent + 1].push_back(i);
  }
  return kids;
}

// VerifyDraftsOnHost for token trees.
VerifiedTokens VerifyTreeOnHost(const Tensor& logits, const VerificationBatch& batch, const std::vector<int32_t>& begins,
                                Tensor* target_probs) {
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const int64_t rows = begins.back(), width = batch.sampling.max_logprobs;
  VerifiedTokens out = UnverifiedTokens(batch.num_drafts.size(), rows, width);
  out.path.assign(rows, -1);
  SampledTokens& e = out.emitted;
  for (size_t r = 0; r < batch.num_drafts.size(); ++r) {
    const int32_t n = batch.num_drafts[r];
    const int64_t first_draft = begins[r] - static_cast<int64_t>(r);
    const std::vector<int32_t> tokens(batch.drafts.begin() + first_draft, batch.drafts.begin() + first_draft + n);
    const std::vector<std::vector<int32_t>> kids = TreeChildren(batch, first_draft, n);
    auto process = [&](int32_t node_row) {  // node_row: 0 the root, 1 + i node i
      const int64_t g = begins[r] + node_row;
      return ProcessRowOnHost(logits.data<float>() + g * vocab, vocab, batch.sampling.rows[g], batch.sampling.adjust.data());
    };
    if (target_probs != nullptr) {
      for (int32_t j = 0; j <= n; ++j) WriteProbabilities(process(j), target_probs->data<float>() + (begins[r] + j) * vocab);
    }
    int32_t at = 0;  // the node row verifying now
    for (int32_t j = 0;; ++j) {
      const int64_t g = begins[r] + at, emit = begins[r] + j;
      const SamplingRow& row = batch.sampling.rows[g];
      const ProcessedRow p = process(at);
      int32_t token = -1;
      const int c = kids[at].empty() ? -1 : VerifyChildren(p, row, kids[at], tokens, batch.forced_accept_rate, &token);
      if (kids[at].empty()) token = DrawOnHost(p, row, -1);  // a leaf: the bonus, the Sample op's draw
      if (c >= 0) token = tokens[kids[at][c]];
      const float* raw = logits.data<float>() + g * vocab;
      const float lse = RawLogprobsOnHost(raw, vocab, row.num_logprobs, e.top_ids.data() + emit * width,
                                          e.top_logprobs.data() + emit * width);
      e.tokens[emit] = token;
      e.logprobs[emit] = raw[token] - lse;
      if (c < 0) break;
      out.path[emit] = kids[at][c];
      ++out.num_accepted[r];
      at = kids[at][c] + 1;
    }
  }
  return out;
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
  if (!batch.parents.empty() && static_cast<int64_t>(batch.parents.size()) != drafts) {
    Fail("the number of tree parents", batch.parents.size(), drafts);
  }
  for (const TokenAdjust& a : batch.sampling.adjust) {
    if (a.token < 0 || a.token >= vocab) Fail("a TokenAdjust token", a.token, vocab - 1);
  }
  return begins;
}

bool IsGreedyTree(const VerificationBatch& batch) {
  if (batch.parents.empty() || batch.forced_accept_rate >= 0.0f) return false;
  return std::all_of(batch.sampling.rows.begin(), batch.sampling.rows.end(),
                     [](const SamplingRow& row) { return row.temperature <= 0.0f; });
}

// At each node the child whose token is the row's greedy token is accepted; the emitted
// token of every row on the path is its greedy token (the accepted child's, the correction
// or the bonus alike), with the logprobs the Sample op reported for it.
VerifiedTokens VerifyGreedyTree(const SampledTokens& greedy, const VerificationBatch& batch) {
  const auto rows = static_cast<int64_t>(greedy.tokens.size());
  const std::vector<int32_t> begins = VerificationRowBegins(batch, rows, std::numeric_limits<int32_t>::max());
  const int64_t width = batch.sampling.max_logprobs;
  VerifiedTokens out = UnverifiedTokens(batch.num_drafts.size(), rows, width);
  out.path.assign(rows, -1);
  SampledTokens& e = out.emitted;
  for (size_t r = 0; r < batch.num_drafts.size(); ++r) {
    const int64_t first_draft = begins[r] - static_cast<int64_t>(r);
    const std::vector<std::vector<int32_t>> kids = TreeChildren(batch, first_draft, batch.num_drafts[r]);
    int32_t at = 0;  // the node row verifying now
    for (int64_t j = 0;; ++j) {
      const int64_t g = begins[r] + at, emit = begins[r] + j;
      const int32_t token = greedy.tokens[g];
      e.tokens[emit] = token;
      e.logprobs[emit] = greedy.logprobs[g];
      std::copy_n(greedy.top_ids.begin() + g * width, width, e.top_ids.begin() + emit * width);
      std::copy_n(greedy.top_logprobs.begin() + g * width, width, e.top_logprobs.begin() + emit * width);
      const auto child = std::find_if(kids[at].begin(), kids[at].end(),
                                      [&](int32_t k) { return batch.drafts[first_draft + k] == token; });
      if (child == kids[at].end()) break;
      out.path[emit] = *child;
      ++out.num_accepted[r];
      at = *child + 1;
    }
  }
  return out;
}

VerifiedTokens VerifyDraftsOnHost(const Tensor& logits, const Tensor* draft_probs, const VerificationBatch& batch,
                                  Tensor* target_probs) {
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const std::vector<int32_t> begins = VerificationRowBegins(batch, logits.size(0), vocab);
  if (draft_probs != nullptr && draft_probs->size(0) != static_cast<int64_t>(batch.drafts.size())) {
    Fail("the number of draft probability rows", draft_probs->size(0), batch.drafts.size());
  }
  if (!batch.parents.empty()) {
    if (draft_probs != nullptr) Fail("draft probability rows with a token tree (one-hot drafts only)", draft_probs->size(0), 0);
    return VerifyTreeOnHost(logits, batch, begins, target_probs);
  }
  const int64_t rows = begins.back(), width = batch.sampling.max_logprobs;
  VerifiedTokens out = UnverifiedTokens(batch.num_drafts.size(), rows, width);
  SampledTokens& e = out.emitted;
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
