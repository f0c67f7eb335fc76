// hsx bench's GEMM baseline: the f32 GEMM of the backend (Sgemm) and of every other
// library the dynamic loader finds on this machine, timed side by side in the same run,
// so extraction is compared with the best GEMM available, not only the linked one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hsx::cli {

struct GemmShape {
  int64_t m, n, k;  // C[m, n] = A[m, k] · W^T, W stored [n, k] as a Linear's weight
};

struct GemmLibraryResult {
  std::string library;  // e.g. "oneDNN 2.6.3", "OpenBLAS (SkylakeX)"
  bool linked = false;  // the backend's own
  double gflops = 0;    // over all the shapes: their FLOPs over the sum of their best times
};

// The backend's library first, then each other one found (OpenBLAS, BLIS, oneDNN, MKL).
std::vector<GemmLibraryResult> MeasureGemmLibraries(const std::vector<GemmShape>& shapes);

}  // namespace hsx::cli
