// Batch-sized Linear: y[m, n] = x[m, k] w[n, k]^T for kGemvMaxRows < m <= kSkinnyGemmMaxRows,
// on tensor cores, aiming at the weight-streaming bound: cuBLASLt's tiles are shaped for
// large m and, at these m, leave Qwen3-8B's decode at 0.5-0.6 of it (issue 10).
//
// The weight is the MMA's A operand (m16n8k16: n maps to the 16 MMA rows, the batch to the
// 8 columns), so a block owns 128 or 256 weight rows (TileN) and the whole batch, padded
// inside the kernel to MP rows (zeros past m: x is never read past its rows, y never
// written past them). Weight and x tiles of kTileK columns stream through a 4-stage
// cp.async pipeline into XOR-swizzled shared memory (conflict-free ldmatrix), so every
// weight byte is read from HBM once, in 16-byte copies, with three stages in flight.
// Each warp computes 32 weight rows by half the batch.
// Small n leaves too few blocks for 132 SMs, so k is split (SkinnyGemmSplits): the blocks
// of one weight tile's k slices form a thread-block cluster, each leaves its f32 partial
// tile in its shared memory, and after a cluster barrier each block sums a share of the
// tile over the cluster's shared memory in split order. No atomics and no workspace: the
// result depends on the shapes alone, never on timing, and the launch (grid, cluster,
// shared memory) is a function of m, n, k and the SM count, so a CUDA graph can hold it.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/dynamic_shared_memory.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.cuh"

namespace hsx::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kTileK = 64;              // columns per pipeline stage: 128-byte rows
constexpr int kChunks = kTileK / 8;     // 16-byte chunks per tile row
constexpr int kStages = 4;
constexpr int kWarpRows = 32;           // weight rows per warp: two 16-row A fragments
constexpr int kWarpsM = 2;              // warps over the batch
constexpr int kMaxSplits = 8;           // the portable cluster size
constexpr int kMinTilesPerSplit = 4;    // k columns per split: at least 4 stages' worth

// The batch padded to MP rows: a multiple of 16 (two warps of n8 MMA tiles).
constexpr int PaddedRows(int64_t m) {
  return m <= 16 ? 16 : m <= 32 ? 32 : m <= 48 ? 48 : m <= 64 ? 64 : m <= 96 ? 96 : 128;
}
// Weight rows per block. Every block reads the whole x tile of each stage from L2 beside
// its weight tile, and L2 has little bandwidth to spare beyond HBM's stream: from 64 batch
// rows on, blocks take 256 weight rows (16 warps, one block per SM), halving that traffic.
constexpr int TileN(int mp) { return mp >= 64 ? 256 : 128; }
constexpr int Threads(int mp) { return TileN(mp) / kWarpRows * kWarpsM * 32; }
// f32 stride of the partial tile's rows; spreads a C fragment's stores over all banks.
constexpr int PartialStride(int mp) { return TileN(mp) + 4; }
constexpr size_t SharedBytes(int mp) {
  return std::max(size_t{kStages} * size_t(TileN(mp) + mp) * kTileK * sizeof(bf16),
                  size_t(mp) * PartialStride(mp) * sizeof(float));
}

// Element offset of chunk c of row r in a tile: chunks XOR-swizzled by the row, so the 8
// rows an ldmatrix (or 8 threads' copies) touch at one chunk lie in different banks.
__device__ __forceinline__ int Swizzled(int r, int c) { return r * kTileK + ((c ^ (r & 7)) * 8); }

// Copies rows [row0, row0 + kRowsTile) of src [rows, k), chunks [chunk0, chunk0 + kChunks),
// into a swizzled tile with kThreads threads; zeros past the rows and past k.
template <int kRowsTile, int kThreads>
__device__ __forceinline__ void LoadTile(bf16* tile, const bf16* src, int64_t row0, int64_t rows, int64_t chunk0,
                                         int64_t k) {
  for (int i = threadIdx.x; i < kRowsTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t row = row0 + r, chunk = chunk0 + c;
    const bool valid = row < rows && chunk * 8 < k;
    CopyAsync16(tile + Swizzled(r, c), valid ? src + row * k + chunk * 8 : src, valid);
  }
}

// Grid (weight tiles, splits), clusters of (1, splits): block (t, s) multiplies weight rows
// [t * TileN, +TileN) by x over the s-th of `splits` equal runs of k tiles.
template <int MP, typename Out>
__global__ void __launch_bounds__(Threads(MP), TileN(MP) == 128 ? 2 : 1)
    SkinnyGemmKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, Out* __restrict__ y, int m, int64_t n,
                     int64_t k) {
  static_assert(MP % (kWarpsM * 8) == 0 && MP <= kSkinnyGemmMaxRows);
  constexpr int kTileN = TileN(MP), kThreads = Threads(MP), kWarpsN = kTileN / kWarpRows;
  constexpr int kPartialStride = PartialStride(MP);
  constexpr int kWarpCols = MP / kWarpsM;  // batch rows per warp
  constexpr int kTilesM = kWarpCols / 8;   // n8 MMA tiles per warp
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* w_tiles = reinterpret_cast<bf16*>(smem);   // [kStages][kTileN * kTileK]
  bf16* x_tiles = w_tiles + kStages * kTileN * kTileK;  // [kStages][MP * kTileK]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warp_n = warp % kWarpsN, warp_m = warp / kWarpsN;
  const int64_t row0 = int64_t(blockIdx.x) * kTileN;
  const int splits = int(gridDim.y), split = int(blockIdx.y);
  const int64_t k_tiles = (k + kTileK - 1) / kTileK;
  const int64_t first = k_tiles * split / splits;
  const int count = int(k_tiles * (split + 1) / splits - first);
  const auto load = [&](int i) {
    const int stage = i % kStages;
    const int64_t chunk0 = (first + i) * kChunks;
    LoadTile<kTileN, kThreads>(w_tiles + stage * kTileN * kTileK, w, row0, n, chunk0, k);
    LoadTile<MP, kThreads>(x_tiles + stage * MP * kTileK, x, 0, m, chunk0, k);
  };

  float acc[2][kTilesM][4] = {};
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < count) load(i);
    CommitAsync();  // empty groups too, so the wait below always counts kStages - 1
  }
  for (int i = 0; i < count; ++i) {
    WaitAsync<kStages - 2>();
    __syncthreads();  // tile i is in, and every warp is done with the stage refilled next
    if (i + kStages - 1 < count) load(i + kStages - 1);
    CommitAsync();
    const bf16* wt = w_tiles + (i % kStages) * kTileN * kTileK;
    const bf16* xt = x_tiles + (i % kStages) * MP * kTileK;
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int f = 0; f < 2; ++f)
        LoadMatrixX4(a[f], wt + Swizzled(warp_n * kWarpRows + f * 16 + lane % 16, kk * 2 + lane / 16));
      // B fragments: x rows are the MMA's columns, stored k-contiguous ("col"), so plain
      // ldmatrix yields them; one x4 covers two n8 tiles, an x2 the odd one.
      uint32_t b[kTilesM][2];
#pragma unroll
      for (int p = 0; p + 1 < kTilesM; p += 2) {
        const int q = lane / 8;
        uint32_t r[4];
        LoadMatrixX4(r, xt + Swizzled(warp_m * kWarpCols + (p + q / 2) * 8 + lane % 8, kk * 2 + q % 2));
        b[p][0] = r[0];
        b[p][1] = r[1];
        b[p + 1][0] = r[2];
        b[p + 1][1] = r[3];
      }
      if constexpr (kTilesM % 2 == 1) {
        constexpr int p = kTilesM - 1;
        uint32_t r[2];
        LoadMatrixX2(r, xt + Swizzled(warp_m * kWarpCols + p * 8 + lane % 8, kk * 2 + (lane / 8) % 2));
        b[p][0] = r[0];
        b[p][1] = r[1];
      }
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int p = 0; p < kTilesM; ++p) Mma(acc[f][p], a[f], b[p][0], b[p][1]);
    }
  }
  WaitAsync<0>();
  __syncthreads();  // the pipeline's memory becomes the partial tile

  // partial[j][r]: batch row j, weight row r of the tile. C fragment: c0, c1 at (row g,
  // columns 2t, 2t + 1), c2, c3 eight rows down.
  float* partial = reinterpret_cast<float*>(smem);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int f = 0; f < 2; ++f) {
#pragma unroll
    for (int p = 0; p < kTilesM; ++p) {
      const int r = warp_n * kWarpRows + f * 16 + g, j = warp_m * kWarpCols + p * 8 + 2 * t;
      partial[j * kPartialStride + r] = acc[f][p][0];
      partial[(j + 1) * kPartialStride + r] = acc[f][p][1];
      partial[j * kPartialStride + r + 8] = acc[f][p][2];
      partial[(j + 1) * kPartialStride + r + 8] = acc[f][p][3];
    }
  }
  // Each block of the cluster sums every split's partial, in split order, for its share of
  // the tile's real outputs (runs of kThreads consecutive elements, dealt out in turn).
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const float* parts[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) parts[s] = s < splits ? cluster.map_shared_rank(partial, s) : partial;
  for (int e = split * kThreads + int(threadIdx.x); e < m * kTileN; e += splits * kThreads) {
    const int j = e / kTileN, r = e % kTileN;
    if (row0 + r >= n) continue;
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      if (s < splits) sum += parts[s][j * kPartialStride + r];
    if constexpr (sizeof(Out) == sizeof(float))
      y[j * n + row0 + r] = sum;
    else
      y[j * n + row0 + r] = __float2bfloat16(sum);
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
}

template <int MP, typename Out>
void Launch(const bf16* x, const bf16* w, int m, int64_t n, int64_t k, void* y, int splits, cudaStream_t stream) {
  constexpr size_t bytes = SharedBytes(MP);
  AllowDynamicSharedMemory<SkinnyGemmKernel<MP, Out>>(bytes);
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 1;
  attribute.val.clusterDim.y = static_cast<unsigned>(splits);
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((n + TileN(MP) - 1) / TileN(MP)), static_cast<unsigned>(splits));
  config.blockDim = dim3(Threads(MP));
  config.dynamicSmemBytes = bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, SkinnyGemmKernel<MP, Out>, x, w, static_cast<Out*>(y), m, n, k);
}

template <int MP>
void LaunchFor(const bf16* x, const bf16* w, int m, int64_t n, int64_t k, void* y, bool y_f32, int splits,
               cudaStream_t stream) {
  if (y_f32)
    Launch<MP, float>(x, w, m, n, k, y, splits, stream);
  else
    Launch<MP, bf16>(x, w, m, n, k, y, splits, stream);
}

}  // namespace

bool SkinnyGemmSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m > kGemvMaxRows && m <= kSkinnyGemmMaxRows && k > 0 && k % 8 == 0 && aligned(x) && aligned(w);
}

int SkinnyGemmSplits(int64_t m, int64_t n, int64_t k, int sm_count) {
  const int tile_n = TileN(PaddedRows(m));
  const int64_t tiles = (n + tile_n - 1) / tile_n, k_tiles = (k + kTileK - 1) / kTileK;
  const int64_t sms = std::max(sm_count, 1);
  // The share of the last wave's SMs that work, with one block per SM.
  const auto busy = [&](int64_t blocks) { return double(blocks) / double((blocks + sms - 1) / sms * sms); };
  int best = 1;
  for (int s = 2; s <= kMaxSplits && k_tiles / s >= kMinTilesPerSplit; s *= 2)
    if (busy(tiles * s) > busy(tiles * best) + 0.02) best = s;
  return best;
}

void SkinnyGemm(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k, void* y, bool y_f32, int sm_count,
                cudaStream_t stream) {
  if (n <= 0) return;
  const int splits = SkinnyGemmSplits(m, n, k, sm_count), rows = static_cast<int>(m);
  switch (PaddedRows(m)) {
    case 16: return LaunchFor<16>(x, w, rows, n, k, y, y_f32, splits, stream);
    case 32: return LaunchFor<32>(x, w, rows, n, k, y, y_f32, splits, stream);
    case 48: return LaunchFor<48>(x, w, rows, n, k, y, y_f32, splits, stream);
    case 64: return LaunchFor<64>(x, w, rows, n, k, y, y_f32, splits, stream);
    case 96: return LaunchFor<96>(x, w, rows, n, k, y, y_f32, splits, stream);
    default: return LaunchFor<128>(x, w, rows, n, k, y, y_f32, splits, stream);
  }
}

}  // namespace hsx::cuda
