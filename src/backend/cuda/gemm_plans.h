// cuBLASLt matmul plans for the CUDA backend's Linear: one per exact shape, each with
// the algorithm it runs (the heuristic's first; the fastest of its top candidates, timed
// once per power-of-two bucket of m; or, in batch-invariant mode, one per weight shape).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/env_switch.h"
#include "tensor/dtype.h"

namespace hsx {

struct GemmPlans {
  cublasLtHandle_t lt = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;  // kWorkspaceBytes of device memory
  bool batch_invariant = false;
  bool profile = false;  // HSX_PROFILE: tuning and batch-invariant choices are printed
  static constexpr size_t kWorkspaceBytes = 64ull << 20;

  static cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

  // One matmul plan per exact shape: descriptors plus the algorithm it runs.
  struct Plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int64_t m;
    bool fp8;
    std::string label;  // "linear NxK": the profile's entry for this GEMM shape
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, int, bool>, Plan> plans;

  // HSX_GEMM_TUNE=0 runs the heuristic's first algorithm instead of the fastest of its top
  // candidates, so a benchmark can compare both.
  bool tune = EnvOn("HSX_GEMM_TUNE");
  static constexpr int kTuneCandidates = 8;
  // Decode-sized GEMMs (m up to this) take the heuristic's first: they stream their weights
  // from HBM, but Tune's back-to-back runs find them in L2 (a q/k/v or o_proj weight fits
  // H200's 50 MB), and the algorithms that won there lost in the step: batch 128 decode
  // ran 10.41-10.45 ms a step tuned against 9.03-9.29 untuned, batch 32 5.63-5.66 against
  // 5.54-5.57 (nvidia-h200, one call, two rounds). Prefill GEMMs are compute-bound and keep
  // their timed winners.
  static constexpr int64_t kMaxUntunedRows = 256;
  // The timed winner per (n, k, out dtype, m bucket). m changes nearly every step, so timing
  // each exact m would tune on most steps; m's of one power-of-two bucket share one timing.
  std::map<std::tuple<int64_t, int64_t, int, int64_t, bool>, cublasLtMatmulAlgo_t> tuned;

  static std::string LinearLabel(int64_t n, int64_t k, bool fp8 = false) {
    return (fp8 ? "linear fp8 " : "linear ") + std::to_string(n) + "x" + std::to_string(k);
  }

  // Row-major y[m, n] = x[m, k] w[n, k]^T is column-major y^T = w x^T: A = w (transposed), B = x.
  // FP8 ("TN", the layout Hopper's FP8 GEMMs require): A and B hold E4M3 codes, and
  // cuBLASLt's outer-vector scaling multiplies element (j, i) of y^T by w's row scale j and
  // x's row scale i; SetFp8Scales points at them before each call.
  Plan MakePlan(int64_t m, int64_t n, int64_t k, DType out, bool fp8) {
    Plan p;
    p.m = m;
    p.fp8 = fp8;
    p.label = LinearLabel(n, k, fp8);
    Check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    Check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa), "TRANSA");
    Check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb), "TRANSB");
    if (fp8) {
      // Hopper's fast FP8 accumulation (no periodic promotion to f32), as vLLM's FP8 GEMMs run.
      const int8_t fast_accum = 1;
      Check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum),
            "FAST_ACCUM");
      const int32_t outer_vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      Check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer_vec, sizeof outer_vec),
            "A_SCALE_MODE");
      Check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer_vec, sizeof outer_vec),
            "B_SCALE_MODE");
    }
    const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    Check(cublasLtMatrixLayoutCreate(&p.a, in, k, n, k), "layout A");
    Check(cublasLtMatrixLayoutCreate(&p.b, in, k, m, k), "layout B");
    Check(cublasLtMatrixLayoutCreate(&p.c, CudaType(out), n, m, n), "layout C");
    return p;
  }

  // An FP8 plan's scale vectors for the next call: w's per-row scales [n] and x's [m].
  static void SetFp8Scales(const Plan& p, const float* w_scales, const float* x_scales) {
    Check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales),
          "A_SCALE_POINTER");
    Check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales),
          "B_SCALE_POINTER");
  }

  // The heuristic's algorithms for p within the workspace, best guess first (at least one).
  std::vector<cublasLtMatmulHeuristicResult_t> Candidates(const Plan& p, int count) {
    cublasLtMatmulPreference_t pref;
    Check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    const size_t ws = kWorkspaceBytes;
    Check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "pref");
    if (batch_invariant) {
      // 16-byte alignment, so that the one algorithm also runs on MoE experts' row slices.
      const uint32_t align = 16;
      for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        Check(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align), "pref alignment");
    }
    std::vector<cublasLtMatmulHeuristicResult_t> results(count);
    int found = 0;
    Check(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, count, results.data(), &found),
          "heuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) {
      std::fprintf(stderr, "hsx: cuBLASLt has no algorithm for %s at m=%ld\n", p.label.c_str(), long(p.m));
      std::abort();
    }
    results.resize(found);
    return results;
  }

  cublasStatus_t Matmul(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* w, const void* x, void* y) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &algo, workspace,
                          kWorkspaceBytes, stream);
  }

  // Mean milliseconds of each candidate over kRounds runs, after a warm-up run of each, the
  // candidates taking turns within each round: a sustained GEMM brings an H200 to its power
  // cap within ~100 ms and its clock down from 1.98 GHz to 1.5-1.7 (measured 2026-12-02), so
  // candidates timed one after another would meet different clocks, the first the highest.
  // Infinity for a candidate cuBLASLt refuses to launch.
  std::vector<float> TimeCandidates(const Plan& p, const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                                    const void* w, const void* x, void* y) {
    constexpr int kRounds = 3;
    constexpr float kRefused = std::numeric_limits<float>::infinity();
    std::vector<float> ms(candidates.size(), 0.0f);
    auto run = [&](size_t c) {
      if (Matmul(p, candidates[c].algo, w, x, y) == CUBLAS_STATUS_SUCCESS) return true;
      cudaGetLastError();  // a refused launch must not surface at the next op's check
      ms[c] = kRefused;
      return false;
    };
    for (size_t c = 0; c < candidates.size(); ++c) run(c);
    // marks[i] and marks[i + 1] bracket timed run i, of candidate ran[i].
    std::vector<cudaEvent_t> marks(1);
    std::vector<size_t> ran;
    HSX_CUDA_CHECK(cudaEventCreate(&marks[0]));
    HSX_CUDA_CHECK(cudaEventRecord(marks[0], stream));
    for (int r = 0; r < kRounds; ++r) {
      for (size_t c = 0; c < candidates.size(); ++c) {
        if (ms[c] == kRefused || !run(c)) continue;
        HSX_CUDA_CHECK(cudaEventCreate(&marks.emplace_back()));
        HSX_CUDA_CHECK(cudaEventRecord(marks.back(), stream));
        ran.push_back(c);
      }
    }
    HSX_CUDA_CHECK(cudaEventSynchronize(marks.back()));
    for (size_t i = 0; i < ran.size(); ++i) {
      float run_ms = 0;
      HSX_CUDA_CHECK(cudaEventElapsedTime(&run_ms, marks[i], marks[i + 1]));
      if (ms[ran[i]] != kRefused) ms[ran[i]] += run_ms / kRounds;
    }
    for (cudaEvent_t e : marks) HSX_CUDA_CHECK(cudaEventDestroy(e));
    return ms;
  }

  // Times the heuristic's top candidates on this call's own buffers (y is written, the real
  // call overwrites it after) and returns the fastest: the heuristic ranks by a model of the
  // GPU, not by a measurement.
  cublasLtMatmulAlgo_t Tune(const Plan& p, int64_t bucket, const void* w, const void* x, void* y) {
    const auto candidates = Candidates(p, kTuneCandidates);
    const std::vector<float> ms = TimeCandidates(p, candidates, w, x, y);
    // If every launch was refused, the first candidate runs and Linear reports its error.
    const size_t best = std::min_element(ms.begin(), ms.end()) - ms.begin();
    if (profile)
      std::fprintf(stderr, "hsx gemm tune: %s m<=%ld (at m=%ld): algo %zu of %zu, %.4f ms vs heuristic-first %.4f ms\n",
                   p.label.c_str(), long(bucket), long(p.m), best, candidates.size(), ms[best], ms[0]);
    return candidates[best].algo;
  }

  // Whether cuBLASLt runs algo (tuned at another m of the bucket) on p's exact shape within
  // the workspace.
  bool Accepts(const Plan& p, const cublasLtMatmulAlgo_t& algo) {
    cublasLtMatmulHeuristicResult_t result;
    return cublasLtMatmulAlgoCheck(lt, p.op, p.a, p.b, p.c, p.c, &algo, &result) == CUBLAS_STATUS_SUCCESS &&
           result.workspaceSize <= kWorkspaceBytes;
  }

  // The bucket's timed algorithm (tuning it on this call if it is the bucket's first) when
  // it accepts p's m, else the heuristic's first for p.
  cublasLtMatmulAlgo_t TunedAlgo(const Plan& p, int64_t n, int64_t k, DType out, const void* w, const void* x,
                                 void* y) {
    const int64_t bucket = std::max<int64_t>(16, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(p.m))));
    const auto key = std::make_tuple(n, k, static_cast<int>(out), bucket, p.fp8);
    auto it = tuned.find(key);
    if (it == tuned.end()) it = tuned.emplace(key, Tune(p, bucket, w, x, y)).first;
    return Accepts(p, it->second) ? it->second : Candidates(p, 1)[0].algo;
  }

  // Batch-invariant mode: one algorithm per (n, k, out dtype) for every m. A tiled GEMM
  // without split-K computes each output element by the same loop over k whatever the
  // other rows, so a row's bits then depend on its own inputs only. The algorithm is the
  // heuristic's first for a full prefill step (kInvariantM rows), not a timed winner:
  // timings vary from run to run, and so would the files.
  static constexpr int64_t kInvariantM = 8192;
  std::map<std::tuple<int64_t, int64_t, int>, cublasLtMatmulAlgo_t> invariant;
  cublasLtMatmulAlgo_t InvariantAlgo(const Plan& p, int64_t n, int64_t k, DType out) {
    const auto key = std::make_tuple(n, k, static_cast<int>(out));
    auto it = invariant.find(key);
    if (it == invariant.end()) {
      Plan reference = MakePlan(kInvariantM, n, k, out, /*fp8=*/false);
      const auto candidates = Candidates(reference, kTuneCandidates);
      DestroyPlan(reference);
      // The first that splits no K; failing that, the first with its split turned off.
      cublasLtMatmulAlgo_t algo = candidates[0].algo;
      for (const auto& c : candidates) {
        int32_t splits = 1;
        Check(cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                                   nullptr), "get SPLITK_NUM");
        if (splits <= 1) {
          algo = c.algo;
          break;
        }
      }
      const int32_t one_split = 1;
      const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
      Check(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one_split, sizeof one_split),
            "SPLITK_NUM");
      Check(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &no_reduction,
                                                 sizeof no_reduction), "REDUCTION_SCHEME");
      if (profile) {
        uint32_t config[4] = {};  // algorithm id, tile, stages, custom option
        const cublasLtMatmulAlgoConfigAttributes_t attrs[4] = {CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID,
                                                               CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                                               CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION};
        for (int i = 0; i < 4; ++i)
          cublasLtMatmulAlgoConfigGetAttribute(&algo, attrs[i], &config[i], sizeof config[i], nullptr);
        std::fprintf(stderr, "hsx gemm batch-invariant: %s: algo %u tile %u stages %u custom %u\n", p.label.c_str(),
                     config[0], config[1], config[2], config[3]);
      }
      it = invariant.emplace(key, algo).first;
    }
    if (!Accepts(p, it->second)) {
      std::fprintf(stderr, "hsx: --batch-invariant: cuBLASLt refuses %s's algorithm at m=%ld\n", p.label.c_str(),
                   long(p.m));
      std::abort();
    }
    return it->second;
  }

  static void DestroyPlan(Plan& p) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }

  // Plans are cached per exact m: layouts are cheap, and m repeats (decode steps, full prefill budgets).
  // FP8 plans (fp8_scales = {w's, x's}) tune on those scales and take them for the call.
  const Plan& GetPlan(int64_t m, int64_t n, int64_t k, DType out, const void* w, const void* x, void* y,
                      std::optional<std::pair<const float*, const float*>> fp8_scales = std::nullopt) {
    auto key = std::make_tuple(m, n, k, static_cast<int>(out), fp8_scales.has_value());
    auto it = plans.find(key);
    if (it != plans.end()) {
      if (fp8_scales) SetFp8Scales(it->second, fp8_scales->first, fp8_scales->second);
      return it->second;
    }
    Plan p = MakePlan(m, n, k, out, fp8_scales.has_value());
    if (fp8_scales) SetFp8Scales(p, fp8_scales->first, fp8_scales->second);
    if (batch_invariant && !p.fp8) p.algo = InvariantAlgo(p, n, k, out);  // the CLI refuses fp8 with it
    else p.algo = tune && m > kMaxUntunedRows ? TunedAlgo(p, n, k, out, w, x, y) : Candidates(p, 1)[0].algo;
    return plans.emplace(key, std::move(p)).first->second;
  }
};

}  // namespace hsx
