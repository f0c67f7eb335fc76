// Picks a backend by name: "cpu" (the f32 reference) or "cuda" / "cuda:N". With
// batch_invariant, a row's results do not depend on what else is in its batch (the
// backends say how), so a prompt gives the same bits alone, batched, chunked or cached.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "util/status.h"

namespace hsx {

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& device, bool batch_invariant = false);

// The communicators joining tensor-parallel ranks, rank r on backends[r]: in-process ones
// on the cpu, NCCL on CUDA devices (one GPU each).
Result<std::vector<std::unique_ptr<Communicator>>> MakeCommunicators(const std::vector<Backend*>& backends);

}  // namespace hsx
