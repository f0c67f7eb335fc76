#include "engine/block_manager.h"

#include <algorithm>

namespace hsx {

BlockManager::BlockManager(int num_blocks, int block_size, bool prefix_caching, int lookahead)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      lookahead_(lookahead),
      prefix_caching_(prefix_caching),
      blocks_(num_blocks) {
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

uint64_t BlockManager::ChainHash(uint64_t parent, const int32_t* tokens) const {
  // FNV-1a over the parent hash and the block's tokens (and lookahead), then a final mix.
  uint64_t h = 1469598103934665603ull ^ parent;
  for (int i = 0; i < block_size_ + lookahead_; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

int32_t BlockManager::Take() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = evictable_.front();
    evictable_.pop_front();
    Block& b = blocks_[id];
    cached_.erase(b.hash);
    b.cached = false;
    b.tokens.clear();
  }
  blocks_[id].ref = 1;
  return id;
}

int BlockManager::MatchPrefix(Sequence& seq) {
  seq.num_cached_tokens = 0;
  if (!prefix_caching_ || !seq.block_table.empty()) return 0;
  // Keep the last prompt token to compute (so a block's lookahead is a prompt token too).
  const int full = (seq.prompt_len() - 1) / block_size_;
  query_tokens_ += seq.prompt_len();
  uint64_t parent = 0;
  const int32_t* tokens = seq.request().prompt.data();
  for (int b = 0; b < full; ++b) {
    const uint64_t h = ChainHash(parent, tokens + b * block_size_);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    Block& block = blocks_[it->second];
    const int32_t* key = tokens + b * block_size_;
    if (!std::equal(block.tokens.begin(), block.tokens.end(), key, key + block_size_ + lookahead_)) break;
    if (block.ref++ == 0) evictable_.erase(block.lru);
    seq.block_table.push_back(it->second);
    seq.block_hashes.push_back(h);
    parent = h;
  }
  seq.num_computed = seq.num_cached_tokens = static_cast<int>(seq.block_table.size()) * block_size_;
  hit_tokens_ += seq.num_cached_tokens;
  return seq.num_cached_tokens;
}

bool BlockManager::Reserve(Sequence& seq, int tokens) {
  const int need = BlocksFor(tokens, block_size_) - static_cast<int>(seq.block_table.size());
  if (need <= 0) return true;
  if (need > num_free_blocks()) return false;
  for (int i = 0; i < need; ++i) seq.block_table.push_back(Take());
  return true;
}

void BlockManager::Commit(Sequence& seq, int tokens) {
  if (!prefix_caching_) return;
  const int full = std::min({tokens, seq.prompt_len() - lookahead_, seq.num_computed}) / block_size_;
  const int32_t* prompt = seq.request().prompt.data();
  for (int b = static_cast<int>(seq.block_hashes.size()); b < full && b < static_cast<int>(seq.block_table.size()); ++b) {
    const uint64_t h = ChainHash(seq.block_hashes.empty() ? 0 : seq.block_hashes.back(), prompt + b * block_size_);
    seq.block_hashes.push_back(h);
    Block& block = blocks_[seq.block_table[b]];
    if (block.cached || cached_.count(h)) continue;  // the same content is cached already
    block.cached = true;
    block.hash = h;
    block.tokens.assign(prompt + b * block_size_, prompt + (b + 1) * block_size_ + lookahead_);
    cached_[h] = seq.block_table[b];
  }
}

void BlockManager::Release(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    Block& block = blocks_[*it];
    if (--block.ref > 0) continue;
    if (block.cached) {
      block.lru = evictable_.insert(evictable_.end(), *it);
    } else {
      free_.push_back(*it);
    }
  }
  seq.block_table.clear();
  seq.block_hashes.clear();
  seq.num_computed = 0;
}

}  // namespace hsx
