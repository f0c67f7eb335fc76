// Draft verification on the device (backend/verification.h): a team of blocks per logit
// row (sampling_device.cuh) decides that row's outcome (accepted draft, correction, or bonus token) on its own,
// with the Sample op's processing and noise (sampling_device.cuh); then one thread per
// request walks its rows to the first rejection and blanks the rows after it.
#include "backend/cuda/sampling_device.cuh"
#include "backend/cuda/verification_kernel.h"

namespace hsx::cuda {
namespace {

using sampler::Best;
using sampler::kThreads;

// The out buffer's regions (4-byte words).
struct Layout {
  int32_t requests, rows, width;
  __device__ int32_t* accepted(int32_t* out) const { return out; }
  __device__ int32_t* tokens(int32_t* out) const { return out + requests; }
  __device__ float* logprobs(int32_t* out) const { return reinterpret_cast<float*>(out + requests + rows); }
  __device__ int32_t* top_ids(int32_t* out) const { return out + requests + 2 * rows; }
  __device__ float* top_lps(int32_t* out) const {
    return reinterpret_cast<float*>(out + requests + 2 * rows + rows * width);
  }
  __device__ int32_t* flags(int32_t* out) const { return out + requests + 2 * rows + 2 * rows * width; }
};

__global__ void __launch_bounds__(kThreads)
    VerifyRowKernel(const float* logits, int32_t vocab, const SamplingRow* params, const TokenAdjust* adjust,
                    Layout layout, const int32_t* row_draft, const int32_t* drafts, const float* draft_probs,
                    float* target_probs, float forced, float* work, int32_t* out) {
  __shared__ sampler::Scratch scratch;
  sampler::Team team(scratch);
  const int g = static_cast<int>(blockIdx.x) / team.Blocks();
  const SamplingRow row = params[g];
  const float* raw = logits + static_cast<int64_t>(g) * vocab;
  const sampler::Processed p =
      sampler::ProcessRow(raw, vocab, row, adjust, work + static_cast<int64_t>(g) * 2 * vocab, team);
  // The kept mass; none kept (parameters that keep nothing) makes the row greedy.
  double z = 0;
  if (!p.greedy) {
    const int shift = sampling::FixedShift(vocab);
    uint64_t part = 0;
    for (int32_t i = team.first; i < vocab; i += team.stride) part += sampling::ToFixed(p.Weight(i), shift);
    z = sampling::FromFixed(team.Sum(part), shift);
  }
  const bool greedy = p.greedy || !(z > 0.0);
  const int32_t argmax = greedy ? sampler::Argmax(p, vocab, team) : -1;
  if (target_probs != nullptr) {
    float* out_p = target_probs + static_cast<int64_t>(g) * vocab;
    for (int32_t i = team.first; i < vocab; i += team.stride) {
      out_p[i] = greedy ? (i == argmax ? 1.0f : 0.0f) : static_cast<float>(p.Weight(i) / z);
    }
  }

  const int32_t draft_index = row_draft[g];
  int32_t token;
  bool accepted = false;
  if (draft_index < 0) {
    token = greedy ? argmax : sampler::Draw(p, vocab, row, -1, team);  // the bonus token
  } else {
    const int32_t draft = drafts[draft_index];
    const bool valid = draft >= 0 && draft < vocab;
    const float* q = draft_probs ? draft_probs + static_cast<int64_t>(draft_index) * vocab : nullptr;
    if (forced >= 0.0f && valid && sampling::ForcedAccept(row.seed_lo, row.seed_hi, row.draw, forced)) {
      token = draft;
      accepted = true;
    } else if (greedy) {
      token = argmax;
      accepted = forced < 0.0f && valid && draft == argmax;
    } else {
      const double q_draft = !valid ? 0.0 : q ? q[draft] : 1.0;
      const double p_draft = valid ? p.Weight(draft) / z : 0.0;
      accepted = forced < 0.0f && q_draft > 0.0 &&
                 p_draft >= sampling::AcceptUniform(row.seed_lo, row.seed_hi, row.draw) * q_draft;
      if (accepted) {
        token = draft;
      } else if (q == nullptr) {
        token = sampler::Draw(p, vocab, row, valid ? draft : -1, team);  // p without the draft
      } else {
        Best b{0.0f, -1};  // a Gumbel-max over max(p - q, 0)
        for (int32_t i = team.first; i < vocab; i += team.stride) {
          const double residual = p.Weight(i) / z - q[i];
          if (!(residual > 0.0)) continue;
          const float score =
              static_cast<float>(log(residual)) + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i);
          b = sampler::Better(b, Best{score, i});
        }
        token = team.First(b).id;
        if (token < 0) token = sampler::Draw(p, vocab, row, -1, team);  // p == q up to rounding
      }
    }
  }
  const int32_t width = layout.width;
  const float lse = sampler::RawLogprobs(raw, vocab, row.num_logprobs, width, layout.top_ids(out) + g * width,
                                         layout.top_lps(out) + g * width, team);
  if (team.Leader()) {
    layout.tokens(out)[g] = token;
    layout.logprobs(out)[g] = raw[token] - lse;
    layout.flags(out)[g] = accepted;
  }
}

// Per request: accepted drafts up to the first rejection (the bonus row never accepts),
// and rows past the emitted ones blanked.
__global__ void FinishKernel(Layout layout, const int32_t* begins, int32_t* out) {
  const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= layout.requests) return;
  const int32_t begin = begins[r], end = begins[r + 1];
  int32_t n = 0;
  while (layout.flags(out)[begin + n]) ++n;
  layout.accepted(out)[r] = n;
  for (int32_t g = begin + n + 1; g < end; ++g) {
    layout.tokens(out)[g] = -1;
    layout.logprobs(out)[g] = -INFINITY;
    for (int32_t c = 0; c < layout.width; ++c) {
      layout.top_ids(out)[g * layout.width + c] = -1;
      layout.top_lps(out)[g * layout.width + c] = -INFINITY;
    }
  }
}

// A token tree's row (backend/verification.h's trees, VerifyChildren on the host): its
// children's tokens tried in draft order, or a leaf's bonus token; the accepted child's
// index into its children (-1: none) in the flags region.
__global__ void __launch_bounds__(kThreads)
    VerifyTreeRowKernel(const float* logits, int32_t vocab, const SamplingRow* params, const TokenAdjust* adjust,
                        Layout layout, const int32_t* child_begin, const int32_t* child_tokens, float forced,
                        float* work, int32_t* out) {
  __shared__ sampler::Scratch scratch;
  sampler::Team team(scratch);
  const int g = static_cast<int>(blockIdx.x) / team.Blocks();
  const SamplingRow row = params[g];
  const float* raw = logits + static_cast<int64_t>(g) * vocab;
  const sampler::Processed p =
      sampler::ProcessRow(raw, vocab, row, adjust, work + static_cast<int64_t>(g) * 2 * vocab, team);
  double z = 0;
  if (!p.greedy) {
    const int shift = sampling::FixedShift(vocab);
    uint64_t part = 0;
    for (int32_t i = team.first; i < vocab; i += team.stride) part += sampling::ToFixed(p.Weight(i), shift);
    z = sampling::FromFixed(team.Sum(part), shift);
  }
  const bool greedy = p.greedy || !(z > 0.0);
  const int32_t argmax = greedy ? sampler::Argmax(p, vocab, team) : -1;
  const int32_t* kids = child_tokens + child_begin[g];
  const int32_t n = child_begin[g + 1] - child_begin[g];
  auto valid = [&](int32_t t) { return t >= 0 && t < vocab; };
  auto repeated = [&](int32_t c) {  // an earlier child has the same token: tried once
    for (int32_t e = 0; e < c; ++e) {
      if (kids[e] == kids[c]) return true;
    }
    return false;
  };
  int32_t choice = -1, token;
  if (n == 0) {
    token = greedy ? argmax : sampler::Draw(p, vocab, row, -1, team);  // a leaf: the bonus token
  } else if (forced >= 0.0f && valid(kids[0]) && sampling::ForcedAccept(row.seed_lo, row.seed_hi, row.draw, forced)) {
    choice = 0;
    token = kids[0];
  } else if (greedy) {
    for (int32_t c = 0; c < n && forced < 0.0f && choice < 0; ++c) {
      if (kids[c] == argmax) choice = c;
    }
    token = choice >= 0 ? kids[choice] : argmax;
  } else {
    int32_t tried = 0, only = -1;  // distinct valid children tokens
    const double u = sampling::AcceptUniform(row.seed_lo, row.seed_hi, row.draw);
    double acc = 0.0;
    for (int32_t c = 0; c < n && choice < 0; ++c) {
      const int32_t t = kids[c];
      if (!valid(t) || repeated(c)) continue;
      ++tried;
      only = t;
      if (forced >= 0.0f) continue;
      acc += p.Weight(t) / z;
      if (p.Weight(t) > 0.0f && u <= acc) choice = c;
    }
    if (choice >= 0) {
      token = kids[choice];
    } else if (tried <= 1) {
      token = sampler::Draw(p, vocab, row, tried == 1 ? only : -1, team);  // the chain's draw
    } else {
      Best b{0.0f, -1};  // p without every child's token: the Sample op's Gumbel-max over the rest
      for (int32_t i = team.first; i < vocab; i += team.stride) {
        if (p.Weight(i) <= 0.0f) continue;
        bool child = false;
        for (int32_t c = 0; c < n && !child; ++c) child = kids[c] == i;
        if (child) continue;
        b = sampler::Better(b, Best{p.l[i] + sampling::Gumbel(row.seed_lo, row.seed_hi, row.draw, i), i});
      }
      token = team.First(b).id;
      if (token < 0) token = sampler::Draw(p, vocab, row, -1, team);  // the children hold all of p
    }
  }
  const int32_t width = layout.width;
  const float lse = sampler::RawLogprobs(raw, vocab, row.num_logprobs, width, layout.top_ids(out) + g * width,
                                         layout.top_lps(out) + g * width, team);
  if (team.Leader()) {
    layout.tokens(out)[g] = token;
    layout.logprobs(out)[g] = raw[token] - lse;
    layout.flags(out)[g] = choice;
  }
}

// Per request: from the root, each row's outcome (in `rows`, by node row) to the next
// emitted row of `out`, following accepted children; path [rows] names the accepted nodes.
__global__ void FinishTreeKernel(Layout layout, Layout by_row, const int32_t* begins, const int32_t* child_begin,
                                 const int32_t* child_nodes, int32_t* rows, int32_t* out, int32_t* path) {
  const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= layout.requests) return;
  const int32_t begin = begins[r], end = begins[r + 1], width = layout.width;
  for (int32_t g = begin; g < end; ++g) path[g] = -1;
  int32_t at = 0, n = 0;
  for (;; ++n) {
    const int32_t g = begin + at, emit = begin + n;
    layout.tokens(out)[emit] = by_row.tokens(rows)[g];
    layout.logprobs(out)[emit] = by_row.logprobs(rows)[g];
    for (int32_t c = 0; c < width; ++c) {
      layout.top_ids(out)[emit * width + c] = by_row.top_ids(rows)[g * width + c];
      layout.top_lps(out)[emit * width + c] = by_row.top_lps(rows)[g * width + c];
    }
    const int32_t choice = by_row.flags(rows)[g];
    if (choice < 0) break;
    const int32_t node = child_nodes[child_begin[g] + choice];
    path[emit] = node;
    at = node + 1;
  }
  layout.accepted(out)[r] = n;
  for (int32_t g = begin + n + 1; g < end; ++g) {
    layout.tokens(out)[g] = -1;
    layout.logprobs(out)[g] = -INFINITY;
    for (int32_t c = 0; c < width; ++c) {
      layout.top_ids(out)[g * width + c] = -1;
      layout.top_lps(out)[g * width + c] = -INFINITY;
    }
  }
}

}  // namespace

int VerifyBlocksPerRow(int32_t rows) { return sampler::BlocksPerRow(VerifyRowKernel, rows, 0); }

void VerifyDrafts(const float* logits, int32_t rows, int32_t requests, int32_t vocab, const SamplingRow* params,
                  const TokenAdjust* adjust, int32_t max_logprobs, const int32_t* index, const float* draft_probs,
                  float* target_probs, float forced_accept_rate, float* work, int32_t* out, cudaStream_t stream) {
  const Layout layout{requests, rows, max_logprobs};
  const int32_t* begins = index;
  const int32_t* row_draft = index + requests + 1;
  const int32_t* drafts = row_draft + rows;
  sampler::LaunchRows(VerifyRowKernel, rows, VerifyBlocksPerRow(rows), 0, stream, logits, vocab, params, adjust, layout,
                      row_draft, drafts, draft_probs, target_probs, forced_accept_rate, work, out);
  FinishKernel<<<(requests + 127) / 128, 128, 0, stream>>>(layout, begins, out);
}

void VerifyTree(const float* logits, int32_t rows, int32_t requests, int32_t vocab, const SamplingRow* params,
                const TokenAdjust* adjust, int32_t max_logprobs, const int32_t* index, float forced_accept_rate,
                float* work, int32_t* by_row, int32_t* out, cudaStream_t stream) {
  const Layout layout{requests, rows, max_logprobs}, rows_layout{0, rows, max_logprobs};
  const int32_t* begins = index;
  const int32_t* child_begin = begins + requests + 1;
  const int32_t* child_tokens = child_begin + rows + 1;
  const int32_t drafts = rows - requests;
  const int32_t* child_nodes = child_tokens + drafts;
  sampler::LaunchRows(VerifyTreeRowKernel, rows, sampler::BlocksPerRow(VerifyTreeRowKernel, rows, 0), 0, stream,
                      logits, vocab, params, adjust, rows_layout, child_begin, child_tokens, forced_accept_rate, work,
                      by_row);
  int32_t* path = out + requests + 2 * rows + 2 * static_cast<int64_t>(rows) * max_logprobs;
  FinishTreeKernel<<<(requests + 127) / 128, 128, 0, stream>>>(layout, rows_layout, begins, child_begin, child_nodes,
                                                               by_row, out, path);
}

}  // namespace hsx::cuda
