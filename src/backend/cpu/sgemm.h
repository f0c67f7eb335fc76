// The CPU backend's one f32 GEMM, row-major: C[m, n] = alpha · A[m, k] · op(B), where op(B) is
// B^T for B stored as [n, k] rows (a weight) and B itself for B stored as [k, n].
// Which library runs it is chosen at build time (HSX_CPU_GEMM; docs/DEPENDENCIES.md says why).
#pragma once

#include <cstdint>

namespace hsx {

enum class BLayout { kRowsOfN, kRowsOfK };  // B as [n, k] (op = transpose) or [k, n]

void Sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
           BLayout layout, float* c, int64_t ldc);

// Sgemm as one library call on the calling thread: the same (m, n, k) always runs the same
// code, which Sgemm's split of m over the thread pool does not promise per row.
void SgemmSingleThreaded(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                         int64_t ldb, BLayout layout, float* c, int64_t ldc);

// The library behind Sgemm, as `hsx bench` names it.
const char* SgemmLibrary();

}  // namespace hsx
