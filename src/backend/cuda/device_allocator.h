// The CUDA backend's device memory.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace hsx {

// Caching allocator: freed blocks return to a per-size free list and are reused in
// stream order (one stream, so a reuse is always after the last use). Sizes are
// rounded to 1/8-octave classes so varying batch shapes share blocks. While a graph is
// recorded, blocks come from and go back to a second set of lists kept for graphs: a
// graph writes its blocks at every replay, so no tensor outside graphs may hold one.
class DeviceAllocator : public std::enable_shared_from_this<DeviceAllocator> {
  using FreeLists = std::unordered_map<size_t, std::vector<void*>>;

 public:
  std::shared_ptr<void> Allocate(size_t bytes) {
    const size_t size = RoundUp(std::max<size_t>(bytes, 256));
    void* p = nullptr;
    const bool for_graphs = recording_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& list = (for_graphs ? graph_free_ : free_)[size];
      if (!list.empty()) {
        p = list.back();
        list.pop_back();
      }
    }
    if (p == nullptr && cudaMalloc(&p, size) != cudaSuccess) {
      cudaGetLastError();
      if (!for_graphs) ReleaseCached();  // synchronizes: not while a graph is recorded
      HSX_CUDA_CHECK(cudaMalloc(&p, size));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_use_ += size;
      peak_ = std::max(peak_, in_use_);
    }
    std::weak_ptr<DeviceAllocator> self = shared_from_this();
    return std::shared_ptr<void>(p, [self, size, for_graphs](void* q) {
      if (auto a = self.lock()) {
        std::lock_guard<std::mutex> lock(a->mu_);
        (for_graphs ? a->graph_free_ : a->free_)[size].push_back(q);
        a->in_use_ -= size;
      }
    });
  }
  size_t peak() const { return peak_; }
  // Called by the recording thread around a recording.
  void set_recording(bool on) { recording_ = on; }

  ~DeviceAllocator() {
    ReleaseCached();
    for (auto& [size, list] : graph_free_)
      for (void* p : list) cudaFree(p);
  }

 private:
  static size_t RoundUp(size_t n) {
    if (n <= 4096) return (n + 255) / 256 * 256;
    const int top = 63 - __builtin_clzll(n);
    const size_t step = size_t{1} << (top - 3);
    return (n + step - 1) / step * step;
  }
  void ReleaseCached() {
    std::lock_guard<std::mutex> lock(mu_);
    cudaDeviceSynchronize();
    for (auto& [size, list] : free_)
      for (void* p : list) cudaFree(p);
    free_.clear();
  }
  std::mutex mu_;
  FreeLists free_, graph_free_;
  bool recording_ = false;
  size_t in_use_ = 0, peak_ = 0;
};

}  // namespace hsx
