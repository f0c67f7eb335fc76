#include "engine/replica_router.h"

#include <algorithm>

#include "util/stable_hash.h"

namespace hsx {

int ReplicaRouter::Preferred(const std::vector<int32_t>& prompt, size_t num_replicas) const {
  if (num_replicas == 0 || block_size_ <= 0 || prompt.size() < static_cast<size_t>(block_size_)) return -1;
  const std::string_view first_block(reinterpret_cast<const char*>(prompt.data()),
                                     static_cast<size_t>(block_size_) * sizeof(int32_t));
  return static_cast<int>(StableHash(first_block) % num_replicas);
}

int ReplicaRouter::Pick(const std::vector<int32_t>& prompt, const std::vector<size_t>& loads) const {
  if (loads.empty()) return -1;
  const int least = static_cast<int>(std::min_element(loads.begin(), loads.end()) - loads.begin());
  const int preferred = Preferred(prompt, loads.size());
  if (preferred < 0 || loads[static_cast<size_t>(preferred)] >= loads[static_cast<size_t>(least)] + slack_) return least;
  return preferred;
}

}  // namespace hsx
