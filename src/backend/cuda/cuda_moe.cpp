// CudaBackend::MoeMlp: the host side of a MoE layer (routing on the device, the grouped
// expert GEMMs, the combine); its kernels are in kernels.cu.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/moe_gemv.h"

namespace hsx {

bool CudaBackend::MoeRecordable(int64_t tokens, int experts, int64_t hidden, int64_t inter) const {
  return impl_->moe_gemv && tokens <= kMoeGemvMaxTokens && cuda::MoeGemvSupports(experts, hidden, inter);
}

// Routing on the device. Pairs (token, choice) are permuted so each expert's rows are
// contiguous, the expert MLPs run on them, and a combine kernel sums each token's choices
// in a fixed order. Up to kMoeGemvMaxTokens tokens nothing leaves the device (MoeGemvPath:
// the offsets are a prefix sum there, the experts grouped GEMVs), so a step can be
// recorded; above, one small download (tokens per expert) sizes grouped cuBLAS GEMMs,
// which read an expert's weights at a fraction of the cost per row once rows are many.
void CudaBackend::MoeMlp(const Tensor& x, const Tensor& router_logits, const MoeWeights& experts, const MoeSpec& spec,
                         Tensor& out) {
  const int top_k = spec.top_k;
  const bool renormalize = spec.renormalize;
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
  if (MoeRecordable(tokens, num_experts, hidden, inter)) {
    MoeGemvPath(x, experts, spec, ids, weights, counts, out);
    return;
  }
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
        const GemmPlans::Plan& p = impl_->gemm.GetPlan(rows_e, n, k, DType::kBF16, w[e].raw(), x_e, y_e);
        Check(impl_->gemm.Matmul(p, p.algo, w[e].raw(), x_e, y_e), "cublasLtMatmul");
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
  // gpt-oss's expert biases: each sorted row adds its expert's row of the [E, n] bias.
  Tensor offsets_dev;
  auto add_bias = [&](const Tensor& bias, Tensor& y) {
    if (!bias.defined()) return;
    if (!offsets_dev.defined()) {
      Tensor host = Tensor::Host(DType::kI32, {num_experts + 1});
      std::copy(offsets.begin(), offsets.end(), host.data<int32_t>());
      offsets_dev = Upload(host);
    }
    cuda::MoeAddExpertBias(B(y), y.size(0), y.size(1), offsets_dev.data<int32_t>(), num_experts, B(bias), stream);
    HSX_LAUNCH_CHECK();
  };
  add_bias(experts.gate_bias, g);
  add_bias(experts.up_bias, u);
  {
    Impl::Timer timer(*impl_, "gated_act");
    if (spec.swiglu_limit > 0.0f) {
      cuda::ClampedSwiglu(B(g), B(u), g.numel(), spec.swiglu_limit, spec.swiglu_alpha, B(g), stream);
    } else {
      cuda::GatedActivation(B(g), B(u), g.size(0), g.size(1), g.size(1), spec.act == Activation::kSilu ? 0 : 1, B(g),
                            stream);
    }
    HSX_LAUNCH_CHECK();
  }
  grouped(experts.down, g, ys);
  add_bias(experts.down_bias, ys);
  cuda::MoeCombine(B(ys), inverse.data<int32_t>(), weights.data<float>(), tokens, top_k, hidden, B(out), stream);
  HSX_LAUNCH_CHECK();
}

// The decode-sized pass: offsets and the permutation on the device, gate and up (their
// biases and the activation) in one grouped GEMV, down (and its bias) in another; the
// experts' weight pointers travel in the launches, so no step uploads or downloads.
void CudaBackend::MoeGemvPath(const Tensor& x, const MoeWeights& experts, const MoeSpec& spec, const Tensor& ids,
                              const Tensor& weights, const Tensor& counts, Tensor& out) {
  cudaStream_t stream = impl_->stream;
  const int top_k = spec.top_k;
  const int64_t tokens = x.size(0), hidden = x.size(1), pairs = tokens * top_k, inter = experts.gate[0].size(0);
  const int num_experts = static_cast<int>(counts.size(0));
  // offsets [E + 1], cursor [E], active [E + 1]
  Tensor index = Empty(DType::kI32, {3 * int64_t{num_experts} + 2});
  int32_t* offsets = index.data<int32_t>();
  int32_t* cursor = offsets + num_experts + 1;
  int32_t* active = cursor + num_experts;
  cuda::MoeOffsets(counts.data<int32_t>(), num_experts, offsets, cursor, active, stream);
  Tensor rows = Empty(DType::kI32, {pairs}), inverse = Empty(DType::kI32, {pairs});
  cuda::MoePermute(ids.data<int32_t>(), pairs, top_k, cursor, rows.data<int32_t>(), inverse.data<int32_t>(), stream);
  Tensor xs = Empty(DType::kBF16, {pairs, hidden});
  cuda::GatherRows(x.raw(), rows.data<int32_t>(), pairs, hidden * 2, xs.raw(), stream);
  HSX_LAUNCH_CHECK();

  cuda::MoeExpertPointers gate{}, up{}, down{};
  for (int e = 0; e < num_experts; ++e) {
    gate.w[e] = B(experts.gate[e]);
    up.w[e] = B(experts.up[e]);
    down.w[e] = B(experts.down[e]);
  }
  auto bias = [](const Tensor& b) -> const cuda::bf16* { return b.defined() ? B(b) : nullptr; };
  const cuda::MoeActivation act{spec.act == Activation::kSilu ? 0 : 1, spec.swiglu_limit, spec.swiglu_alpha};
  Tensor h = Empty(DType::kBF16, {pairs, inter}), ys = Empty(DType::kBF16, {pairs, hidden});
  cuda::MoeGatedGemv(B(xs), gate, up, bias(experts.gate_bias), bias(experts.up_bias), offsets, active, num_experts,
                     pairs, inter, hidden, act, B(h), stream);
  HSX_LAUNCH_CHECK();
  cuda::MoeGemv(B(h), down, bias(experts.down_bias), offsets, active, num_experts, pairs, hidden, inter, B(ys),
                stream);
  HSX_LAUNCH_CHECK();
  cuda::MoeCombine(B(ys), inverse.data<int32_t>(), weights.data<float>(), tokens, top_k, hidden, B(out), stream);
  HSX_LAUNCH_CHECK();
}

}  // namespace hsx
