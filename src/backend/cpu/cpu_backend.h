// The f32 reference backend: every op computes in f32 over checkpoint-dtype weights.
// GEMMs convert weight panels to f32 on the fly and call OpenBLAS sgemm; the rest is
// plain loops split over the global thread pool.
#pragma once

#include "backend/backend.h"

namespace hsx {

class CpuBackend final : public Backend {
 public:
  // batch_invariant: every sgemm of a Linear has one shape per weight, and attention runs
  // each query row over its own keys alone, so no row's arithmetic depends on its batch.
  explicit CpuBackend(bool batch_invariant = false) : batch_invariant_(batch_invariant) {}
  Device device() const override { return Device::kCPU; }
  DType compute_dtype() const override { return DType::kF32; }
  std::string name() const override { return "cpu"; }
  bool batch_invariant() const override { return batch_invariant_; }

  Tensor Empty(DType dtype, Shape shape) override { return Tensor::Host(dtype, std::move(shape)); }
  Tensor Upload(const Tensor& host) override { return host; }
  Tensor Download(const Tensor& t) override { return t; }
  void DownloadTo(const Tensor& t, Tensor& host) override { Copy(t, host); }
  void Copy(const Tensor& src, Tensor& dst) override;
  void FillUniform(Tensor& t, uint64_t seed, float lo, float hi) override;

  void Embed(const Tensor& table, const Tensor& ids, float scale, Tensor& out) override;
  void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  Tensor QuantizeRowsFp8(const Tensor& x) override;
  void RmsNorm(const Tensor& x, const Tensor* w, float eps, bool one_plus_weight, Tensor& y) override;
  void Add(Tensor& acc, const Tensor& x) override;
  void Multiply(Tensor& acc, const Tensor& x) override;
  void Scale(Tensor& x, float s) override;
  void ScaleByTensor(Tensor& x, const Tensor& scalar) override;
  void Softcap(Tensor& x, float cap) override;
  void Activate(Tensor& x, Activation act) override;
  void GatedActivation(const Tensor& gate_up, Activation act, Tensor& out) override;
  void Rope(Tensor& x, const Tensor& positions, const RopeTable& rope) override;
  void StoreKV(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache) override;
  void Attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                 const AttentionParams& params, Tensor& out) override;
  void GatherRows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) override;
  void GatherRowsAt(const Tensor& x, const Tensor& rows, Tensor& out) override;
  // Keys (with their values) copied out of the paged cache into scratch so far: what an
  // attention step costs beyond its arithmetic; steps of few queries copy none.
  int64_t gathered_keys() const { return gathered_keys_; }
  void SliceColumns(const Tensor& x, int64_t begin, Tensor& out) override;
  void WriteColumns(const Tensor& x, int64_t begin, Tensor& out) override;
  void MoeMlp(const Tensor& x, const Tensor& router_logits, const MoeWeights& experts, const MoeSpec& spec,
              Tensor& out) override;
  void CentroidMaskedLogits(const Tensor& x, const Tensor& centroid_logits, const Tensor& token_ordering,
                            const Tensor& lm_head, int top_k, Tensor& logits) override;
  void FlagNonFiniteRows(const Tensor& x, Tensor& flags) override;
  SampledTokens Sample(const Tensor& logits, const SamplingBatch& batch, const SampledAhead& ahead = {}) override;
  void GreedyTokens(const Tensor& logits, const Tensor* offsets, Tensor& tokens) override;
  void TopLogprobs(const Tensor& logits, const Tensor* offsets, Tensor& ids, Tensor& logprobs) override;
  void ExpandDraftTrees(const Tensor& ids, const Tensor& logprobs, int d, DraftTreeState& state, Tensor* next_ids,
                        Tensor* next_rows, Tensor* next_masks) override;
  void SelectDraftTrees(const DraftTreeState& state, const Tensor& limits, Tensor& out) override;
  VerifiedTokens VerifyDrafts(const Tensor& logits, const Tensor* draft_probs, const VerificationBatch& batch,
                              Tensor* target_probs) override {
    return VerifyDraftsOnHost(logits, draft_probs, batch, target_probs);
  }

 private:
  // c[m, cols] (leading dimension ldc) = a[m, k] w_panel[cols, k]^T.
  void MultiplyPanel(const float* a, int64_t m, int64_t k, const float* w_panel, int64_t cols, float* c,
                     int64_t ldc) const;
  void RowwiseAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                        const AttentionParams& params, Tensor& out) const;

  void FewQueryAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                         const AttentionParams& params, Tensor& out) const;

  // Queries a sequence up to which attention reads the cache in place: a verification
  // step's K + 1 for K <= 7 (CUDA's split-KV kernel takes up to 8 too).
  static constexpr int kFewQueries = 8;
  bool batch_invariant_;
  int64_t gathered_keys_ = 0;
};

}  // namespace hsx
