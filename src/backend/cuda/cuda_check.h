// The CUDA backend's checks: a CUDA or cuBLAS failure there is a programming error or a
// dead device, so it is reported and the process stops.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace hsx {

inline void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "hsx: CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}
inline void Check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "hsx: cuBLASLt error %d in %s\n", static_cast<int>(s), what);
    std::abort();
  }
}

}  // namespace hsx

#define HSX_CUDA_CHECK(expr) ::hsx::Check((expr), #expr)
#define HSX_LAUNCH_CHECK() ::hsx::Check(cudaGetLastError(), __func__)
