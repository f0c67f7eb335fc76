#include "engine/dynamic_tree.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hsx {
namespace {

std::vector<int32_t> Ranked(const std::vector<DraftCandidate>& candidates, size_t first) {
  std::vector<int32_t> order(candidates.size() - std::min(first, candidates.size()));
  std::iota(order.begin(), order.end(), static_cast<int32_t>(first));
  // NaN (a draft row gone bad) ranks last; stable on the index: ties go to the earlier
  // candidate (a parent before its child).
  auto score = [&](int32_t c) { return std::isnan(candidates[c].score) ? -INFINITY : candidates[c].score; };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return score(a) > score(b); });
  return order;
}

}  // namespace

std::vector<int32_t> BestCandidates(const std::vector<DraftCandidate>& candidates, size_t first, int k) {
  std::vector<int32_t> order = Ranked(candidates, first);
  if (order.size() > static_cast<size_t>(std::max(0, k))) order.resize(static_cast<size_t>(std::max(0, k)));
  return order;
}

DraftTree SelectDraftTree(const std::vector<DraftCandidate>& candidates, int budget) {
  std::vector<int32_t> chosen = BestCandidates(candidates, 0, budget);
  std::sort(chosen.begin(), chosen.end());
  std::vector<int32_t> node_of(candidates.size(), -1);
  DraftTree tree;
  for (int32_t c : chosen) {
    const int32_t parent = candidates[c].parent;
    // Unreachable while scores only fall along a path; a node without its parent would
    // be verified after a token never drafted.
    if (parent >= 0 && node_of[parent] < 0) continue;
    node_of[c] = static_cast<int32_t>(tree.tokens.size());
    tree.tokens.push_back(candidates[c].token);
    tree.parents.push_back(parent >= 0 ? node_of[parent] : -1);
  }
  return tree;
}

}  // namespace hsx
