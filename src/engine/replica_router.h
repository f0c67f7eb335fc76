// Which data-parallel replica takes a request. Prompts that share their first KV block
// go to one replica, whose prefix cache then holds their common blocks (M replicas with
// their own caches would otherwise each compute them); that replica yields to the least
// loaded one once it has `slack` more requests outstanding, so one hot prefix cannot
// pile everything onto one replica while the others idle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hsx {

class ReplicaRouter {
 public:
  ReplicaRouter(int block_size, size_t slack) : block_size_(block_size), slack_(slack) {}

  // `loads[r]`: replica r's outstanding requests (queued or running). A prompt shorter
  // than one block shares no cached block with anything: it goes by load alone (the
  // lowest index among equals).
  int Pick(const std::vector<int32_t>& prompt, const std::vector<size_t>& loads) const;
  // The replica a prompt's first block maps to, or -1 for a prompt shorter than a block.
  int Preferred(const std::vector<int32_t>& prompt, size_t num_replicas) const;

 private:
  int block_size_;
  size_t slack_;
};

}  // namespace hsx
