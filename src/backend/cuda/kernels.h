// Launchers of hsx's CUDA kernels. Activations are bf16 unless named otherwise; all
// arithmetic is f32. Each enqueues on `stream` and returns at once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace hsx::cuda {

using bf16 = __nv_bfloat16;

void FillUniform(bf16* out, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);
void Embed(const bf16* table, const int32_t* ids, int64_t tokens, int64_t hidden, float scale, bf16* out,
           cudaStream_t stream);
// programmatic: launched to overlap the kernel before (programmatic_launch.cuh).
void RmsNorm(const bf16* x, const bf16* w, int64_t rows, int64_t dim, float eps, bool one_plus_weight, bf16* y,
             cudaStream_t stream, bool programmatic = false);
// residual += branch (rounded to bf16), then y = RmsNorm(residual).
void AddRmsNorm(bf16* residual, const bf16* branch, const bf16* w, int64_t rows, int64_t dim, float eps,
                bool one_plus_weight, bf16* y, cudaStream_t stream, bool programmatic = false);
// Backend::DraftLayerInput for tokens rows of dim (% 8 == 0, 16-byte aligned: else false,
// nothing launched): out [tokens, 2 dim], residual [tokens, dim].
bool DraftLayerInput(const bf16* table, const int32_t* ids, const bf16* hidden, const bf16* embed_w,
                     const bf16* hidden_w, int64_t tokens, int64_t dim, float eps, bool normed_residual, bf16* out,
                     bf16* residual, cudaStream_t stream);
// y [rows, cols] (bf16 or f32) += bias [cols], in f32.
void AddBias(void* y, bool is_f32, const bf16* bias, int64_t rows, int64_t cols, cudaStream_t stream);
void Add(bf16* acc, const bf16* x, int64_t n, cudaStream_t stream);
void Multiply(bf16* acc, const bf16* x, int64_t n, cudaStream_t stream);
void Scale(bf16* x, int64_t n, float s, const bf16* device_scalar, cudaStream_t stream);
void Softcap(void* x, bool is_f32, int64_t n, float cap, cudaStream_t stream);
void Activate(bf16* x, int64_t n, int act, cudaStream_t stream);
// out [rows, cols] = act(gate) * up, gate's and up's rows `stride` elements apart (a fused
// gate/up output: up = gate + cols, stride 2 cols).
void GatedActivation(const bf16* gate, const bf16* up, int64_t rows, int64_t cols, int64_t stride, int act, bf16* out,
                     cudaStream_t stream);
// Per-head attention inputs (norm_rope_store.cu): token t's q_heads heads of dim at
// q_in + t * q_stride and, with k given, its kv_heads k and v heads at k / v + t * kv_stride
// (a fused q/k/v GEMM's row, or separate tensors). q and k are normed with q_norm / k_norm
// (null: not normed; the normed value rounded to bf16) and rotated (rotary_dims of each
// head, inv_freq [rotary_dims / 2]); v is normed without a weight if v_norm. q is written
// to q [tokens, q_heads, dim] (q_in itself for in place); k and v are only stored, at their
// token's slot (negative: none) in k_cache / v_cache [slots, kv_heads, dim]. dim <= 512.
struct NormRopeStoreArgs {
  const bf16* q_in = nullptr;
  int64_t q_stride = 0;
  bf16* q = nullptr;
  const bf16* q_norm = nullptr;
  int q_heads = 0;
  const bf16* k = nullptr;  // null: q alone (k, v, slots and the caches unused)
  const bf16* k_norm = nullptr;
  const bf16* v = nullptr;  // may be k (values that are the raw keys)
  int64_t kv_stride = 0;
  bool v_norm = false;
  int kv_heads = 0;
  const int32_t* slots = nullptr;
  bf16* k_cache = nullptr;
  bf16* v_cache = nullptr;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int rotary_dims = 0;
  int64_t tokens = 0;
  int dim = 0;
  float eps = 0.0f;
  bool one_plus_weight = false;
};
// programmatic: launched to overlap the kernel before (programmatic_launch.cuh).
void NormRopeStore(const NormRopeStoreArgs& args, cudaStream_t stream, bool programmatic = false);
// The same for prefill-sized steps (norm_rope.cu), one block per token, the same bits; rows
// it cannot stage in shared memory run on NormRopeStore's kernel.
void NormRopeStoreRows(const NormRopeStoreArgs& args, cudaStream_t stream);
void StoreKV(const bf16* k, const bf16* v, const int32_t* slots, int64_t tokens, int64_t k_row, int64_t v_row,
             bf16* k_cache, bf16* v_cache, cudaStream_t stream);
void GatherRows(const void* x, const int32_t* rows, int64_t n_rows, int64_t row_bytes, void* out, cudaStream_t stream);
// Backend::MoveRows (move_rows.cu): moves int32 [2 n] on the device (sources, then
// destinations), rows of row_bytes (a multiple of 4). scratch: null, or
// MoveRowsScratchBytes' bytes where that is not 0.
int64_t MoveRowsScratchBytes(int64_t n, int64_t row_bytes);
void MoveRows(void* x, const int32_t* moves, int64_t n, int64_t row_bytes, void* scratch, cudaStream_t stream);
void SliceColumns(const bf16* x, int64_t rows, int64_t cols, int64_t begin, int64_t width, bf16* out,
                  cudaStream_t stream);
// out[:, begin : begin + width] = x for x [rows, width], out [rows, cols].
void WriteColumns(const bf16* x, int64_t rows, int64_t width, int64_t begin, int64_t cols, bf16* out,
                  cudaStream_t stream);

// MoE routing, one warp per token: softmax over the experts (f32), top_k (ties to the
// lower id), optional renormalization; counts[e] += tokens routed to e (zero it first).
void MoeRoute(const float* logits, int64_t tokens, int experts, int top_k, bool renormalize, int32_t* ids,
              float* weights, int32_t* counts, cudaStream_t stream);
// Groups the (token, choice) pairs by expert: slot = cursor[e]++ (cursor starts at each
// expert's offset), rows[slot] = token, inverse[token * top_k + j] = slot.
void MoePermute(const int32_t* ids, int64_t pairs, int top_k, int32_t* cursor, int32_t* rows, int32_t* inverse,
                cudaStream_t stream);
// gpt-oss (moe_experts_extra.cu): y [rows, cols] (rows sorted by expert, expert e's from
// offsets[e], offsets int32 [experts + 1] on the device) += bias [experts, cols]'s row of
// each row's expert; and out = the clamped SwiGLU of gate and up (n elements, MoeSpec).
void MoeAddExpertBias(bf16* y, int64_t rows, int64_t cols, const int32_t* offsets, int experts, const bf16* bias,
                      cudaStream_t stream);
void ClampedSwiglu(const bf16* gate, const bf16* up, int64_t n, float limit, float alpha, bf16* out,
                   cudaStream_t stream);
// out[t] = sum_j weights[t, j] * y[inverse[t, j]], in choice order (deterministic).
void MoeCombine(const bf16* y, const int32_t* inverse, const float* weights, int64_t tokens, int top_k, int64_t hidden,
                bf16* out, cudaStream_t stream);
void ConvertToBF16(const void* x, int src_dtype, int64_t n, bf16* out, cudaStream_t stream);
// Each row of x [rows, cols] as E4M3 codes q and the f32 scale that multiplies them back
// (tensor/float8.h's rule).
void QuantizeRowsFp8(const bf16* x, int64_t rows, int64_t cols, uint8_t* q, float* scales, cudaStream_t stream);
// --quantization fp8: a norm or gated activation whose output only feeds FP8 GEMMs writes it
// as QuantizeRowsFp8 would make it of the bf16 output (the same codes and scales, bit for
// bit), in one pass. RmsNormFp8 is RmsNorm (with a branch: AddRmsNorm, residual x updated)
// into q [rows, dim]; GatedActivationFp8 is GatedActivation into q [rows, cols]. False,
// launching nothing, unless the widths are multiples of 8 that fit the registers
// (dim <= 65536, cols <= 32768).
bool RmsNormFp8(bf16* x, const bf16* branch, const bf16* w, int64_t rows, int64_t dim, float eps, bool one_plus_weight,
                uint8_t* q, float* scales, cudaStream_t stream);
bool GatedActivationFp8(const bf16* gate, const bf16* up, int64_t rows, int64_t cols, int64_t stride, int act,
                        uint8_t* q, float* scales, cudaStream_t stream);
// flags[r] = 1 where row r of x [rows, cols] holds an inf or NaN, else 0.
void FlagNonFiniteRows(const bf16* x, int64_t rows, int64_t cols, int32_t* flags, cudaStream_t stream);

// Gemma 4 MTP's centroid-masked LM head (Backend::CentroidMaskedLogits): logits f32
// [rows, vocab]; token_ordering [clusters, per_cluster]. False, launching nothing, unless
// 1 <= top_k <= min(clusters, 256) and clusters <= 8192.
bool CentroidMaskedLogits(const bf16* x, const float* centroid_logits, const int32_t* token_ordering,
                          const bf16* lm_head, int64_t rows, int hidden, int clusters, int per_cluster, int top_k,
                          int64_t vocab, float* logits, cudaStream_t stream);

// Decode-sized Linear (gemv.cu): y[m, n] = x[m, k] w[n, k]^T, y bf16 or (y_f32) f32, each
// weight read from memory once whatever m, on tensor cores; deterministic (no atomics,
// fixed reduction order), and a row's result does not depend on m.
constexpr int kGemvMaxRows = 8;  // 16 on two mma column tiles lost to cuBLASLt
// Whether Gemv takes this call: 1 <= m <= kGemvMaxRows, k a multiple of 8, x and w 16-byte aligned.
bool GemvSupports(const void* x, const void* w, int64_t m, int64_t k);
// Only for calls GemvSupports takes.
// programmatic: launched to overlap the kernel before (programmatic_launch.cuh).
void Gemv(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k, void* y, bool y_f32, cudaStream_t stream,
          bool programmatic = false);
// The gated MLP's first half (gated_gemv.cu): out[m, n] = act(x gate^T) * (x up^T) with
// gate_up [2n, k] (gate's rows, then up's), each product rounded to bf16 first: the bits
// of Gemv into [m, 2n] and GatedActivation. act 0: SiLU, 1: GELU (tanh). Only for calls
// GemvSupports takes.
void GatedGemv(const bf16* x, const bf16* gate_up, int64_t m, int64_t n, int64_t k, int act, bf16* out,
               cudaStream_t stream, bool programmatic = false);

struct AttentionArgs {
  const bf16* q;        // [T, num_heads, head_dim]
  const bf16* k_cache;  // [slots, kv_heads, head_dim]
  const bf16* v_cache;
  int64_t cache_slots = 0;  // rows of the caches (for TMA's bounds; 0 when unknown)
  bf16* out;            // [T, num_heads, head_dim]
  const int32_t* seq_info;      // [num_seqs, 4]: q_start, q_len, ctx_len, block table offset
  const int32_t* host_seq_info; // the same on the host, for scheduling; may be null
  const int32_t* block_tables;
  int num_seqs, max_q_len, num_heads, kv_heads, head_dim, block_size, sliding_window;
  float scale, softcap;
  // gpt-oss: f32 [num_heads], a logit per head that joins each row's softmax (its value
  // column dropped); null: none. Every kernel starts a row's online softmax at max = sink,
  // sum = 1 (split-KV decode: only the first chunk, so the merge counts it once).
  const float* sinks = nullptr;
  // Token trees (tree_mask.cuh): each sequence's tree base ([num_seqs], -1: none) and one
  // mask word per packed query row; both null when no sequence has tree rows. The wgmma
  // kernel takes no trees (such steps run on the mma.sync kernels).
  const int32_t* tree_base = nullptr;
  const uint64_t* tree_mask = nullptr;
  bool hopper;  // the device is sm_90: head dim 128 may run on warpgroup MMAs
  // Key tiles start at multiples of the tile size, not at a block's window start, so a
  // sliding-window row sees the same tiles whichever rows share its block.
  bool batch_invariant;
  // Split-KV decode (attention_decode.cu): with decode_splits > 0, a step whose sequences
  // all have q_len <= kDecodeMaxQueryRows runs there, each context cut into up to decode_splits chunks
  // (DecodeAttentionSplits); decode_workspace holds DecodeAttentionWorkspaceBytes for
  // the chunks' partial results. Launch shapes never depend on per-sequence data.
  int decode_splits = 0;
  float* decode_workspace = nullptr;
  // A context's chunks are one cluster that merges them in distributed shared memory (no
  // workspace, no merge kernel); decode_splits then at most 16 (8 at head dim 512).
  bool decode_cluster_merge = false;
  // The split-KV kernels launch to overlap the kernel before (programmatic_launch.cuh).
  bool programmatic = false;
  // Split-KV decode only: with inputs.q_in set, q is null and the kernel makes its own
  // inputs from the fused q/k/v rows, as NormRopeStore would (the same bits): each block
  // its rows of q, and the K and V of the step's tokens whose keys fall in its chunk
  // (stored at their slots too; a token of slot < 0 stores none and its keys are the
  // cache's). Its keys before the step's tokens are then fetched before it waits for the
  // kernel before it. The tokens of a sequence are the last q_len of its context.
  NormRopeStoreArgs inputs;
};
// False if head_dim is not one of 16, 32, 64, 128, 256, 512 (or decode_splits is past its
// bound).
bool Attention(const AttentionArgs& args, cudaStream_t stream);
// Queries per sequence the split-KV kernels take: a decode step's one, or a speculative
// verification's last token and drafts (more run on the prefill kernels).
constexpr int kDecodeMaxQueryRows = 8;
// The split-KV decode kernels; false, launching nothing, unless head_dim is supported,
// max_q_len <= kDecodeMaxQueryRows and decode_splits in [1, 64] ([1, 16] or [1, 8] with
// decode_cluster_merge).
bool AttentionDecode(const AttentionArgs& args, cudaStream_t stream);
// Chunks per context: as many as keep num_seqs sequences' blocks (of up to max_q_len
// queries) within two per SM, at least 1 and at most 64; merged in clusters (at most 16
// chunks, 8 at head dim 512) where their blocks are at most one per SM and the device holds
// all the clusters at once: cluster_capacity is DecodeClusterCapacity's (0: no clusters).
// fused_inputs: the kernel makes its own inputs (AttentionArgs::inputs) only while its
// blocks fit one wave, where each block's added prologue overlaps the others'.
struct DecodeSplits {
  int count;
  bool cluster_merge;
  bool fused_inputs;
};
DecodeSplits PlanDecodeSplits(int num_seqs, int max_q_len, int num_heads, int kv_heads, int head_dim, int sm_count,
                              int cluster_capacity);
// Clusters of a head dim's largest chunk count the current device can run at once (0 if
// none, or the head dim is unsupported). Asks the driver: callers keep the answer.
int DecodeClusterCapacity(int head_dim);
// Bytes of f32 workspace for `splits` chunks (0 for one, whose kernel writes out directly,
// and with cluster_merge).
size_t DecodeAttentionWorkspaceBytes(int num_seqs, int max_q_len, int num_heads, int head_dim, int splits,
                                     bool cluster_merge);
// The wgmma kernel (attention_hopper.cu); false, launching nothing, unless head_dim is
// 128, 256 or 512, the GQA group divides the block's rows (128; 64 at 512), host_seq_info
// and cache_slots are given and the block size is a multiple of 8 that divides the tile's
// keys (128; 64 at head dim 256, 32 at 512).
bool AttentionHopper(const AttentionArgs& args, cudaStream_t stream);

}  // namespace hsx::cuda
