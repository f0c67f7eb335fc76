#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/sampling_kernel.h"
#include "backend/cuda/verification_kernel.h"

namespace hsx {
namespace {

// A CUDA or cuBLAS failure here is a programming error or a dead device: report and stop.
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "hsx: CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}
void Check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "hsx: cuBLASLt error %d in %s\n", static_cast<int>(s), what);
    std::abort();
  }
}
#define HSX_CUDA_CHECK(expr) Check((expr), #expr)
#define HSX_LAUNCH_CHECK() Check(cudaGetLastError(), __func__)

// Caching allocator: freed blocks return to a per-size free list and are reused in
// stream order (one stream, so a reuse is always after the last use). Sizes are
// rounded to 1/8-octave classes so varying batch shapes share blocks. While a graph is
// recorded, blocks come from and go back to a second set of lists kept for graphs: a
// graph writes its blocks at every replay, so no tensor outside graphs may hold one.
class DeviceAllocator : public std::enable_shared_from_this<DeviceAllocator> {
  using FreeLists = std::unordered_map<size_t, std::vector<void*>>;

 public:
  std::shared_ptr<void> Allocate(size_t bytes) {
    const size_t size = RoundUp(std::max<size_t>(bytes, 256));
    void* p = nullptr;
    const bool for_graphs = recording_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& list = (for_graphs ? graph_free_ : free_)[size];
      if (!list.empty()) {
        p = list.back();
        list.pop_back();
      }
    }
    if (p == nullptr && cudaMalloc(&p, size) != cudaSuccess) {
      cudaGetLastError();
      if (!for_graphs) ReleaseCached();  // synchronizes: not while a graph is recorded
      HSX_CUDA_CHECK(cudaMalloc(&p, size));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_use_ += size;
      peak_ = std::max(peak_, in_use_);
    }
    std::weak_ptr<DeviceAllocator> self = shared_from_this();
    return std::shared_ptr<void>(p, [self, size, for_graphs](void* q) {
      if (auto a = self.lock()) {
        std::lock_guard<std::mutex> lock(a->mu_);
        (for_graphs ? a->graph_free_ : a->free_)[size].push_back(q);
        a->in_use_ -= size;
      }
    });
  }
  size_t peak() const { return peak_; }
  // Called by the recording thread around a recording.
  void set_recording(bool on) { recording_ = on; }

  ~DeviceAllocator() {
    ReleaseCached();
    for (auto& [size, list] : graph_free_)
      for (void* p : list) cudaFree(p);
  }

 private:
  static size_t RoundUp(size_t n) {
    if (n <= 4096) return (n + 255) / 256 * 256;
    const int top = 63 - __builtin_clzll(n);
    const size_t step = size_t{1} << (top - 3);
    return (n + step - 1) / step * step;
  }
  void ReleaseCached() {
    std::lock_guard<std::mutex> lock(mu_);
    cudaDeviceSynchronize();
    for (auto& [size, list] : free_)
      for (void* p : list) cudaFree(p);
    free_.clear();
  }
  std::mutex mu_;
  FreeLists free_, graph_free_;
  bool recording_ = false;
  size_t in_use_ = 0, peak_ = 0;
};

// A switch that is on unless its variable is "0".
bool EnvOn(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::string_view(e) != "0";
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

cuda::bf16* B(const Tensor& t) { return static_cast<cuda::bf16*>(t.raw()); }
int64_t RowsOf(const Tensor& t) { return t.numel() / t.size(-1); }
// Whether two tensors' bytes overlap.
bool Overlap(const Tensor& a, const Tensor& b) {
  const char *pa = a.data<char>(), *pb = b.data<char>();
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

struct CudaBackend::Impl {
  int device = 0;
  std::string name;
  cudaStream_t stream = nullptr;
  cudaStream_t copy_stream = nullptr;  // device-to-host capture copies, beside the compute
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;  // grouped GEMMs (MoE experts)
  std::shared_ptr<DeviceAllocator> allocator = std::make_shared<DeviceAllocator>();
  std::shared_ptr<void> workspace;
  // Head dim 128, 256 and 512 attention on warpgroup MMAs (sm_90); HSX_ATTENTION=mma keeps the
  // mma.sync kernel, for comparison.
  bool hopper_attention = false;
  bool batch_invariant = false;
  // Decode steps (one query per sequence) on the split-KV kernel; HSX_DECODE_ATTENTION=0
  // keeps the kernels above, for comparison. Off in batch-invariant mode.
  bool decode_attention = false;
  // Its chunks merged by their own blocks as a cluster where PlanDecodeSplits finds that
  // faster (attention_decode.cu); HSX_DECODE_CLUSTER=0: always by a second kernel.
  bool decode_cluster_merge = EnvOn("HSX_DECODE_CLUSTER");
  std::map<int, int> decode_cluster_capacity;  // per head dim, DecodeClusterCapacity's
  // Decode-sized Linear calls (m <= kGemvMaxRows) on hsx's weight-streaming kernel
  // (gemv.cu); HSX_GEMV=0 keeps cuBLASLt, for comparison. Off in batch-invariant mode,
  // which keeps one cuBLASLt algorithm per weight shape for every m.
  bool gemv = false;
  // The fusions, each with a switch for comparison: q/k norm, RoPE and the KV store in
  // one launch (HSX_NORM_ROPE_STORE=0: three), and the gated MLP's gate and up GEMVs with
  // the activation (HSX_GATED_GEMV=0: two GEMVs and the activation kernel).
  bool fuse_norm_rope_store = EnvOn("HSX_NORM_ROPE_STORE");
  // Decode and verification steps: the split-KV attention makes those inputs itself, one
  // launch where there were two, its keys fetched while the q/k/v GEMV finishes
  // (HSX_FUSE_ATTENTION_INPUTS=0: NormRopeStore, then the attention).
  bool fuse_attention_inputs = EnvOn("HSX_FUSE_ATTENTION_INPUTS");
  // Verification steps (a few queries per sequence) on the split-KV kernel too;
  // HSX_VERIFY_ATTENTION=0: on the prefill kernels, for comparison.
  int decode_attention_rows = EnvOn("HSX_VERIFY_ATTENTION") ? cuda::kDecodeMaxQueryRows : 1;
  bool gated_gemv = EnvOn("HSX_GATED_GEMV");
  // --quantization fp8: the norms and the gated activation before FP8 projections write
  // their codes and row scales directly (HSX_FP8_FUSED_INPUTS=0: bf16, then QuantizeRowsFp8).
  bool fp8_fused_inputs = EnvOn("HSX_FP8_FUSED_INPUTS");
  // GEMVs launch programmatically (programmatic_launch.cuh), their first weight loads
  // overlapping the norm or attention kernel before them (~1% at batch 1), and so do the
  // norms, norm/RoPE/store and the split-KV kernels, whose blocks become resident while
  // the kernel before them finishes; HSX_PDL=0: none.
  bool programmatic = EnvOn("HSX_PDL");
  int sm_count = 0;
  static constexpr size_t kWorkspaceBytes = 64ull << 20;

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

  // HSX_PROFILE=1: each op is timed with events and synchronized (so the total slows
  // down, the split stays right); the totals print when the backend is destroyed.
  bool profile = std::getenv("HSX_PROFILE") != nullptr;
  std::map<std::string, std::pair<double, int64_t>> profile_ms;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  struct Timer {
    Impl& impl;
    std::string_view name;  // a literal or a Plan's label, both outlive the timer
    Timer(Impl& i, std::string_view n) : impl(i), name(n) {
      if (impl.profile) cudaEventRecord(impl.t0, impl.stream);
    }
    ~Timer() {
      if (!impl.profile) return;
      cudaEventRecord(impl.t1, impl.stream);
      cudaEventSynchronize(impl.t1);
      float ms = 0;
      cudaEventElapsedTime(&ms, impl.t0, impl.t1);
      auto& e = impl.profile_ms[std::string(name)];
      e.first += ms;
      ++e.second;
    }
  };

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
    return cublasLtMatmul(lt, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &algo, workspace.get(),
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

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device_index, bool batch_invariant) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Error("--device cuda: no CUDA device is visible");
  }
  if (device_index >= count) return Error("--device cuda: device " + std::to_string(device_index) + " does not exist");
  auto impl = std::make_unique<Impl>();
  impl->device = device_index;
  impl->batch_invariant = batch_invariant;
  HSX_CUDA_CHECK(cudaSetDevice(device_index));
  cudaDeviceProp prop;
  HSX_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  impl->name = std::string("cuda:") + prop.name;
  const char* attention = std::getenv("HSX_ATTENTION");
  impl->hopper_attention = prop.major == 9 && !(attention && std::string(attention) == "mma");
  impl->decode_attention = !batch_invariant && EnvOn("HSX_DECODE_ATTENTION");
  impl->gemv = !batch_invariant && EnvOn("HSX_GEMV");
  impl->sm_count = prop.multiProcessorCount;
  HSX_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  HSX_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->copy_stream, cudaStreamNonBlocking));
  Check(cublasLtCreate(&impl->lt), "cublasLtCreate");
  Check(cublasCreate(&impl->blas), "cublasCreate");
  Check(cublasSetStream(impl->blas, impl->stream), "cublasSetStream");
  impl->workspace = impl->allocator->Allocate(Impl::kWorkspaceBytes);
  if (impl->profile) {
    HSX_CUDA_CHECK(cudaEventCreate(&impl->t0));
    HSX_CUDA_CHECK(cudaEventCreate(&impl->t1));
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  // Data-parallel replicas on other devices are destroyed from one thread: make ours current.
  cudaSetDevice(impl_->device);
  cudaStreamSynchronize(impl_->stream);
  if (impl_->profile) {
    double total = 0;
    for (const auto& [name, e] : impl_->profile_ms) total += e.first;
    for (const auto& [name, e] : impl_->profile_ms)
      std::fprintf(stderr, "hsx profile: %-18s %10.1f ms %5.1f%% %8ld calls\n", name.c_str(), e.first,
                   100.0 * e.first / total, static_cast<long>(e.second));
  }
  for (auto& [key, p] : impl_->plans) Impl::DestroyPlan(p);
  cublasLtDestroy(impl_->lt);
  cublasDestroy(impl_->blas);
  cudaStreamDestroy(impl_->stream);
  cudaStreamDestroy(impl_->copy_stream);
}

std::string CudaBackend::name() const { return impl_->name; }
size_t CudaBackend::peak_memory_bytes() const { return impl_->allocator->peak(); }

Tensor CudaBackend::Empty(DType dtype, Shape shape) {
  const size_t bytes = static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype);
  std::shared_ptr<void> owner = impl_->allocator->Allocate(bytes);
  void* p = owner.get();
  return Tensor(p, dtype, std::move(shape), Device::kCUDA, std::move(owner));
}

Tensor CudaBackend::Upload(const Tensor& host) {
  Tensor t = Empty(host.dtype(), host.shape());
  HSX_CUDA_CHECK(cudaMemcpyAsync(t.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, impl_->stream));
  return t;
}

Tensor CudaBackend::UploadWeight(const Tensor& host) {
  if (host.dtype() == DType::kBF16 || (host.dtype() != DType::kF32 && host.dtype() != DType::kF16)) return Upload(host);
  const Tensor raw = Upload(host);
  Tensor t = Empty(DType::kBF16, host.shape());
  cuda::ConvertToBF16(raw.raw(), host.dtype() == DType::kF32 ? 0 : 1, host.numel(), B(t), impl_->stream);
  HSX_LAUNCH_CHECK();
  return t;
}

Tensor CudaBackend::Download(const Tensor& t) {
  Tensor host = Tensor::Host(t.dtype(), t.shape());
  HSX_CUDA_CHECK(cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, impl_->stream));
  HSX_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  return host;
}

Tensor CudaBackend::HostBuffer(DType dtype, Shape shape) {
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype));
  void* p = nullptr;
  HSX_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  std::shared_ptr<void> owner(p, [](void* q) { cudaFreeHost(q); });
  return Tensor(p, dtype, std::move(shape), Device::kCPU, std::move(owner));
}

void CudaBackend::DownloadTo(const Tensor& t, Tensor& host) {
  Impl::Timer timer(*impl_, "download");
  HSX_CUDA_CHECK(cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, impl_->stream));
  HSX_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

namespace {
struct CudaPendingDownload final : PendingDownload {
  cudaEvent_t done = nullptr;
  ~CudaPendingDownload() override { cudaEventDestroy(done); }
  void Wait() override { HSX_CUDA_CHECK(cudaEventSynchronize(done)); }
};
}  // namespace

std::unique_ptr<PendingDownload> CudaBackend::DownloadAsync(const Tensor& t, Tensor& host) {
  auto pending = std::make_unique<CudaPendingDownload>();
  cudaEvent_t ready;
  HSX_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  HSX_CUDA_CHECK(cudaEventCreateWithFlags(&pending->done, cudaEventDisableTiming));
  HSX_CUDA_CHECK(cudaEventRecord(ready, impl_->stream));
  HSX_CUDA_CHECK(cudaStreamWaitEvent(impl_->copy_stream, ready));
  HSX_CUDA_CHECK(cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, impl_->copy_stream));
  HSX_CUDA_CHECK(cudaEventRecord(pending->done, impl_->copy_stream));
  HSX_CUDA_CHECK(cudaEventDestroy(ready));  // released once the copy stream has passed it
  return pending;
}

void CudaBackend::Copy(const Tensor& src, Tensor& dst) {
  Impl::Timer timer(*impl_, "copy");
  HSX_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, impl_->stream));
}

void CudaBackend::Synchronize() { HSX_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

void CudaBackend::UploadTo(const Tensor& host, Tensor& dst) {
  HSX_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, impl_->stream));
}

void CudaBackend::PinThread() { HSX_CUDA_CHECK(cudaSetDevice(impl_->device)); }
int CudaBackend::device_index() const { return impl_->device; }
void* CudaBackend::compute_stream() const { return impl_->stream; }

// HSX_PROFILE times each op with events and synchronizes, which a recording cannot hold.
bool CudaBackend::can_record() const { return !impl_->profile; }

namespace {
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void Replay() override { HSX_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};
}  // namespace

std::unique_ptr<DeviceGraph> CudaBackend::Record(const std::function<void()>& work) {
  // Relaxed: an allocation the graph pool lacks may cudaMalloc while recording.
  HSX_CUDA_CHECK(cudaStreamBeginCapture(impl_->stream, cudaStreamCaptureModeRelaxed));
  impl_->allocator->set_recording(true);
  work();
  impl_->allocator->set_recording(false);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(impl_->stream, &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    std::fprintf(stderr, "hsx: recording a CUDA graph failed (%s); running without\n", cudaGetErrorString(ended));
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "hsx: instantiating a CUDA graph failed (%s); running without\n", cudaGetErrorString(made));
    return nullptr;
  }
  return std::make_unique<CudaGraph>(exec, impl_->stream);
}

void CudaBackend::FillUniform(Tensor& t, uint64_t seed, float lo, float hi) {
  cuda::FillUniform(B(t), t.numel(), seed, lo, hi, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Embed(const Tensor& table, const Tensor& ids, float scale, Tensor& out) {
  Impl::Timer timer(*impl_, "embed");
  cuda::Embed(B(table), ids.data<int32_t>(), ids.numel(), table.size(1), scale, B(out), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t m = RowsOf(x), k = x.size(-1), n = w.size(0);
  if (m == 0) return;
  // cuBLASLt reads x and w while writing y, and tuning writes y before the real call.
  if (Overlap(y, x) || Overlap(y, w)) {
    std::fprintf(stderr, "hsx: Linear's output overlaps its input or weight\n");
    std::abort();
  }
  if (w.dtype() == DType::kF8E4M3) return LinearFp8(x, w, bias, y);
  const bool gemv = impl_->gemv && x.dtype() == DType::kBF16 && w.dtype() == DType::kBF16 &&
                    (y.dtype() == DType::kBF16 || y.dtype() == DType::kF32) &&
                    cuda::GemvSupports(x.raw(), w.raw(), m, k);
  // Planning (and tuning) comes before the timer so the profile shows only the GEMM.
  const Impl::Plan* p = gemv ? nullptr : &impl_->GetPlan(m, n, k, y.dtype(), w.raw(), x.raw(), y.raw());
  const std::string gemv_label = gemv && impl_->profile ? Impl::LinearLabel(n, k) : std::string();
  Impl::Timer timer(*impl_, gemv ? std::string_view(gemv_label) : std::string_view(p->label));
  if (gemv) {
    cuda::Gemv(B(x), B(w), m, n, k, y.raw(), y.dtype() == DType::kF32, impl_->stream, impl_->programmatic);
    HSX_LAUNCH_CHECK();
  } else {
    Check(impl_->Matmul(*p, p->algo, w.raw(), x.raw(), y.raw()), "cublasLtMatmul");
  }
  if (bias != nullptr) {
    cuda::AddBias(B(y), B(*bias), m, n, impl_->stream);
    HSX_LAUNCH_CHECK();
  }
}

// x comes quantized per row, or is quantized here (tensor/float8.h's rule) into scratch
// that lives until the stream has used it: the allocator reuses memory in stream order.
void CudaBackend::LinearFp8(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t m = RowsOf(x), k = x.size(-1), n = w.size(0);
  if ((x.dtype() != DType::kBF16 && x.dtype() != DType::kF8E4M3) || y.dtype() != DType::kBF16 ||
      w.row_scales() == nullptr) {
    std::fprintf(stderr, "hsx: an FP8 Linear takes bf16 or FP8 x, bf16 y and a weight with row scales\n");
    std::abort();
  }
  const Tensor xq = x.dtype() == DType::kF8E4M3 ? x : QuantizeRowsFp8(x.View({m, k}));
  const float* w_scales = w.row_scales()->data<float>();
  const Impl::Plan& p = impl_->GetPlan(m, n, k, y.dtype(), w.raw(), xq.raw(), y.raw(),
                                       std::make_pair(w_scales, xq.row_scales()->data<float>()));
  Impl::Timer timer(*impl_, p.label);
  Check(impl_->Matmul(p, p.algo, w.raw(), xq.raw(), y.raw()), "cublasLtMatmul (fp8)");
  if (bias != nullptr) {
    cuda::AddBias(B(y), B(*bias), m, n, impl_->stream);
    HSX_LAUNCH_CHECK();
  }
}

Tensor CudaBackend::QuantizeRowsFp8(const Tensor& x) {
  const int64_t n = x.size(0), k = x.size(1);
  if (x.dtype() != DType::kBF16 || k % 16 != 0) {  // FP8 GEMMs read 16-byte rows
    std::fprintf(stderr, "hsx: FP8 rows are quantized from bf16 with a multiple of 16 columns (got %s, %ld)\n",
                 std::string(DTypeName(x.dtype())).c_str(), static_cast<long>(k));
    std::abort();
  }
  Tensor q = Empty(DType::kF8E4M3, x.shape());
  Tensor scales = Empty(DType::kF32, {n});
  Impl::Timer timer(*impl_, "quantize_fp8");
  cuda::QuantizeRowsFp8(B(x), n, k, q.data<uint8_t>(), scales.data<float>(), impl_->stream);
  HSX_LAUNCH_CHECK();
  return q.WithRowScales(scales);
}

Tensor CudaBackend::RmsNormFp8(Tensor& x, const Tensor* branch, const Tensor* w, float eps, bool one_plus_weight) {
  const int64_t rows = RowsOf(x), dim = x.size(-1);
  if (impl_->fp8_fused_inputs && x.dtype() == DType::kBF16 && dim % 16 == 0) {  // FP8 GEMMs read 16-byte rows
    Tensor q = Empty(DType::kF8E4M3, {rows, dim});
    Tensor scales = Empty(DType::kF32, {rows});
    Impl::Timer timer(*impl_, branch != nullptr ? "add_rmsnorm_fp8" : "rmsnorm_fp8");
    if (cuda::RmsNormFp8(B(x), branch != nullptr ? B(*branch) : nullptr, w != nullptr ? B(*w) : nullptr, rows, dim,
                         eps, one_plus_weight, q.data<uint8_t>(), scales.data<float>(), impl_->stream)) {
      HSX_LAUNCH_CHECK();
      return q.WithRowScales(scales);
    }
  }
  return Backend::RmsNormFp8(x, branch, w, eps, one_plus_weight);
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor* w, float eps, bool one_plus_weight, Tensor& y) {
  Impl::Timer timer(*impl_, "rmsnorm");
  cuda::RmsNorm(B(x), w ? B(*w) : nullptr, RowsOf(x), x.size(-1), eps, one_plus_weight, B(y), impl_->stream,
                impl_->programmatic);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::AddRmsNorm(Tensor& residual, const Tensor& branch, const Tensor* w, float eps, bool one_plus_weight,
                             Tensor& y) {
  Impl::Timer timer(*impl_, "add_rmsnorm");
  cuda::AddRmsNorm(B(residual), B(branch), w ? B(*w) : nullptr, RowsOf(residual), residual.size(-1), eps,
                   one_plus_weight, B(y), impl_->stream, impl_->programmatic);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Add(Tensor& acc, const Tensor& x) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Add(B(acc), B(x), acc.numel(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Multiply(Tensor& acc, const Tensor& x) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Multiply(B(acc), B(x), acc.numel(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Scale(Tensor& x, float s) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Scale(B(x), x.numel(), s, nullptr, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::ScaleByTensor(Tensor& x, const Tensor& scalar) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Scale(B(x), x.numel(), 1.0f, B(scalar), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Softcap(Tensor& x, float cap) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Softcap(x.raw(), x.dtype() == DType::kF32, x.numel(), cap, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Activate(Tensor& x, Activation act) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Activate(B(x), x.numel(), act == Activation::kSilu ? 0 : 1, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::GatedLinear(const Tensor& x, const Tensor& gate_up, Activation act, Tensor& out) {
  const int64_t m = RowsOf(x), k = x.size(-1), n = gate_up.size(0) / 2;
  const bool fused = impl_->gemv && impl_->gated_gemv && out.dtype() == DType::kBF16 &&
                     gate_up.dtype() == DType::kBF16 && cuda::GemvSupports(x.raw(), gate_up.raw(), m, k);
  if (!fused) return Backend::GatedLinear(x, gate_up, act, out);
  if (Overlap(out, x)) {
    std::fprintf(stderr, "hsx: GatedLinear's output overlaps its input\n");
    std::abort();
  }
  const std::string label = impl_->profile ? "gated " + Impl::LinearLabel(2 * n, k) : std::string();
  Impl::Timer timer(*impl_, label);
  cuda::GatedGemv(B(x), B(gate_up), m, n, k, act == Activation::kSilu ? 0 : 1, B(out), impl_->stream,
                  impl_->programmatic);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::GatedActivation(const Tensor& gate_up, Activation act, Tensor& out) {
  Impl::Timer timer(*impl_, "gated_act");
  const int64_t cols = out.size(-1);
  cuda::GatedActivation(B(gate_up), B(gate_up) + cols, RowsOf(out), cols, 2 * cols, act == Activation::kSilu ? 0 : 1,
                        B(out), impl_->stream);
  HSX_LAUNCH_CHECK();
}

Tensor CudaBackend::GatedActivationFp8(const Tensor& gate_up, Activation act) {
  const int64_t rows = RowsOf(gate_up), cols = gate_up.size(-1) / 2;
  if (impl_->fp8_fused_inputs && gate_up.dtype() == DType::kBF16 && cols % 16 == 0) {  // FP8 GEMMs read 16-byte rows
    Tensor q = Empty(DType::kF8E4M3, {rows, cols});
    Tensor scales = Empty(DType::kF32, {rows});
    Impl::Timer timer(*impl_, "gated_act_fp8");
    if (cuda::GatedActivationFp8(B(gate_up), B(gate_up) + cols, rows, cols, 2 * cols,
                                 act == Activation::kSilu ? 0 : 1, q.data<uint8_t>(), scales.data<float>(),
                                 impl_->stream)) {
      HSX_LAUNCH_CHECK();
      return q.WithRowScales(scales);
    }
  }
  return Backend::GatedActivationFp8(gate_up, act);
}

namespace {
// The args of NormRopeStore for x [T, heads, D] alone (q's part).
cuda::NormRopeStoreArgs HeadArgs(Tensor& x, const Tensor* w, float eps, bool one_plus_weight, const Tensor& positions,
                                 const RopeTable& rope) {
  cuda::NormRopeStoreArgs a;
  a.q_in = B(x);
  a.q_stride = x.size(1) * x.size(2);
  a.q = B(x);
  a.q_norm = w != nullptr ? B(*w) : nullptr;
  a.q_heads = static_cast<int>(x.size(1));
  a.positions = positions.data<int32_t>();
  a.inv_freq = rope.inv_freq.data<float>();
  a.rotary_dims = rope.rotary_dims;
  a.tokens = x.size(0);
  a.dim = static_cast<int>(x.size(2));
  a.eps = eps;
  a.one_plus_weight = one_plus_weight;
  return a;
}
}  // namespace

void CudaBackend::Rope(Tensor& x, const Tensor& positions, const RopeTable& rope) {
  Impl::Timer timer(*impl_, "rope");
  LaunchNormRopeStore(HeadArgs(x, nullptr, 0.0f, false, positions, rope), FusedNormRopeTakes(x.size(0)));
}

void CudaBackend::RmsNormRope(Tensor& x, const Tensor& w, float eps, bool one_plus_weight, const Tensor& positions,
                              const RopeTable& rope) {
  Impl::Timer timer(*impl_, "norm_rope");
  LaunchNormRopeStore(HeadArgs(x, &w, eps, one_plus_weight, positions, rope), FusedNormRopeTakes(x.size(0)));
}

// The one-warp-per-head kernel (norm_rope_store.cu) for decode-sized steps, the per-token
// one (norm_rope.cu) for prefill. They give the same bits (tested); batch-invariant runs
// still keep the one kernel for every size.
bool CudaBackend::FusedNormRopeTakes(int64_t tokens) const {
  return !impl_->batch_invariant && tokens <= kFusedNormRopeMaxTokens;
}

void CudaBackend::NormRopeStoreKV(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms,
                                  const Tensor& positions, const RopeTable& rope, const Tensor& slots, Tensor& k_cache,
                                  Tensor& v_cache, Tensor& q) {
  if (qkv.dtype() != DType::kBF16)
    return Backend::NormRopeStoreKV(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, q);
  Impl::Timer timer(*impl_, "norm_rope_store");
  LaunchNormRopeStore(FusedRowsArgs(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, q),
                      impl_->fuse_norm_rope_store && FusedNormRopeTakes(q.size(0)));
}

// The one-warp-per-head kernel for decode-sized steps (launched programmatically when the
// backend is), the per-token one for prefill: the same bits.
void CudaBackend::LaunchNormRopeStore(const cuda::NormRopeStoreArgs& a, bool decode_sized) {
  if (decode_sized) {
    cuda::NormRopeStore(a, impl_->stream, impl_->programmatic);
  } else {
    cuda::NormRopeStoreRows(a, impl_->stream);
  }
  HSX_LAUNCH_CHECK();
}

// NormRopeStore's args for the fused q/k/v rows (NormRopeStoreKV's), q written to q.
cuda::NormRopeStoreArgs CudaBackend::FusedRowsArgs(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms,
                                                   const Tensor& positions, const RopeTable& rope, const Tensor& slots,
                                                   Tensor& k_cache, Tensor& v_cache, Tensor& q) {
  const int64_t q_cols = q.size(1) * q.size(2), kv_cols = k_cache.size(1) * k_cache.size(2);
  cuda::NormRopeStoreArgs a = HeadArgs(q, norms.q, norms.eps, norms.one_plus_weight, positions, rope);
  a.q_in = B(qkv);
  a.q_stride = qkv.size(-1);
  a.k = B(qkv) + q_cols;
  a.k_norm = norms.k != nullptr ? B(*norms.k) : nullptr;
  a.v = values_are_keys ? a.k : a.k + kv_cols;
  a.kv_stride = qkv.size(-1);
  a.v_norm = norms.v;
  a.kv_heads = static_cast<int>(k_cache.size(1));
  a.slots = slots.data<int32_t>();
  a.k_cache = B(k_cache);
  a.v_cache = B(v_cache);
  return a;
}

void CudaBackend::StoreKV(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache) {
  Impl::Timer timer(*impl_, "store_kv");
  cuda::StoreKV(B(k), B(v), slots.data<int32_t>(), k.size(0), k.numel() / k.size(0), v.numel() / v.size(0),
                B(k_cache), B(v_cache), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                            const AttentionParams& params, Tensor& out) {
  Impl::Timer timer(*impl_, "attention");
  cuda::AttentionArgs a = AttentionArgsFor(k_cache, v_cache, batch, params, out);
  a.q = B(q);
  if (!LaunchAttention(a)) {
    std::fprintf(stderr, "hsx: CUDA attention supports head dims 16, 32, 64, 128, 256, 512; got %d\n", a.head_dim);
    std::abort();
  }
  HSX_LAUNCH_CHECK();
}

// The split-KV decode kernel makes its own inputs (attention_decode.cu) where it takes the
// step and NormRopeStoreKV would run its one-warp-per-head kernel; else the two ops.
void CudaBackend::QkvAttention(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms,
                               const Tensor& positions, const RopeTable& rope, const Tensor& slots, Tensor& k_cache,
                               Tensor& v_cache, const AttentionBatch& batch, const AttentionParams& params,
                               Tensor& out) {
  if (FusesAttentionInputs(qkv, k_cache, rope, batch, out)) {
    Impl::Timer timer(*impl_, "qkv_attention");
    cuda::AttentionArgs a = AttentionArgsFor(k_cache, v_cache, batch, params, out);
    a.inputs = FusedRowsArgs(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, out);
    a.inputs.q = nullptr;  // q stays in the kernel
    a.q = nullptr;
    if (LaunchAttention(a)) {
      HSX_LAUNCH_CHECK();
      return;
    }
  }
  Backend::QkvAttention(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, batch, params, out);
}

bool CudaBackend::FusesAttentionInputs(const Tensor& qkv, const Tensor& k_cache, const RopeTable& rope,
                                       const AttentionBatch& batch, const Tensor& out) const {
  if (!impl_->fuse_attention_inputs || !impl_->fuse_norm_rope_store || !FusedNormRopeTakes(out.size(0)) ||
      !DecodeAttentionTakes(batch.max_q_len) || qkv.dtype() != DType::kBF16 || rope.rotary_dims > out.size(2))
    return false;
  return PlanDecode(static_cast<int>(batch.seq_info.size(0)), batch.max_q_len, static_cast<int>(out.size(1)),
                    static_cast<int>(k_cache.size(1)), static_cast<int>(out.size(2)))
      .fused_inputs;
}

cuda::DecodeSplits CudaBackend::PlanDecode(int num_seqs, int max_q_len, int num_heads, int kv_heads,
                                           int head_dim) const {
  int capacity = 0;
  if (impl_->decode_cluster_merge) {
    auto [it, added] = impl_->decode_cluster_capacity.try_emplace(head_dim, 0);
    if (added) it->second = cuda::DecodeClusterCapacity(head_dim);
    capacity = it->second;
  }
  return cuda::PlanDecodeSplits(num_seqs, max_q_len, num_heads, kv_heads, head_dim, impl_->sm_count, capacity);
}

bool CudaBackend::DecodeAttentionTakes(int max_q_len) const {
  return impl_->decode_attention && max_q_len <= impl_->decode_attention_rows;
}

cuda::AttentionArgs CudaBackend::AttentionArgsFor(const Tensor& k_cache, const Tensor& v_cache,
                                                  const AttentionBatch& batch, const AttentionParams& params,
                                                  Tensor& out) const {
  cuda::AttentionArgs a;
  a.k_cache = B(k_cache);
  a.v_cache = B(v_cache);
  a.cache_slots = k_cache.size(0);
  a.out = B(out);
  a.seq_info = batch.seq_info.data<int32_t>();
  a.host_seq_info = batch.seq_info_host.data();
  a.block_tables = batch.block_tables.data<int32_t>();
  a.num_seqs = static_cast<int>(batch.seq_info.size(0));  // a recorded batch has no host slices
  a.max_q_len = batch.max_q_len;
  a.num_heads = static_cast<int>(out.size(1));
  a.kv_heads = static_cast<int>(k_cache.size(1));
  a.head_dim = static_cast<int>(out.size(2));
  a.block_size = params.block_size;
  a.sliding_window = params.sliding_window;
  a.scale = params.scale;
  a.softcap = params.softcap;
  a.hopper = impl_->hopper_attention;
  a.batch_invariant = impl_->batch_invariant;
  a.programmatic = impl_->programmatic;
  return a;
}

// Plans the split-KV chunks of a decode step, then launches; false (nothing launched) for
// an unsupported head dim.
bool CudaBackend::LaunchAttention(cuda::AttentionArgs& a) {
  Tensor workspace;  // freed after the launch: the allocator reuses memory in stream order
  if (DecodeAttentionTakes(a.max_q_len)) {
    const cuda::DecodeSplits splits = PlanDecode(a.num_seqs, a.max_q_len, a.num_heads, a.kv_heads, a.head_dim);
    a.decode_splits = splits.count;
    a.decode_cluster_merge = splits.cluster_merge;
    const size_t bytes = cuda::DecodeAttentionWorkspaceBytes(a.num_seqs, a.max_q_len, a.num_heads, a.head_dim,
                                                             a.decode_splits, a.decode_cluster_merge);
    if (bytes > 0) {
      workspace = Empty(DType::kF32, {static_cast<int64_t>(bytes / sizeof(float))});
      a.decode_workspace = workspace.data<float>();
    }
  }
  return cuda::Attention(a, impl_->stream);
}

void CudaBackend::GatherRows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) {
  Impl::Timer timer(*impl_, "gather");
  Tensor host = Tensor::Host(DType::kI32, {static_cast<int64_t>(rows.size())});
  std::copy(rows.begin(), rows.end(), host.data<int32_t>());
  const Tensor idx = Upload(host);
  cuda::GatherRows(x.raw(), idx.data<int32_t>(), static_cast<int64_t>(rows.size()),
                   static_cast<int64_t>(x.nbytes() / x.size(0)), out.raw(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

namespace {

// Plain data of 4-byte words (SamplingRow, TokenAdjust, int32) to the device, at least one word.
Tensor UploadWords(Backend& backend, const void* data, size_t bytes) {
  Tensor host = Tensor::Host(DType::kI32, {static_cast<int64_t>(std::max<size_t>(bytes / 4, 1))});
  if (bytes > 0) std::memcpy(host.raw(), data, bytes);
  return backend.Upload(host);
}

}  // namespace

SampledTokens CudaBackend::Sample(const Tensor& logits, const SamplingBatch& batch) {
  Impl::Timer timer(*impl_, "sample");
  const auto rows = static_cast<int32_t>(logits.size(0));
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const int32_t width = batch.max_logprobs;
  // Parameters up; one download of every result.
  const Tensor params = UploadWords(*this, batch.rows.data(), batch.rows.size() * sizeof(SamplingRow));
  const Tensor adjust = UploadWords(*this, batch.adjust.data(), batch.adjust.size() * sizeof(TokenAdjust));
  Tensor work = Empty(DType::kF32, {rows, 2 * vocab});  // sampling_device.cuh's row scratch
  Tensor out = Empty(DType::kI32, {2 * rows + 2 * rows * width});
  cuda::Sample(logits.data<float>(), rows, vocab, static_cast<const SamplingRow*>(params.raw()),
               static_cast<const TokenAdjust*>(adjust.raw()), width, work.data<float>(), out.data<int32_t>(),
               impl_->stream);
  HSX_LAUNCH_CHECK();
  const Tensor host = Download(out);
  const int32_t* words = host.data<int32_t>();
  SampledTokens result;
  result.tokens.assign(words, words + rows);
  result.logprobs.resize(rows);
  std::memcpy(result.logprobs.data(), words + rows, rows * sizeof(float));
  result.top_ids.assign(words + 2 * rows, words + 2 * rows + rows * width);
  result.top_logprobs.resize(static_cast<size_t>(rows) * width);
  std::memcpy(result.top_logprobs.data(), words + 2 * rows + rows * width, result.top_logprobs.size() * sizeof(float));
  return result;
}

void CudaBackend::GreedyTokens(const Tensor& logits, const Tensor* offsets, Tensor& tokens) {
  cuda::GreedyTokens(logits.data<float>(), static_cast<int32_t>(logits.size(0)), static_cast<int32_t>(logits.size(1)),
                     offsets != nullptr ? offsets->data<int32_t>() : nullptr, tokens.data<int32_t>(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

VerifiedTokens CudaBackend::VerifyDrafts(const Tensor& logits, const Tensor* draft_probs, const VerificationBatch& batch,
                                         Tensor* target_probs) {
  Impl::Timer timer(*impl_, "verify");
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const std::vector<int32_t> begins = VerificationRowBegins(batch, logits.size(0), vocab);
  const auto requests = static_cast<int32_t>(batch.num_drafts.size());
  const int32_t rows = begins.back(), width = batch.sampling.max_logprobs;
  VerifiedTokens result;
  if (requests == 0) return result;
  // Row begins, each row's draft index (-1: a bonus row) and the drafts, in one upload.
  std::vector<int32_t> index(begins);
  for (int32_t r = 0, d = 0; r < requests; ++r) {
    for (int32_t j = 0; j < batch.num_drafts[r]; ++j) index.push_back(d++);
    index.push_back(-1);
  }
  index.insert(index.end(), batch.drafts.begin(), batch.drafts.end());
  const Tensor params = UploadWords(*this, batch.sampling.rows.data(), batch.sampling.rows.size() * sizeof(SamplingRow));
  const Tensor adjust =
      UploadWords(*this, batch.sampling.adjust.data(), batch.sampling.adjust.size() * sizeof(TokenAdjust));
  const Tensor indices = UploadWords(*this, index.data(), index.size() * sizeof(int32_t));
  Tensor work = Empty(DType::kF32, {rows, 2 * vocab});  // sampling_device.cuh's row scratch
  const int64_t result_words = requests + 2 * rows + 2 * static_cast<int64_t>(rows) * width;
  Tensor out = Empty(DType::kI32, {result_words + rows});  // the rows' accept flags after the results
  cuda::VerifyDrafts(logits.data<float>(), rows, requests, vocab, static_cast<const SamplingRow*>(params.raw()),
                     static_cast<const TokenAdjust*>(adjust.raw()), width, indices.data<int32_t>(),
                     draft_probs ? draft_probs->data<float>() : nullptr,
                     target_probs ? target_probs->data<float>() : nullptr, batch.forced_accept_rate, work.data<float>(),
                     out.data<int32_t>(),
                     impl_->stream);
  HSX_LAUNCH_CHECK();
  const Tensor host = Download(out.Rows(0, result_words));
  const int32_t* words = host.data<int32_t>();
  result.num_accepted.assign(words, words + requests);
  words += requests;
  SampledTokens& e = result.emitted;
  e.tokens.assign(words, words + rows);
  e.logprobs.resize(rows);
  std::memcpy(e.logprobs.data(), words + rows, rows * sizeof(float));
  e.top_ids.assign(words + 2 * rows, words + 2 * rows + static_cast<int64_t>(rows) * width);
  e.top_logprobs.resize(static_cast<size_t>(rows) * width);
  std::memcpy(e.top_logprobs.data(), words + 2 * rows + static_cast<int64_t>(rows) * width,
              e.top_logprobs.size() * sizeof(float));
  return result;
}

void CudaBackend::SliceColumns(const Tensor& x, int64_t begin, Tensor& out) {
  cuda::SliceColumns(B(x), x.size(0), x.size(-1), begin, out.size(-1), B(out), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::DraftLayerInput(const Tensor& table, const Tensor& ids, const Tensor& hidden,
                                  const Tensor& embed_norm, const Tensor& hidden_norm, float eps, bool normed_residual,
                                  Tensor& out, Tensor& residual) {
  if (table.dtype() == DType::kBF16 && hidden.dtype() == DType::kBF16 && embed_norm.dtype() == DType::kBF16 &&
      hidden_norm.dtype() == DType::kBF16) {
    Impl::Timer timer(*impl_, "draft_layer_input");
    if (cuda::DraftLayerInput(B(table), ids.data<int32_t>(), B(hidden), B(embed_norm), B(hidden_norm), ids.numel(),
                              hidden.size(-1), eps, normed_residual, B(out), B(residual), impl_->stream)) {
      HSX_LAUNCH_CHECK();
      return;
    }
  }
  Backend::DraftLayerInput(table, ids, hidden, embed_norm, hidden_norm, eps, normed_residual, out, residual);
}

void CudaBackend::WriteColumns(const Tensor& x, int64_t begin, Tensor& out) {
  // A plain copy: an f32 column moves as two bf16 ones.
  const int64_t per = static_cast<int64_t>(DTypeSize(x.dtype()) / 2);
  cuda::WriteColumns(B(x), x.size(0), per * x.size(-1), per * begin, per * out.size(-1), B(out), impl_->stream);
  HSX_LAUNCH_CHECK();
}

// Routing on the device; one small download (tokens per expert) sizes the grouped
// GEMMs. Pairs (token, choice) are permuted so each expert's rows are contiguous, the
// three expert GEMMs run as grouped GEMMs (one cuBLAS call each, one group per active
// expert), and a combine kernel sums each token's choices in a fixed order.
void CudaBackend::MoeMlp(const Tensor& x, const Tensor& router_logits, const MoeWeights& experts, int top_k,
                         bool renormalize, Activation act, Tensor& out) {
  Impl::Timer timer(*impl_, "moe");
  const int64_t tokens = x.size(0), hidden = x.size(1), pairs = tokens * top_k;
  const int num_experts = static_cast<int>(router_logits.size(1));
  const int64_t inter = experts.gate[0].size(0);
  if (top_k > 16) {
    std::fprintf(stderr, "hsx: CUDA MoE supports top_k <= 16, got %d\n", top_k);
    std::abort();
  }
  cudaStream_t stream = impl_->stream;
  Tensor ids = Empty(DType::kI32, {pairs}), weights = Empty(DType::kF32, {pairs});
  Tensor counts = Empty(DType::kI32, {num_experts});
  HSX_CUDA_CHECK(cudaMemsetAsync(counts.raw(), 0, counts.nbytes(), stream));
  cuda::MoeRoute(router_logits.data<float>(), tokens, num_experts, top_k, renormalize, ids.data<int32_t>(), weights.data<float>(),
                 counts.data<int32_t>(), stream);
  HSX_LAUNCH_CHECK();
  const Tensor host_counts = Download(counts);
  std::vector<int32_t> offsets(num_experts + 1, 0);
  for (int e = 0; e < num_experts; ++e) offsets[e + 1] = offsets[e] + host_counts.data<int32_t>()[e];
  Tensor cursor_host = Tensor::Host(DType::kI32, {num_experts});
  std::copy(offsets.begin(), offsets.end() - 1, cursor_host.data<int32_t>());
  Tensor cursor = Upload(cursor_host), rows = Empty(DType::kI32, {pairs}), inverse = Empty(DType::kI32, {pairs});
  cuda::MoePermute(ids.data<int32_t>(), pairs, top_k, cursor.data<int32_t>(), rows.data<int32_t>(),
                   inverse.data<int32_t>(), stream);
  Tensor xs = Empty(DType::kBF16, {pairs, hidden});
  cuda::GatherRows(x.raw(), rows.data<int32_t>(), pairs, hidden * 2, xs.raw(), stream);
  HSX_LAUNCH_CHECK();

  Tensor g = Empty(DType::kBF16, {pairs, inter}), u = Empty(DType::kBF16, {pairs, inter});
  Tensor ys = Empty(DType::kBF16, {pairs, hidden});
  // y[rows of e] = in[rows of e] * W_e^T for every expert with rows, as one grouped GEMM.
  auto grouped = [&](const std::vector<Tensor>& w, const Tensor& in, Tensor& y) {
    const int64_t k = in.size(1), n = y.size(1);
    if (impl_->batch_invariant) {
      // The grouped GEMM picks its kernels from every group's row count; one invariant
      // GEMM per expert keeps a token's arithmetic independent of the others' routing.
      for (int e = 0; e < num_experts; ++e) {
        const int rows_e = offsets[e + 1] - offsets[e];
        if (rows_e == 0) continue;
        const void* x_e = in.data<char>() + int64_t(offsets[e]) * k * 2;
        void* y_e = y.data<char>() + int64_t(offsets[e]) * n * 2;
        const Impl::Plan& p = impl_->GetPlan(rows_e, n, k, DType::kBF16, w[e].raw(), x_e, y_e);
        Check(impl_->Matmul(p, p.algo, w[e].raw(), x_e, y_e), "cublasLtMatmul");
      }
      return;
    }
    std::vector<int> m_arr, n_arr, k_arr, lda, ldb, ldc, group_size;
    std::vector<const void*> a_ptrs, b_ptrs;
    std::vector<void*> c_ptrs;
    for (int e = 0; e < num_experts; ++e) {
      const int rows_e = offsets[e + 1] - offsets[e];
      if (rows_e == 0) continue;
      // Column-major view, as in Linear: C (n x rows_e) = W_e^T(n x k) * in^T (k x rows_e).
      m_arr.push_back(static_cast<int>(n));
      n_arr.push_back(rows_e);
      k_arr.push_back(static_cast<int>(k));
      lda.push_back(static_cast<int>(k));
      ldb.push_back(static_cast<int>(k));
      ldc.push_back(static_cast<int>(n));
      group_size.push_back(1);
      a_ptrs.push_back(w[e].raw());
      b_ptrs.push_back(in.data<char>() + int64_t(offsets[e]) * k * 2);
      c_ptrs.push_back(y.data<char>() + int64_t(offsets[e]) * n * 2);
    }
    const int groups = static_cast<int>(m_arr.size());
    if (groups == 0) return;
    std::vector<cublasOperation_t> ta(groups, CUBLAS_OP_T), tb(groups, CUBLAS_OP_N);
    std::vector<float> alpha(groups, 1.0f), beta(groups, 0.0f);
    Tensor ptr_host = Tensor::Host(DType::kI64, {3 * groups});
    auto* p = ptr_host.data<const void*>();
    std::copy(a_ptrs.begin(), a_ptrs.end(), p);
    std::copy(b_ptrs.begin(), b_ptrs.end(), p + groups);
    std::copy(c_ptrs.begin(), c_ptrs.end(), p + 2 * groups);
    const Tensor ptr_dev = Upload(ptr_host);
    const auto* dp = ptr_dev.data<const void*>();
    const cublasStatus_t status = cublasGemmGroupedBatchedEx(
        impl_->blas, ta.data(), tb.data(), m_arr.data(), n_arr.data(), k_arr.data(), alpha.data(), dp, CUDA_R_16BF,
        lda.data(), dp + groups, CUDA_R_16BF, ldb.data(), beta.data(), const_cast<void* const*>(dp + 2 * groups),
        CUDA_R_16BF, ldc.data(), groups, group_size.data(), CUBLAS_COMPUTE_32F);
    Check(status, "cublasGemmGroupedBatchedEx");
  };
  grouped(experts.gate, xs, g);
  grouped(experts.up, xs, u);
  {
    Impl::Timer timer(*impl_, "gated_act");
    cuda::GatedActivation(B(g), B(u), g.size(0), g.size(1), g.size(1), act == Activation::kSilu ? 0 : 1, B(g), stream);
    HSX_LAUNCH_CHECK();
  }
  grouped(experts.down, g, ys);
  cuda::MoeCombine(B(ys), inverse.data<int32_t>(), weights.data<float>(), tokens, top_k, hidden, B(out), stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::CentroidMaskedLogits(const Tensor& x, const Tensor& centroid_logits, const Tensor& token_ordering,
                                       const Tensor& lm_head, int top_k, Tensor& logits) {
  if (!cuda::CentroidMaskedLogits(B(x), centroid_logits.data<float>(), token_ordering.data<int32_t>(), B(lm_head),
                                  x.size(0), static_cast<int>(x.size(1)), static_cast<int>(centroid_logits.size(1)),
                                  static_cast<int>(token_ordering.size(1)), top_k, logits.size(1),
                                  logits.data<float>(), impl_->stream)) {
    std::fprintf(stderr, "hsx: CUDA centroid head supports top_k in [1, min(256, centroids)] and <= 8192 centroids; got %d of %lld\n",
                 top_k, static_cast<long long>(centroid_logits.size(1)));
    std::abort();
  }
  HSX_LAUNCH_CHECK();
}

void CudaBackend::FlagNonFiniteRows(const Tensor& x, Tensor& flags) {
  cuda::FlagNonFiniteRows(B(x), flags.numel(), x.size(-1), flags.data<int32_t>(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

}  // namespace hsx
