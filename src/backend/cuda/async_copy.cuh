// cp.async (sm_80+): global-to-shared copies that bypass registers, so a thread can have
// many in flight before it waits for them.
#pragma once

#include <cuda_runtime.h>

namespace hsx::cuda {

// Copies 16 bytes; with `valid` false it writes zeros instead.
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src, bool valid = true) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CommitAsync() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void WaitAsync() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace hsx::cuda
