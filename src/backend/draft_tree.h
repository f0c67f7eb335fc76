// EAGLE-2's dynamic draft trees (engine/dynamic_tree.h) as a round keeps them: per request
// slot, candidates at fixed places (depth 1: the root's k at [0, k); depth d >= 2: k^2 at
// DraftDepthStart, frontier entry j's children at start + j k + c) and the k frontier
// entries a depth expands. The expansion rule is compiled for host and device, so the host
// round, the CPU backend's op and the CUDA kernel choose the same frontiers bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/sampling_math.h"  // HSX_HOST_DEVICE
#include "tensor/tensor.h"

namespace hsx {

constexpr int kMaxDraftTreeTopk = 16;

// a ranks before b: a higher path score (NaN as -inf), or the same and an earlier place (a
// parent's place is before its children's, and a child never scores above its parent).
HSX_HOST_DEVICE bool DraftBeats(float sa, int64_t a, float sb, int64_t b) {
  sa = sa != sa ? -INFINITY : sa;
  sb = sb != sb ? -INFINITY : sb;
  return sa > sb || (sa == sb && a < b);
}

HSX_HOST_DEVICE int64_t DraftDepthStart(int k, int d) { return d == 1 ? 0 : k + int64_t{d - 2} * k * k; }
// The places of depths 1..d.
HSX_HOST_DEVICE int64_t DraftTreePlaces(int k, int d) { return k + int64_t{d - 1} * k * k; }

// One slot's expansion into depth d from its rows' top tokens ids / logprobs [f, k] (f = 1
// for d = 1: the root's row; else k: row j expanded frontier entry j; id -1: none): writes
// the depth's candidates (score: the parent's plus the logprob, -inf for id -1), then the k
// best of them (DraftBeats) as the frontier, each with its ancestor mask over the scratch
// slots (bit (d - 1) k + j, or'd with its parent's). Where next_ids is given, the next
// depth's row j: its token (0 for none: a row must embed some id; its score is -inf), the
// row (0..f-1) that drafted it, and its mask.
HSX_HOST_DEVICE void ExpandDraftTreeSlot(const int32_t* ids, const float* logprobs, int k, int d, int32_t* tokens,
                                         float* scores, int32_t* parents, int32_t* frontier, uint64_t* masks,
                                         int32_t* next_ids, int32_t* next_rows, uint64_t* next_masks) {
  const int f = d == 1 ? 1 : k;
  const int64_t start = DraftDepthStart(k, d);
  int32_t old_frontier[kMaxDraftTreeTopk];
  uint64_t old_masks[kMaxDraftTreeTopk];
  for (int j = 0; j < f; ++j) {
    old_frontier[j] = d == 1 ? -1 : frontier[j];
    old_masks[j] = d == 1 ? 0 : masks[j];
  }
  for (int j = 0; j < f; ++j) {
    const float base = d == 1 ? 0.0f : scores[old_frontier[j]];
    for (int c = 0; c < k; ++c) {
      const int64_t place = start + j * k + c;
      tokens[place] = ids[j * k + c];
      parents[place] = old_frontier[j];
      scores[place] = ids[j * k + c] < 0 ? -INFINITY : base + logprobs[j * k + c];
    }
  }
  int64_t prev = -1;  // the n-th best is the best of those the (n-1)-th beats
  for (int n = 0; n < k; ++n) {
    int64_t best = -1;
    for (int64_t place = start; place < start + f * k; ++place) {
      if (prev >= 0 && !DraftBeats(scores[prev], prev, scores[place], place)) continue;
      if (best < 0 || DraftBeats(scores[place], place, scores[best], best)) best = place;
    }
    prev = best;
    const int row = static_cast<int>((best - start) / k);
    const int bit = (d - 1) * k + n;  // past 63 only at a round's last depth, which runs no rows
    const uint64_t mask = bit < 64 ? (uint64_t{1} << bit) | old_masks[row] : 0;
    frontier[n] = static_cast<int32_t>(best);
    masks[n] = mask;
    if (next_ids != nullptr) {
      next_ids[n] = tokens[best] < 0 ? 0 : tokens[best];
      next_rows[n] = row;
      next_masks[n] = mask;
    }
  }
}

// A round's trees on the device (the backend's DraftTree ops), S slots of C places:
// tokens int32 [S, C], scores f32 [S, C], parents int32 [S, C], frontier int32 [S, k],
// masks int32 [S, 2k] (each a 64-bit word).
struct DraftTreeState {
  int topk = 0;
  Tensor tokens, scores, parents, frontier, masks;
};

// A verified tree: node i's token and its parent (a node index, -1: the root), parents first.
struct DraftTree {
  std::vector<int32_t> tokens, parents;
};

// One slot's tree: the `budget` best (DraftBeats) of its first `places` candidates with a
// token, in place order (parents first); a node whose parent is not chosen is dropped
// (unreachable while scores only fall along a path).
DraftTree SelectDraftTreeSlot(const int32_t* tokens, const float* scores, const int32_t* parents, int64_t places,
                              int budget);

}  // namespace hsx
