// Backend::MoveRows on the device: rows src[i] of x copied to rows dst[i], every source
// read before any destination is written (a token tree's accepted KV moved onto its path,
// where a destination can be another move's source). Each block owns a column range of
// every moved row: it stages that range of all sources in shared memory, waits, then
// writes it to the destinations, so no block writes what another still has to read. More
// moves than shared memory holds go through a scratch copy in global memory instead.
#include <algorithm>

#include "backend/cuda/kernels.h"

namespace hsx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kStagedBytes = 32 << 10;  // shared memory per block

__global__ void MoveRowsKernel(uint32_t* x, const int32_t* moves, int n, int64_t row_words, int chunk) {
  extern __shared__ uint32_t staged[];  // [n][chunk]
  const int64_t c0 = int64_t(blockIdx.x) * chunk;
  const int width = static_cast<int>(min(int64_t(chunk), row_words - c0));
  for (int i = threadIdx.x; i < n * width; i += blockDim.x)
    staged[(i / width) * chunk + i % width] = x[int64_t(moves[i / width]) * row_words + c0 + i % width];
  __syncthreads();
  for (int i = threadIdx.x; i < n * width; i += blockDim.x)
    x[int64_t(moves[n + i / width]) * row_words + c0 + i % width] = staged[(i / width) * chunk + i % width];
}

// The scratch path: copy rows idx[i] of from to rows out_idx[i] of to (null: row i).
__global__ void CopyRowsKernel(const uint32_t* from, const int32_t* idx, int64_t row_words, uint32_t* to,
                               const int32_t* out_idx) {
  const int64_t src = idx != nullptr ? idx[blockIdx.x] : blockIdx.x;
  const int64_t dst = out_idx != nullptr ? out_idx[blockIdx.x] : blockIdx.x;
  for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) to[dst * row_words + i] = from[src * row_words + i];
}

}  // namespace

int64_t MoveRowsScratchBytes(int64_t n, int64_t row_bytes) {
  return n * 4 <= kStagedBytes ? 0 : n * row_bytes;
}

void MoveRows(void* x, const int32_t* moves, int64_t n, int64_t row_bytes, void* scratch, cudaStream_t stream) {
  if (n <= 0) return;
  auto* words = static_cast<uint32_t*>(x);
  const int64_t row_words = row_bytes / 4;
  if (scratch == nullptr) {
    const int chunk = static_cast<int>(std::clamp<int64_t>(kStagedBytes / (4 * n), 1, row_words));
    const int64_t blocks = (row_words + chunk - 1) / chunk;
    MoveRowsKernel<<<blocks, kThreads, n * chunk * 4, stream>>>(words, moves, static_cast<int>(n), row_words, chunk);
    return;
  }
  auto* staged = static_cast<uint32_t*>(scratch);
  CopyRowsKernel<<<n, kThreads, 0, stream>>>(words, moves, row_words, staged, nullptr);
  CopyRowsKernel<<<n, kThreads, 0, stream>>>(staged, nullptr, row_words, words, moves + n);
}

}  // namespace hsx::cuda
