// A static speculative token tree, vLLM's `speculative_token_tree`: a Python-literal list
// of paths, each a tuple of child ranks from the root ("[(0,), (1,), (0, 0)]": the draft's
// two most likely tokens after the root, then the most likely after the first). Node i is
// the i-th path in vLLM's order (sorted by (length, path): breadth-first, ranks ascending);
// its token is the draft's rank-th most likely after its parent's. A tree of one path
// (0,), (0, 0), ... is the chain.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace hsx {

struct TokenTree {
  // Nodes and the root fit one 64-bit ancestor mask per verification row (AttentionBatch).
  static constexpr int kMaxNodes = 63;

  std::vector<std::vector<int>> paths;  // node i's path (vLLM's order)
  std::vector<int32_t> parent;          // node i's parent node, -1: the root
  std::vector<int32_t> depth;           // 1 for the root's children
  std::vector<int32_t> rank;            // the last entry of its path
  int max_depth = 0;

  int size() const { return static_cast<int>(paths.size()); }
  bool is_chain() const { return max_depth == size(); }
  // How many nodes have depth <= d: vLLM's order puts them first, and they form a tree.
  int NodesUpToDepth(int d) const;
  // Bit j set for node j when it is node i or one of its ancestors (the root not included).
  uint64_t AncestorMask(int i) const;

  // text: the option's value, checked as vLLM's ast.literal_eval would read it and then as
  // a tree: non-empty, every path's proper prefixes present, no path twice, ranks >= 0,
  // at most kMaxNodes nodes. Errors name `field`.
  static Result<TokenTree> Parse(const std::string& text, const std::string& field);
  // The chain of k nodes (vLLM's default tree).
  static TokenTree Chain(int k);
};

// For any tree given by its parents (node i's parent, -1: the root; parents first), as a
// request's drafts carry it (static or dynamic): bit j set for node j when it is node i or
// one of its ancestors, and node i's depth (1 for the root's children).
uint64_t AncestorMask(const std::vector<int32_t>& parent, int i);
int NodeDepth(const std::vector<int32_t>& parent, int i);

}  // namespace hsx
