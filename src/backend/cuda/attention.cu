// Causal variable-length attention over a paged KV cache, flash style: each block owns
// 16 query rows per warp of one head of one sequence, walks the visible keys in tiles
// of 64, and keeps a running max and sum per row (online softmax). GQA, sliding windows
// and logit softcapping are handled in the softmax step, and so are token-tree masks
// (tree_mask.cuh): a tree sequence's tiles are masked key by key, and its tree keys that no
// row of the block sees load as zeros (their slots may hold anything: a draft's deeper
// nodes are not written yet, and 0 * NaN would reach P V).
//
// Two variants: for head dims up to 256 (RegisterKernel) scores, probabilities and the
// output accumulator stay in registers, with QK^T and PV as raw mma.sync m16n8k16 fed by
// ldmatrix (FlashAttention-2's scheme); head dim 512 (SharedKernel) keeps the output in
// shared memory and multiplies through WMMA, slower but within the register budget.
#include <mma.h>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/dynamic_shared_memory.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.cuh"
#include "backend/cuda/online_softmax.cuh"
#include "backend/cuda/query_key_scores.cuh"
#include "backend/cuda/tree_mask.cuh"

namespace hsx::cuda {
namespace {

using namespace nvcuda;

constexpr int kKeyTile = 64;

// Warps per block: fewer for wide heads so the tiles fit in shared memory.
template <int D>
__host__ __device__ constexpr int WarpsFor() {
  return D >= 512 ? 1 : (D >= 256 ? 2 : 4);
}

template <int D>
constexpr size_t SharedBytes() {
  constexpr int rows = 16 * WarpsFor<D>();
  return size_t(rows) * D * 2          // Q tile
         + 2 * size_t(kKeyTile) * D * 2  // K and V tiles
         + size_t(rows) * D * 4        // O accumulator
         + size_t(rows) * kKeyTile * 4  // scores
         + size_t(rows) * kKeyTile * 2  // probabilities
         + size_t(rows) * 2 * 4;       // running max and sum
}

// Copies `rows` rows of D bf16 (16-byte chunks) into shared memory, zeros past `valid`
// and where loads(r) is false; row_ptr(r) gives row r's address in global memory.
template <int D, class RowPtr, class Loads>
__device__ void LoadRows(bf16* dst, int rows, int valid, int threads, RowPtr row_ptr, Loads loads, int stride = D) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += threads) {
    const int r = i / kChunks, c = i % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid && loads(r)) v = reinterpret_cast<const uint4*>(row_ptr(r))[c];
    reinterpret_cast<uint4*>(dst + r * stride)[c] = v;
  }
}

// Query heads per block in RegisterKernel: up to 4 of a KV group.
__host__ __device__ constexpr int HeadsPerBlock(int group) { return group % 4 == 0 ? 4 : (group % 2 == 0 ? 2 : 1); }

// Warps per RegisterKernel block. 8 warps share each K/V tile among twice the query rows
// (halving the L2 traffic of re-reading K and V); registers allow one such block per SM,
// the same 8 warps as two blocks of 4. Head dim 256 needs every register for 4 warps.
template <int D>
__host__ __device__ constexpr int RegisterKernelWarps() {
  return D <= 128 ? 8 : 4;
}

template <int D>
constexpr size_t RegisterKernelSharedBytes() {
  // Q rows, then two stages of K and V tiles.
  return (size_t(16 * RegisterKernelWarps<D>()) + 4 * kKeyTile) * (D + 8) * 2;
}

template <int D>
__global__ void __launch_bounds__(32 * RegisterKernelWarps<D>()) RegisterKernel(AttentionArgs a) {
  constexpr int kWarps = RegisterKernelWarps<D>(), kThreads = 32 * kWarps;
  constexpr int kKeyBlocks = kKeyTile / 8, kDimBlocks = D / 8, kSteps = D / 16;
  // Rows padded by 16 bytes so the 8 rows an ldmatrix reads fall in distinct banks.
  constexpr int kLd = D + 8;
  // Q fragments stay in registers up to D = 128; wider heads reread them from shared
  // memory every tile so that the output accumulator still fits in registers.
  constexpr bool kQInRegisters = D <= 128;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* kv_s = q_s + kWarps * 16 * kLd;          // two stages of [K tile, V tile]
  __shared__ int64_t row_offset_s[2][kKeyTile];  // cache row offsets of each stage's keys

  // Query heads that share a KV head share a block, so each K/V tile is loaded once for
  // all of them: warp w takes head (w % heads_per_block) and row group (w / heads_per_block).
  const int group = a.num_heads / a.kv_heads, per_block = HeadsPerBlock(group);
  const int block_rows = 16 * (kWarps / per_block);
  const int seq = blockIdx.z, kvh = blockIdx.y / (group / per_block);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int head = kvh * group + (blockIdx.y % (group / per_block)) * per_block + warp % per_block;
  const int wr = (warp / per_block) * 16;  // this warp's first row within the block
  const int q_start = a.seq_info[seq * 4], q_len = a.seq_info[seq * 4 + 1];
  const int ctx_len = a.seq_info[seq * 4 + 2], table_offset = a.seq_info[seq * 4 + 3];
  // Blocks start with the last rows, which see the most keys, so the longest work is
  // dispatched first and the kernel's tail is short.
  const int q0 = (gridDim.x - 1 - blockIdx.x) * block_rows;
  if (q0 >= q_len) return;
  const int rows = min(block_rows, q_len - q0);
  const int first_pos = ctx_len - q_len + q0;

  bf16* q_w = q_s + warp * 16 * kLd;
  const bf16* q_base = a.q + (int64_t(q_start + q0 + wr) * a.num_heads + head) * D;
  for (int i = lane; i < 16 * (D / 8); i += 32) {
    const int r = i / (D / 8), c = i % (D / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (wr + r < rows) v = reinterpret_cast<const uint4*>(q_base + int64_t(r) * a.num_heads * D)[c];
    reinterpret_cast<uint4*>(q_w + r * kLd)[c] = v;
  }
  __syncwarp();
  // A-operand addresses: lanes 0-15 give rows 0-15 at column 0, lanes 16-31 at column 8.
  const bf16* q_lane = q_w + (lane % 16) * kLd + 8 * (lane / 16);
  uint32_t q_frag[kQInRegisters ? kSteps : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) LoadMatrixX4(q_frag[s], q_lane + 16 * s);
  }

  float o[kDimBlocks][4];
#pragma unroll
  for (int c = 0; c < kDimBlocks; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.0f;
  // Rows g and g + 8 of the warp: running max (log2 units) and this lane's partial sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  if (a.sinks != nullptr) {  // the sink's column: exp2(sink - m) = 1, counted by one lane of the quad
    m[0] = m[1] = a.sinks[head] * kLog2e;
    l[0] = l[1] = lane % 4 == 0 ? 1.0f : 0.0f;
  }

  const int window = a.sliding_window;
  // A tree's rows measure their windows from their logical positions, at least its base.
  const int tree_base = TreeBaseOr(a, seq, -1);
  const bool tree = tree_base >= 0;
  int key_begin = window > 0 ? max(0, (tree ? min(first_pos, tree_base) : first_pos) - window + 1) : 0;
  if (a.batch_invariant) key_begin -= key_begin % kKeyTile;  // tiles at fixed key positions
  const int key_end = first_pos + rows;
  const int32_t* table = a.block_tables + table_offset;
  const int num_tiles = (key_end - key_begin + kKeyTile - 1) / kKeyTile;
  const int pos_lo = first_pos + wr, pos_hi = pos_lo + 15;  // positions of this warp's rows
  const int window_lo = tree ? min(pos_lo, tree_base) : pos_lo;  // the earliest a row's window starts from
  const uint64_t block_keys = tree ? BlockTreeKeys(a, seq, tree_base, q_start + q0, first_pos, rows) : 0;
  RowSight sight[2];  // rows g and g + 8 of the warp
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = min(wr + g + 8 * h, rows - 1);  // a dead row borrows a live one's (never written)
    sight[h] = SightOf(a, seq, q_start + q0 + r, first_pos + wr + g + 8 * h);
  }
  const bool warp_live = wr < rows;
  const float scale_log2 = a.scale * kLog2e;
  const bool softcap = a.softcap > 0.0f;

  // Two-stage pipeline: while a tile is multiplied, the next one is in flight (cp.async).
  auto tile_offsets = [&](int tile) {
    const int stage = tile & 1, kt = key_begin + tile * kKeyTile;
    for (int r = threadIdx.x; r < kKeyTile; r += kThreads) {
      const int p = min(kt + r, key_end - 1);
      const int64_t slot = int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size;
      row_offset_s[stage][r] = (slot * a.kv_heads + kvh) * D;
    }
  };
  auto tile_issue = [&](int tile) {
    const int stage = tile & 1, valid = min(kKeyTile, key_end - key_begin - tile * kKeyTile);
    const int kt = key_begin + tile * kKeyTile;
    bf16* k_dst = kv_s + stage * 2 * kKeyTile * kLd;
    bf16* v_dst = k_dst + kKeyTile * kLd;
    constexpr int kChunks = D / 8;
    for (int i = threadIdx.x; i < kKeyTile * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int64_t off = row_offset_s[stage][r] + c * 8;
      const bool load = r < valid && LoadsKey(kt + r, tree_base, block_keys);
      CopyAsync16(k_dst + r * kLd + c * 8, a.k_cache + off, load);
      CopyAsync16(v_dst + r * kLd + c * 8, a.v_cache + off, load);
    }
    CommitAsync();
  };
  tile_offsets(0);
  __syncthreads();
  tile_issue(0);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int kt = key_begin + tile * kKeyTile;
    const bool has_next = tile + 1 < num_tiles;
    if (has_next) tile_offsets(tile + 1);
    __syncthreads();  // offsets visible; every warp is done with the stage about to be refilled
    if (has_next) {
      tile_issue(tile + 1);
      WaitAsync<1>();
    } else {
      WaitAsync<0>();
    }
    __syncthreads();  // this tile's K and V have landed
    // Skip tiles no row of this warp can see (past the diagonal, or before the window).
    if (!warp_live || kt > pos_hi || (window > 0 && kt + kKeyTile - 1 <= window_lo - window)) continue;
    const bf16* k_s = kv_s + (tile & 1) * 2 * kKeyTile * kLd;
    const bf16* v_s = k_s + kKeyTile * kLd;

    // S = Q K^T.
    float s[kKeyBlocks][4];
    QueryKeyScores<D, kKeyBlocks, kQInRegisters, kLd>(s, q_frag, q_lane, k_s, 0, lane);

    // Online softmax in registers (base 2); a row's 64 scores are spread over one quad.
    const bool masked = tree || kt + kKeyTile - 1 > pos_lo || (window > 0 && kt <= pos_hi - window);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeyBlocks; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v = softcap ? a.softcap * tanhf(s[j][i] * a.scale / a.softcap) * kLog2e : s[j][i] * scale_log2;
        if (masked && !sight[i / 2].Sees(kt + 8 * j + 2 * t + (i & 1))) v = -INFINITY;
        s[j][i] = v;
        mx[i / 2] = fmaxf(mx[i / 2], v);
      }
    }
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float alpha = OnlineSoftmaxStep(mx[h], m[h], l[h], base[h]);
#pragma unroll
      for (int c = 0; c < kDimBlocks; ++c) {
        o[c][2 * h] *= alpha;
        o[c][2 * h + 1] *= alpha;
      }
    }
    // P goes straight from the accumulator layout into A fragments (keys 16k..16k+15);
    // the row sums add the bf16-rounded values that the PV product uses.
    uint32_t p_frag[kKeyTile / 16][4];
#pragma unroll
    for (int j = 0; j < kKeyBlocks; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_bfloat162 e =
            __floats2bfloat162_rn(Exp2(s[j][2 * h] - base[h]), Exp2(s[j][2 * h + 1] - base[h]));
        l[h] += __low2float(e) + __high2float(e);
        p_frag[j / 2][2 * (j % 2) + h] = *reinterpret_cast<const uint32_t*>(&e);
      }
    }

    // O += P V: V rows are B's rows, so ldmatrix.trans gives B fragments.
#pragma unroll
    for (int k = 0; k < kKeyTile / 16; ++k) {
#pragma unroll
      for (int c = 0; c < D / 16; ++c) {
        uint32_t b[4];  // keys 16k.., dims 16c + {0, 8}
        LoadMatrixX4Trans(b, v_s + (16 * k + lane % 16) * kLd + 16 * c + 8 * (lane / 16));
        Mma(o[2 * c], p_frag[k], b[0], b[1]);
        Mma(o[2 * c + 1], p_frag[k], b[2], b[3]);
      }
    }
  }

  if (!warp_live) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
    const int r = wr + g + 8 * h;
    if (r >= rows) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    bf16* out = a.out + (int64_t(q_start + q0 + r) * a.num_heads + head) * D + 2 * t;
#pragma unroll
    for (int c = 0; c < kDimBlocks; ++c)
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * c) = __floats2bfloat162_rn(o[c][2 * h] * inv, o[c][2 * h + 1] * inv);
  }
}

template <int D>
__global__ void __launch_bounds__(32 * WarpsFor<D>()) SharedKernel(AttentionArgs a) {
  constexpr int kWarps = WarpsFor<D>(), kRows = 16 * kWarps, kThreads = 32 * kWarps;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = q_s + kRows * D;
  bf16* v_s = k_s + kKeyTile * D;
  float* o_s = reinterpret_cast<float*>(v_s + kKeyTile * D);
  float* s_s = o_s + kRows * D;
  bf16* p_s = reinterpret_cast<bf16*>(s_s + kRows * kKeyTile);
  float* m_s = reinterpret_cast<float*>(p_s + kRows * kKeyTile);
  float* l_s = m_s + kRows;

  const int seq = blockIdx.z, head = blockIdx.y;
  const int q_start = a.seq_info[seq * 4], q_len = a.seq_info[seq * 4 + 1];
  const int ctx_len = a.seq_info[seq * 4 + 2], table_offset = a.seq_info[seq * 4 + 3];
  const int q0 = blockIdx.x * kRows;
  if (q0 >= q_len) return;
  const int rows = min(kRows, q_len - q0);
  const int first_pos = ctx_len - q_len + q0;  // position of this block's first query
  const int kvh = head / (a.num_heads / a.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const bf16* q_base = a.q + (int64_t(q_start + q0) * a.num_heads + head) * D;
  LoadRows<D>(q_s, kRows, rows, kThreads, [&](int r) { return q_base + int64_t(r) * a.num_heads * D; },
              [](int) { return true; });
  for (int i = threadIdx.x; i < kRows * D; i += kThreads) o_s[i] = 0.0f;
  for (int i = threadIdx.x; i < kRows; i += kThreads) {  // a sink starts the sum at its own column
    m_s[i] = a.sinks != nullptr ? a.sinks[head] : -INFINITY;
    l_s[i] = a.sinks != nullptr ? 1.0f : 0.0f;
  }

  const int window = a.sliding_window;
  const int tree_base = TreeBaseOr(a, seq, -1);  // tree rows: windows from their logical positions
  int key_begin = window > 0 ? max(0, (tree_base >= 0 ? min(first_pos, tree_base) : first_pos) - window + 1) : 0;
  if (a.batch_invariant) key_begin -= key_begin % kKeyTile;  // tiles at fixed key positions
  const int key_end = first_pos + rows;  // exclusive: the last query's own position + 1
  const uint64_t block_keys = tree_base >= 0 ? BlockTreeKeys(a, seq, tree_base, q_start + q0, first_pos, rows) : 0;
  const int32_t* table = a.block_tables + table_offset;

  const int wr = warp * 16;  // this warp's first row in the tile
  float* s_w = s_s + wr * kKeyTile;
  bf16* p_w = p_s + wr * kKeyTile;
  float* o_w = o_s + wr * D;

  for (int kt = key_begin; kt < key_end; kt += kKeyTile) {
    __syncthreads();  // previous tile fully consumed
    const int valid = min(kKeyTile, key_end - kt);
    auto row_offset = [&](int r) {
      const int p = kt + r;
      const int64_t slot = int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size;
      return (slot * a.kv_heads + kvh) * D;
    };
    LoadRows<D>(k_s, kKeyTile, valid, kThreads, [&](int r) { return a.k_cache + row_offset(r); },
                [&](int r) { return LoadsKey(kt + r, tree_base, block_keys); });
    LoadRows<D>(v_s, kKeyTile, valid, kThreads, [&](int r) { return a.v_cache + row_offset(r); },
                [&](int r) { return LoadsKey(kt + r, tree_base, block_keys); });
    __syncthreads();

    // S = Q K^T for this warp's 16 rows.
    for (int n = 0; n < kKeyTile / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int d = 0; d < D / 16; ++d) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> kb;
        wmma::load_matrix_sync(qa, q_s + wr * D + d * 16, D);
        wmma::load_matrix_sync(kb, k_s + n * 16 * D + d * 16, D);
        wmma::mma_sync(acc, qa, kb, acc);
      }
      wmma::store_matrix_sync(s_w + n * 16, acc, kKeyTile, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax, one row at a time: lane j takes keys j and j + 32, so shared
    // memory accesses are consecutive across the warp (no bank conflicts).
    for (int r = 0; r < 16; ++r) {
      const bool live = wr + r < rows;
      const RowSight sight = SightOf(a, seq, q_start + q0 + min(wr + r, rows - 1), first_pos + wr + r);
      float s[2];
      float mx = -INFINITY;
      for (int h = 0; h < 2; ++h) {
        const int j = lane + 32 * h, p = kt + j;
        float v = s_w[r * kKeyTile + j] * a.scale;
        if (a.softcap > 0.0f) v = a.softcap * tanhf(v / a.softcap);
        const bool visible = live && sight.Sees(p);
        s[h] = visible ? v : -INFINITY;
        mx = fmaxf(mx, s[h]);
      }
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
      const float m_old = m_s[wr + r];
      const float m_new = fmaxf(m_old, mx);
      const float alpha = m_new == m_old ? 1.0f : __expf(m_old - m_new);  // as OnlineSoftmaxStep
      float sum = 0.0f;
      for (int h = 0; h < 2; ++h) {
        const float e = s[h] == -INFINITY ? 0.0f : __expf(s[h] - m_new);
        const bf16 eb = __float2bfloat16(e);
        p_w[r * kKeyTile + lane + 32 * h] = eb;
        sum += __bfloat162float(eb);
      }
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
      if (alpha != 1.0f)
        for (int c = lane; c < D; c += 32) o_w[r * D + c] *= alpha;
      if (lane == 0) {
        m_s[wr + r] = m_new;
        l_s[wr + r] = l_s[wr + r] * alpha + sum;
      }
    }
    __syncwarp();

    // O += P V for this warp's rows.
    for (int c = 0; c < D / 16; ++c) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + c * 16, D, wmma::mem_row_major);
      for (int k = 0; k < kKeyTile / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, p_w + k * 16, kKeyTile);
        wmma::load_matrix_sync(vb, v_s + k * 16 * D + c * 16, D);
        wmma::mma_sync(acc, pa, vb, acc);
      }
      wmma::store_matrix_sync(o_w + c * 16, acc, D, wmma::mem_row_major);
    }
  }
  __syncthreads();

  for (int i = threadIdx.x; i < rows * D; i += kThreads) {
    const int r = i / D, c = i % D;
    const float l = l_s[r];
    a.out[(int64_t(q_start + q0 + r) * a.num_heads + head) * D + c] = __float2bfloat16(l > 0.0f ? o_s[i] / l : 0.0f);
  }
}

template <int D>
void Launch(const AttentionArgs& a, cudaStream_t stream) {
  if constexpr (D <= 256) {
    constexpr size_t kSmem = RegisterKernelSharedBytes<D>();
    AllowDynamicSharedMemory<RegisterKernel<D>>(kSmem);
    constexpr int kWarps = RegisterKernelWarps<D>();
    const int group = a.num_heads / a.kv_heads, per_block = HeadsPerBlock(group);
    const int block_rows = 16 * (kWarps / per_block);
    const dim3 grid((a.max_q_len + block_rows - 1) / block_rows, a.kv_heads * (group / per_block), a.num_seqs);
    RegisterKernel<D><<<grid, 32 * kWarps, kSmem, stream>>>(a);
  } else {
    constexpr int kRows = 16 * WarpsFor<D>();
    constexpr size_t kSmem = SharedBytes<D>();
    AllowDynamicSharedMemory<SharedKernel<D>>(kSmem);
    const dim3 grid((a.max_q_len + kRows - 1) / kRows, a.num_heads, a.num_seqs);
    SharedKernel<D><<<grid, 32 * WarpsFor<D>(), kSmem, stream>>>(a);
  }
}

}  // namespace

bool Attention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.num_seqs == 0 || a.max_q_len == 0) return true;
  if (a.max_q_len <= kDecodeMaxQueryRows && a.decode_splits > 0) return AttentionDecode(a, stream);
  if (a.hopper && a.tree_base == nullptr && AttentionHopper(a, stream)) return true;
  switch (a.head_dim) {
    case 16: Launch<16>(a, stream); return true;
    case 32: Launch<32>(a, stream); return true;
    case 64: Launch<64>(a, stream); return true;
    case 128: Launch<128>(a, stream); return true;
    case 256: Launch<256>(a, stream); return true;
    case 512: Launch<512>(a, stream); return true;
    default: return false;
  }
}

}  // namespace hsx::cuda
