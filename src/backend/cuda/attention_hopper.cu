// Causal variable-length attention over the paged KV cache for head dim 128 on Hopper,
// with warpgroup MMAs (wgmma): FlashAttention-2's online softmax, but each warpgroup
// multiplies 64 query rows against a whole 128-key tile that the tensor cores read
// straight from shared memory, instead of every warp reloading K and V through ldmatrix
// for its own 16 rows (the shared-memory bandwidth that bounds RegisterKernel).
//
// A block is two warpgroups, 128 query rows: the query heads of one KV group for
// 128 / group consecutive tokens, so each K/V tile is loaded once for all of them. K and
// V tiles stream through two cp.async stages; S = Q K^T reads Q and K from shared memory,
// the probabilities stay in registers as the A operand of O += P V.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/dynamic_shared_memory.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/online_softmax.cuh"
#include "backend/cuda/wgmma.cuh"

namespace hsx::cuda {
namespace {

constexpr int kD = 128;
constexpr int kRows = 128;  // query rows per block: two warpgroups of 64
constexpr int kKeys = 128;  // keys per tile
constexpr int kThreads = 256;
constexpr int kHalf = 64;  // a 128-byte swizzled row holds 64 of a row's 128 values
constexpr int kChunks = kD / 8;  // 16-byte chunks per row
// Q, K and V tiles share one layout, [2 halves of D][128 rows][64] with 128-byte
// swizzling (wgmma.cuh): 32 KB each.
constexpr int kTileElems = 128 * kD;
constexpr uint32_t kHalfBytes = 128 * kHalf * 2;
constexpr uint32_t kGroupBytes = 8 * kHalf * 2;  // 8 swizzled rows
constexpr size_t kSmemBytes = 1024                             // slack to align tiles to 1024 bytes
                              + 5 * size_t(kTileElems) * 2     // Q, then two stages of K and V
                              + 2 * kKeys * sizeof(int64_t);  // cache row offsets per stage

// Which block does what, passed by value (kernel parameter space): every block has real
// work, sequences with the longest context first, each from its last rows back, so the
// longest blocks start first and the kernel's tail is short.
struct Schedule {
  static constexpr int kMaxSeqs = 1024;
  int num_seqs;
  int seq[kMaxSeqs];             // sequences in the order their row blocks run
  int first_block[kMaxSeqs + 1];  // prefix sums of row blocks (of 128 / group tokens)
};

// Element offset of 16-byte chunk c of row r in a swizzled tile.
__device__ __forceinline__ int Swizzled(int r, int c) {
  return (c / 8) * (128 * kHalf) + r * kHalf + ((c % 8) ^ (r % 8)) * 8;
}

__global__ void __launch_bounds__(kThreads, 1) HopperKernel(AttentionArgs a, const __grid_constant__ Schedule sched) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ unsigned char smem_raw[];
  // Swizzling repeats every 1024 bytes of shared address space; tiles start on it.
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) % 1024;
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw + (1024 - misalign) % 1024);
  bf16* kv_s = q_s + kTileElems;  // stage s: K at kv_s + 2 s kTileElems, V after it
  int64_t* row_offset_s = reinterpret_cast<int64_t*>(kv_s + 4 * kTileElems);  // [2][kKeys]

  const int group = a.num_heads / a.kv_heads, tokens = kRows / group;
  const int item = blockIdx.x / a.kv_heads, kvh = blockIdx.x % a.kv_heads;
  int lo = 0, hi = sched.num_seqs - 1;  // the last i with first_block[i] <= item
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (sched.first_block[mid] <= item) lo = mid; else hi = mid - 1;
  }
  const int seq = sched.seq[lo];
  const int q_start = a.seq_info[seq * 4], q_len = a.seq_info[seq * 4 + 1];
  const int ctx_len = a.seq_info[seq * 4 + 2], table_offset = a.seq_info[seq * 4 + 3];
  const int q0 = (sched.first_block[lo + 1] - 1 - item) * tokens;
  const int valid_rows = min(tokens, q_len - q0) * group;
  const int first_pos = ctx_len - q_len + q0;
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int r0 = wg * 64 + (tid % 128) / 32 * 16 + g;  // this thread's rows: r0 and r0 + 8

  // Row r is token q0 + r / group, query head kvh * group + r % group.
  const bf16* q_base = a.q + (int64_t(q_start + q0) * a.num_heads + kvh * group) * kD;
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = r < valid_rows;
    const bf16* src = q_base + int64_t(r / group) * a.num_heads * kD + (r % group) * kD + c * 8;
    CopyAsync16(q_s + Swizzled(r, c), valid ? src : a.q, valid);
  }
  CommitAsync();

  const int window = a.sliding_window;
  int key_begin = window > 0 ? max(0, first_pos - window + 1) : 0;
  if (a.batch_invariant) key_begin -= key_begin % kKeys;  // tiles at fixed key positions
  const int key_end = first_pos + valid_rows / group;
  const int32_t* table = a.block_tables + table_offset;
  const int num_tiles = (key_end - key_begin + kKeys - 1) / kKeys;

  auto tile_offsets = [&](int tile) {
    const int kt = key_begin + tile * kKeys;
    // Both warpgroups compute (and store) the same 128 offsets: no divergent path, which
    // would make ptxas serialize the wgmma around it (C7518).
    const int r = tid % kKeys;
    const int p = min(kt + r, key_end - 1);
    const int64_t slot = int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size;
    row_offset_s[(tile & 1) * kKeys + r] = (slot * a.kv_heads + kvh) * kD;
  };
  auto tile_issue = [&](int tile) {
    const int valid = min(kKeys, key_end - key_begin - tile * kKeys);
    bf16* k_dst = kv_s + (tile & 1) * 2 * kTileElems;
    bf16* v_dst = k_dst + kTileElems;
    for (int i = tid; i < kKeys * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int64_t off = row_offset_s[(tile & 1) * kKeys + r] + c * 8;
      CopyAsync16(k_dst + Swizzled(r, c), a.k_cache + off, r < valid);
      CopyAsync16(v_dst + Swizzled(r, c), a.v_cache + off, r < valid);
    }
    CommitAsync();
  };

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows r0, r0 + 8 (log2 units)
  const int pos[2] = {first_pos + r0 / group, first_pos + (r0 + 8) / group};
  // The warpgroup's rows, for skipping tiles none of them can see.
  const bool wg_live = wg * 64 < valid_rows;
  const int wg_pos_lo = first_pos + wg * 64 / group;
  const int wg_pos_hi = first_pos + (min(wg * 64 + 63, valid_rows - 1)) / group;
  const float scale_log2 = a.scale * kLog2e;
  const bool softcap = a.softcap > 0.0f;

  // Pipeline: tile j + 1 streams in while tile j is multiplied, and the cache offsets of
  // tile j + 2 are looked up while S_j multiplies (block-table reads are slow loads).
  tile_offsets(0);
  __syncthreads();
  tile_issue(0);
  if (num_tiles > 1) tile_offsets(1);
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int kt = key_begin + tile * kKeys;
    const bool has_next = tile + 1 < num_tiles;
    __syncthreads();  // tile + 1's offsets visible; both warpgroups done with its stage
    if (has_next) {
      tile_issue(tile + 1);
      WaitAsync<1>();
    } else {
      WaitAsync<0>();
    }
    wgmma::FenceSharedForAsyncProxy();
    __syncthreads();  // Q (first time) and this tile's K and V have landed
    const bf16* k_s = kv_s + (tile & 1) * 2 * kTileElems;
    const bf16* v_s = k_s + kTileElems;
    // Warpgroups skip tiles none of their rows can see (past the diagonal, before the window).
    const bool live = wg_live && kt <= wg_pos_hi && !(window > 0 && kt + kKeys - 1 <= wg_pos_lo - window);

    // Tile + 2's offsets are looked up while S multiplies (its stage's offsets were used
    // before the last barrier); a skipped tile looks them up at once.
    if (!live) {
      if (tile + 2 < num_tiles) tile_offsets(tile + 2);
      continue;
    }

    // S = Q K^T over D in steps of 16: 32 bytes along a swizzled row, then the next half.
    float s[64];
    wgmma::Fence();
#pragma unroll
    for (int k = 0; k < kD / 16; ++k) {
      const int col = (k / 4) * (128 * kHalf) + (k % 4) * 16;
      wgmma::MmaSharedA(s, wgmma::Descriptor(q_s + wg * 64 * kHalf + col, 16, kGroupBytes),
                        wgmma::Descriptor(k_s + col, 16, kGroupBytes), k > 0);
    }
    wgmma::Commit();
    if (tile + 2 < num_tiles) tile_offsets(tile + 2);
    wgmma::WaitAll();
    wgmma::PinRegisters(s);

    // Online softmax (base 2); a row's 128 scores are spread over one quad of lanes.
    const bool masked = kt + kKeys - 1 > wg_pos_lo || (window > 0 && kt <= wg_pos_hi - window);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int h = (i % 4) / 2;
      float v = softcap ? a.softcap * tanhf(s[i] * a.scale / a.softcap) * kLog2e : s[i] * scale_log2;
      if (masked) {
        const int p = kt + 8 * (i / 4) + 2 * t + (i & 1);
        if (p > pos[h] || (window > 0 && pos[h] - p >= window)) v = -INFINITY;
      }
      s[i] = v;
      mx[h] = fmaxf(mx[h], v);
    }
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float alpha = OnlineSoftmaxStep(mx[h], m[h], l[h], base[h]);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o[4 * j + 2 * h] *= alpha;
        o[4 * j + 2 * h + 1] *= alpha;
      }
    }
    // P goes from the accumulator layout straight into A fragments (keys 16k..16k+15);
    // row sums add the bf16-rounded values the PV product uses.
    uint32_t p[kKeys / 16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_bfloat162 e =
            __floats2bfloat162_rn(Exp2(s[4 * j + 2 * h] - base[h]), Exp2(s[4 * j + 2 * h + 1] - base[h]));
        l[h] += __low2float(e) + __high2float(e);
        p[j / 2][2 * (j % 2) + h] = *reinterpret_cast<const uint32_t*>(&e);
      }
    }

    // O += P V over the tile's keys in steps of 16 (two groups of 8 swizzled rows); V is
    // MN-major here: D runs along its rows, the other half of D is a half-tile away.
    wgmma::Fence();
#pragma unroll
    for (int k = 0; k < kKeys / 16; ++k)
      wgmma::MmaRegisterA(o, p[k], wgmma::Descriptor(v_s + k * 16 * kHalf, kHalfBytes, kGroupBytes), 1);
    wgmma::Commit();
    wgmma::WaitAll();
    wgmma::PinRegisters(o);
  }

  if (!wg_live) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
    const int r = r0 + 8 * h;
    if (r >= valid_rows) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    bf16* out = a.out + (int64_t(q_start + q0 + r / group) * a.num_heads + kvh * group + r % group) * kD + 2 * t;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = __floats2bfloat162_rn(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
  }
#else
  __trap();  // built only for sm_90a; AttentionHopper is called on Hopper devices only
#endif
}

}  // namespace

bool AttentionHopper(const AttentionArgs& a, cudaStream_t stream) {
  const int group = a.num_heads / a.kv_heads;
  if (a.head_dim != kD || kRows % group != 0) return false;
  AllowDynamicSharedMemory<HopperKernel>(kSmemBytes);
  if (a.host_seq_info == nullptr) return false;
  const int tokens = kRows / group;
  const int32_t* info = a.host_seq_info;
  // One launch per kMaxSeqs sequences (the schedule is a kernel parameter), so that a
  // sequence runs on this kernel however many others share its step.
  for (int first = 0; first < a.num_seqs; first += Schedule::kMaxSeqs) {
    Schedule sched;
    sched.num_seqs = std::min(Schedule::kMaxSeqs, a.num_seqs - first);
    for (int i = 0; i < sched.num_seqs; ++i) sched.seq[i] = first + i;
    std::stable_sort(sched.seq, sched.seq + sched.num_seqs,
                     [&](int x, int y) { return info[x * 4 + 2] > info[y * 4 + 2]; });
    sched.first_block[0] = 0;
    for (int i = 0; i < sched.num_seqs; ++i)
      sched.first_block[i + 1] = sched.first_block[i] + (info[sched.seq[i] * 4 + 1] + tokens - 1) / tokens;
    const int blocks = sched.first_block[sched.num_seqs] * a.kv_heads;
    if (blocks > 0) HopperKernel<<<blocks, kThreads, kSmemBytes, stream>>>(a, sched);
  }
  return true;
}

}  // namespace hsx::cuda
