// Tensor parallelism's collectives: the ranks of one model, each on its own backend and
// host thread, call them in the same order. The CPU implementation joins threads of one
// process (CI runs tensor parallelism on it); cuda/nccl_communicator the GPUs of one host.
#pragma once

#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace hsx {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x = the sum of every rank's x, in place (compute dtype, same shape on every rank);
  // every rank gets the same bits.
  virtual void AllReduceSum(Tensor& x) = 0;
  // out (size() times x's elements) = every rank's x, in rank order.
  virtual void AllGather(const Tensor& x, Tensor& out) = 0;
};

// `size` communicators for ranks on the CPU backend in one process: f32, sums in rank
// order (so a sum is the same whichever rank computes it).
std::vector<std::unique_ptr<Communicator>> MakeCpuCommunicators(int size);

}  // namespace hsx
