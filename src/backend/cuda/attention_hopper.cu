// Causal variable-length attention over the paged KV cache for head dims 128, 256 and 512 on Hopper,
// FlashAttention-3's way: warpgroup MMAs (wgmma) that read K and V straight from shared
// memory, a loader warp that fills that memory with TMA copies, and math warpgroups that
// compute one tile's softmax while the tensor cores still multiply.
//
// A block is three warpgroups and 128 query rows (64 at head dim 512; Shape below): the
// query heads of one KV group for rows / group consecutive tokens, so each K/V tile is
// loaded once for all of them:
// - warpgroup 0 loads: one warp copies each tile of K and of V (128 keys at head dim 128,
//   64 at 256, 32 at 512), a TMA box per cache block and 64 values of D (the block table
//   says where), into kStages stages guarded by barriers:
//   "full" completes when a stage's bytes have landed, "empty" when both math warpgroups
//   are done with it;
// - warpgroups 1 and 2 each own 64 query rows (at 512, half the output columns of the
//   block's 64). Per tile j a math warpgroup issues
//   S_j = Q K_j^T and O += P_{j-1} V_{j-1} together, then computes the softmax of S_j
//   while O's product still runs (P_{j-1} stays in registers as wgmma's A operand).
// Every math warpgroup takes every tile of its block, visible or not (a tile it cannot
// see is masked to zero weight), so both release every stage.
// Measured and not kept: FlashAttention-3's ping-pong (named barriers making the two
// math warpgroups take turns issuing) gained nothing here; loads by a cp.async warpgroup
// instead of TMA were 40% slower.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/dynamic_shared_memory.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/online_softmax.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace hsx::cuda {
namespace {

constexpr int kThreads = 3 * 128;
constexpr int kPart = 64;  // a 128-byte swizzled row holds 64 of a row's D values
constexpr uint32_t kGroupBytes = 8 * kPart * 2;  // 8 swizzled rows
constexpr int kMathWarps = 8;
// K/V tiles in flight: a third stage (all of shared memory) measured 2-3% slower.
constexpr int kStages = 2;
constexpr int kQueryBarrier = 1;  // named barrier 1 + w: math warpgroup w's Q has landed

// Sizes for head dim D. Q, K and V tiles share one layout, [D / 64 parts][rows][64] with
// 128-byte swizzling (wgmma.cuh), which TMA writes itself. A K or V tile is 32 KB: 128
// keys at D = 128, 64 at 256, 32 at 512. A math warpgroup holds at most 64 x 256 of the
// output (half its registers), so up to D = 256 a block has 128 query rows, 64 a
// warpgroup, and at D = 512 64 rows whose output columns the two warpgroups split (each
// computing the same scores: 1.5x the minimum of tensor-core work, all of it on wgmma).
template <int D>
struct Shape {
  static constexpr bool kRowSplit = D <= 256;  // math warpgroups split rows, else columns
  static constexpr int kRows = kRowSplit ? 128 : 64;  // query rows per block
  static constexpr int kKeys = 128 * 128 / D;  // keys per tile
  static constexpr int kChunks = D / 8;        // 16-byte chunks per row
  static constexpr int kQueryElems = kRows * D, kTileElems = kKeys * D;
  static constexpr int kOutColumns = kRowSplit ? D : D / 2;  // a math warpgroup's
  static constexpr uint32_t kTileBytes = kTileElems * 2;
  // Registers a thread of the loader and of the math warpgroups (128 x loader + 256 x math
  // <= 64K): D = 256's output accumulators need the most.
  static constexpr int kLoaderRegisters = D == 128 ? 56 : 40, kMathRegisters = D == 128 ? 224 : 232;
  static_assert(kOutColumns <= 256, "wgmma's widest N");
  static constexpr size_t kSmemBytes = 1024                                         // slack to align tiles to 1024 bytes
                                       + size_t(kQueryElems) * 2                    // Q
                                       + 2 * kStages * size_t(kTileBytes)           // the K and V stages
                                       + (4 * kStages + 1) * sizeof(uint64_t);      // full and empty per stage, the last V's fix-up
};

// Element offset of 16-byte chunk c of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ int Swizzled(int rows, int r, int c) {
  return (c / 8) * (rows * kPart) + r * kPart + ((c % 8) ^ (r % 8)) * 8;
}

// Which block does what, passed by value (kernel parameter space): every block has real
// work, sequences with the longest context first, each from its last rows back, so the
// longest blocks start first and the kernel's tail is short. The KV heads run in
// sections of heads_per_section, all of a section's blocks before the next section's,
// so that the K and V the running blocks stream (each from its first key on) stay in L2:
// with all 8 heads of a 16k-token context at once they would be 64 MB.
struct Schedule {
  static constexpr int kMaxSeqs = 1024;
  int num_seqs;
  int heads_per_section;  // divides kv_heads
  int seq[kMaxSeqs];             // sequences in the order their row blocks run
  int first_block[kMaxSeqs + 1];  // prefix sums of row blocks (of rows / group tokens)
};

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    HopperKernel(const __grid_constant__ AttentionArgs a, const __grid_constant__ Schedule sched,
                 const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr float kLog2e = 1.4426950408889634f;
  using S = Shape<D>;
  constexpr int kKeys = S::kKeys, kChunks = S::kChunks, kTileElems = S::kTileElems, kParts = D / kPart;
  constexpr int kRows = S::kRows;
  extern __shared__ unsigned char smem_raw[];
  // Swizzling repeats every 1024 bytes of shared address space; tiles start on it.
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) % 1024;
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw + (1024 - misalign) % 1024);
  bf16* k_s = q_s + S::kQueryElems;         // stage s at k_s + s kTileElems
  bf16* v_s = k_s + kStages * kTileElems;   // likewise
  uint64_t* full_k = reinterpret_cast<uint64_t*>(v_s + kStages * kTileElems);
  uint64_t* full_v = full_k + kStages;
  uint64_t* empty_k = full_v + kStages;
  uint64_t* empty_v = empty_k + kStages;
  uint64_t* last_v_ready = empty_v + kStages;  // the last tile's V with its rows past the keys zeroed

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::InitBarrier(&full_k[s], 1);
      tma::InitBarrier(&full_v[s], 1);
      tma::InitBarrier(&empty_k[s], kMathWarps);
      tma::InitBarrier(&empty_v[s], kMathWarps);
    }
    tma::InitBarrier(last_v_ready, 1);
    tma::FenceBarrierInit();
  }
  __syncthreads();

  const int group = a.num_heads / a.kv_heads, tokens = kRows / group;
  const int hps = sched.heads_per_section, section_blocks = sched.first_block[sched.num_seqs] * hps;
  const int within = blockIdx.x % section_blocks;
  const int item = within / hps, kvh = blockIdx.x / section_blocks * hps + within % hps;
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
  const int window = a.sliding_window;
  // Tiles start at multiples of kKeys (so at cache block boundaries, as TMA's boxes need,
  // and at the same keys whichever rows share the block: batch invariance).
  int key_begin = window > 0 ? max(0, first_pos - window + 1) : 0;
  key_begin -= key_begin % kKeys;
  const int key_end = first_pos + valid_rows / group;
  const int num_tiles = (key_end - key_begin + kKeys - 1) / kKeys;
  const int last_keys = key_end - key_begin - (num_tiles - 1) * kKeys;  // keys in the last tile

  if (wg == 0) {
    // The loader: lane b of warp 0 copies cache block b of each tile (its D / 64 parts).
    tma::ReleaseRegisters<S::kLoaderRegisters>();
    if (tid >= 32) return;
    const int32_t* table = a.block_tables + table_offset;
    const int bs = a.block_size, blocks_per_tile = kKeys / bs, last_block = (key_end - 1) / bs;
    auto block_slot = [&](int tile) {
      // Blocks past the keys repeat the last one: every box is a whole block of real
      // cache, and the bytes each stage expects never change.
      const int kt = key_begin + tile * kKeys;
      return lane < blocks_per_tile ? table[min(kt / bs + lane, last_block)] * bs : 0;
    };
    auto load = [&](bf16* stages, const CUtensorMap* map, uint64_t* empty, uint64_t* full, int tile, int slot) {
      const int s = tile % kStages;
      tma::Wait(&empty[s], ((tile / kStages) & 1) ^ 1);
      if (lane == 0) tma::ArriveExpectingBytes(&full[s], S::kTileBytes);
      __syncwarp();
      if (lane < blocks_per_tile)
        for (int part = 0; part < kParts; ++part)
          tma::Load3d(stages + s * kTileElems + part * kKeys * kPart + lane * bs * kPart, map, part * kPart, kvh, slot,
                      &full[s]);
    };
    // K runs a tile ahead of V: a tile's K is free again after its scores, its V only
    // after its P V, an iteration later, and the next tile's scores need only K.
    int slot = block_slot(0);
    load(k_s, &k_map, empty_k, full_k, 0, slot);
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int next_slot = tile + 1 < num_tiles ? block_slot(tile + 1) : 0;
      if (tile + 1 < num_tiles) load(k_s, &k_map, empty_k, full_k, tile + 1, next_slot);
      load(v_s, &v_map, empty_v, full_v, tile, slot);
      slot = next_slot;
    }
    // The last tile's rows past the keys hold whatever the cache has there, possibly not
    // finite, and a zero probability times NaN is NaN: zero those rows of V once landed.
    const int s = (num_tiles - 1) % kStages;
    tma::Wait(&full_v[s], ((num_tiles - 1) / kStages) & 1);
    uint4* v_last = reinterpret_cast<uint4*>(v_s + s * kTileElems);
    for (int i = lane; i < (kKeys - last_keys) * kChunks; i += 32) {
      const int r = last_keys + i / kChunks, c = i % kChunks;
      v_last[Swizzled(kKeys, r, c) / 8] = make_uint4(0, 0, 0, 0);
    }
    wgmma::FenceSharedForAsyncProxy();
    __syncwarp();
    if (lane == 0) tma::Arrive(last_v_ready);
    return;
  }

  tma::ClaimRegisters<S::kMathRegisters>();
  const int mw = wg - 1, mtid = tid - 128 * wg, g = lane / 4, t = lane % 4;
  const int row0 = S::kRowSplit ? mw * 64 : 0, col0 = S::kRowSplit ? 0 : mw * S::kOutColumns;  // this warpgroup's
  const int r0 = row0 + mtid / 32 * 16 + g;  // this thread's rows: r0 and r0 + 8

  // This warpgroup's 64 Q rows (at D = 512 both warpgroups' rows, each loading half).
  // Row r is token q0 + r / group, query head kvh * group + r % group.
  const bf16* q_base = a.q + (int64_t(q_start + q0) * a.num_heads + kvh * group) * D;
  constexpr int kQueryChunks = S::kRowSplit ? kChunks : kChunks / 2, kQueryThreads = S::kRowSplit ? 128 : 256;
  for (int i = mtid; i < 64 * kQueryChunks; i += 128) {
    const int r = row0 + i / kQueryChunks, c = (S::kRowSplit ? 0 : mw * kQueryChunks) + i % kQueryChunks;
    const bool valid = r < valid_rows;
    const bf16* src = q_base + int64_t(r / group) * a.num_heads * D + (r % group) * D + c * 8;
    CopyAsync16(q_s + Swizzled(kRows, r, c), valid ? src : a.q, valid);
  }
  CommitAsync();
  WaitAsync<0>();
  wgmma::FenceSharedForAsyncProxy();
  tma::SyncNamed(kQueryBarrier + (S::kRowSplit ? mw : 0), kQueryThreads);

  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) tma::Arrive(bar);
  };

  // Accumulators of a thread (wgmma.cuh's layout): O's rows r0 and r0 + 8 over D columns,
  // S's over the tile's keys.
  constexpr int kOut = S::kOutColumns / 2, kScores = kKeys / 2;
  float o[kOut];
#pragma unroll
  for (int i = 0; i < kOut; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows r0, r0 + 8 (log2 units)
  if (a.sinks != nullptr) {  // the sink's column: exp2(sink - m) = 1, counted by one lane of the quad
    m[0] = a.sinks[kvh * group + r0 % group] * kLog2e;
    m[1] = a.sinks[kvh * group + (r0 + 8) % group] * kLog2e;
    l[0] = l[1] = threadIdx.x % 4 == 0 ? 1.0f : 0.0f;
  }
  float alpha[2] = {1.0f, 1.0f};  // what O must be scaled by before the next P V
  const int pos[2] = {first_pos + r0 / group, first_pos + (r0 + 8) / group};
  const int wg_pos_lo = first_pos + row0 / group;
  const int wg_pos_hi = first_pos + (min(row0 + 63, max(valid_rows - 1, 0))) / group;
  const float scale_log2 = a.scale * kLog2e;
  const bool softcap = a.softcap > 0.0f;
  float s[kScores];
  uint32_t p[kKeys / 16][4];  // P of the tile before, as wgmma A fragments (keys 16k..16k+15)

  // S = Q K^T over D in steps of 16: 32 bytes along a swizzled row, then the next part.
  auto issue_scores = [&](int tile) {
    const bf16* k_tile = k_s + (tile % kStages) * kTileElems;
    wgmma::Fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      const int part = k / 4, col = (k % 4) * 16;
      wgmma::MmaSharedA(s, wgmma::Descriptor(q_s + part * kRows * kPart + row0 * kPart + col, 16, kGroupBytes),
                        wgmma::Descriptor(k_tile + part * kKeys * kPart + col, 16, kGroupBytes), k > 0);
    }
    wgmma::Commit();
  };
  // O = alpha O + P V over the tile's keys in steps of 16 (two groups of 8 swizzled
  // rows); V is MN-major here: D runs along its rows, each next 64 of D a part away.
  auto issue_values = [&](int tile) {
#pragma unroll
    for (int i = 0; i < kOut; ++i) o[i] *= alpha[(i % 4) / 2];
    const int st = tile % kStages;
    if (tile == num_tiles - 1) {
      tma::Wait(last_v_ready, 0);
    } else {
      tma::Wait(&full_v[st], (tile / kStages) & 1);
    }
    const bf16* v_tile = v_s + st * kTileElems + col0 / kPart * kKeys * kPart;  // this warpgroup's columns
    wgmma::Fence();
#pragma unroll
    for (int k = 0; k < kKeys / 16; ++k)
      wgmma::MmaRegisterA(o, p[k], wgmma::Descriptor(v_tile + k * 16 * kPart, kKeys * kPart * 2, kGroupBytes), 1);
    wgmma::Commit();
  };
  // The online softmax of S (base 2), leaving exp(S - max) in s; a row's scores are
  // spread over one quad of lanes.
  auto softmax = [&](int tile) {
    // Uniform branches around whole loops, and a mask without branches: per-score
    // branches would each cost a convergence region on all 64 scores of every tile.
    // Without softcap the scores stay unscaled until the exponent, where the scale and
    // the max fold into one FMA (the scale is positive: the max commutes with it).
    float factor = scale_log2;
    if (softcap) {
#pragma unroll
      for (int i = 0; i < kScores; ++i) s[i] = a.softcap * tanhf(s[i] * a.scale / a.softcap) * kLog2e;
      factor = 1.0f;
    }
    const int kt = key_begin + tile * kKeys;
    if (kt + kKeys - 1 > wg_pos_lo || (window > 0 && kt <= wg_pos_hi - window)) {
#pragma unroll
      for (int i = 0; i < kScores; ++i) {
        const int h = (i % 4) / 2, key = kt + 8 * (i / 4) + 2 * t + (i & 1);
        const bool hidden = (key > pos[h]) | ((window > 0) & (pos[h] - key >= window));
        s[i] = hidden ? -INFINITY : s[i];
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kScores; ++i) mx[(i % 4) / 2] = fmaxf(mx[(i % 4) / 2], s[i]);
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) alpha[h] = OnlineSoftmaxStep(mx[h] * factor, m[h], l[h], base[h]);
#pragma unroll
    for (int i = 0; i < kScores; ++i) s[i] = Exp2(fmaf(s[i], factor, -base[(i % 4) / 2]));
  };
  // P from the accumulator layout straight into A fragments; row sums add the
  // bf16-rounded values the P V product uses.
  auto to_probabilities = [&] {
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_bfloat162 e = __floats2bfloat162_rn(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
        l[h] += __low2float(e) + __high2float(e);
        p[j / 2][2 * (j % 2) + h] = *reinterpret_cast<const uint32_t*>(&e);
      }
    }
  };

  // Tile 0's scores alone; then per tile its scores with the tile before's P V; then the
  // last P V alone.
  tma::Wait(&full_k[0], 0);
  issue_scores(0);
  wgmma::WaitAll();
  wgmma::PinRegisters(s);
  release(&empty_k[0]);
  softmax(0);
  to_probabilities();
  for (int tile = 1; tile < num_tiles; ++tile) {
    tma::Wait(&full_k[tile % kStages], (tile / kStages) & 1);
      issue_scores(tile);
    issue_values(tile - 1);
      wgmma::WaitPending<1>();  // the scores; O's product may still run
    wgmma::PinRegisters(s);
    release(&empty_k[tile % kStages]);
    softmax(tile);
    wgmma::WaitAll();
    wgmma::PinRegisters(o);
    release(&empty_v[(tile - 1) % kStages]);
    to_probabilities();
  }
  issue_values(num_tiles - 1);
  wgmma::WaitAll();
  wgmma::PinRegisters(o);

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
    const int r = r0 + 8 * h;
    if (r >= valid_rows) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    bf16* out =
        a.out + (int64_t(q_start + q0 + r / group) * a.num_heads + kvh * group + r % group) * D + col0 + 2 * t;
#pragma unroll
    for (int j = 0; j < S::kOutColumns / 8; ++j)
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = __floats2bfloat162_rn(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
  }
#else
  __trap();  // built only for sm_90a; AttentionHopper is called on Hopper devices only
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point, so that hsx links no
// libcuda of its own; null if the driver lacks it.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled TensorMapEncoder() {
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return EncodeTiled{nullptr};
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encode;
}

// A cache [slots, kv_heads, head_dim] as TMA boxes of one cache block of one head's rows
// in parts of 64 values (128 bytes, swizzled) by `block_size` slots.
bool CacheTensorMap(const bf16* cache, int64_t slots, int kv_heads, int head_dim, int block_size, CUtensorMap* map) {
  const EncodeTiled encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(kv_heads), cuuint64_t(slots)};
  const cuuint64_t strides[2] = {head_dim * sizeof(bf16), cuuint64_t(kv_heads) * head_dim * sizeof(bf16)};
  const cuuint32_t box[3] = {kPart, 1, cuuint32_t(block_size)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(cache), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// KV heads a section of the schedule: as many as keep their K and V over the longest
// context within half the L2 (FlashAttention-3's scheduler keeps 32 MB of H100's 50), and a
// divisor of kv_heads, so every section has the same blocks.
int HeadsPerSection(const AttentionArgs& a, int max_context) {
  static const int64_t l2_bytes = [] {
    int device = 0, bytes = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device);
    return int64_t(bytes);
  }();
  const int64_t head_bytes = int64_t(max_context) * a.head_dim * 2 * sizeof(bf16);
  int heads = int(std::clamp<int64_t>(l2_bytes / 2 / std::max<int64_t>(head_bytes, 1), 1, a.kv_heads));
  while (a.kv_heads % heads != 0) --heads;
  return heads;
}

template <int D>
bool Launch(const AttentionArgs& a, cudaStream_t stream) {
  const int group = a.num_heads / a.kv_heads;
  constexpr int kRows = Shape<D>::kRows;
  if (kRows % group != 0 || a.host_seq_info == nullptr) return false;
  // A tile is whole cache blocks, each a box whose rows keep the swizzle's 8-row period.
  const int bs = a.block_size;
  if (bs < 8 || bs % 8 != 0 || Shape<D>::kKeys % bs != 0 || a.cache_slots <= 0 || a.cache_slots > INT32_MAX)
    return false;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(a.k_cache) || !aligned(a.v_cache)) return false;
  CUtensorMap k_map, v_map;
  if (!CacheTensorMap(a.k_cache, a.cache_slots, a.kv_heads, D, bs, &k_map) ||
      !CacheTensorMap(a.v_cache, a.cache_slots, a.kv_heads, D, bs, &v_map))
    return false;
  constexpr size_t kSmem = Shape<D>::kSmemBytes;
  AllowDynamicSharedMemory<HopperKernel<D>>(kSmem);
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
    sched.heads_per_section = HeadsPerSection(a, info[sched.seq[0] * 4 + 2]);
    const int blocks = sched.first_block[sched.num_seqs] * a.kv_heads;
    if (blocks > 0) HopperKernel<D><<<blocks, kThreads, kSmem, stream>>>(a, sched, k_map, v_map);
  }
  return true;
}

}  // namespace

bool AttentionHopper(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 128: return Launch<128>(a, stream);
    case 256: return Launch<256>(a, stream);
    case 512: return Launch<512>(a, stream);
    default: return false;
  }
}

}  // namespace hsx::cuda
