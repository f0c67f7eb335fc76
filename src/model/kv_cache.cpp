#include "model/kv_cache.h"

#include <algorithm>

namespace hsx {

KVCache::KVCache(const ModelConfig& config, Backend& backend, int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  const int64_t slots = static_cast<int64_t>(num_blocks) * block_size;
  cache_index_.assign(config.num_layers, -1);
  for (int i = 0; i < config.num_layers; ++i) {
    const LayerSpec& l = config.layers[i];
    layer_source_.push_back(l.kv_source);
    if (l.kv_source != i) continue;
    cache_index_[i] = static_cast<int>(k_.size());
    k_.push_back(backend.Empty(backend.compute_dtype(), {slots, l.num_kv_heads, l.head_dim}));
    v_.push_back(backend.Empty(backend.compute_dtype(), {slots, l.num_kv_heads, l.head_dim}));
  }
}

void KVCache::MoveSlots(Backend& backend, const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  if (src.empty()) return;
  // One upload of the moves for every cache; the backend orders reads before writes
  // (Backend::MoveRows: on CUDA one kernel per tensor, no host round trip).
  const auto n = static_cast<int64_t>(src.size());
  Tensor moves = Tensor::Host(DType::kI32, {2 * n});
  std::copy(src.begin(), src.end(), moves.data<int32_t>());
  std::copy(dst.begin(), dst.end(), moves.data<int32_t>() + n);
  if (backend.device() != Device::kCPU) moves = backend.Upload(moves);
  for (size_t c = 0; c < k_.size(); ++c) {  // each cache once: a shared layer's is its source's
    backend.MoveRows(k_[c], moves);
    backend.MoveRows(v_[c], moves);
  }
}

size_t KVCache::BytesPerToken(const ModelConfig& config, DType dtype) {
  size_t n = 0;
  for (int i = 0; i < config.num_layers; ++i) {
    const LayerSpec& l = config.layers[i];
    if (l.kv_source == i) n += 2 * static_cast<size_t>(l.num_kv_heads) * l.head_dim * DTypeSize(dtype);
  }
  return n;
}

}  // namespace hsx
