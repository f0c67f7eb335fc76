#include "backend/draft_tree.h"

#include <algorithm>
#include <numeric>

namespace hsx {

DraftTree SelectDraftTreeSlot(const int32_t* tokens, const float* scores, const int32_t* parents, int64_t places,
                              int budget) {
  std::vector<int64_t> order;
  for (int64_t p = 0; p < places; ++p) {
    if (tokens[p] >= 0) order.push_back(p);
  }
  const size_t keep = std::min(order.size(), static_cast<size_t>(std::max(0, budget)));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    [&](int64_t a, int64_t b) { return DraftBeats(scores[a], a, scores[b], b); });
  order.resize(keep);
  std::sort(order.begin(), order.end());
  std::vector<int32_t> node_of(static_cast<size_t>(places), -1);
  DraftTree tree;
  for (int64_t p : order) {
    const int32_t parent = parents[p];
    if (parent >= 0 && node_of[parent] < 0) continue;
    node_of[p] = static_cast<int32_t>(tree.tokens.size());
    tree.tokens.push_back(tokens[p]);
    tree.parents.push_back(parent >= 0 ? node_of[parent] : -1);
  }
  return tree;
}

}  // namespace hsx
