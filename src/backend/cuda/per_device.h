// Kernel attributes (cudaFuncSetAttribute) belong to a device, and one process may drive
// several: a setting made once must be made once per device.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace hsx::cuda {

// Runs configure() the first time the calling thread's current device gets here; `done`
// is the caller's static, one bit per device. Two threads may both configure a device
// the first time: the settings are idempotent.
template <class F>
void OncePerDevice(std::atomic<uint64_t>& done, F&& configure) {
  int device = 0;
  cudaGetDevice(&device);
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  configure();
  done.fetch_or(bit, std::memory_order_acq_rel);
}

}  // namespace hsx::cuda
