// EAGLE-2's dynamic draft trees, as SGLang drafts them (--speculative-eagle-topk,
// --speculative-num-steps, --speculative-num-draft-tokens): the root's topk most likely
// tokens are the first depth's candidates; at each later depth the topk best candidates of
// the depth before (by path score, the sum of the draft's logprobs along the path) are
// expanded, each into its own topk; after `depth` depths the best candidates of all depths
// are verified as one tree. Where a request's draft is sure, the tree grows deep; where it
// hesitates, wide, with the same verification rows. The rules: backend/draft_tree.h.
#pragma once

#include "backend/draft_tree.h"

namespace hsx {

struct DynamicTreeConfig {
  static constexpr int kMaxTopk = kMaxDraftTreeTopk;
  int topk = 0;   // children of an expanded node, and nodes expanded per depth
  int depth = 0;  // draft steps: the deepest candidate's depth
  // The candidates verified are the drafter's K (num_speculative_tokens; SGLang's
  // num_draft_tokens counts the root too).
  // The nodes a round expands (depths 1..depth - 1, topk each): each runs a draft row whose
  // KV goes to a scratch slot, numbered depth-major, so the request needs as many slots.
  int expanded_nodes() const { return (depth - 1) * topk; }
  // Candidates scored by a round of d depths.
  int candidates(int d) const { return static_cast<int>(DraftTreePlaces(topk, d)); }
};

}  // namespace hsx
