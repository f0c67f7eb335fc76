// CpuBackend's dynamic-tree ops: the host rules of backend/draft_tree.h over each slot.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"

namespace hsx {

void CpuBackend::TopLogprobs(const Tensor& logits, const Tensor* offsets, Tensor& ids, Tensor& logprobs) {
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const auto k = static_cast<int32_t>(ids.size(1));
  if (k > vocab) {
    std::fprintf(stderr, "hsx: TopLogprobs: %d tokens asked of a row of %d\n", k, vocab);
    std::abort();
  }
  for (int64_t r = 0; r < logits.size(0); ++r) {
    int32_t* id = ids.data<int32_t>() + r * k;
    float* lp = logprobs.data<float>() + r * k;
    RawLogprobsOnHost(logits.data<float>() + r * vocab, vocab, k, id, lp);
    for (int32_t j = 0; j < k; ++j) {
      if (id[j] < 0 || !std::isfinite(lp[j])) {
        id[j] = -1;
        lp[j] = -INFINITY;
      } else if (offsets != nullptr) {
        id[j] += offsets->data<int32_t>()[id[j]];
      }
    }
  }
}

void CpuBackend::ExpandDraftTrees(const Tensor& ids, const Tensor& logprobs, int d, DraftTreeState& state,
                                  Tensor* next_ids, Tensor* next_rows, Tensor* next_masks) {
  const int k = state.topk, f = d == 1 ? 1 : k;
  const int64_t slots = state.tokens.size(0), places = state.tokens.size(1);
  for (int64_t s = 0; s < slots; ++s) {
    int32_t* rows = next_rows != nullptr ? next_rows->data<int32_t>() + s * k : nullptr;
    ExpandDraftTreeSlot(ids.data<int32_t>() + s * f * k, logprobs.data<float>() + s * f * k, k, d,
                        state.tokens.data<int32_t>() + s * places, state.scores.data<float>() + s * places,
                        state.parents.data<int32_t>() + s * places, state.frontier.data<int32_t>() + s * k,
                        reinterpret_cast<uint64_t*>(state.masks.data<int32_t>()) + s * k,
                        next_ids != nullptr ? next_ids->data<int32_t>() + s * k : nullptr, rows,
                        next_masks != nullptr ? reinterpret_cast<uint64_t*>(next_masks->data<int32_t>()) + s * k : nullptr);
    for (int j = 0; rows != nullptr && j < k; ++j) rows[j] += static_cast<int32_t>(s * f);
  }
}

void CpuBackend::SelectDraftTrees(const DraftTreeState& state, const Tensor& limits, Tensor& out) {
  const int64_t slots = state.tokens.size(0), places = state.tokens.size(1), n = out.size(1) / 2;
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t* limit = limits.data<int32_t>() + s * 2;
    const DraftTree tree = SelectDraftTreeSlot(state.tokens.data<int32_t>() + s * places,
                                               state.scores.data<float>() + s * places,
                                               state.parents.data<int32_t>() + s * places,
                                               std::min<int64_t>(limit[0], places), std::min<int64_t>(limit[1], n));
    int32_t* row = out.data<int32_t>() + s * 2 * n;
    for (int64_t i = 0; i < n; ++i) {
      const bool node = i < static_cast<int64_t>(tree.tokens.size());
      row[i] = node ? tree.tokens[i] : -1;
      row[n + i] = node ? tree.parents[i] : -1;
    }
  }
}

}  // namespace hsx
