// Tensor parallelism across the GPUs of one host through NCCL: one communicator per rank
// (ncclCommInitAll), each collective enqueued on its rank's compute stream, so it orders
// with the forward's kernels and the host thread never waits on it.
#pragma once

#include <memory>
#include <vector>

#include "backend/communicator.h"
#include "backend/cuda/cuda_backend.h"
#include "util/status.h"

namespace hsx {

// One communicator per backend, rank r on backends[r]'s device (each a different GPU).
// NVLink multicast (NVLS) is turned off: NCCL_NVLS_ENABLE=0.
Result<std::vector<std::unique_ptr<Communicator>>> MakeNcclCommunicators(const std::vector<CudaBackend*>& backends);

}  // namespace hsx
