// The CUDA backend for Hopper: bf16 activations and KV cache, f32 accumulation.
// GEMMs go through cuBLASLt; everything else is hsx's own kernels (kernels.h).
// Every op is enqueued on one stream; Download synchronizes.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "util/status.h"

namespace hsx::cuda {
struct AttentionArgs;  // kernels.h
struct DecodeSplits;
struct NormRopeStoreArgs;
}  // namespace hsx::cuda

namespace hsx {

class CudaBackend final : public Backend {
 public:
  // batch_invariant: one GEMM algorithm per weight shape whatever m (chosen without timing,
  // no split-K), per-expert GEMMs for MoE, and attention tiles aligned to key positions.
  static Result<std::unique_ptr<CudaBackend>> Create(int device_index = 0, bool batch_invariant = false);
  ~CudaBackend() override;

  Device device() const override { return Device::kCUDA; }
  DType compute_dtype() const override { return DType::kBF16; }
  std::string name() const override;
  bool batch_invariant() const override;
  // Bytes of device memory held at the high-water mark (weights, cache, activations).
  size_t peak_memory_bytes() const override;

  Tensor Empty(DType dtype, Shape shape) override;
  Tensor Upload(const Tensor& host) override;
  Tensor UploadWeight(const Tensor& host) override;
  Tensor Download(const Tensor& t) override;
  Tensor HostBuffer(DType dtype, Shape shape) override;
  void DownloadTo(const Tensor& t, Tensor& host) override;
  std::unique_ptr<PendingDownload> DownloadAsync(const Tensor& t, Tensor& host) override;
  void Copy(const Tensor& src, Tensor& dst) override;
  void UploadTo(const Tensor& host, Tensor& dst) override;
  void Synchronize() override;
  void PinThread() override;
  // For NCCL (nccl_communicator): the device and the compute stream (a cudaStream_t).
  int device_index() const;
  void* compute_stream() const;
  bool can_record() const override;
  std::unique_ptr<DeviceGraph> Record(const std::function<void()>& work) override;
  void FillUniform(Tensor& t, uint64_t seed, float lo, float hi) override;

  void Embed(const Tensor& table, const Tensor& ids, float scale, Tensor& out) override;
  void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  Tensor QuantizeRowsFp8(const Tensor& x) override;
  void RmsNorm(const Tensor& x, const Tensor* w, float eps, bool one_plus_weight, Tensor& y) override;
  void Add(Tensor& acc, const Tensor& x) override;
  void AddRmsNorm(Tensor& residual, const Tensor& branch, const Tensor* w, float eps, bool one_plus_weight,
                  Tensor& y) override;
  void Multiply(Tensor& acc, const Tensor& x) override;
  void Scale(Tensor& x, float s) override;
  void ScaleByTensor(Tensor& x, const Tensor& scalar) override;
  void Softcap(Tensor& x, float cap) override;
  void Activate(Tensor& x, Activation act) override;
  void GatedActivation(const Tensor& gate_up, Activation act, Tensor& out) override;
  Tensor GatedActivationFp8(const Tensor& gate_up, Activation act) override;
  Tensor RmsNormFp8(Tensor& x, const Tensor* branch, const Tensor* w, float eps, bool one_plus_weight) override;
  void GatedLinear(const Tensor& x, const Tensor& gate_up, Activation act, Tensor& out) override;
  void Rope(Tensor& x, const Tensor& positions, const RopeTable& rope) override;
  void RmsNormRope(Tensor& x, const Tensor& w, float eps, bool one_plus_weight, const Tensor& positions,
                   const RopeTable& rope) override;
  void NormRopeStoreKV(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms, const Tensor& positions,
                       const RopeTable& rope, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                       Tensor& q) override;
  void StoreKV(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache) override;
  void Attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                 const AttentionParams& params, Tensor& out) override;
  void QkvAttention(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms, const Tensor& positions,
                    const RopeTable& rope, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                    const AttentionBatch& batch, const AttentionParams& params, Tensor& out) override;
  // Whether QkvAttention runs as one kernel for this step (the split-KV decode kernel making
  // its own inputs), given a head dim that kernel supports.
  bool FusesAttentionInputs(const Tensor& qkv, const Tensor& k_cache, const RopeTable& rope,
                            const AttentionBatch& batch, const Tensor& out) const;
  void GatherRows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) override;
  void GatherRowsAt(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void MoveRows(Tensor& x, const Tensor& moves) override;
  void SliceColumns(const Tensor& x, int64_t begin, Tensor& out) override;
  void WriteColumns(const Tensor& x, int64_t begin, Tensor& out) override;
  void DraftLayerInput(const Tensor& table, const Tensor& ids, const Tensor& hidden, const Tensor& embed_norm,
                       const Tensor& hidden_norm, float eps, bool normed_residual, Tensor& out,
                       Tensor& residual) override;
  void MoeMlp(const Tensor& x, const Tensor& router_logits, const MoeWeights& experts, const MoeSpec& spec,
              Tensor& out) override;
  // MoeMlp up to this many tokens runs on the device alone (cuda_moe.cpp): decode and
  // verification steps of up to 64 sequences of 4 rows, or 256 of 1.
  static constexpr int64_t kMoeGemvMaxTokens = 256;
  bool MoeRecordable(int64_t tokens, int experts, int64_t hidden, int64_t inter) const override;
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
                              Tensor* target_probs) override;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  void LinearFp8(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);
  // VerifyDrafts for token trees of one-hot drafts, on the device (verification.cu's tree kernels).
  VerifiedTokens VerifyTree(const Tensor& logits, const VerificationBatch& batch);
  // MoeMlp's experts once routed (ids, weights, counts: MoeRoute's), host-free.
  void MoeGemvPath(const Tensor& x, const MoeWeights& experts, const MoeSpec& spec, const Tensor& ids,
                   const Tensor& weights, const Tensor& counts, Tensor& out);
  static constexpr int64_t kFusedNormRopeMaxTokens = 256;
  bool FusedNormRopeTakes(int64_t tokens) const;
  void LaunchNormRopeStore(const cuda::NormRopeStoreArgs& a, bool decode_sized);
  bool DecodeAttentionTakes(int max_q_len) const;  // the split-KV decode kernel runs a step of these rows
  cuda::NormRopeStoreArgs FusedRowsArgs(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms,
                                        const Tensor& positions, const RopeTable& rope, const Tensor& slots,
                                        Tensor& k_cache, Tensor& v_cache, Tensor& q);
  cuda::AttentionArgs AttentionArgsFor(const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                                       const AttentionParams& params, Tensor& out) const;
  bool LaunchAttention(cuda::AttentionArgs& a);
  // PlanDecodeSplits for this device (its cluster capacity asked once per head dim).
  cuda::DecodeSplits PlanDecode(int num_seqs, int max_q_len, int num_heads, int kv_heads, int head_dim) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hsx
