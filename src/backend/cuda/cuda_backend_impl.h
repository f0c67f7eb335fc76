// The CUDA backend's state (CudaBackend::Impl), shared by the files that implement its ops:
// devices and streams, the allocator, the GEMM plans, the switches that pick kernels, and
// the HSX_PROFILE timers.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/gemm_plans.h"
#include "backend/cuda/kernels.h"

namespace hsx {

inline cuda::bf16* B(const Tensor& t) { return static_cast<cuda::bf16*>(t.raw()); }
inline int64_t RowsOf(const Tensor& t) { return t.numel() / t.size(-1); }
// Whether two tensors' bytes overlap.
inline bool Overlap(const Tensor& a, const Tensor& b) {
  const char *pa = a.data<char>(), *pb = b.data<char>();
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

struct CudaBackend::Impl {
  int device = 0;
  std::string name;
  cudaStream_t stream = nullptr;
  cudaStream_t copy_stream = nullptr;  // device-to-host capture copies, beside the compute
  // The Sample op's words when the caller queues work ahead of them (pinned, so that the
  // download is queued without waiting), grown as needed.
  Tensor sample_host;
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
  // MoE layers of up to kMoeGemvMaxTokens tokens on the grouped GEMVs (moe_gemv.cu), which
  // keep a step on the device so it can be recorded; HSX_MOE_GEMV=0 keeps the grouped
  // cuBLAS GEMMs sized on the host, for comparison. Off in batch-invariant mode, whose
  // per-expert GEMMs serve every size alike (the GEMVs are invariant too, but prefill-sized
  // MoE layers need the GEMMs, and a token's bits must not depend on the step's size).
  bool moe_gemv = false;
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

  GemmPlans gemm;

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

};

}  // namespace hsx
