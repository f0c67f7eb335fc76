#include "backend/cpu/sgemm.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "util/thread_pool.h"

#ifdef HSX_GEMM_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#else
#include <cblas.h>
extern "C" char* openblas_get_corename();
#endif

namespace hsx {

void SgemmSingleThreaded(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                       int64_t ldb, BLayout layout, float* c, int64_t ldc) {
#ifdef HSX_GEMM_DNNL
  omp_set_num_threads(1);  // this thread's setting only: no OpenMP team, no spinning workers
  const dnnl_status_t status =
      dnnl_sgemm('N', layout == BLayout::kRowsOfN ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc);
  if (status != dnnl_success) {  // only for arguments the backend never passes, or no memory
    std::fprintf(stderr, "hsx: dnnl_sgemm(m=%lld, n=%lld, k=%lld) failed with status %d\n", static_cast<long long>(m),
                 static_cast<long long>(n), static_cast<long long>(k), static_cast<int>(status));
    std::abort();
  }
#else
  static const bool single = (openblas_set_num_threads(1), true);  // process-wide in OpenBLAS
  (void)single;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, layout == BLayout::kRowsOfN ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              lda, b, ldb, 0.0f, c, ldc);
#endif
}

// The rows are split over hsx's thread pool, one single-threaded library call per share.
// A library's own threads (OpenMP's, OpenBLAS's) spin-wait between calls on cores the
// pool's ops then need: with oneDNN's OpenMP workers that took half of a 2-core run.
// The split depends only on m and the pool's size, so equal shapes round alike.
void Sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
           BLayout layout, float* c, int64_t ldc) {
  if (m * n * k < (1 << 18)) {  // too small to pay for waking the pool
    SgemmSingleThreaded(m, n, k, alpha, a, lda, b, ldb, layout, c, ldc);
    return;
  }
  ThreadPool::Global().ParallelFor(m, [&](int64_t begin, int64_t end) {
    SgemmSingleThreaded(end - begin, n, k, alpha, a + begin * lda, lda, b, ldb, layout, c + begin * ldc, ldc);
  });
}

const char* SgemmLibrary() {
#ifdef HSX_GEMM_DNNL
  static const std::string name = [] {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }();
#else
  static const std::string name = std::string("OpenBLAS (") + openblas_get_corename() + ")";
#endif
  return name.c_str();
}

}  // namespace hsx
