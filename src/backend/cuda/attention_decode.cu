// Split-KV ("flash decoding") attention for decode and verification steps, where every
// sequence has a few queries (at most kDecodeMaxQueryRows: one, or a speculative step's
// last token and drafts). attention.cu gives each (sequence, head) one block that walks
// the whole context, which leaves most of the GPU idle for a few long sequences; here each
// sequence's visible keys are cut into `splits` chunks, one block per (chunk, KV head, row
// tile, sequence), and the chunks' partial softmax results are merged: by the blocks
// themselves when one cluster holds a context's chunks (their partial results meet in
// distributed shared memory, no second launch and no round trip through HBM), else by a
// second kernel from a workspace.
//
// A block's mma rows are (query, head) pairs of one KV group, query-major, 16 to a tile:
// the group's heads of every query of the sequence, so each K/V element is read from HBM
// once per sequence and row tile (once, for Qwen3's groups of 4 up to 4 queries). Query j
// of q sees the keys before ctx_len - q + 1 + j (causal), the others masked per row; a
// token tree's rows see what their mask words allow (tree_mask.cuh), and tree keys no row
// of the block sees load as zeros. Key tiles stream through a
// cp.async pipeline; each warp computes the scores of a quarter of a tile's keys
// (S = Q K^T on mma.sync), all warps then apply the tile's online softmax to the whole
// tile (redundantly, from shared memory), and each warp accumulates a quarter of the
// output dims (O += P V), so the f32 accumulator fits in registers up to head dim 512.
//
// With AttentionArgs::inputs the kernel also makes its inputs from the q/k/v GEMV's rows
// (PrepareInputs), where norm/RoPE/store was a launch of its own before it.
//
// Graph-safe: the launch depends only on num_seqs, heads, head_dim and the split count,
// which PlanDecodeSplits derives from the batch's shape and the SM count; each block
// finds its chunk from ctx_len on the device, and blocks past the last chunk exit.
#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/dynamic_shared_memory.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.cuh"
#include "backend/cuda/norm_rope_head.cuh"
#include "backend/cuda/online_softmax.cuh"
#include "backend/cuda/programmatic_launch.cuh"
#include "backend/cuda/query_key_scores.cuh"
#include "backend/cuda/tree_mask.cuh"

namespace hsx::cuda {
namespace {

constexpr int kRows = 16;       // query heads per block: one mma row tile
constexpr int kMaxSplits = 64;  // bounds the workspace and the combine's loop
// Chunks a cluster can hold: 16 blocks (a non-portable size Hopper allows) where two fit an
// SM, else the portable 8, so that a cluster always fits one GPC's SMs.
__host__ __device__ constexpr int MaxClusterSplits(int head_dim) { return head_dim <= 256 ? 16 : 8; }
constexpr int kCombineThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

// Warps per block: each takes D / warps output dims, at least one 16-wide mma block.
template <int D>
__host__ __device__ constexpr int Warps() {
  return D >= 64 ? 4 : D / 16;
}
// Keys per tile: narrower tiles for wide heads so that the pipeline fits in shared memory.
template <int D>
__host__ __device__ constexpr int Tile() {
  return D <= 128 ? 64 : 32;
}
template <int D>
constexpr int Stages() {
  return D <= 64 ? 4 : (D <= 256 ? 3 : 2);
}
template <int D>
constexpr int Ld() {  // shared row stride in bf16: padded so ldmatrix's 8 rows hit distinct banks
  return D + 8;
}
template <int D>
constexpr int ScoreLd() {  // f32 score row stride, padded likewise
  return Tile<D>() + 8;
}
template <int D>
constexpr size_t SharedBytes() {
  return size_t(Stages<D>()) * 2 * Tile<D>() * Ld<D>() * 2  // K and V tiles per stage
         + size_t(kRows) * Ld<D>() * 2                      // Q
         + size_t(kRows) * ScoreLd<D>() * 4;                // one tile's scores
}

// The keys a sequence's queries see, [begin, end) (the first query's window begin to the
// last query's end; a tree's rows measure windows from their logical positions, at least
// its base), and the chunk each split takes: an equal share rounded up to whole tiles, so
// only the last chunk has a partial tile.
struct Chunks {
  int begin, end, size, count;
};
__device__ __forceinline__ Chunks SplitKeys(int ctx_len, int q_len, int tree_base, int window, int splits, int tile) {
  Chunks c;
  c.end = ctx_len;
  const int first = tree_base >= 0 ? min(ctx_len - q_len, tree_base) : ctx_len - q_len;
  c.begin = window > 0 ? max(0, first + 1 - window) : 0;
  const int n = max(0, c.end - c.begin);
  c.size = ((n + splits - 1) / splits + tile - 1) / tile * tile;
  c.count = n == 0 ? 0 : (n + c.size - 1) / c.size;
  return c;
}

// Row tiles of a KV head's (query, head) pairs for q_len queries per sequence.
__host__ __device__ __forceinline__ int RowTiles(int q_len, int group) { return (q_len * group + kRows - 1) / kRows; }

// Partial results of split s for (token row, head): the unnormalized output [D], and the
// running max (log2 units) and sum, in a workspace of three arrays.
struct Workspace {
  float *o, *m, *l;
  __device__ Workspace(const AttentionArgs& a) {
    const int64_t rows = int64_t(a.num_seqs) * a.max_q_len * a.num_heads * a.decode_splits;
    o = a.decode_workspace;
    m = o + rows * a.head_dim;
    l = m + rows;
  }
};

// Fused inputs (AttentionArgs::inputs): the rotations of the sequence's q_len tokens,
// cos_s and sin_s [q_len][D / 2], from positions (a step input) and the model's frequencies,
// so before the wait.
template <int D>
__device__ __forceinline__ void RopeAngles(const NormRopeStoreArgs& in, int q_start, int q_len, float* cos_s,
                                           float* sin_s) {
  const int half = in.rotary_dims / 2;
  for (int e = threadIdx.x; e < q_len * half; e += 32 * Warps<D>()) {
    const int j = e / half, i = e % half;
    RopeCosSin(static_cast<float>(in.positions[q_start + j]), in.inv_freq[i], &sin_s[j * (D / 2) + i],
               &cos_s[j * (D / 2) + i]);
  }
}

// Fused inputs, after the wait: the block's q rows into q_s (row r: pair pair0 + r), and
// the K and V of the fresh tokens at positions [fresh_begin, fresh_begin + n_new) stored
// at their slots and, where stage_row(p, value) gives a row (a tile issued before the
// wait), there too. One warp per head, made as NormRopeStoreKernel makes it
// (norm_rope_head.cuh: the same bits), rotated by RopeAngles' table; row is the warp's D
// floats of scratch. A warp loads its next head before it computes the current one: the
// loads are a round trip to L2 each.
template <int D, int kLd, typename StageRow>
__device__ __forceinline__ void PrepareInputs(const NormRopeStoreArgs& in, int kvh, int group, int pair0, int rows,
                                              int q_start, int first_new, unsigned fresh, int fresh_begin, int n_new,
                                              bf16* q_s, StageRow stage_row, const float* cos_table,
                                              const float* sin_table, float* row) {
  constexpr int kPerLane = (D + 31) / 32;
  const int lane = threadIdx.x % 32;
  const int half = in.rotary_dims / 2;
  const float plus = in.one_plus_weight ? 1.0f : 0.0f;
  const int items = rows + 2 * n_new;  // q heads, then each fresh token's K and V
  struct Head {
    bool live = false, norm = false, rope = false;
    int token = 0;
    const bf16* w = nullptr;
    bf16 *q_row = nullptr, *stage = nullptr, *cache = nullptr;
    bf16 x[kPerLane], scale[kPerLane];  // this lane's elements, as loaded
  };
  const auto load = [&](int item, Head& h) {
    h = Head();
    if (item >= items) return;
    const bf16* x;
    if (item < rows) {
      const int pair = pair0 + item;
      h.token = q_start + pair / group;
      x = in.q_in + int64_t(h.token) * in.q_stride + (kvh * group + pair % group) * D;
      h.w = in.q_norm;
      h.norm = h.w != nullptr;
      h.rope = true;
      h.q_row = q_s + item * kLd;
    } else {
      const int e = item - rows, p = fresh_begin + e / 2, j = p - first_new;
      if (!(fresh >> j & 1u)) return;  // a padding token: its K and V stay the cache's
      const bool value = e % 2 == 1;
      h.token = q_start + j;
      x = (value ? in.v : in.k) + int64_t(h.token) * in.kv_stride + kvh * D;
      if (value) {
        h.norm = in.v_norm;  // without a weight
      } else {
        h.w = in.k_norm;
        h.norm = h.w != nullptr;
        h.rope = true;
      }
      h.cache = (value ? in.v_cache : in.k_cache) + (int64_t(in.slots[h.token]) * in.kv_heads + kvh) * D;
      h.stage = stage_row(p, value);
    }
    h.live = true;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      h.x[j] = i < D ? x[i] : bf16();
      h.scale[j] = h.w != nullptr && i < D ? h.w[i] : bf16();
    }
  };
  Head head, next;
  int item = threadIdx.x / 32;
  load(item, head);
  for (; item < items; item += Warps<D>()) {
    load(item + Warps<D>(), next);
    if (head.live) {
      float r[kPerLane], scale[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        r[j] = __bfloat162float(head.x[j]);
        scale[j] = head.w != nullptr ? __bfloat162float(head.scale[j]) + plus : 1.0f;
      }
      const int64_t angles = int64_t(head.token - q_start) * (D / 2);
      MakeHeadReady(r, scale, head.norm, head.rope, row, cos_table + angles, sin_table + angles, D, half, in.eps);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int i = lane + 32 * j;
        if (i >= D) continue;
        const bf16 v = __float2bfloat16(r[j]);
        if (head.q_row != nullptr) head.q_row[i] = v;
        if (head.stage != nullptr) head.stage[i] = v;
        if (head.cache != nullptr) head.cache[i] = v;
      }
    }
    head = next;
  }
}

// kClusterMerge: the grid's x (the chunks of a context) is one cluster, whose blocks
// merge their partial results themselves (the epilogue below).
template <int D, bool kClusterMerge>
__global__ void __launch_bounds__(32 * Warps<D>()) DecodeKernel(AttentionArgs a) {
  constexpr int kWarps = Warps<D>(), kThreads = 32 * kWarps, kTile = Tile<D>(), kStages = Stages<D>();
  constexpr int kLd = Ld<D>(), kSLd = ScoreLd<D>();
  constexpr int kWarpKeys = kTile / kWarps, kWarpDims = D / kWarps;  // each warp's share
  constexpr int kChunks = D / 8;                                     // 16-byte pieces of a row
  // Q fragments stay in registers up to D = 256; D = 512 rereads them from shared memory.
  constexpr bool kQInRegisters = D <= 256;
  static_assert(kWarpKeys % 8 == 0 && kWarpDims % 16 == 0 && kThreads % kChunks == 0 &&
                kTile % (kThreads / kChunks) == 0);
  // With fused inputs, what is read before the wait no kernel of this step writes: the keys
  // of earlier steps, the RoPE frequencies, and the step inputs (block tables, sequence
  // info, positions and slots).
  const bool fused = a.inputs.q_in != nullptr;
  const auto wait_for_inputs = [] {
    WaitForPriorGrid();      // q (or the q/k/v rows) and the cache rows come from the kernel before
    AllowDependentLaunch();  // the merge or o_proj follows (programmatic_launch.cuh)
  };
  if (!fused) wait_for_inputs();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* kv_s = reinterpret_cast<bf16*>(smem);  // per stage: K tile, then V tile
  bf16* q_s = kv_s + kStages * 2 * kTile * kLd;
  float* s_s = reinterpret_cast<float*>(q_s + kRows * kLd);

  const int split = blockIdx.x, seq = blockIdx.z;
  const int group = a.num_heads / a.kv_heads, row_tiles = RowTiles(a.max_q_len, group);
  const int kvh = blockIdx.y / row_tiles, pair0 = (blockIdx.y % row_tiles) * kRows;
  const int q_start = a.seq_info[seq * 4], q_len = a.seq_info[seq * 4 + 1];
  const int ctx_len = a.seq_info[seq * 4 + 2], table_offset = a.seq_info[seq * 4 + 3];
  const int rows = min(kRows, q_len * group - pair0);  // live (query, head) pairs of this block
  if (rows <= 0) return;  // no query row of this tile in this step
  // Pair r of the tile: query (pair0 + r) / group, head kvh * group + (pair0 + r) % group.
  auto row_offset = [&](int r) {
    const int pair = pair0 + r;
    return (int64_t(q_start + pair / group) * a.num_heads + kvh * group + pair % group) * D;
  };
  const int tree_base = TreeBaseOr(a, seq, -1);
  const Chunks chunks = SplitKeys(ctx_len, q_len, tree_base, a.sliding_window, a.decode_splits, kTile);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  if (chunks.count == 0) {  // a padding row (no keys): zeros, written once
    if (fused) wait_for_inputs();
    if (split == 0)
      for (int i = threadIdx.x; i < rows * D; i += kThreads) a.out[row_offset(i / D) + i % D] = __float2bfloat16(0.0f);
    return;
  }
  // In a merging cluster every block reaches the cluster's barriers; one past the last
  // chunk has no keys (no tiles, m = -inf, l = 0). chunks.count is the cluster's own.
  const bool merge_in_cluster = kClusterMerge && chunks.count > 1;
  if (split >= chunks.count && !merge_in_cluster) return;
  const int key_begin = chunks.begin + split * chunks.size;
  const int key_end = min(chunks.end, key_begin + chunks.size);
  const int num_tiles = max(0, (key_end - key_begin + kTile - 1) / kTile);
  const int32_t* table = a.block_tables + table_offset;

  // Fused inputs: the step's tokens (positions first_new + j) whose K/V this kernel makes,
  // bit j set where token j has a slot (the rest are padding: their keys are the cache's).
  const int first_new = ctx_len - q_len;
  unsigned fresh = 0;
  if (fused)
    for (int j = 0; j < q_len; ++j) fresh |= (a.inputs.slots[q_start + j] >= 0 ? 1u : 0u) << j;
  const auto is_fresh = [&](int p) { return p >= first_new && p < key_end && (fresh >> (p - first_new) & 1u); };
  // A tree's keys that no query of the block sees (a step input: read before the wait).
  uint64_t block_keys = 0;
  if (tree_base >= 0) {
    for (int j = pair0 / group; j <= (pair0 + rows - 1) / group; ++j) {
      uint64_t w = a.tree_mask[q_start + j];
      const int pos = first_new + j;
      if (w == 0 && pos >= tree_base) w = pos - tree_base >= 63 ? ~0ull : (2ull << (pos - tree_base)) - 1;
      block_keys |= w;
    }
  }

  // Issues the cp.async copies of a tile's keys and values into its stage; keys past
  // key_end are zero-filled (their scores are masked, and zero values keep P V finite).
  // Each thread copies one 16-byte column of every (kThreads / kChunks)-th row. Tiles
  // issued before the wait skip the fresh keys, which PrepareInputs writes there itself.
  auto issue = [&](int tile, bool before_wait) {
    if (tile < num_tiles) {
      bf16* k_dst = kv_s + (tile % kStages) * 2 * kTile * kLd;
      bf16* v_dst = k_dst + kTile * kLd;
      constexpr int kRowStep = kThreads / kChunks;
      const int kt = key_begin + tile * kTile, c = threadIdx.x % kChunks;
#pragma unroll
      for (int i = 0; i < kTile / kRowStep; ++i) {  // unrolled, so the table reads overlap
        const int r = threadIdx.x / kChunks + i * kRowStep;
        const int p = min(kt + r, key_end - 1);
        const int64_t slot = int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size;
        const int64_t off = (slot * a.kv_heads + kvh) * D + c * 8;
        if (before_wait && is_fresh(kt + r)) continue;
        const bool load = kt + r < key_end && LoadsKey(kt + r, tree_base, block_keys);
        CopyAsync16(k_dst + r * kLd + c * 8, a.k_cache + off, load);
        CopyAsync16(v_dst + r * kLd + c * 8, a.v_cache + off, load);
      }
    }
    CommitAsync();  // an empty group past the end keeps the wait counts uniform
  };
  for (int tile = 0; tile < kStages - 1; ++tile) issue(tile, fused);

  // The block's query rows, zero rows past `rows`.
  if (fused) {
    // Scratch: the stage the first tiles left free, until the loop's first barrier: the
    // rotations of up to kDecodeMaxQueryRows tokens, then a row per warp.
    float* cos_table = reinterpret_cast<float*>(kv_s + (kStages - 1) * 2 * kTile * kLd);
    float* sin_table = cos_table + kDecodeMaxQueryRows * (D / 2);
    float* warp_rows = sin_table + kDecodeMaxQueryRows * (D / 2);
    static_assert((kDecodeMaxQueryRows + kWarps) * D * sizeof(float) <= 2 * kTile * kLd * sizeof(bf16));
    RopeAngles<D>(a.inputs, q_start, q_len, cos_table, sin_table);
    wait_for_inputs();
    __syncthreads();  // the table is whole
    for (int i = threadIdx.x; i < (kRows - rows) * kChunks; i += kThreads)
      reinterpret_cast<uint4*>(q_s + (rows + i / kChunks) * kLd)[i % kChunks] = make_uint4(0, 0, 0, 0);
    const int fresh_begin = max(key_begin, first_new);
    PrepareInputs<D, kLd>(a.inputs, kvh, group, pair0, rows, q_start, first_new, fresh, fresh_begin,
                          max(0, key_end - fresh_begin), q_s, [&](int p, bool value) -> bf16* {
                            const int tile = (p - key_begin) / kTile;  // a stage row, if issued already
                            if (tile >= kStages - 1) return nullptr;
                            return kv_s + tile * 2 * kTile * kLd + (value ? kTile * kLd : 0) +
                                   (p - key_begin - tile * kTile) * kLd;
                          },
                          cos_table, sin_table, warp_rows + warp * D);
  } else {
    for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows) v = reinterpret_cast<const uint4*>(a.q + row_offset(r))[c];
      reinterpret_cast<uint4*>(q_s + r * kLd)[c] = v;
    }
  }
  // The keys rows g and g + 8 see, [see_begin, see_end) (dead rows none).
  int see_begin[2], see_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    see_end[h] = r < rows ? ctx_len - q_len + 1 + (pair0 + r) / group : 0;
    see_begin[h] = a.sliding_window > 0 ? max(0, see_end[h] - a.sliding_window) : 0;
  }
  RowSight sight[2];  // tree rows (dead rows see nothing: position -1)
  if (tree_base >= 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h, query = (pair0 + min(r, rows - 1)) / group;
      sight[h] = SightOf(a, seq, q_start + query, r < rows ? first_new + query : -1);
    }
  }
  __syncthreads();
  // A-operand addresses: lanes 0-15 give rows 0-15 at column 0, lanes 16-31 at column 8.
  const bf16* q_lane = q_s + (lane % 16) * kLd + 8 * (lane / 16);
  uint32_t q_frag[kQInRegisters ? D / 16 : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int s = 0; s < D / 16; ++s) LoadMatrixX4(q_frag[s], q_lane + 16 * s);
  }

  float o[kWarpDims / 8][4];
#pragma unroll
  for (int c = 0; c < kWarpDims / 8; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.0f;
  // Rows g and g + 8: running max (log2 units) and this lane's part of the sum; every
  // warp computes the same values from the same scores.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  if (a.sinks != nullptr && split == 0) {  // the sink joins one chunk only: the merge adds it once
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      m[h] = a.sinks[kvh * group + (pair0 + r) % group] * kLog2e;
      l[h] = t == 0 ? 1.0f : 0.0f;
    }
  }
  const float scale_log2 = a.scale * kLog2e;
  const bool softcap = a.softcap > 0.0f;
  const int warp_key = warp * kWarpKeys, warp_dim = warp * kWarpDims;

  for (int tile = 0; tile < num_tiles; ++tile) {
    WaitAsync<kStages - 2>();
    __syncthreads();            // this tile landed; every warp is done with the previous tile
    issue(tile + kStages - 1, false);  // into the stage the previous tile used
    const bf16* k_s = kv_s + (tile % kStages) * 2 * kTile * kLd;
    const bf16* v_s = k_s + kTile * kLd;
    const int tile_key = key_begin + tile * kTile;

    // S = Q K^T for this warp's keys.
    float s[kWarpKeys / 8][4];
    QueryKeyScores<D, kWarpKeys / 8, kQInRegisters, kLd>(s, q_frag, q_lane, k_s, warp_key, lane);
    // Scaled (and softcapped) scores in log2 units, keys past the chunk or out of the
    // row's sight masked.
#pragma unroll
    for (int j = 0; j < kWarpKeys / 8; ++j) {
      const int key = warp_key + 8 * j + 2 * t;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v = softcap ? a.softcap * tanhf(s[j][i] * a.scale / a.softcap) * kLog2e : s[j][i] * scale_log2;
        const int abs_key = tile_key + key + (i & 1), h = i / 2;
        if (abs_key >= key_end || (tree_base >= 0 ? !sight[h].Sees(abs_key)
                                                  : abs_key >= see_end[h] || abs_key < see_begin[h]))
          v = -INFINITY;
        s[j][i] = v;
      }
      *reinterpret_cast<float2*>(s_s + g * kSLd + key) = make_float2(s[j][0], s[j][1]);
      *reinterpret_cast<float2*>(s_s + (g + 8) * kSLd + key) = make_float2(s[j][2], s[j][3]);
    }
    __syncthreads();

    // Online softmax over the whole tile, read back in A-fragment layout: sv[k][h][x]
    // holds row g + 8h, keys 16k + 8x + 2t and the one after.
    float2 sv[kTile / 16][2][2];
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int k = 0; k < kTile / 16; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          sv[k][h][x] = *reinterpret_cast<const float2*>(s_s + (g + 8 * h) * kSLd + 16 * k + 8 * x + 2 * t);
          mx[h] = fmaxf(mx[h], fmaxf(sv[k][h][x].x, sv[k][h][x].y));
        }
      }
    }
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float alpha = OnlineSoftmaxStep(mx[h], m[h], l[h], base[h]);
#pragma unroll
      for (int c = 0; c < kWarpDims / 8; ++c) {
        o[c][2 * h] *= alpha;
        o[c][2 * h + 1] *= alpha;
      }
    }
    // P in A fragments; the row sums add the bf16-rounded values that P V uses.
    uint32_t p_frag[kTile / 16][4];
#pragma unroll
    for (int k = 0; k < kTile / 16; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const __nv_bfloat162 e = __floats2bfloat162_rn(Exp2(sv[k][h][x].x - base[h]), Exp2(sv[k][h][x].y - base[h]));
          l[h] += __low2float(e) + __high2float(e);
          p_frag[k][2 * x + h] = *reinterpret_cast<const uint32_t*>(&e);
        }
      }
    }

    // O += P V for this warp's dims; V rows are B's rows, so ldmatrix.trans gives B.
#pragma unroll
    for (int k = 0; k < kTile / 16; ++k) {
#pragma unroll
      for (int c = 0; c < kWarpDims / 16; ++c) {
        uint32_t b[4];  // keys 16k.., dims warp_dim + 16c + {0, 8}
        LoadMatrixX4Trans(b, v_s + (16 * k + lane % 16) * kLd + warp_dim + 16 * c + 8 * (lane / 16));
        Mma(o[2 * c], p_frag[k], b[0], b[1]);
        Mma(o[2 * c + 1], p_frag[k], b[2], b[3]);
      }
    }
  }
  WaitAsync<0>();  // no copy may still target shared memory when the block exits
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
  }

  if (merge_in_cluster) {
    // This chunk's unnormalized outputs and (m, l) per row, over the spent K/V stages.
    float* part = reinterpret_cast<float*>(smem);  // [kRows][D]
    float* stats = part + kRows * D;               // [kRows][2]
    static_assert(kRows * (D + 2) * 4 <= kStages * 2 * kTile * kLd * 2);
    __syncthreads();  // every warp is done reading the stages
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      if (r >= rows) continue;
#pragma unroll
      for (int c = 0; c < kWarpDims / 8; ++c)
        *reinterpret_cast<float2*>(part + r * D + warp_dim + 8 * c + 2 * t) = make_float2(o[c][2 * h], o[c][2 * h + 1]);
      if (warp == 0 && t == 0) {
        stats[2 * r] = m[h];
        stats[2 * r + 1] = l[h];
      }
    }
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every chunk's results are in its block's shared memory
    // The (row, dim) outputs shared out over the cluster's blocks (rank = split); each sums
    // the chunks in order with CombineKernel's arithmetic. All loads of an output are
    // issued before any is used: distributed shared memory is a round trip per wait.
    constexpr int kMaxChunks = MaxClusterSplits(D);
    for (int i = split * kThreads + threadIdx.x; i < rows * D; i += a.decode_splits * kThreads) {
      const int r = i / D, d = i % D;
      float cm[kMaxChunks], cl[kMaxChunks], co[kMaxChunks];
#pragma unroll
      for (int s = 0; s < kMaxChunks; ++s) {
        if (s >= chunks.count) break;
        const float* their_stats = cluster.map_shared_rank(stats, s);
        cm[s] = their_stats[2 * r];
        cl[s] = their_stats[2 * r + 1];
        co[s] = cluster.map_shared_rank(part, s)[r * D + d];
      }
      float mx = -INFINITY;
#pragma unroll
      for (int s = 0; s < kMaxChunks; ++s)
        if (s < chunks.count) mx = fmaxf(mx, cm[s]);
      float sum = 0.0f, acc = 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxChunks; ++s) {
        if (s >= chunks.count) break;
        const float weight = exp2f(cm[s] - mx);
        sum += weight * cl[s];
        acc += weight * co[s];
      }
      a.out[row_offset(r) + d] = __float2bfloat16(acc * (sum > 0.0f ? 1.0f / sum : 0.0f));
    }
    cluster.sync();  // no block exits while another still reads its shared memory
    return;
  }

  // One chunk: the final output. Several: this chunk's partial results for the combine.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    if (r >= rows) continue;
    if (chunks.count == 1) {
      const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
      bf16* out = a.out + row_offset(r) + warp_dim + 2 * t;
#pragma unroll
      for (int c = 0; c < kWarpDims / 8; ++c)
        *reinterpret_cast<__nv_bfloat162*>(out + 8 * c) =
            __floats2bfloat162_rn(o[c][2 * h] * inv, o[c][2 * h + 1] * inv);
    } else {
      const Workspace ws(a);
      const int64_t row = row_offset(r) / D * a.decode_splits + split;  // (token row, head)
      float* po = ws.o + row * D + warp_dim + 2 * t;
#pragma unroll
      for (int c = 0; c < kWarpDims / 8; ++c)
        *reinterpret_cast<float2*>(po + 8 * c) = make_float2(o[c][2 * h], o[c][2 * h + 1]);
      if (warp == 0 && t == 0) {
        ws.m[row] = m[h];
        ws.l[row] = l[h];
      }
    }
  }
}

// Merges the chunks of one (sequence, query, head): out = sum_s w_s o_s / sum_s w_s l_s
// with w_s = 2^(m_s - max m). Rows of one chunk or none were written by DecodeKernel.
// A split the row sees nothing of has m_s = -inf, so w_s = 0; every row sees its own key.
// The kernel is all latency at decode sizes: it reads the chunks' m, l and partial outputs
// in one round trip (up to kCombineBatch chunks; more take one trip per batch), where a
// loop of dependent loads took one per chunk.
constexpr int kCombineBatch = 16;
template <int D>
__global__ void __launch_bounds__(kCombineThreads) CombineKernel(AttentionArgs a) {
  constexpr int kPerThread = (D + kCombineThreads - 1) / kCombineThreads;
  WaitForPriorGrid();      // DecodeKernel's partial results
  AllowDependentLaunch();  // o_proj follows: its weight loads may start
  const int head = blockIdx.x, seq = blockIdx.y / a.max_q_len, query = blockIdx.y % a.max_q_len;
  const int q_start = a.seq_info[seq * 4], q_len = a.seq_info[seq * 4 + 1];
  const int ctx_len = a.seq_info[seq * 4 + 2];
  const Chunks chunks = SplitKeys(ctx_len, q_len, TreeBaseOr(a, seq, -1), a.sliding_window, a.decode_splits, Tile<D>());
  if (query >= q_len || chunks.count <= 1) return;
  const Workspace ws(a);
  const int64_t token_head = int64_t(q_start + query) * a.num_heads + head;
  const int64_t row0 = token_head * a.decode_splits;
  __shared__ float m_s[kMaxSplits], l_s[kMaxSplits];
  if (threadIdx.x < chunks.count) {
    m_s[threadIdx.x] = ws.m[row0 + threadIdx.x];
    l_s[threadIdx.x] = ws.l[row0 + threadIdx.x];
  }
  float part[kCombineBatch][kPerThread];  // a batch of chunks' partial outputs
  const auto load_batch = [&](int base) {
#pragma unroll
    for (int s = 0; s < kCombineBatch; ++s)
#pragma unroll
      for (int p = 0; p < kPerThread; ++p) {
        const int d = threadIdx.x + p * kCombineThreads;
        part[s][p] = base + s < chunks.count && d < D ? ws.o[(row0 + base + s) * D + d] : 0.0f;
      }
  };
  load_batch(0);  // in flight with the m and l loads
  __syncthreads();
  float mx = -INFINITY;
  for (int s = 0; s < chunks.count; ++s) mx = fmaxf(mx, m_s[s]);
  float sum = 0.0f, acc[kPerThread] = {};
  for (int base = 0; base < chunks.count; base += kCombineBatch) {
    if (base > 0) load_batch(base);
#pragma unroll
    for (int s = 0; s < kCombineBatch; ++s) {
      if (base + s >= chunks.count) break;
      const float weight = exp2f(m_s[base + s] - mx);
      sum += weight * l_s[base + s];
#pragma unroll
      for (int p = 0; p < kPerThread; ++p) acc[p] += weight * part[s][p];
    }
  }
  const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
  bf16* out = a.out + token_head * D;
#pragma unroll
  for (int p = 0; p < kPerThread; ++p) {
    const int d = threadIdx.x + p * kCombineThreads;
    if (d < D) out[d] = __float2bfloat16(acc[p] * inv_sum);
  }
}

// DecodeKernel<D, true>'s launch configuration for clusters of `splits` blocks (its
// attributes set on the current device first).
template <int D>
struct ClusterLaunch {
  cudaLaunchAttribute attributes[2];
  cudaLaunchConfig_t config = {};
  ClusterLaunch(dim3 grid, int splits, bool programmatic, cudaStream_t stream) {
    AllowDynamicSharedMemory<DecodeKernel<D, true>>(SharedBytes<D>());
    SetKernelAttributeOncePerDevice<DecodeKernel<D, true>, cudaFuncAttributeNonPortableClusterSizeAllowed>(1);
    attributes[0].id = cudaLaunchAttributeClusterDimension;
    attributes[0].val.clusterDim.x = splits;
    attributes[0].val.clusterDim.y = 1;
    attributes[0].val.clusterDim.z = 1;
    attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[1].val.programmaticStreamSerializationAllowed = 1;
    config.gridDim = grid;
    config.blockDim = dim3(32 * Warps<D>());
    config.dynamicSmemBytes = SharedBytes<D>();
    config.stream = stream;
    config.attrs = attributes;
    config.numAttrs = programmatic ? 2 : 1;
  }
};

template <int D>
int ClusterCapacity() {
  constexpr int kSize = MaxClusterSplits(D);
  ClusterLaunch<D> launch(dim3(kSize), kSize, false, nullptr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, DecodeKernel<D, true>, &launch.config) != cudaSuccess) {
    cudaGetLastError();  // clear it: the device cannot hold such a cluster
    return 0;
  }
  return clusters;
}

template <int D>
void Launch(const AttentionArgs& a, cudaStream_t stream) {
  constexpr size_t kSmem = SharedBytes<D>();
  const int group = a.num_heads / a.kv_heads;
  const dim3 grid(a.decode_splits, a.kv_heads * RowTiles(a.max_q_len, group), a.num_seqs);
  const dim3 block(32 * Warps<D>());
  if (a.decode_cluster_merge && a.decode_splits > 1) {
    ClusterLaunch<D> launch(grid, a.decode_splits, a.programmatic, stream);
    cudaLaunchKernelEx(&launch.config, DecodeKernel<D, true>, a);
    return;
  }
  AllowDynamicSharedMemory<DecodeKernel<D, false>>(kSmem);
  LaunchMaybeProgrammatic(DecodeKernel<D, false>, grid, block, kSmem, a.programmatic, stream, a);
  if (a.decode_splits > 1)
    LaunchMaybeProgrammatic(CombineKernel<D>, dim3(a.num_heads, a.num_seqs * a.max_q_len), dim3(kCombineThreads), 0,
                            a.programmatic, stream, a);
}

// Calls f(std::integral_constant<int, D>) for the supported head dim D = head_dim; false
// (no call) for any other.
template <typename F>
bool WithHeadDim(int head_dim, F&& f) {
  switch (head_dim) {
    case 16: f(std::integral_constant<int, 16>{}); return true;
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    case 256: f(std::integral_constant<int, 256>{}); return true;
    case 512: f(std::integral_constant<int, 512>{}); return true;
    default: return false;
  }
}

}  // namespace

int DecodeClusterCapacity(int head_dim) {
  int clusters = 0;
  WithHeadDim(head_dim, [&](auto d) { clusters = ClusterCapacity<d()>(); });
  return clusters;
}

DecodeSplits PlanDecodeSplits(int num_seqs, int max_q_len, int num_heads, int kv_heads, int head_dim, int sm_count,
                              int cluster_capacity) {
  // As many chunks as keep the blocks within one wave of two per SM (DecodeKernel<128>'s
  // shared memory allows two): rounding up put batch 32's 256 blocks of Qwen3-8B into 512,
  // two waves and a merge where one wave needs none. More only cut chunks shorter.
  const int64_t blocks = int64_t(num_seqs) * kv_heads * RowTiles(max_q_len, num_heads / kv_heads);
  if (blocks <= 0) return {1, false, true};
  // Fused inputs, measured on the Qwen3-8B shape (nvidia-h200, one call, three rounds):
  // batch 1 and 32 (one wave) decoded 0.8% and 1.5% faster, batch 128 (four waves) 0.8%
  // slower.
  const bool fused_inputs = blocks <= 2 * int64_t(sm_count);
  const int splits = int(std::clamp<int64_t>(2 * int64_t(sm_count) / blocks, 1, kMaxSplits));
  // Merged in clusters while their blocks are at most one an SM. Measured on the Qwen3-8B
  // shape (nvidia-h200, one call, two rounds): batch 1, 8 clusters of 16, decoded 215.1 /
  // 214.5 tok/s against 210.6 / 211.6 with the merge kernel; batch 4, 32 clusters of 8
  // (256 blocks), 788 / 791 against 816 / 821, so more blocks keep the merge kernel.
  // And only if the device holds every cluster at once.
  const int cluster_splits = std::min(splits, MaxClusterSplits(head_dim));
  if (cluster_splits > 1 && blocks * cluster_splits <= sm_count && blocks <= cluster_capacity)
    return {cluster_splits, true, fused_inputs};
  return {splits, false, fused_inputs};
}

size_t DecodeAttentionWorkspaceBytes(int num_seqs, int max_q_len, int num_heads, int head_dim, int splits,
                                     bool cluster_merge) {
  if (splits <= 1 || cluster_merge) return 0;
  return size_t(num_seqs) * max_q_len * num_heads * splits * (head_dim + 2) * sizeof(float);
}

bool AttentionDecode(const AttentionArgs& a, cudaStream_t stream) {
  const int most = a.decode_cluster_merge ? MaxClusterSplits(a.head_dim) : kMaxSplits;
  if (a.decode_splits < 1 || a.decode_splits > most || a.max_q_len > kDecodeMaxQueryRows) return false;
  return WithHeadDim(a.head_dim, [&](auto d) { Launch<d()>(a, stream); });
}

}  // namespace hsx::cuda
