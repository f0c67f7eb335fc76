// Kernels that need more than 48 KiB of dynamic shared memory (or clusters of more than
// 8 blocks) must say so with cudaFuncSetAttribute, which applies to the current device
// only; a process may drive several GPUs, so an attribute is set once per device, not
// once per process.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

namespace hsx::cuda {

template <auto kKernel, cudaFuncAttribute kAttribute>
void SetKernelAttributeOncePerDevice(int value) {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  int device = 0;
  cudaGetDevice(&device);
  auto set = [&] { cudaFuncSetAttribute(kKernel, kAttribute, value); };
  if (device >= 0 && device < kMaxDevices) {
    std::call_once(once[device], set);
  } else {
    set();
  }
}

template <auto kKernel>
void AllowDynamicSharedMemory(size_t bytes) {
  SetKernelAttributeOncePerDevice<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(int(bytes));
}

}  // namespace hsx::cuda
