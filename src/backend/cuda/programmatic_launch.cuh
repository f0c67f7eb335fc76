// Programmatic dependent launch (sm_90). A kernel launched with it may start while the
// kernel before it in the stream still runs, once every block of that one has called
// AllowDependentLaunch (or exited), and must call WaitForPriorGrid before it reads
// anything that kernel (or any before it) wrote. The GEMVs use it to put their first
// weight loads in flight while the norm or attention kernel before them finishes: at
// decode sizes a kernel's ramp and tail are a large share of its time. Both device calls
// are no-ops in a kernel launched the ordinary way.
#pragma once

#include <cuda_runtime.h>

namespace hsx::cuda {

__device__ __forceinline__ void AllowDependentLaunch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void WaitForPriorGrid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...), programmatically if asked.
template <typename... Params, typename... Args>
void LaunchMaybeProgrammatic(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, bool programmatic,
                             cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace hsx::cuda
