// The ops a model forward is written against. One implementation per device: cpu/ is
// the f32 reference, cuda/ the fast path. Activations live on the backend's device in
// its compute dtype (f32 on the CPU); weights stay in their checkpoint dtype.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/draft_tree.h"
#include "backend/sampling.h"
#include "backend/verification.h"
#include "tensor/tensor.h"

namespace hsx {

enum class Activation { kSilu, kGeluTanh };

// What a caller queues on the sampled tokens while they are on their way to the host
// (Backend::Sample).
using SampledAhead = std::function<void(const Tensor& tokens)>;

// A device-to-host copy in flight; Wait returns once the host buffer holds the data.
class PendingDownload {
 public:
  virtual ~PendingDownload() = default;
  virtual void Wait() = 0;
};

// Device work recorded once and replayed on the same buffers (a CUDA graph): inputs are
// whatever the recorded ops read at replay time, so callers refill them in place.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void Replay() = 0;
};

// One sequence's slice of a packed batch: its new tokens are rows [q_start, q_start + q_len)
// and sit at the end of its ctx_len-token context, whose KV lives in the cache blocks
// listed in block_table (token p at slot block_table[p / block_size] * block_size + p % block_size).
//
// Tree attention (speculative token trees): with tree_base >= 0 the keys at positions
// [tree_base, ctx_len) are a token tree's rows (at most 64), and tree_mask holds one word
// per query row. A row whose word is 0 is causal as usual. A row with word m sees every key
// before tree_base and, of the tree's, the key at tree_base + j iff bit j of m is set (its
// ancestors and itself): never a sibling's. Its logical position (RoPE, sliding window) is
// tree_base + popcount(m) - 1; the window applies to the keys before tree_base, the tree's
// keys are always in it. The same words can go to a device kernel as they are.
struct SequenceSlice {
  int32_t q_start = 0;
  int32_t q_len = 0;
  int32_t ctx_len = 0;
  std::vector<int32_t> block_table;
  int32_t tree_base = -1;           // -1: no tree rows
  std::vector<uint64_t> tree_mask;  // [q_len] when tree_base >= 0
};

// Token `pos`'s KV slot under `block_table`, in 64 bits: blocks x block size outgrows int32.
inline int64_t SlotOf(const std::vector<int32_t>& block_table, int64_t pos, int64_t block_size) {
  return static_cast<int64_t>(block_table[static_cast<size_t>(pos / block_size)]) * block_size + pos % block_size;
}

// A packed batch's sequences for attention: the host copy for the CPU backend, and the
// same on the device (built once per forward by MakeAttentionBatch).
struct AttentionBatch {
  std::vector<SequenceSlice> seqs;
  Tensor seq_info;      // int32 [S, 4] on the device: q_start, q_len, ctx_len, offset into block_tables
  std::vector<int32_t> seq_info_host;  // the same on the host, where a backend schedules from it
  Tensor block_tables;  // int32, every sequence's block table, concatenated
  int32_t max_q_len = 0;
  // Token trees on the device (undefined: no sequence has tree rows): int32 words, each
  // sequence's tree_base ([S], -1: none), padded to an even count, then one 64-bit mask
  // word per packed query row (SequenceSlice::tree_mask; 0 for rows of no tree).
  Tensor tree;
  int64_t tree_mask_offset = 0;  // the first mask word's int32 index in `tree`
};

struct AttentionParams {
  float scale = 1.0f;
  int32_t sliding_window = 0;  // 0: full causal; w: query at p sees keys in (p - w, p]
  float softcap = 0.0f;        // 0: none; c: scores become c * tanh(scores / c)
  int32_t block_size = 16;
  // gpt-oss: f32 [num_heads] on the device, one learned logit per query head that joins
  // every softmax as an extra column whose value is dropped (it only takes probability
  // away from the keys); null: none.
  const Tensor* sinks = nullptr;
};

// Rotary embedding of the first rotary_dims of each head (rotate-half pairing within
// them); inv_freq has rotary_dims / 2 entries, a zero entry leaves its pair unrotated.
struct RopeTable {
  Tensor inv_freq;  // f32 [rotary_dims / 2], on the backend's device
  int32_t rotary_dims = 0;
};

// The per-head norms of a layer's attention inputs: q and k norms with a weight (null:
// none), v's without one.
struct HeadNorms {
  const Tensor* q = nullptr;
  const Tensor* k = nullptr;
  bool v = false;
  float eps = 0.0f;
  bool one_plus_weight = false;
};

// Expert weights of one MoE layer, each a list with one tensor per expert; gpt-oss's
// biases, one row per expert (undefined: none).
struct MoeWeights {
  std::vector<Tensor> gate, up, down;  // [I, H], [I, H], [H, I]
  Tensor gate_bias, up_bias, down_bias;  // [E, I], [E, I], [E, H]
};

// How a MoE layer routes and activates. Routing: softmax over all experts, the top_k kept
// (ties to the lower index), renormalized over them when asked (which equals gpt-oss's
// softmax over the top-k logits). Activation: act(gate) * up, or with swiglu_limit > 0
// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
// out = (u + 1) * g * sigmoid(alpha * g).
struct MoeSpec {
  int top_k = 1;
  bool renormalize = false;
  Activation act = Activation::kSilu;
  float swiglu_limit = 0.0f, swiglu_alpha = 0.0f;
};

// The clamped SwiGLU of one (gate, up) pair (MoeSpec).
inline float ClampedSwiglu(float gate, float up, float limit, float alpha) {
  const float g = gate > limit ? limit : gate;  // NaN passes through, as torch's clamp does
  const float u = up < -limit ? -limit : (up > limit ? limit : up);
  return (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual DType compute_dtype() const = 0;
  virtual std::string name() const = 0;
  // Made with batch_invariant (backend_factory.h).
  virtual bool batch_invariant() const { return false; }

  // Memory.
  virtual Tensor Empty(DType dtype, Shape shape) = 0;
  virtual Tensor Upload(const Tensor& host) = 0;
  // A checkpoint weight: the CPU keeps its dtype; a bf16 device converts f32/f16 to bf16.
  virtual Tensor UploadWeight(const Tensor& host) { return Upload(host); }
  // Fills a float tensor with uniform values in [lo, hi) from a seed (dummy weights).
  virtual void FillUniform(Tensor& t, uint64_t seed, float lo, float hi) = 0;
  virtual Tensor Download(const Tensor& t) = 0;  // to host, same dtype
  // Host memory the device copies into fastest (pinned on CUDA), and a copy into it.
  virtual Tensor HostBuffer(DType dtype, Shape shape) { return Tensor::Host(dtype, std::move(shape)); }
  virtual void DownloadTo(const Tensor& t, Tensor& host) = 0;
  // Starts copying t (once the work queued so far has written it) into host, off the
  // compute path; t and host must stay alive until Wait returns.
  virtual std::unique_ptr<PendingDownload> DownloadAsync(const Tensor& t, Tensor& host);
  virtual void Copy(const Tensor& src, Tensor& dst) = 0;  // same shape and dtype
  // Copies host (pinned from HostBuffer, where the device has pinned memory) into dst on the
  // device, in order with the work queued; host must stay unchanged until that work is done.
  virtual void UploadTo(const Tensor& host, Tensor& dst) { Copy(host, dst); }
  virtual void Synchronize() {}
  // Makes this backend's device the calling thread's current one; every thread that queues
  // work on the backend calls it first (CUDA keeps the current device per thread).
  virtual void PinThread() {}

  // Recording (CUDA graphs): Record runs `work` without executing it and returns it as a
  // graph, or null where the backend cannot record. The ops inside must not read host data
  // or synchronize; their allocations come from a pool kept for graphs, so no tensor outside
  // a graph ever shares memory with one, and the graphs (replayed one at a time) share it.
  virtual bool can_record() const { return false; }
  virtual std::unique_ptr<DeviceGraph> Record(const std::function<void()>& work) {
    (void)work;
    return nullptr;
  }
  // Device memory held at the high-water mark; 0 where not tracked (host memory).
  virtual size_t peak_memory_bytes() const { return 0; }

  // Ops. Shapes: x [T, K] rows of activations; ids/positions/slots int32 [T].
  virtual void Embed(const Tensor& table, const Tensor& ids, float scale, Tensor& out) = 0;
  virtual void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) = 0;  // y = x w^T + b
  // --quantization fp8: the rows of x [n, k] as E4M3 codes with one f32 scale per row
  // (tensor/float8.h's rule). Linear takes such a weight: it multiplies the codes of each
  // row of x quantized by the same rule, y = (qx qw^T) * sx[row] * sw[col] + b; x may come
  // quantized already, so one quantization serves several projections of the same input.
  virtual Tensor QuantizeRowsFp8(const Tensor& x) = 0;
  // y = x / rms(x) * (w or 1 + w or 1), over the last dimension; y may alias x.
  virtual void RmsNorm(const Tensor& x, const Tensor* w, float eps, bool one_plus_weight, Tensor& y) = 0;
  virtual void Add(Tensor& acc, const Tensor& x) = 0;           // acc += x
  // residual += branch, then y = RmsNorm(residual): one pass where the device fuses it.
  virtual void AddRmsNorm(Tensor& residual, const Tensor& branch, const Tensor* w, float eps, bool one_plus_weight,
                          Tensor& y) {
    Add(residual, branch);
    RmsNorm(residual, w, eps, one_plus_weight, y);
  }
  // --quantization fp8, for a norm whose output only feeds FP8 projections: RmsNorm of x
  // (with a branch: AddRmsNorm, x += branch first) as QuantizeRowsFp8 makes its output,
  // returned; one pass, with no compute-dtype output in memory, where the device fuses it.
  virtual Tensor RmsNormFp8(Tensor& x, const Tensor* branch, const Tensor* w, float eps, bool one_plus_weight);
  virtual void Multiply(Tensor& acc, const Tensor& x) = 0;      // acc *= x
  virtual void Scale(Tensor& x, float s) = 0;
  virtual void ScaleByTensor(Tensor& x, const Tensor& scalar) = 0;  // x *= scalar[0]
  virtual void Softcap(Tensor& x, float cap) = 0;
  virtual void Activate(Tensor& x, Activation act) = 0;
  // out [T, I] = act(gate) * up, where each row of gate_up [T, 2I] holds gate's I columns
  // then up's (the output of a fused gate/up Linear).
  virtual void GatedActivation(const Tensor& gate_up, Activation act, Tensor& out) = 0;
  // --quantization fp8: GatedActivation's out [T, I] as QuantizeRowsFp8 makes it (the down
  // projection's FP8 input), returned; one pass where the device fuses it.
  virtual Tensor GatedActivationFp8(const Tensor& gate_up, Activation act);
  // out [T, I] = act(x gate^T) * (x up^T) for gate_up [2I, K] (gate's rows, then up's), each
  // product rounded to the compute dtype first (one Linear into [T, 2I], then
  // GatedActivation): one pass with the activation where the device fuses it.
  virtual void GatedLinear(const Tensor& x, const Tensor& gate_up, Activation act, Tensor& out);
  virtual void Rope(Tensor& x, const Tensor& positions, const RopeTable& rope) = 0;  // x [T, heads, D]
  // Per-head RMSNorm (q/k norm) then RoPE, in place: one pass where the device fuses it.
  virtual void RmsNormRope(Tensor& x, const Tensor& w, float eps, bool one_plus_weight, const Tensor& positions,
                           const RopeTable& rope) {
    RmsNorm(x, &w, eps, one_plus_weight, x);
    Rope(x, positions, rope);
  }
  // A layer's new attention inputs, read from the q/k/v GEMM's output qkv [T, W]: each row
  // holds q's heads, then k's, then v's (W = (heads + 2 kv_heads) D), or with values_are_keys
  // no v (W = (heads + kv_heads) D: v is k's raw heads). q is normed per head (norms.q) and
  // rotated into q [T, heads, D]; k normed (norms.k) and rotated and v normed if norms.v are
  // stored at slots as StoreKV does (caches [slots, kv_heads, D]). qkv is left as it was.
  // One pass where the device fuses it.
  virtual void NormRopeStoreKV(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms,
                               const Tensor& positions, const RopeTable& rope, const Tensor& slots, Tensor& k_cache,
                               Tensor& v_cache, Tensor& q);
  // A negative slot (a padding row) stores nothing.
  virtual void StoreKV(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache) = 0;
  virtual void Attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const AttentionBatch& batch, const AttentionParams& params, Tensor& out) = 0;
  // NormRopeStoreKV, then Attention of its q into out [T, heads, D]: one pass where the
  // device fuses them (q is then never written out).
  virtual void QkvAttention(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms, const Tensor& positions,
                            const RopeTable& rope, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                            const AttentionBatch& batch, const AttentionParams& params, Tensor& out);
  virtual void GatherRows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) = 0;
  // The same with the row indices int32 [n] on the backend's device: no upload, so a graph
  // records it (a token tree's round: each node's token and parent row).
  virtual void GatherRowsAt(const Tensor& x, const Tensor& rows, Tensor& out) = 0;
  // Row src[i] of x [rows, ...] copied to row dst[i] for each i, every source read before any
  // destination is written (a token tree's accepted KV moved to its path: KVCache::MoveSlots).
  // moves: int32 [2 n] on the backend's device, the n sources then the n destinations.
  virtual void MoveRows(Tensor& x, const Tensor& moves);
  // out [T, w] = x[:, begin : begin + w] for x [T, C].
  virtual void SliceColumns(const Tensor& x, int64_t begin, Tensor& out) = 0;
  // out[:, begin : begin + w] = x for x [T, w], out [T, C]: SliceColumns' inverse, which
  // concatenates along the last dimension (EAGLE-3's [embedding | hidden] and aux inputs;
  // the f32 logits of a vocabulary-parallel LM head): compute dtype or f32.
  virtual void WriteColumns(const Tensor& x, int64_t begin, Tensor& out) = 0;
  // The input of a draft layer fed tokens and hidden states (EAGLE-3's layer 0): out [T, 2H]
  // = [RmsNorm(table[ids]) * embed_norm | RmsNorm(hidden) * hidden_norm], the embedding
  // unscaled; residual [T, H] = the normed hidden (normed_residual) or hidden as it is.
  // One pass where the device fuses it (a draft step's inputs are launch-bound).
  virtual void DraftLayerInput(const Tensor& table, const Tensor& ids, const Tensor& hidden, const Tensor& embed_norm,
                               const Tensor& hidden_norm, float eps, bool normed_residual, Tensor& out,
                               Tensor& residual);
  // Router (router_logits [T, E] f32) and experts as `spec` says; out = sum of the chosen
  // experts' MLPs, weighted.
  virtual void MoeMlp(const Tensor& x, const Tensor& router_logits, const MoeWeights& experts, const MoeSpec& spec,
                      Tensor& out) = 0;
  // Whether MoeMlp on `tokens` rows of a layer of `experts` experts ([inter, hidden] gate
  // and up) queues no host synchronization, so a step of it can be recorded.
  virtual bool MoeRecordable(int64_t tokens, int experts, int64_t hidden, int64_t inter) const {
    (void)tokens, (void)experts, (void)hidden, (void)inter;
    return false;
  }
  // Gemma 4 MTP's centroid-masked LM head (vLLM's Gemma4MTPMaskedEmbedder). Per row r of
  // x [R, H]: the top_k highest of centroid_logits f32 [R, C] (NaN lowest, ties to the lower
  // index) select clusters; cluster c holds the tokens in row c of token_ordering int32
  // [C, V / C]. A selected token's logit is x[r] . lm_head[token] (lm_head [V, H]); every
  // other entry of logits f32 [R, V] is the lowest finite float (vLLM's fill).
  virtual void CentroidMaskedLogits(const Tensor& x, const Tensor& centroid_logits, const Tensor& token_ordering,
                                    const Tensor& lm_head, int top_k, Tensor& logits) = 0;
  // flags int32 [R]: 1 where row r of x [R, C] (compute dtype) holds an inf or NaN, else 0.
  virtual void FlagNonFiniteRows(const Tensor& x, Tensor& flags) = 0;
  // One token per row of logits f32 [rows, vocab] (backend/sampling.h); only the tokens
  // and logprobs come back to the host. `ahead` (may be empty) gets the sampled tokens on
  // the device (int32 [rows]) once they are queued, before the host waits for them: the
  // work it queues runs while the host waits, and on CUDA after the download, which waits
  // for the sampling alone.
  virtual SampledTokens Sample(const Tensor& logits, const SamplingBatch& batch, const SampledAhead& ahead = {}) = 0;
  // Greedy tokens that stay on the device: tokens int32 [R] gets each row of logits f32
  // [R, V]'s arg max (the Sample op's temperature-0 token), plus offsets[arg max] where
  // offsets int32 [V] is given (an EAGLE-3 draft's d2t). tokens int32 [R, k] (k <= V) gets
  // each row's k highest, highest first, lowest id on ties: the ids of the Sample op's top
  // logprobs (a token tree's children; past a NaN, where nothing is ordered, the last id
  // found again). No host work: graphs record it.
  virtual void GreedyTokens(const Tensor& logits, const Tensor* offsets, Tensor& tokens) = 0;
  // EAGLE-2's dynamic trees (backend/draft_tree.h), in fixed shapes a graph can record.
  // TopLogprobs: each row's k best raw logprobs (the Sample op's top logprobs: highest
  // first, lowest id on ties) into ids int32 [R, k], offset as GreedyTokens offsets them,
  // and logprobs f32 [R, k]; an entry with no finite logprob gets id -1 and -inf (as do
  // all after a -1: past a NaN nothing is ordered).
  virtual void TopLogprobs(const Tensor& logits, const Tensor* offsets, Tensor& ids, Tensor& logprobs) = 0;
  // ExpandDraftTreeSlot for every slot of `state` into depth d, from ids / logprobs [S f, k]
  // (TopLogprobs of the depth's rows); with next_ids, next_rows (the drafting row among all
  // S f) and next_masks (int32 [S k], [S k], [S 2k]) the next depth's row inputs.
  virtual void ExpandDraftTrees(const Tensor& ids, const Tensor& logprobs, int d, DraftTreeState& state,
                                Tensor* next_ids, Tensor* next_rows, Tensor* next_masks) = 0;
  // Each slot's tree (SelectDraftTreeSlot) of its first limits[s][0] places with budget
  // limits[s][1] (int32 [S, 2]) into out int32 [S, 2N]: its N token slots, then its N
  // parents, -1 past its nodes.
  virtual void SelectDraftTrees(const DraftTreeState& state, const Tensor& limits, Tensor& out) = 0;
  // Speculative decoding's accept stage (backend/verification.h): K_r drafts and K_r + 1
  // logit rows f32 per request in, the accepted counts and emitted tokens out (only they
  // and requested logprobs reach the host). draft_probs f32 [drafts, vocab] on the device,
  // or null for one-hot drafts; target_probs, if not null, f32 [rows, vocab] on the
  // device, receives each row's processed target distribution p.
  virtual VerifiedTokens VerifyDrafts(const Tensor& logits, const Tensor* draft_probs, const VerificationBatch& batch,
                                      Tensor* target_probs) = 0;
};

AttentionBatch MakeAttentionBatch(Backend& backend, std::vector<SequenceSlice> seqs);

}  // namespace hsx
