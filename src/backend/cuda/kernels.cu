// Elementwise, normalization, KV-store and gather kernels. Each thread handles
// whole elements in f32 and writes bf16; launches use grid-stride loops. The norm and the
// gated activation also come in variants that write an FP8 GEMM's input (E4M3 codes and
// row scales) directly, in one block per row.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/fp8_rows.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/programmatic_launch.cuh"

namespace hsx::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

__device__ float ToF(bf16 v) { return __bfloat162float(v); }
__device__ bf16 ToB(float v) { return __float2bfloat16(v); }

__device__ uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void FillUniformKernel(bf16* out, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = (SplitMix(seed ^ SplitMix(i)) >> 40) * (1.0f / 16777216.0f);
    out[i] = ToB(lo + (hi - lo) * u);
  }
}

__global__ void EmbedKernel(const bf16* table, const int32_t* ids, int64_t hidden, float scale, bf16* out) {
  const bf16* row = table + int64_t(ids[blockIdx.x]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[blockIdx.x * hidden + i] = ToB(ToF(row[i]) * scale);
}

__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += partial[w];
  return total;
}

// The sum over a row's threads (blockDim.x of them): a block's, or a warp's where rows of
// one warp go several to a block (NormKernel, one row per threadIdx.y). The two agree on
// a block of one warp (BlockSum's total is 0 + the warp's sum of non-negative squares).
__device__ float RowSum(float v) {
  if (blockDim.x != 32) return BlockSum(v);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

// Eight bf16 in one 16-byte access.
struct Vec8 {
  float v[8];
  // One 16-byte load: Unpack takes its copy, since a reference into global memory read
  // through __nv_bfloat162 pointers compiles to four 4-byte loads.
  __device__ void Load(const bf16* p) { Unpack(*reinterpret_cast<const uint4*>(p)); }
  __device__ void Unpack(uint4 raw) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
  // The 8 rounded to bf16 (nearest even), as Store writes them.
  __device__ uint4 Pack() const {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    return raw;
  }
  __device__ void Store(bf16* p) const { *reinterpret_cast<uint4*>(p) = Pack(); }
};

// A norm's first pass over row xr (one block per row): with a branch, the row first becomes
// bf16(x + branch), written back to x, and the norm is taken of those rounded values (as a
// bf16 framework would). Returns 1 / rms. dim % 8 == 0 takes 16-byte accesses; otherwise
// scalar. Each thread's elements, and so the sums, are the same for every caller.
template <bool kAdd, bool kWarpRows = false>  // kWarpRows: the row's sum is RowSum's, not BlockSum's
__device__ __forceinline__ float RowInverseRms(bf16* xr, const bf16* branch_row, int64_t dim, float eps) {
  float ss = 0.0f;
  if (dim % 8 == 0) {
    for (int64_t i = threadIdx.x * 8; i < dim; i += blockDim.x * 8) {
      Vec8 a;
      a.Load(xr + i);
      if (kAdd) {
        Vec8 b;
        b.Load(branch_row + i);
        for (int j = 0; j < 8; ++j) a.v[j] = __bfloat162float(__float2bfloat16(a.v[j] + b.v[j]));
        a.Store(xr + i);
      }
      for (int j = 0; j < 8; ++j) ss += a.v[j] * a.v[j];
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      float v = ToF(xr[i]);
      if (kAdd) {
        v = ToF(ToB(v + ToF(branch_row[i])));
        xr[i] = ToB(v);
      }
      ss += v * v;
    }
  }
  return rsqrtf((kWarpRows ? RowSum(ss) : BlockSum(ss)) / dim + eps);
}

// yr = xr * inv * (w, 1 + w or 1) for a row of dim % 8 == 0, the block's threads striding
// 8-element chunks; also into copy_r if not null.
__device__ __forceinline__ void WriteNormedRow8(const bf16* xr, const bf16* w, float inv, float plus, int64_t dim,
                                                bf16* yr, bf16* copy_r = nullptr) {
  for (int64_t i = threadIdx.x * 8; i < dim; i += blockDim.x * 8) {
    Vec8 a, s;
    a.Load(xr + i);
    if (w != nullptr) s.Load(w + i);
    for (int j = 0; j < 8; ++j) a.v[j] = a.v[j] * inv * (w != nullptr ? s.v[j] + plus : 1.0f);
    a.Store(yr + i);
    if (copy_r != nullptr) a.Store(copy_r + i);
  }
}

// WriteNormedRow8 for any dim: scalar where dim % 8 != 0.
__device__ __forceinline__ void WriteNormedRow(const bf16* xr, const bf16* w, float inv, float plus, int64_t dim,
                                               bf16* yr) {
  if (dim % 8 == 0) {
    WriteNormedRow8(xr, w, inv, plus, dim, yr);
    return;
  }
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float scale = w == nullptr ? 1.0f : ToF(w[i]) + plus;
    yr[i] = ToB(ToF(xr[i]) * inv * scale);
  }
}

// NormKernel for rows that fit the block's registers (dim % 8 == 0, at most kChunks
// 8-element chunks a thread): every read in one round trip, where the two-pass path reads
// x, then after the sum x and w again. The same elements per thread in the same order as
// RowInverseRms and WriteNormedRow8, so the same bits. kChunks is the row's need, not a
// fixed maximum: registers sized for 4 chunks held a 512-thread block to one an SM, and
// hidden-size norms ran at a quarter of HBM bandwidth.
// The row stays packed bf16 between the passes (4 registers a chunk, not 8): a holds
// x's chunks (after the add, as written back), s the weight's. Returns 1 / rms.
template <bool kAdd, int kChunks>
__device__ __forceinline__ float LoadRowInRegisters(bf16* xr, const bf16* branch_row, const bf16* w, int64_t dim,
                                                    float eps, uint4 (&a)[kChunks], uint4 (&s)[kChunks]) {
  uint4 b[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
    if (i >= dim) continue;
    a[c] = *reinterpret_cast<const uint4*>(xr + i);
    if (kAdd) b[c] = *reinterpret_cast<const uint4*>(branch_row + i);
    if (w != nullptr) s[c] = *reinterpret_cast<const uint4*>(w + i);
  }
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
    if (i >= dim) continue;
    Vec8 x;
    x.Unpack(a[c]);
    if (kAdd) {
      Vec8 y;
      y.Unpack(b[c]);
      for (int j = 0; j < 8; ++j) x.v[j] += y.v[j];
      a[c] = x.Pack();  // the bf16-rounded sum, whose squares the norm takes
      *reinterpret_cast<uint4*>(xr + i) = a[c];
      x.Unpack(a[c]);
    }
    for (int j = 0; j < 8; ++j) ss += x.v[j] * x.v[j];
  }
  return rsqrtf(RowSum(ss) / dim + eps);
}

// Eight values of the normed row from their packed x and weight: x * inv * (w, 1 + w or
// 1), rounded to bf16.
__device__ __forceinline__ uint4 NormedChunk(uint4 x_raw, uint4 w_raw, bool weighted, float inv, float plus) {
  Vec8 x, scale;
  x.Unpack(x_raw);
  if (weighted) scale.Unpack(w_raw);
  for (int j = 0; j < 8; ++j) x.v[j] = x.v[j] * inv * (weighted ? scale.v[j] + plus : 1.0f);
  return x.Pack();
}

template <bool kAdd, int kChunks>
__device__ __forceinline__ void NormRowInRegisters(bf16* xr, const bf16* branch_row, const bf16* w, int64_t dim,
                                                   float eps, float plus, bf16* yr) {
  uint4 a[kChunks], s[kChunks];
  const float inv = LoadRowInRegisters<kAdd, kChunks>(xr, branch_row, w, dim, eps, a, s);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
    if (i < dim) *reinterpret_cast<uint4*>(yr + i) = NormedChunk(a[c], s[c], w != nullptr, inv, plus);
  }
}

// Decode-sized steps (LaunchNorm's kFewRows) run the norm as it was before the sized form
// above (the same PTX): its rows in floats, four chunks a thread whatever the row (92-112
// registers). The sized form, same bits and the same 16-byte loads, cost batch-1 decode
// 8.5% (193 against 211 tok/s, Qwen3-8B shape, H200, 2026-12-02, alternating in one call)
// for a reason not yet established; one guess is that its small footprint lets the blocks
// of the GEMV launched programmatically after it share its SM.
constexpr int kFewRowsNormChunks = 4;

template <bool kAdd>
__device__ __forceinline__ void FewRowsNormInRegisters(bf16* xr, const bf16* branch_row, const bf16* w, int64_t dim,
                                                       float eps, float plus, bf16* yr) {
  Vec8 a[kFewRowsNormChunks], b[kFewRowsNormChunks], s[kFewRowsNormChunks];
#pragma unroll
  for (int c = 0; c < kFewRowsNormChunks; ++c) {
    const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
    if (i >= dim) continue;
    a[c].Load(xr + i);
    if (kAdd) b[c].Load(branch_row + i);
    if (w != nullptr) s[c].Load(w + i);
  }
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < kFewRowsNormChunks; ++c) {
    const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
    if (i >= dim) continue;
    if (kAdd) {
      for (int j = 0; j < 8; ++j) a[c].v[j] = __bfloat162float(__float2bfloat16(a[c].v[j] + b[c].v[j]));
      a[c].Store(xr + i);
    }
    for (int j = 0; j < 8; ++j) ss += a[c].v[j] * a[c].v[j];
  }
  const float inv = rsqrtf(BlockSum(ss) / dim + eps);
#pragma unroll
  for (int c = 0; c < kFewRowsNormChunks; ++c) {
    const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
    if (i >= dim) continue;
    for (int j = 0; j < 8; ++j) a[c].v[j] = a[c].v[j] * inv * (w != nullptr ? s[c].v[j] + plus : 1.0f);
    a[c].Store(yr + i);
  }
}

// One block per row.
template <bool kAdd>
__global__ void FewRowsNormKernel(bf16* x, const bf16* branch, const bf16* w, int64_t dim, float eps, bool one_plus,
                                  bf16* y) {
  WaitForPriorGrid();      // launched programmatically after the kernel that wrote x or branch
  AllowDependentLaunch();  // a GEMV follows: its weight loads may start (programmatic_launch.cuh)
  bf16* xr = x + blockIdx.x * dim;
  bf16* yr = y + blockIdx.x * dim;
  if (dim % 8 == 0 && dim <= int64_t(kFewRowsNormChunks) * 8 * blockDim.x) {
    FewRowsNormInRegisters<kAdd>(xr, kAdd ? branch + blockIdx.x * dim : nullptr, w, dim, eps, one_plus ? 1.0f : 0.0f,
                                 yr);
    return;
  }
  const float inv = RowInverseRms<kAdd>(xr, kAdd ? branch + blockIdx.x * dim : nullptr, dim, eps);
  WriteNormedRow(xr, w, inv, one_plus ? 1.0f : 0.0f, dim, yr);
}

// y = x / rms(x) * (w, 1 + w or 1), after RowInverseRms's add: a row per blockDim.x
// threads, blockDim.y rows a block (more than one only for rows of one warp). kChunks:
// NormRowInRegisters', or 0 for the two-pass path.
template <bool kAdd, int kChunks>
__global__ void NormKernel(bf16* x, const bf16* branch, const bf16* w, int64_t rows, int64_t dim, float eps,
                           bool one_plus, bf16* y) {
  WaitForPriorGrid();      // launched programmatically after the kernel that wrote x or branch
  AllowDependentLaunch();  // a GEMV follows: its weight loads may start (programmatic_launch.cuh)
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // only in a block of one-warp rows, whose sums need no __syncthreads
  bf16* xr = x + row * dim;
  bf16* yr = y + row * dim;
  const float plus = one_plus ? 1.0f : 0.0f;
  if constexpr (kChunks > 0) {
    NormRowInRegisters<kAdd, kChunks>(xr, kAdd ? branch + row * dim : nullptr, w, dim, eps, plus, yr);
  } else {
    WriteNormedRow(xr, w, RowInverseRms<kAdd, true>(xr, kAdd ? branch + row * dim : nullptr, dim, eps), plus, dim, yr);
  }
}

// Backend::DraftLayerInput, one block per token (dim % 8 == 0): NormKernel's sums and
// products, so its rows are bit for bit the unfused Embed, RmsNorm and WriteColumns'.
__global__ void DraftLayerInputKernel(const bf16* table, const int32_t* ids, const bf16* hidden, const bf16* embed_w,
                                      const bf16* hidden_w, int64_t dim, float eps, bool normed_residual, bf16* out,
                                      bf16* residual) {
  AllowDependentLaunch();  // the q/k/v GEMV follows
  const int64_t row = blockIdx.x;
  bf16* embedded = const_cast<bf16*>(table) + int64_t(ids[row]) * dim;  // only read (RowInverseRms<false>)
  bf16* h = const_cast<bf16*>(hidden) + row * dim;
  bf16* o = out + row * 2 * dim;
  bf16* res = residual + row * dim;
  WriteNormedRow8(embedded, embed_w, RowInverseRms<false>(embedded, nullptr, dim, eps), 0.0f, dim, o);
  WriteNormedRow8(h, hidden_w, RowInverseRms<false>(h, nullptr, dim, eps), 0.0f, dim, o + dim,
                  normed_residual ? res : nullptr);
  if (!normed_residual)
    for (int64_t i = threadIdx.x * 8; i < dim; i += blockDim.x * 8) *reinterpret_cast<uint4*>(res + i) =
        *reinterpret_cast<const uint4*>(h + i);
}

// NormKernel with y as an FP8 GEMM's input: the same bf16 values of y, held in registers
// (kChunks 8-element chunks per thread, dim % 8 == 0), become E4M3 codes q and the row's
// scale by fp8_rows.cuh's rule, so y never goes to memory in bf16.
template <bool kAdd, int kChunks>
__global__ void __launch_bounds__(512) NormFp8Kernel(bf16* x, const bf16* branch, const bf16* w, int64_t dim,
                                                     float eps, bool one_plus, uint8_t* q, float* scales) {
  bf16* xr = x + blockIdx.x * dim;
  const bf16* branch_row = kAdd ? branch + blockIdx.x * dim : nullptr;
  const float plus = one_plus ? 1.0f : 0.0f;
  uint4 y[kChunks];
  float absmax = 0.0f;
  if constexpr (kChunks <= 4) {  // one pass, as NormKernel's (more chunks would spill)
    uint4 s[kChunks];
    const float inv = LoadRowInRegisters<kAdd, kChunks>(xr, branch_row, w, dim, eps, y, s);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
      if (i < dim) {
        y[c] = NormedChunk(y[c], s[c], w != nullptr, inv, plus);
        absmax = fmaxf(absmax, AbsMax8(y[c]));
      }
    }
  } else {
    const float inv = RowInverseRms<kAdd>(xr, branch_row, dim, eps);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
      if (i < dim) {
        const uint4 x_raw = *reinterpret_cast<const uint4*>(xr + i);
        const uint4 w_raw = w != nullptr ? *reinterpret_cast<const uint4*>(w + i) : uint4{};
        y[c] = NormedChunk(x_raw, w_raw, w != nullptr, inv, plus);
        absmax = fmaxf(absmax, AbsMax8(y[c]));
      }
    }
  }
  StoreRowCodes(y, absmax, dim, q + blockIdx.x * dim, scales + blockIdx.x);
}

template <typename T>
__global__ void AddBiasKernel(T* y, const bf16* bias, int64_t n, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float sum = static_cast<float>(y[i]) + ToF(bias[i % cols]);
    y[i] = static_cast<T>(sum);
  }
}

__global__ void AddKernel(bf16* acc, const bf16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] = ToB(ToF(acc[i]) + ToF(x[i]));
}

__global__ void MultiplyKernel(bf16* acc, const bf16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] = ToB(ToF(acc[i]) * ToF(x[i]));
}

__global__ void ScaleKernel(bf16* x, int64_t n, float s, const bf16* device_scalar) {
  const float scale = device_scalar != nullptr ? ToF(*device_scalar) : s;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = ToB(ToF(x[i]) * scale);
}

template <class T>
__global__ void SoftcapKernel(T* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = static_cast<float>(x[i]);
    x[i] = static_cast<T>(cap * tanhf(v / cap));
  }
}

__global__ void ActivateKernel(bf16* x, int64_t n, int act) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = ToB(Activation(act, ToF(x[i])));
}

// Over the rows * cols outputs; 8 at a time when rows keep 16-byte alignment.
__global__ void GatedActivationKernel(const bf16* gate, const bf16* up, int64_t rows, int64_t cols, int64_t stride,
                                      int act, bf16* out) {
  AllowDependentLaunch();  // the down projection follows
  const int64_t n = rows * cols;
  if (cols % 8 == 0 && stride % 8 == 0) {
    for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * 8; i < n; i += int64_t(gridDim.x) * blockDim.x * 8) {
      const int64_t in = i / cols * stride + i % cols;  // the 8 share a row
      Vec8 g, u;
      g.Load(gate + in);
      u.Load(up + in);
      for (int j = 0; j < 8; ++j) g.v[j] = Activation(act, g.v[j]) * u.v[j];
      g.Store(out + i);
    }
    return;
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t in = i / cols * stride + i % cols;
    out[i] = ToB(Activation(act, ToF(gate[in])) * ToF(up[in]));
  }
}

// GatedActivationKernel with out as an FP8 GEMM's input (the down projection's): one block
// per row, the row's bf16 products held in registers (kChunks 8-element chunks per thread;
// cols and stride multiples of 8), then E4M3 codes q and the row's scale by fp8_rows.cuh's
// rule, so out never goes to memory in bf16.
constexpr int kGatedFp8Threads = 512;
template <int kChunks>
__global__ void __launch_bounds__(kGatedFp8Threads)
    GatedActivationFp8Kernel(const bf16* gate, const bf16* up, int64_t cols, int64_t stride, int act, uint8_t* q,
                             float* scales) {
  const int64_t in = blockIdx.x * stride;
  uint4 y[kChunks];
  float absmax = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = (threadIdx.x + int64_t(c) * blockDim.x) * 8;
    if (i < cols) {
      Vec8 g, u;
      g.Load(gate + in + i);
      u.Load(up + in + i);
      for (int j = 0; j < 8; ++j) g.v[j] = Activation(act, g.v[j]) * u.v[j];
      y[c] = g.Pack();
      absmax = fmaxf(absmax, AbsMax8(y[c]));
    }
  }
  StoreRowCodes(y, absmax, cols, q + blockIdx.x * cols, scales + blockIdx.x);
}

__global__ void StoreKVKernel(const bf16* k, const bf16* v, const int32_t* slots, int64_t k_row, int64_t v_row,
                              bf16* k_cache, bf16* v_cache) {
  const int64_t slot = slots[blockIdx.x];
  if (slot < 0) return;  // a padding row
  for (int64_t i = threadIdx.x; i < k_row; i += blockDim.x) k_cache[slot * k_row + i] = k[blockIdx.x * k_row + i];
  for (int64_t i = threadIdx.x; i < v_row; i += blockDim.x) v_cache[slot * v_row + i] = v[blockIdx.x * v_row + i];
}

__global__ void GatherRowsKernel(const char* x, const int32_t* rows, int64_t row_bytes, char* out) {
  const char* src = x + int64_t(rows[blockIdx.x]) * row_bytes;
  for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) out[blockIdx.x * row_bytes + i] = src[i];
}

__global__ void SliceColumnsKernel(const bf16* x, int64_t cols, int64_t begin, int64_t width, bf16* out) {
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) out[blockIdx.x * width + i] = x[blockIdx.x * cols + begin + i];
}

__global__ void WriteColumnsKernel(const bf16* x, int64_t width, int64_t begin, int64_t cols, bf16* out) {
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) out[blockIdx.x * cols + begin + i] = x[blockIdx.x * width + i];
}

__global__ void MoeRouteKernel(const float* logits, int64_t tokens, int experts, int top_k, bool renormalize,
                               int32_t* ids, float* weights, int32_t* counts) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= tokens) return;
  const float* row = logits + t * experts;
  float mx = -INFINITY;
  for (int e = lane; e < experts; e += 32) mx = fmaxf(mx, row[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
  float sum = 0.0f;
  for (int e = lane; e < experts; e += 32) sum += __expf(row[e] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
  // top_k rounds of a warp-wide argmax over the logits (softmax is monotone). A NaN logit
  // counts as -inf, and any untaken expert beats none (best_e == experts): a row of NaNs (a
  // padding row over a never-written KV block) still routes to experts in range.
  float kept = 0.0f;
  int chosen[16];
  float prob[16];
  for (int j = 0; j < top_k; ++j) {
    float best = -INFINITY;
    int best_e = experts;
    for (int e = lane; e < experts; e += 32) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= chosen[i] == e;
      const float v = isnan(row[e]) ? -INFINITY : row[e];
      if (!taken && (v > best || (v == best && e < best_e))) {
        best = v;
        best_e = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffff, best, o);
      const int oe = __shfl_xor_sync(0xffffffff, best_e, o);
      if (ov > best || (ov == best && oe < best_e)) {
        best = ov;
        best_e = oe;
      }
    }
    chosen[j] = best_e;
    prob[j] = __expf(best - mx) / sum;
    kept += prob[j];
  }
  if (lane == 0) {
    for (int j = 0; j < top_k; ++j) {
      ids[t * top_k + j] = chosen[j];
      weights[t * top_k + j] = renormalize ? prob[j] / kept : prob[j];
      atomicAdd(&counts[chosen[j]], 1);
    }
  }
}

__global__ void MoePermuteKernel(const int32_t* ids, int64_t pairs, int32_t* cursor, int32_t* rows, int32_t* inverse,
                                 int top_k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t slot = atomicAdd(&cursor[ids[i]], 1);
    rows[slot] = static_cast<int32_t>(i / top_k);
    inverse[i] = slot;
  }
}

__global__ void MoeCombineKernel(const bf16* y, const int32_t* inverse, const float* weights, int top_k, int64_t hidden,
                                 bf16* out) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j) acc += weights[t * top_k + j] * ToF(y[int64_t(inverse[t * top_k + j]) * hidden + c]);
    out[t * hidden + c] = ToB(acc);
  }
}

__global__ void ToBF16Kernel(const float* x, int64_t n, bf16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = ToB(x[i]);
}

__global__ void HalfToBF16Kernel(const __half* x, int64_t n, bf16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = ToB(__half2float(x[i]));
}

}  // namespace

void FillUniform(bf16* out, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  FillUniformKernel<<<Blocks(n), kThreads, 0, stream>>>(out, n, seed, lo, hi);
}
void Embed(const bf16* table, const int32_t* ids, int64_t tokens, int64_t hidden, float scale, bf16* out,
           cudaStream_t stream) {
  if (tokens > 0) EmbedKernel<<<tokens, kThreads, 0, stream>>>(table, ids, hidden, scale, out);
}
static int NormThreads(int64_t dim) { return dim >= 4096 ? 512 : (dim >= 1024 ? 128 : 32); }
static bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Steps of at most this many rows (decode and verification steps, graph-replayed up to 256
// sequences) take FewRowsNormKernel.
constexpr int64_t kFewRows = 256;
// NormKernel's grid and block: rows of one warp go 8 to a block. A block of 32 threads
// per row caps an SM at 1,024 threads (32 blocks), and per-head norms (Gemma's v norm:
// tokens x KV heads rows of 256) then ran at a quarter of HBM bandwidth.
template <bool kAdd>
static void LaunchNorm(bf16* x, const bf16* branch, const bf16* w, int64_t rows, int64_t dim, float eps,
                       bool one_plus, bf16* y, cudaStream_t stream, bool programmatic) {
  if (rows <= 0) return;
  const int threads = NormThreads(dim);
  if (rows <= kFewRows) {
    LaunchMaybeProgrammatic(FewRowsNormKernel<kAdd>, dim3(rows), dim3(threads), 0, programmatic, stream, x, branch, w,
                            dim, eps, one_plus, y);
    return;
  }
  const int rows_per_block = threads == 32 ? 8 : 1;
  const dim3 grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block)), block(threads, rows_per_block);
  const int64_t need = dim % 8 == 0 ? (dim / 8 + threads - 1) / threads : 0;  // chunks of 8 a thread
  auto launch = [&](auto kernel) {
    LaunchMaybeProgrammatic(kernel, grid, block, 0, programmatic, stream, x, branch, w, rows, dim, eps, one_plus, y);
  };
  if (need == 1) {
    launch(NormKernel<kAdd, 1>);
  } else if (need == 2) {
    launch(NormKernel<kAdd, 2>);
  } else if (need == 3 || need == 4) {
    launch(NormKernel<kAdd, 4>);
  } else {  // rows past 16k elements at 512 threads, or dim % 8 != 0
    launch(NormKernel<kAdd, 0>);
  }
}
void RmsNorm(const bf16* x, const bf16* w, int64_t rows, int64_t dim, float eps, bool one_plus_weight, bf16* y,
             cudaStream_t stream, bool programmatic) {
  // x is only read here (NormKernel<false, ...> never writes it).
  LaunchNorm<false>(const_cast<bf16*>(x), nullptr, w, rows, dim, eps, one_plus_weight, y, stream, programmatic);
}
void AddRmsNorm(bf16* residual, const bf16* branch, const bf16* w, int64_t rows, int64_t dim, float eps,
                bool one_plus_weight, bf16* y, cudaStream_t stream, bool programmatic) {
  LaunchNorm<true>(residual, branch, w, rows, dim, eps, one_plus_weight, y, stream, programmatic);
}
bool DraftLayerInput(const bf16* table, const int32_t* ids, const bf16* hidden, const bf16* embed_w,
                     const bf16* hidden_w, int64_t tokens, int64_t dim, float eps, bool normed_residual, bf16* out,
                     bf16* residual, cudaStream_t stream) {
  if (dim % 8 != 0 || !Aligned16(table) || !Aligned16(hidden) || !Aligned16(embed_w) || !Aligned16(hidden_w) ||
      !Aligned16(out) || !Aligned16(residual))
    return false;
  if (tokens > 0)  // RmsNorm's threads per row, so each row sums in the same order
    DraftLayerInputKernel<<<tokens, NormThreads(dim), 0, stream>>>(table, ids, hidden, embed_w, hidden_w, dim, eps,
                                                                   normed_residual, out, residual);
  return true;
}
// The register chunks an FP8 row kernel needs per thread (8 elements each), rounded up to
// an instantiated count; 0 when a row of `cols` takes more.
static int Fp8Chunks(int64_t cols, int threads) {
  const int64_t need = (cols / 8 + threads - 1) / threads;
  for (int c : {1, 2, 4, 8, 16})
    if (need <= c) return c;
  return 0;
}
template <bool kAdd>
static void LaunchNormFp8(int chunks, int64_t rows, int threads, bf16* x, const bf16* branch, const bf16* w,
                          int64_t dim, float eps, bool one_plus, uint8_t* q, float* scales, cudaStream_t stream) {
  switch (chunks) {
    case 1: NormFp8Kernel<kAdd, 1><<<rows, threads, 0, stream>>>(x, branch, w, dim, eps, one_plus, q, scales); break;
    case 2: NormFp8Kernel<kAdd, 2><<<rows, threads, 0, stream>>>(x, branch, w, dim, eps, one_plus, q, scales); break;
    case 4: NormFp8Kernel<kAdd, 4><<<rows, threads, 0, stream>>>(x, branch, w, dim, eps, one_plus, q, scales); break;
    case 8: NormFp8Kernel<kAdd, 8><<<rows, threads, 0, stream>>>(x, branch, w, dim, eps, one_plus, q, scales); break;
    default: NormFp8Kernel<kAdd, 16><<<rows, threads, 0, stream>>>(x, branch, w, dim, eps, one_plus, q, scales);
  }
}
bool RmsNormFp8(bf16* x, const bf16* branch, const bf16* w, int64_t rows, int64_t dim, float eps, bool one_plus_weight,
                uint8_t* q, float* scales, cudaStream_t stream) {
  const int threads = NormThreads(dim);  // RmsNorm's, so each row sums in the same order
  const int chunks = Fp8Chunks(dim, threads);
  if (dim % 8 != 0 || chunks == 0 || !Aligned16(x) || (branch && !Aligned16(branch)) || (w && !Aligned16(w)) ||
      reinterpret_cast<uintptr_t>(q) % 8 != 0)
    return false;
  if (rows == 0) return true;
  if (branch != nullptr) {
    LaunchNormFp8<true>(chunks, rows, threads, x, branch, w, dim, eps, one_plus_weight, q, scales, stream);
  } else {  // x is only read (NormFp8Kernel<false, _> never writes it)
    LaunchNormFp8<false>(chunks, rows, threads, x, branch, w, dim, eps, one_plus_weight, q, scales, stream);
  }
  return true;
}
bool GatedActivationFp8(const bf16* gate, const bf16* up, int64_t rows, int64_t cols, int64_t stride, int act,
                        uint8_t* q, float* scales, cudaStream_t stream) {
  // 512 threads a row, at most 8 chunks a thread (118 registers; 16 would spill under the
  // launch bound): at 256 threads an MLP row of 12,288 took 8 chunks and two blocks an SM,
  // and the kernel moved ~1.6 TB/s.
  const int chunks = Fp8Chunks(cols, kGatedFp8Threads);
  if (cols % 8 != 0 || stride % 8 != 0 || chunks == 0 || chunks > 8 || !Aligned16(gate) || !Aligned16(up) ||
      reinterpret_cast<uintptr_t>(q) % 8 != 0)
    return false;
  if (rows == 0) return true;
  auto launch = [&](auto kernel) {
    kernel<<<rows, kGatedFp8Threads, 0, stream>>>(gate, up, cols, stride, act, q, scales);
  };
  switch (chunks) {
    case 1: launch(GatedActivationFp8Kernel<1>); break;
    case 2: launch(GatedActivationFp8Kernel<2>); break;
    case 4: launch(GatedActivationFp8Kernel<4>); break;
    default: launch(GatedActivationFp8Kernel<8>);
  }
  return true;
}
void AddBias(void* y, bool is_f32, const bf16* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (is_f32) AddBiasKernel<float><<<Blocks(rows * cols), kThreads, 0, stream>>>(static_cast<float*>(y), bias, rows * cols, cols);
  else AddBiasKernel<bf16><<<Blocks(rows * cols), kThreads, 0, stream>>>(static_cast<bf16*>(y), bias, rows * cols, cols);
}
void Add(bf16* acc, const bf16* x, int64_t n, cudaStream_t stream) { AddKernel<<<Blocks(n), kThreads, 0, stream>>>(acc, x, n); }
void Multiply(bf16* acc, const bf16* x, int64_t n, cudaStream_t stream) {
  MultiplyKernel<<<Blocks(n), kThreads, 0, stream>>>(acc, x, n);
}
void Scale(bf16* x, int64_t n, float s, const bf16* device_scalar, cudaStream_t stream) {
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, s, device_scalar);
}
void Softcap(void* x, bool is_f32, int64_t n, float cap, cudaStream_t stream) {
  if (is_f32) SoftcapKernel<float><<<Blocks(n), kThreads, 0, stream>>>(static_cast<float*>(x), n, cap);
  else SoftcapKernel<bf16><<<Blocks(n), kThreads, 0, stream>>>(static_cast<bf16*>(x), n, cap);
}
void Activate(bf16* x, int64_t n, int act, cudaStream_t stream) {
  ActivateKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, act);
}
void GatedActivation(const bf16* gate, const bf16* up, int64_t rows, int64_t cols, int64_t stride, int act, bf16* out,
                     cudaStream_t stream) {
  const int64_t n = rows * cols;
  const bool vec = cols % 8 == 0 && stride % 8 == 0;
  if (n > 0) GatedActivationKernel<<<Blocks(vec ? n / 8 : n), kThreads, 0, stream>>>(gate, up, rows, cols, stride, act, out);
}
void StoreKV(const bf16* k, const bf16* v, const int32_t* slots, int64_t tokens, int64_t k_row, int64_t v_row,
             bf16* k_cache, bf16* v_cache, cudaStream_t stream) {
  if (tokens > 0) StoreKVKernel<<<tokens, 128, 0, stream>>>(k, v, slots, k_row, v_row, k_cache, v_cache);
}
void GatherRows(const void* x, const int32_t* rows, int64_t n_rows, int64_t row_bytes, void* out, cudaStream_t stream) {
  if (n_rows > 0)
    GatherRowsKernel<<<n_rows, kThreads, 0, stream>>>(static_cast<const char*>(x), rows, row_bytes, static_cast<char*>(out));
}
void SliceColumns(const bf16* x, int64_t rows, int64_t cols, int64_t begin, int64_t width, bf16* out,
                  cudaStream_t stream) {
  if (rows > 0) SliceColumnsKernel<<<rows, 128, 0, stream>>>(x, cols, begin, width, out);
}
void WriteColumns(const bf16* x, int64_t rows, int64_t width, int64_t begin, int64_t cols, bf16* out,
                  cudaStream_t stream) {
  if (rows > 0) WriteColumnsKernel<<<rows, 128, 0, stream>>>(x, width, begin, cols, out);
}
void MoeRoute(const float* logits, int64_t tokens, int experts, int top_k, bool renormalize, int32_t* ids,
              float* weights, int32_t* counts, cudaStream_t stream) {
  constexpr int kWarpsPerBlock = 8;
  if (tokens > 0)
    MoeRouteKernel<<<(tokens + kWarpsPerBlock - 1) / kWarpsPerBlock, 32 * kWarpsPerBlock, 0, stream>>>(
        logits, tokens, experts, top_k, renormalize, ids, weights, counts);
}
void MoePermute(const int32_t* ids, int64_t pairs, int top_k, int32_t* cursor, int32_t* rows, int32_t* inverse,
                cudaStream_t stream) {
  MoePermuteKernel<<<Blocks(pairs), kThreads, 0, stream>>>(ids, pairs, cursor, rows, inverse, top_k);
}
void MoeCombine(const bf16* y, const int32_t* inverse, const float* weights, int64_t tokens, int top_k, int64_t hidden,
                bf16* out, cudaStream_t stream) {
  if (tokens > 0) MoeCombineKernel<<<tokens, kThreads, 0, stream>>>(y, inverse, weights, top_k, hidden, out);
}
void ConvertToBF16(const void* x, int src_dtype, int64_t n, bf16* out, cudaStream_t stream) {
  if (src_dtype == 0) ToBF16Kernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const float*>(x), n, out);
  else HalfToBF16Kernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const __half*>(x), n, out);
}

namespace {

// One warp per row, 16-byte loads where the row allows: bf16 inf and NaN are the values
// whose exponent bits are all set. A few microseconds against a step's milliseconds.
__global__ void FlagNonFiniteRowsKernel(const uint16_t* x, int64_t rows, int64_t cols, int32_t* flags) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint16_t* r = x + row * cols;
  bool bad = false;
  if (cols % 8 == 0) {
    const uint4* v = reinterpret_cast<const uint4*>(r);
    for (int64_t i = lane; i < cols / 8; i += 32) {
      const uint4 q = v[i];
      for (uint32_t w : {q.x, q.y, q.z, q.w}) {
        bad |= (w & 0x7f80u) == 0x7f80u || (w & 0x7f800000u) == 0x7f800000u;
      }
    }
  } else {
    for (int64_t i = lane; i < cols; i += 32) bad |= (r[i] & 0x7f80u) == 0x7f80u;
  }
  bad = __any_sync(0xffffffffu, bad);
  if (lane == 0) flags[row] = bad;
}

}  // namespace

void FlagNonFiniteRows(const bf16* x, int64_t rows, int64_t cols, int32_t* flags, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kThreads / 32;
  if (rows > 0) {
    FlagNonFiniteRowsKernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream>>>(
        reinterpret_cast<const uint16_t*>(x), rows, cols, flags);
  }
}

}  // namespace hsx::cuda
