// Kernels that need more than 48 KiB of dynamic shared memory must say so with
// cudaFuncSetAttribute, which applies to the current device only; a process may drive
// several GPUs, so the attribute is set once per device, not once per process.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

namespace hsx::cuda {

template <auto kKernel>
void AllowDynamicSharedMemory(size_t bytes) {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  int device = 0;
  cudaGetDevice(&device);
  auto set = [&] { cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)); };
  if (device >= 0 && device < kMaxDevices) {
    std::call_once(once[device], set);
  } else {
    set();
  }
}

}  // namespace hsx::cuda
