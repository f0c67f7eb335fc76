#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/sgemm.h"
#include "tensor/float8.h"
#include "util/thread_pool.h"

namespace hsx {
namespace {

ThreadPool& Pool() { return ThreadPool::Global(); }

// A small float vector (norm weight, bias, scalar) as f32.
std::vector<float> ToF32(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ConvertToF32(t.dtype(), t.raw(), v.data(), v.size());
  return v;
}

int64_t Rows(const Tensor& t) { return t.numel() / t.size(-1); }

float Gelu(float x) {
  const float kAlpha = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(kAlpha * (x + 0.044715f * x * x * x)));
}
float Silu(float x) { return x / (1.0f + std::exp(-x)); }
float Apply(Activation act, float x) { return act == Activation::kSilu ? Silu(x) : Gelu(x); }

// Runs f(begin, end) over [0, n) items of `cost` floats each, split across the pool
// only when the total is large enough to pay for waking it.
template <class F>
void ForEach(int64_t n, F&& f, int64_t cost = 1) {
  if (n * cost < (1 << 15)) {
    f(0, n);
    return;
  }
  Pool().ParallelFor(n, f);
}

// Eight floats in one vector register (GCC's and Clang's vector extension): the attention
// loops below say how they vectorize rather than leave it to the vectorizer, which turned a
// loop over keys into gathers.
using Float8 = float __attribute__((vector_size(32)));
Float8 Load8(const float* p) {
  Float8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
float Sum8(Float8 v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

float Dot(const float* a, const float* b, int64_t n) {
  Float8 part = {};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) part += Load8(a + c) * Load8(b + c);
  float s = Sum8(part);
  for (; c < n; ++c) s += a[c] * b[c];
  return s;
}

// row[i] = exp(row[i] - mx) over [0, n), returning their sum (eight lanes, then a fixed tree): Cephes'
// expf (range reduction by ln 2, a degree-6 polynomial; within 1 ulp of libm's) in a loop the
// compiler vectorizes, where a libm call per score was most of a decode step's softmax.
float ExpShiftedSum(float* row, int64_t n, float mx) {
  constexpr float kLog2e = 1.44269504088896341f, kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;      // 1.5 * 2^23: adding it rounds to an integer
  constexpr uint32_t kFloorBits = 0xC2AE0000u;  // -87.0f: exp is under 2^-125 there, as good as 0
  for (int64_t i = 0; i < n; ++i) {
    const float shifted = row[i] - mx;
    // max(shifted, -87) on the bits (shifted <= 0): a float compare would keep the loop scalar.
    uint32_t bits;
    std::memcpy(&bits, &shifted, 4);
    bits = std::min(bits, kFloorBits);
    float x;
    std::memcpy(&x, &bits, 4);
    const float k = (x * kLog2e + kRound) - kRound;
    const float r = x - k * kC1 - k * kC2;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const int32_t exponent = (static_cast<int32_t>(k) + 127) << 23;
    float scale;
    std::memcpy(&scale, &exponent, 4);
    row[i] = (p * r * r + r + 1.0f) * scale + (shifted - shifted);  // the last term keeps a NaN
  }
  Float8 part = {};  // eight partial sums
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) part += Load8(row + i);
  float sum = Sum8(part);
  for (; i < n; ++i) sum += row[i];
  return sum;
}

// out [rows, cols] = act(gate) * up, gate's and up's rows `stride` floats apart (a fused
// gate/up output, or an expert's separate products).
void Gate(const float* gate, const float* up, int64_t rows, int64_t cols, int64_t stride, Activation act, float* out) {
  ForEach(rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = Apply(act, gate[r * stride + c]) * up[r * stride + c];
    }
  }, cols);
}

}  // namespace

void CpuBackend::Copy(const Tensor& src, Tensor& dst) {
  assert(src.nbytes() == dst.nbytes());
  std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::FillUniform(Tensor& t, uint64_t seed, float lo, float hi) {
  // Chunks draw from independent streams, so the result does not depend on the thread count.
  constexpr int64_t kChunk = 1 << 16;
  const int64_t n = t.numel();
  const size_t esize = DTypeSize(t.dtype());
  Pool().ParallelFor((n + kChunk - 1) / kChunk, [&](int64_t b, int64_t e) {
    std::vector<float> buf(kChunk);
    for (int64_t chunk = b; chunk < e; ++chunk) {
      std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(chunk));
      std::uniform_real_distribution<float> uni(lo, hi);
      const int64_t begin = chunk * kChunk, count = std::min(kChunk, n - begin);
      for (int64_t i = 0; i < count; ++i) buf[i] = uni(rng);
      ConvertFromF32(buf.data(), t.dtype(), t.data<char>() + begin * esize, static_cast<size_t>(count));
    }
  });
}

void CpuBackend::Embed(const Tensor& table, const Tensor& ids, float scale, Tensor& out) {
  const int64_t h = table.size(1);
  const size_t row_bytes = static_cast<size_t>(h) * DTypeSize(table.dtype());
  const int32_t* id = ids.data<int32_t>();
  float* o = out.data<float>();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    ConvertToF32(table.dtype(), table.data<char>() + id[t] * row_bytes, o + t * h, static_cast<size_t>(h));
    if (scale != 1.0f) {
      for (int64_t i = 0; i < h; ++i) o[t * h + i] *= scale;
    }
  }
}

// Rows per sgemm in batch-invariant mode. GEMM libraries pick their kernel by the call's
// shape (OpenBLAS 0.3.21 runs m·n·k <= 100^3 through small-matrix kernels that round
// differently from its blocked ones; oneDNN splits work by shape) and, inside one call,
// may give rows past the last full multiple of their kernel's row unroll another kernel
// (oneDNN's sgemm unrolls 24 rows on AVX2, 48 on AVX-512), so a row's bits would depend
// on how many rows came with it and where it sat. Every call here is one single-threaded
// call of exactly 48 rows, a multiple of both unrolls: every row takes the same path
// (tests/test_batch_invariant.cpp checks it); the blocks share the thread pool.
constexpr int64_t kInvariantRows = 48;

void CpuBackend::MultiplyPanel(const float* a, int64_t m, int64_t k, const float* w_panel, int64_t cols, float* c,
                               int64_t ldc) const {
  if (!batch_invariant_) {
    Sgemm(m, cols, k, 1.0f, a, k, w_panel, k, BLayout::kRowsOfN, c, ldc);
    return;
  }
  const int64_t blocks = (m + kInvariantRows - 1) / kInvariantRows;
  ThreadPool::Global().ParallelFor(blocks, [&](int64_t b0, int64_t b1) {
    std::vector<float> a_pad, c_pad;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kInvariantRows, rows = std::min(kInvariantRows, m - r0);
      if (rows == kInvariantRows) {
        SgemmSingleThreaded(rows, cols, k, 1.0f, a + r0 * k, k, w_panel, k, BLayout::kRowsOfN, c + r0 * ldc, ldc);
        continue;
      }
      // The last block, zero-padded to the full height.
      a_pad.assign(static_cast<size_t>(kInvariantRows * k), 0.0f);
      std::copy(a + r0 * k, a + (r0 + rows) * k, a_pad.begin());
      c_pad.resize(static_cast<size_t>(kInvariantRows * cols));
      SgemmSingleThreaded(kInvariantRows, cols, k, 1.0f, a_pad.data(), k, w_panel, k, BLayout::kRowsOfN, c_pad.data(),
                          cols);
      for (int64_t r = 0; r < rows; ++r)
        std::copy(c_pad.begin() + r * cols, c_pad.begin() + (r + 1) * cols, c + (r0 + r) * ldc);
    }
  });
}

void CpuBackend::Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t m = Rows(x), k = x.size(-1), n = w.size(0);
  assert(w.size(1) == k && y.numel() == m * n);
  if (m == 0) return;
  const float* a = x.data<float>();
  float* c = y.data<float>();
  std::vector<float> x_scales, x_codes;  // FP8: each row of x quantized as the weight's rows are
  if (w.dtype() == DType::kF8E4M3) {
    const Tensor xq = x.dtype() == DType::kF8E4M3 ? x : QuantizeRowsFp8(x.View({m, k}));
    x_scales.assign(xq.row_scales()->data<float>(), xq.row_scales()->data<float>() + m);
    x_codes.resize(static_cast<size_t>(m * k));
    ConvertToF32(DType::kF8E4M3, xq.raw(), x_codes.data(), x_codes.size());
    a = x_codes.data();
  }
  if (w.dtype() == DType::kF32) {
    MultiplyPanel(a, m, k, w.data<float>(), n, c, n);
  } else {
    // Convert a panel of weight rows to f32 (about 4 MiB) and multiply it; the
    // conversion is O(n k) against the GEMM's O(m n k).
    const int64_t panel = std::max<int64_t>(16, std::min<int64_t>(n, (1 << 20) / k));
    std::vector<float> wf(static_cast<size_t>(panel * k));
    const size_t esize = DTypeSize(w.dtype());
    for (int64_t r0 = 0; r0 < n; r0 += panel) {
      const int64_t rows = std::min(panel, n - r0);
      Pool().ParallelFor(rows, [&](int64_t b, int64_t e) {
        ConvertToF32(w.dtype(), w.data<char>() + (r0 + b) * k * esize, wf.data() + b * k, static_cast<size_t>((e - b) * k));
      });
      MultiplyPanel(a, m, k, wf.data(), rows, c + r0, n);
    }
  }
  if (w.dtype() == DType::kF8E4M3) {  // the products of codes, scaled back
    const float* sw = w.row_scales()->data<float>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] = c[i * n + j] * x_scales[i] * sw[j];
  }
  if (bias != nullptr) {
    const std::vector<float> b = ToF32(*bias);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += b[j];
  }
}

Tensor CpuBackend::QuantizeRowsFp8(const Tensor& x) {
  const int64_t n = x.size(0), k = x.size(1);
  Tensor q = Tensor::Host(DType::kF8E4M3, x.shape());
  Tensor scales = Tensor::Host(DType::kF32, {n});
  Pool().ParallelFor(n, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = b; r < e; ++r) {
      ConvertToF32(x.dtype(), x.data<char>() + r * k * DTypeSize(x.dtype()), row.data(), static_cast<size_t>(k));
      scales.data<float>()[r] = QuantizeRowF8E4M3(row.data(), k, q.data<uint8_t>() + r * k);
    }
  });
  return q.WithRowScales(scales);
}

void CpuBackend::RmsNorm(const Tensor& x, const Tensor* w, float eps, bool one_plus_weight, Tensor& y) {
  const int64_t d = x.size(-1);
  std::vector<float> weight(static_cast<size_t>(d), 1.0f);
  if (w != nullptr) {
    weight = ToF32(*w);
    if (one_plus_weight)
      for (float& v : weight) v += 1.0f;
  }
  const float* in = x.data<float>();
  float* out = y.data<float>();
  ForEach(Rows(x), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = in + r * d;
      float ss = 0.0f;
      for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
      for (int64_t i = 0; i < d; ++i) out[r * d + i] = xr[i] * inv * weight[i];
    }
  }, d);
}

void CpuBackend::Add(Tensor& acc, const Tensor& x) {
  float* a = acc.data<float>();
  const float* b = x.data<float>();
  ForEach(acc.numel(), [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) a[i] += b[i];
  });
}

void CpuBackend::Multiply(Tensor& acc, const Tensor& x) {
  float* a = acc.data<float>();
  const float* b = x.data<float>();
  ForEach(acc.numel(), [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) a[i] *= b[i];
  });
}

void CpuBackend::Scale(Tensor& x, float s) {
  float* a = x.data<float>();
  ForEach(x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) a[i] *= s;
  });
}

void CpuBackend::ScaleByTensor(Tensor& x, const Tensor& scalar) { Scale(x, ToF32(scalar)[0]); }

void CpuBackend::Softcap(Tensor& x, float cap) {
  float* a = x.data<float>();
  ForEach(x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) a[i] = cap * std::tanh(a[i] / cap);
  });
}

void CpuBackend::Activate(Tensor& x, Activation act) {
  float* a = x.data<float>();
  ForEach(x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) a[i] = Apply(act, a[i]);
  });
}

void CpuBackend::GatedActivation(const Tensor& gate_up, Activation act, Tensor& out) {
  const int64_t cols = out.size(-1);
  assert(gate_up.size(-1) == 2 * cols && Rows(gate_up) == Rows(out));
  const float* g = gate_up.data<float>();
  Gate(g, g + cols, Rows(out), cols, 2 * cols, act, out.data<float>());
}

void CpuBackend::Rope(Tensor& x, const Tensor& positions, const RopeTable& rope) {
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2), half = rope.rotary_dims / 2;
  const float* inv_freq = rope.inv_freq.data<float>();
  const int32_t* pos = positions.data<int32_t>();
  float* data = x.data<float>();
  Pool().ParallelFor(tokens, [&](int64_t b, int64_t e) {
    std::vector<float> cos(static_cast<size_t>(half)), sin(static_cast<size_t>(half));
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos[t]) * inv_freq[i];
        cos[i] = std::cos(angle);
        sin[i] = std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = data + (t * heads + h) * d;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * cos[i] - x2 * sin[i];
          v[i + half] = x2 * cos[i] + x1 * sin[i];
        }
      }
    }
  });
}

void CpuBackend::StoreKV(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache) {
  const int64_t k_row = k.numel() / k.size(0), v_row = v.numel() / v.size(0);
  const int32_t* slot = slots.data<int32_t>();
  for (int64_t t = 0; t < k.size(0); ++t) {
    if (slot[t] < 0) continue;  // a padding row
    std::memcpy(k_cache.data<float>() + slot[t] * k_row, k.data<float>() + t * k_row, k_row * 4);
    std::memcpy(v_cache.data<float>() + slot[t] * v_row, v.data<float>() + t * v_row, v_row * 4);
  }
}

// Per (sequence, KV head): gather its keys and values out of the paged cache once, then
// for each query head and block of queries, S = Q K^T and O = softmax(S) V through sgemm
// over just the key range the block can see (causal, sliding window).
void CpuBackend::Attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                           const AttentionParams& params, Tensor& out) {
  if (batch.seqs.empty() && batch.seq_info.defined() && batch.seq_info.numel() > 0) {
    // A graph shape's batch (RunnerConfig::graph_shapes_without_recording) has no host copy:
    // its sequences are read out of seq_info and block_tables, as a device kernel reads them.
    AttentionBatch with_seqs = batch;
    const int32_t* info = batch.seq_info.data<int32_t>();
    const int32_t* tables = batch.block_tables.data<int32_t>();
    for (int64_t i = 0; i < batch.seq_info.size(0); ++i) {
      const int32_t* row = info + 4 * i;
      const int64_t blocks = (int64_t{row[2]} + params.block_size - 1) / params.block_size;
      if (row[3] < 0 || row[3] + blocks > batch.block_tables.numel()) {
        std::fprintf(stderr, "hsx: attention: sequence %ld's block table lies outside block_tables\n", long(i));
        std::abort();
      }
      SequenceSlice& seq = with_seqs.seqs.emplace_back();
      seq = {row[0], row[1], row[2], std::vector<int32_t>(tables + row[3], tables + row[3] + blocks)};
      if (batch.tree.defined()) {  // tree bases [S], then a 64-bit mask per row
        const int32_t* words = batch.tree.data<int32_t>();
        const auto* masks = reinterpret_cast<const uint64_t*>(words + batch.tree_mask_offset);
        seq.tree_base = words[i];
        if (seq.tree_base >= 0) seq.tree_mask.assign(masks + row[0], masks + row[0] + row[1]);
      }
    }
    return Attention(q, k_cache, v_cache, with_seqs, params, out);
  }
  bool few_queries = true, tree = false;
  for (const SequenceSlice& seq : batch.seqs) {
    few_queries = few_queries && seq.q_len <= kFewQueries;
    tree = tree || seq.tree_base >= 0;
  }
  // Both paths below give each row its own key list, so tree rows (speculative token
  // trees) run there, with the bits a decode row of the same keys gets.
  if (batch_invariant_) return RowwiseAttention(q, k_cache, v_cache, batch, params, out);
  if (tree) return FewQueryAttention(q, k_cache, v_cache, batch, params, out);
  if (few_queries) return FewQueryAttention(q, k_cache, v_cache, batch, params, out);
  const std::vector<SequenceSlice>& seqs = batch.seqs;
  const int64_t num_heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(1), dv = v_cache.size(2);
  const int64_t group = num_heads / kv_heads, window = params.sliding_window;
  const float* sink = params.sinks != nullptr ? params.sinks->data<float>() : nullptr;
  constexpr int64_t kQueryBlock = 256;
  std::vector<float> keys, values, scores;
  for (const SequenceSlice& seq : seqs) {
    const int64_t ctx = seq.ctx_len, first_pos = seq.ctx_len - seq.q_len;
    const int64_t key_lo = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
    const int64_t n_keys = ctx - key_lo;
    keys.resize(static_cast<size_t>(n_keys * d));
    values.resize(static_cast<size_t>(n_keys * dv));
    for (int64_t g = 0; g < kv_heads; ++g) {
      gathered_keys_ += n_keys;
      Pool().ParallelFor(n_keys, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          const int64_t p = key_lo + j;
          const int64_t slot = SlotOf(seq.block_table, p, params.block_size);
          std::memcpy(&keys[j * d], k_cache.data<float>() + (slot * kv_heads + g) * d, d * 4);
          std::memcpy(&values[j * dv], v_cache.data<float>() + (slot * kv_heads + g) * dv, dv * 4);
        }
      });
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < seq.q_len; i0 += kQueryBlock) {
          const int64_t rows = std::min<int64_t>(kQueryBlock, seq.q_len - i0);
          const int64_t pos0 = first_pos + i0;
          const int64_t lo = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0;
          const int64_t hi = pos0 + rows;  // keys [lo, hi) cover the whole block
          const int64_t n = hi - lo;
          scores.resize(static_cast<size_t>(rows * n));
          const float* qp = q.data<float>() + ((seq.q_start + i0) * num_heads + h) * d;
          Sgemm(rows, n, d, params.scale, qp, num_heads * d, &keys[(lo - key_lo) * d], d, BLayout::kRowsOfN,
                scores.data(), n);
          Pool().ParallelFor(rows, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
              float* row = &scores[r * n];
              const int64_t pos = pos0 + r;
              const int64_t first = (window > 0 ? std::max<int64_t>(lo, pos - window + 1) : lo) - lo;
              const int64_t last = pos - lo;  // inclusive
              float mx = sink != nullptr ? sink[h] : -INFINITY;
              for (int64_t j = first; j <= last; ++j) {
                if (params.softcap > 0.0f) row[j] = params.softcap * std::tanh(row[j] / params.softcap);
                mx = std::max(mx, row[j]);
              }
              float sum = sink != nullptr ? std::exp(sink[h] - mx) : 0.0f;
              for (int64_t j = first; j <= last; ++j) sum += (row[j] = std::exp(row[j] - mx));
              const float inv = 1.0f / sum;
              for (int64_t j = 0; j < n; ++j) row[j] = (j >= first && j <= last) ? row[j] * inv : 0.0f;
            }
          });
          float* op = out.data<float>() + ((seq.q_start + i0) * num_heads + h) * dv;
          Sgemm(rows, dv, n, 1.0f, scores.data(), n, &values[(lo - key_lo) * dv], dv, BLayout::kRowsOfK, op,
                num_heads * dv);
        }
      }
    }
  }
}

// Decode, verification and draft steps (a few queries a sequence): the gather above would
// copy every key and value of the context out of the cache per KV head, layer and step, and
// wake the pool per head and row, which made such steps cost several times a decode step's
// attention per query (an EAGLE-3 round runs K + 1 verification rows and K draft steps).
// Here one pool task per (sequence, KV head) serves its query heads' rows, reading keys and
// values in place in the paged cache. Each row runs over its own keys alone, starting at
// its first, so its bits do not depend on the other rows of its step: a verification row
// gets the decode row's.
void CpuBackend::FewQueryAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const AttentionBatch& batch, const AttentionParams& params, Tensor& out) const {
  const std::vector<SequenceSlice>& seqs = batch.seqs;
  const int64_t num_heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(1), dv = v_cache.size(2);
  const int64_t group = num_heads / kv_heads, window = params.sliding_window;
  const float* sink = params.sinks != nullptr ? params.sinks->data<float>() : nullptr;
  int64_t work = 0;
  for (const SequenceSlice& seq : seqs) work += int64_t{seq.q_len} * seq.ctx_len * num_heads * (d + dv);
  const int64_t items = static_cast<int64_t>(seqs.size()) * kv_heads;
  ForEach(items, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    std::vector<int64_t> key_rows, tree_rows;
    for (int64_t item = b; item < e; ++item) {
      const SequenceSlice& seq = seqs[item / kv_heads];
      const int64_t g = item % kv_heads;
      const int64_t first_pos = seq.ctx_len - seq.q_len;
      // A tree row's logical position can lie before first_pos (never before tree_base).
      const int64_t lo_pos = seq.tree_base >= 0 ? std::min<int64_t>(first_pos, seq.tree_base) : first_pos;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, lo_pos - window + 1) : 0;
      const int64_t n = seq.ctx_len - lo, nq = seq.q_len * group;
      key_rows.resize(static_cast<size_t>(n));  // each position's row (slot, KV head) in the cache
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = lo + j;
        key_rows[j] = SlotOf(seq.block_table, p, params.block_size) * kv_heads + g;
      }
      scores.resize(static_cast<size_t>(n));
      // Query v is row v / group of the sequence, head g * group + v % group.
      for (int64_t v = 0; v < nq; ++v) {
        const int64_t at = (seq.q_start + v / group) * num_heads + g * group + v % group;
        const float* qv = q.data<float>() + at * d;
        float* o = out.data<float>() + at * dv;
        int64_t pos = first_pos + v / group;
        // The keys the row sees, in position order: keys[0, count).
        const uint64_t tree_word = seq.tree_base >= 0 ? seq.tree_mask[v / group] : 0;
        const int64_t* keys = nullptr;
        int64_t count = 0;
        if (tree_word == 0) {
          const int64_t first = (window > 0 ? std::max<int64_t>(lo, pos - window + 1) : lo) - lo;
          keys = key_rows.data() + first;
          count = pos - lo + 1 - first;
        } else {
          pos = seq.tree_base + std::popcount(tree_word) - 1;  // the row's logical position
          tree_rows.clear();
          for (int64_t p = window > 0 ? std::max<int64_t>(lo, pos - window + 1) : lo; p < seq.tree_base; ++p) {
            tree_rows.push_back(key_rows[p - lo]);
          }
          for (int j = 0; j < 64; ++j) {
            if (tree_word >> j & 1) tree_rows.push_back(key_rows[seq.tree_base + j - lo]);
          }
          keys = tree_rows.data();
          count = static_cast<int64_t>(tree_rows.size());
        }
        const int64_t first = 0, last = count - 1;
        float* row = scores.data();
        const int64_t head = g * group + v % group;
        float mx = sink != nullptr ? sink[head] : -INFINITY;
        for (int64_t j = first; j <= last; ++j) {
          float x = Dot(qv, k_cache.data<float>() + keys[j] * d, d) * params.scale;
          if (params.softcap > 0.0f) x = params.softcap * std::tanh(x / params.softcap);
          row[j] = x;
          mx = std::max(mx, x);
        }
        const float sink_term = sink != nullptr ? std::exp(sink[head] - mx) : 0.0f;
        const float inv = 1.0f / (ExpShiftedSum(row + first, last + 1 - first, mx) + sink_term);
        // o = inv * sum_j row[j] v_j, eight output columns at a time in a register.
        int64_t c0 = 0;
        for (; c0 + 8 <= dv; c0 += 8) {
          const float* vc = v_cache.data<float>() + c0;
          Float8 acc[4] = {};  // four chains of adds in flight, not one
          int64_t j = first;
          for (; j + 4 <= last + 1; j += 4) {
            for (int u = 0; u < 4; ++u) acc[u] += row[j + u] * Load8(vc + keys[j + u] * dv);
          }
          for (; j <= last; ++j) acc[0] += row[j] * Load8(vc + keys[j] * dv);
          acc[0] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) * inv;
          std::memcpy(o + c0, &acc[0], sizeof acc[0]);
        }
        for (; c0 < dv; ++c0) {
          float acc = 0.0f;
          for (int64_t j = first; j <= last; ++j) acc += row[j] * v_cache.data<float>()[keys[j] * dv + c0];
          o[c0] = acc * inv;
        }
      }
    }
  }, work / std::max<int64_t>(1, items));
}

// Batch-invariant attention: each (query row, head) runs over exactly the keys it sees, in
// position order, with plain loops. The sgemm path above sizes its products by the query
// block a row came in (its key range and its row count), so a row's rounding would follow
// its step's batch and chunking.
void CpuBackend::RowwiseAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                  const AttentionBatch& batch, const AttentionParams& params, Tensor& out) const {
  const int64_t num_heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(1), dv = v_cache.size(2);
  const int64_t group = num_heads / kv_heads, window = params.sliding_window;
  const float* sink = params.sinks != nullptr ? params.sinks->data<float>() : nullptr;
  for (const SequenceSlice& seq : batch.seqs) {
    const int64_t first_pos = seq.ctx_len - seq.q_len;
    auto slot = [&](int64_t p) { return SlotOf(seq.block_table, p, params.block_size); };
    Pool().ParallelFor(seq.q_len * num_heads, [&](int64_t b, int64_t e) {
      std::vector<float> scores;
      std::vector<int64_t> keys;  // the positions the row sees, in order
      for (int64_t item = b; item < e; ++item) {
        const int64_t i = item / num_heads, h = item % num_heads, g = h / group;
        const uint64_t tree_word = seq.tree_base >= 0 ? seq.tree_mask[i] : 0;
        // A tree row's logical position (backend.h's SequenceSlice).
        const int64_t pos = tree_word != 0 ? seq.tree_base + std::popcount(tree_word) - 1 : first_pos + i;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
        keys.clear();
        for (int64_t p = lo; p <= pos && (tree_word == 0 || p < seq.tree_base); ++p) keys.push_back(p);
        for (int j = 0; j < 64 && tree_word != 0; ++j) {
          if (tree_word >> j & 1) keys.push_back(seq.tree_base + j);
        }
        const float* qr = q.data<float>() + ((seq.q_start + i) * num_heads + h) * d;
        scores.resize(keys.size());
        float mx = sink != nullptr ? sink[h] : -INFINITY;
        for (size_t j = 0; j < keys.size(); ++j) {
          const float* kr = k_cache.data<float>() + (slot(keys[j]) * kv_heads + g) * d;
          float s = 0.0f;
          for (int64_t c = 0; c < d; ++c) s += qr[c] * kr[c];
          s *= params.scale;
          if (params.softcap > 0.0f) s = params.softcap * std::tanh(s / params.softcap);
          mx = std::max(mx, scores[j] = s);
        }
        float sum = sink != nullptr ? std::exp(sink[h] - mx) : 0.0f;
        for (float& s : scores) sum += (s = std::exp(s - mx));
        const float inv = 1.0f / sum;
        float* o = out.data<float>() + ((seq.q_start + i) * num_heads + h) * dv;
        std::fill(o, o + dv, 0.0f);
        for (size_t j = 0; j < keys.size(); ++j) {
          const float* vr = v_cache.data<float>() + (slot(keys[j]) * kv_heads + g) * dv;
          const float weight = scores[j] * inv;
          for (int64_t c = 0; c < dv; ++c) o[c] += weight * vr[c];
        }
      }
    });
  }
}

void CpuBackend::GatherRows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) {
  const int64_t width = x.numel() / x.size(0);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data<float>() + i * width, x.data<float>() + rows[i] * width, width * 4);
}

void CpuBackend::GatherRowsAt(const Tensor& x, const Tensor& rows, Tensor& out) {
  const int32_t* at = rows.data<int32_t>();
  GatherRows(x, std::vector<int32_t>(at, at + rows.numel()), out);
}

void CpuBackend::SliceColumns(const Tensor& x, int64_t begin, Tensor& out) {
  const int64_t cols = x.size(-1), width = out.size(-1);
  for (int64_t t = 0; t < x.size(0); ++t)
    std::memcpy(out.data<float>() + t * width, x.data<float>() + t * cols + begin, width * 4);
}

void CpuBackend::WriteColumns(const Tensor& x, int64_t begin, Tensor& out) {
  const int64_t cols = out.size(-1), width = x.size(-1);
  for (int64_t t = 0; t < x.size(0); ++t)
    std::memcpy(out.data<float>() + t * cols + begin, x.data<float>() + t * width, width * 4);
}

void CpuBackend::MoeMlp(const Tensor& x, const Tensor& router_logits, const MoeWeights& experts, const MoeSpec& spec,
                        Tensor& out) {
  const int top_k = spec.top_k;
  const bool renormalize = spec.renormalize;
  const int64_t tokens = x.size(0), hidden = x.size(1), num_experts = router_logits.size(1);
  // Route: softmax over experts, keep the top_k (ties to the lower index), renormalize.
  std::vector<std::vector<std::pair<int32_t, float>>> assigned(static_cast<size_t>(num_experts));
  const float* logits = router_logits.data<float>();
  std::vector<float> prob(static_cast<size_t>(num_experts));
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * num_experts;
    const float mx = *std::max_element(l, l + num_experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) sum += (prob[e] = std::exp(l[e] - mx));
    for (float& p : prob) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
    float kept = 0.0f;
    for (int k = 0; k < top_k; ++k) kept += prob[order[k]];
    for (int k = 0; k < top_k; ++k)
      assigned[order[k]].push_back({static_cast<int32_t>(t), renormalize ? prob[order[k]] / kept : prob[order[k]]});
  }
  std::fill(out.data<float>(), out.data<float>() + out.numel(), 0.0f);
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto& routed = assigned[e];
    if (routed.empty()) continue;
    const int64_t n = static_cast<int64_t>(routed.size()), inter = experts.gate[e].size(0);
    std::vector<int32_t> rows(routed.size());
    for (size_t i = 0; i < routed.size(); ++i) rows[i] = routed[i].first;
    Tensor xe = Empty(DType::kF32, {n, hidden});
    Tensor g = Empty(DType::kF32, {n, inter}), u = Empty(DType::kF32, {n, inter}), y = Empty(DType::kF32, {n, hidden});
    GatherRows(x, rows, xe);
    // gpt-oss's expert biases: row e of each [E, n] bias.
    const auto bias_row = [&](const Tensor& b, int64_t n_cols, Tensor& row) -> const Tensor* {
      if (!b.defined()) return nullptr;
      row = Empty(DType::kF32, {n_cols});
      ConvertToF32(b.dtype(), b.data<char>() + e * n_cols * DTypeSize(b.dtype()), row.data<float>(), n_cols);
      return &row;
    };
    Tensor gb, ub, db;
    Linear(xe, experts.gate[e], bias_row(experts.gate_bias, inter, gb), g);
    Linear(xe, experts.up[e], bias_row(experts.up_bias, inter, ub), u);
    if (spec.swiglu_limit > 0.0f) {
      float* gp = g.data<float>();
      const float* up = u.data<float>();
      for (int64_t i = 0; i < n * inter; ++i) gp[i] = ClampedSwiglu(gp[i], up[i], spec.swiglu_limit, spec.swiglu_alpha);
    } else {
      Gate(g.data<float>(), u.data<float>(), n, inter, inter, spec.act, g.data<float>());
    }
    Linear(g, experts.down[e], bias_row(experts.down_bias, hidden, db), y);
    for (int64_t i = 0; i < n; ++i) {
      float* o = out.data<float>() + rows[i] * hidden;
      const float* yr = y.data<float>() + i * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += routed[i].second * yr[c];
    }
  }
}

void CpuBackend::CentroidMaskedLogits(const Tensor& x, const Tensor& centroid_logits, const Tensor& token_ordering,
                                      const Tensor& lm_head, int top_k, Tensor& logits) {
  const int64_t rows = x.size(0), hidden = x.size(1), clusters = centroid_logits.size(1);
  const int64_t vocab = logits.size(1), per_cluster = token_ordering.size(1);
  const int32_t* ordering = token_ordering.data<int32_t>();
  std::fill(logits.data<float>(), logits.data<float>() + logits.numel(), std::numeric_limits<float>::lowest());
  ForEach(
      rows,
      [&](int64_t b, int64_t e) {
        std::vector<int32_t> order(static_cast<size_t>(clusters));
        std::vector<float> embedding(static_cast<size_t>(hidden));
        for (int64_t r = b; r < e; ++r) {
          const float* c = centroid_logits.data<float>() + r * clusters;
          auto key = [&](int32_t i) { return std::isnan(c[i]) ? -std::numeric_limits<float>::infinity() : c[i]; };
          std::iota(order.begin(), order.end(), 0);
          std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b2) {
            return key(a) > key(b2) || (key(a) == key(b2) && a < b2);
          });
          const float* xr = x.data<float>() + r * hidden;
          float* out = logits.data<float>() + r * vocab;
          for (int k = 0; k < top_k; ++k) {
            for (int64_t j = 0; j < per_cluster; ++j) {
              const int32_t token = ordering[order[k] * per_cluster + j];
              ConvertToF32(lm_head.dtype(), static_cast<const char*>(lm_head.raw()) + token * hidden * DTypeSize(lm_head.dtype()),
                           embedding.data(), embedding.size());
              float dot = 0.0f;
              for (int64_t i = 0; i < hidden; ++i) dot += xr[i] * embedding[i];
              out[token] = dot;
            }
          }
        }
      },
      vocab);
}

void CpuBackend::FlagNonFiniteRows(const Tensor& x, Tensor& flags) {
  assert(x.dtype() == DType::kF32);
  const int64_t cols = x.size(-1);
  ForEach(
      Rows(x),
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          // inf and NaN are the floats whose exponent bits are all set; an integer OR
          // reduction over them vectorizes (a float one would not, without fast-math).
          const uint32_t* row = reinterpret_cast<const uint32_t*>(x.data<float>() + r * cols);
          uint32_t bad = 0;
          for (int64_t i = 0; i < cols; ++i) bad |= (row[i] & 0x7f800000u) == 0x7f800000u;
          flags.data<int32_t>()[r] = static_cast<int32_t>(bad);
        }
      },
      cols);
}

}  // namespace hsx
