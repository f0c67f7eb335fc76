// Hands out fixed-size KV cache blocks to sequences and takes them back.
#pragma once

#include <vector>

#include "engine/sequence.h"

namespace hsx {

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int num_free_blocks() const { return static_cast<int>(free_.size()); }
  int num_blocks() const { return num_blocks_; }
  static int BlocksFor(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

  // Grows seq's block table to hold `tokens` tokens; false (and no change) if short of blocks.
  bool Reserve(Sequence& seq, int tokens);
  void Release(Sequence& seq);

 private:
  int num_blocks_, block_size_;
  std::vector<int32_t> free_;
};

}  // namespace hsx
