// Paged KV cache storage: per KV-owning layer, K and V tensors of num_blocks * block_size
// token slots. Which slots a sequence uses is the engine's business (block tables).
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace hsx {

class KVCache {
 public:
  KVCache(const ModelConfig& config, Backend& backend, int num_blocks, int block_size);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  // The cache a layer reads and writes: its own, or its KV-sharing source's.
  Tensor& k(int layer) { return k_[cache_index_[layer_source_[layer]]]; }
  Tensor& v(int layer) { return v_[cache_index_[layer_source_[layer]]]; }
  // Copies every layer's K/V at slots src[i] to slots dst[i] (all read before any is
  // written): a token tree's accepted rows moved to the positions of their path.
  void MoveSlots(Backend& backend, const std::vector<int32_t>& src, const std::vector<int32_t>& dst);
  // Bytes one token takes across all layers, for sizing the cache to a memory budget.
  static size_t BytesPerToken(const ModelConfig& config, DType dtype);

 private:
  int num_blocks_, block_size_;
  std::vector<int> layer_source_, cache_index_;
  std::vector<Tensor> k_, v_;
};

}  // namespace hsx
