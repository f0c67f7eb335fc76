// EAGLE-2's dynamic draft trees, as SGLang drafts them (--speculative-eagle-topk,
// --speculative-num-steps, --speculative-num-draft-tokens): the root's topk most likely
// tokens are the first depth's candidates; at each later depth the topk best candidates so
// far (by path score, the sum of the draft's logprobs along the path) are expanded, each
// into its own topk; after `depth` depths the `nodes` best candidates of all depths are
// verified as one tree. Where a request's draft is sure, the tree grows deep; where it
// hesitates, wide, with the same verification rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hsx {

struct DynamicTreeConfig {
  static constexpr int kMaxTopk = 16;
  int topk = 0;   // children of an expanded node, and nodes expanded per depth
  int depth = 0;  // draft steps: the deepest candidate's depth
  // The candidates verified are the drafter's K (num_speculative_tokens; SGLang's
  // num_draft_tokens counts the root too).
  // The nodes a round expands (depths 1..depth - 1, topk each): each runs a draft row whose
  // KV goes to a scratch slot, numbered depth-major, so the request needs as many slots.
  int expanded_nodes() const { return (depth - 1) * topk; }
  // Candidates scored by a round of d depths.
  int candidates(int d) const { return topk + (d - 1) * topk * topk; }
};

struct DraftCandidate {
  int32_t token = 0;
  float score = 0;      // the sum of the draft's logprobs along its path (<= its parent's)
  int32_t parent = -1;  // its parent's index among the request's candidates; -1: the root
};

// The indices of the k best of candidates[first..] (score, then the lower index), best first.
std::vector<int32_t> BestCandidates(const std::vector<DraftCandidate>& candidates, size_t first, int k);

// A verified tree: node i's token and its parent (a node index, -1: the root), parents first.
struct DraftTree {
  std::vector<int32_t> tokens, parents;
};

// The `budget` best candidates (score, then the lower index) in candidate order. A child
// never scores above its parent and comes after it, so every chosen node's parent is
// chosen and precedes it.
DraftTree SelectDraftTree(const std::vector<DraftCandidate>& candidates, int budget);

}  // namespace hsx
