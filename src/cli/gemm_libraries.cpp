#include "cli/gemm_libraries.h"

#include <dlfcn.h>

#include <chrono>
#include <functional>

#include "backend/cpu/sgemm.h"

namespace hsx::cli {
namespace {

using GemmCall = std::function<void(const GemmShape&, const float* a, const float* w, float* c)>;

// Best-of-3 seconds per shape, summed; the result in GFLOP/s.
double Measure(const std::vector<GemmShape>& shapes, const GemmCall& gemm) {
  double flops = 0, seconds = 0;
  for (const GemmShape& s : shapes) {
    const std::vector<float> a(static_cast<size_t>(s.m * s.k), 0.5f), w(static_cast<size_t>(s.n * s.k), 0.25f);
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      gemm(s, a.data(), w.data(), c.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    flops += 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    seconds += best;
  }
  return flops / seconds / 1e9;
}

// The CBLAS and oneDNN entry points, as each library exports them.
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

struct Candidate {
  const char* name;
  std::vector<const char*> sonames;  // newest first
  bool dnnl_api;
};

}  // namespace

std::vector<GemmLibraryResult> MeasureGemmLibraries(const std::vector<GemmShape>& shapes) {
  const std::string linked = SgemmLibrary();
  std::vector<GemmLibraryResult> results = {{linked, true, Measure(shapes, [](const GemmShape& s, const float* a,
                                                                           const float* w, float* c) {
                                               Sgemm(s.m, s.n, s.k, 1.0f, a, s.k, w, s.k, BLayout::kRowsOfN, c, s.n);
                                             })}};
  const std::vector<Candidate> candidates = {{"OpenBLAS", {"libopenblas.so.0"}, false},
                                             {"BLIS", {"libblis.so.4", "libblis.so.3"}, false},
                                             {"oneDNN", {"libdnnl.so.3", "libdnnl.so.2"}, true},
                                             {"MKL", {"libmkl_rt.so.3", "libmkl_rt.so.2"}, false}};
  for (const Candidate& cand : candidates) {
    if (linked.rfind(cand.name, 0) == 0) continue;  // measured above
    void* lib = nullptr;
    for (const char* soname : cand.sonames) {
      if ((lib = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) continue;  // not installed here. Never closed: its threads may outlive a call.
    std::string name = cand.name;
    if (auto corename = reinterpret_cast<const char* (*)()>(::dlsym(lib, "openblas_get_corename"))) {
      name += std::string(" (") + corename() + ")";
    }
    if (cand.dnnl_api) {
      auto sgemm = reinterpret_cast<DnnlSgemm>(::dlsym(lib, "dnnl_sgemm"));
      if (sgemm == nullptr) continue;
      results.push_back({name, false, Measure(shapes, [&](const GemmShape& s, const float* a, const float* w, float* c) {
                           sgemm('N', 'T', s.m, s.n, s.k, 1.0f, a, s.k, w, s.k, 0.0f, c, s.n);
                         })});
    } else {
      auto sgemm = reinterpret_cast<CblasSgemm>(::dlsym(lib, "cblas_sgemm"));
      if (sgemm == nullptr) continue;
      results.push_back({name, false, Measure(shapes, [&](const GemmShape& s, const float* a, const float* w, float* c) {
                           sgemm(kRowMajor, kNoTrans, kTrans, static_cast<int>(s.m), static_cast<int>(s.n),
                                 static_cast<int>(s.k), 1.0f, a, static_cast<int>(s.k), w, static_cast<int>(s.k), 0.0f,
                                 c, static_cast<int>(s.n));
                         })});
    }
  }
  return results;
}

}  // namespace hsx::cli
