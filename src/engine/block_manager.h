// Hands out fixed-size KV cache blocks to sequences and takes them back, with prefix
// caching: a full prompt block is registered under a hash chained over its tokens and
// all before it; a later sequence whose prompt starts the same way reuses those blocks
// (and their captured hidden states) instead of computing them. Blocks nobody holds stay
// cached until their slots are needed, then the least recently used goes first.
// With a lookahead of 1 (an EAGLE-3 draft, vLLM's num_hash_lookahead_tokens) a block's hash
// and key also cover the token after it: the draft's KV at a block's last position was
// computed from that token, so the block is reusable only where it follows too.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "engine/sequence.h"

namespace hsx {

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size, bool prefix_caching, int lookahead = 0);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  // Blocks that can be handed out now: never used, or cached and held by no sequence.
  int num_free_blocks() const { return static_cast<int>(free_.size() + evictable_.size()); }
  static int BlocksFor(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

  // For a sequence without blocks: takes the cached blocks matching its prompt's leading
  // full blocks (never the block holding the last prompt token, which must be computed)
  // and sets num_computed and num_cached_tokens. Returns the tokens reused.
  int MatchPrefix(Sequence& seq);
  // Grows seq's block table to hold `tokens` tokens; false (and no change) if short of blocks.
  bool Reserve(Sequence& seq, int tokens);
  // Registers seq's full prompt blocks within its first `tokens` tokens (their KV, and
  // captured rows where capture is on, are complete) whose lookahead is in the prompt.
  void Commit(Sequence& seq, int tokens);
  void Release(Sequence& seq);

  uint64_t hits() const { return hit_tokens_; }
  uint64_t queries() const { return query_tokens_; }

 private:
  struct Block {
    int ref = 0;
    uint64_t hash = 0;
    bool cached = false;
    std::vector<int32_t> tokens;  // the block's tokens and lookahead, to rule out hash collisions
    std::list<int32_t>::iterator lru;
  };
  uint64_t ChainHash(uint64_t parent, const int32_t* tokens) const;
  int32_t Take();  // a never-used block, else evicts the least recently used cached one

  int num_blocks_, block_size_, lookahead_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;        // never cached, unheld
  std::list<int32_t> evictable_;     // cached, unheld; front = least recently used
  std::unordered_map<uint64_t, int32_t> cached_;
  uint64_t hit_tokens_ = 0, query_tokens_ = 0;
};

}  // namespace hsx
