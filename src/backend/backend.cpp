#include "backend/backend.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>
#include <vector>

namespace hsx {

namespace {
struct DoneDownload final : PendingDownload {
  void Wait() override {}
};
}  // namespace

std::unique_ptr<PendingDownload> Backend::DownloadAsync(const Tensor& t, Tensor& host) {
  DownloadTo(t, host);
  return std::make_unique<DoneDownload>();
}

Tensor Backend::RmsNormFp8(Tensor& x, const Tensor* branch, const Tensor* w, float eps, bool one_plus_weight) {
  const int64_t dim = x.size(-1);
  Tensor y = Empty(compute_dtype(), {x.numel() / dim, dim});
  if (branch != nullptr) {
    AddRmsNorm(x, *branch, w, eps, one_plus_weight, y);
  } else {
    RmsNorm(x, w, eps, one_plus_weight, y);
  }
  return QuantizeRowsFp8(y);
}

void Backend::DraftLayerInput(const Tensor& table, const Tensor& ids, const Tensor& hidden, const Tensor& embed_norm,
                              const Tensor& hidden_norm, float eps, bool normed_residual, Tensor& out,
                              Tensor& residual) {
  const int64_t t = ids.numel(), h = hidden.size(-1);
  Tensor embedded = Empty(compute_dtype(), {t, h});
  Embed(table, ids, 1.0f, embedded);
  RmsNorm(embedded, &embed_norm, eps, false, embedded);
  WriteColumns(embedded, 0, out);
  Tensor normed = Empty(compute_dtype(), {t, h});
  RmsNorm(hidden, &hidden_norm, eps, false, normed);
  WriteColumns(normed, h, out);
  Copy(normed_residual ? normed : hidden, residual);
}

Tensor Backend::GatedActivationFp8(const Tensor& gate_up, Activation act) {
  Tensor out = Empty(compute_dtype(), {gate_up.numel() / gate_up.size(-1), gate_up.size(-1) / 2});
  GatedActivation(gate_up, act, out);
  return QuantizeRowsFp8(out);
}

void Backend::GatedLinear(const Tensor& x, const Tensor& gate_up, Activation act, Tensor& out) {
  Tensor both = Empty(compute_dtype(), {out.numel() / out.size(-1), gate_up.size(0)});
  Linear(x, gate_up, nullptr, both);
  GatedActivation(both, act, out);
}

void Backend::NormRopeStoreKV(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms, const Tensor& positions,
                              const RopeTable& rope, const Tensor& slots, Tensor& k_cache, Tensor& v_cache, Tensor& q) {
  const int64_t t = q.size(0), d = q.size(2), q_cols = q.size(1) * d, kv_heads = k_cache.size(1), kv_cols = kv_heads * d;
  assert(qkv.size(-1) == q_cols + (values_are_keys ? 1 : 2) * kv_cols);
  Tensor q_rows = q.View({t, q_cols});
  SliceColumns(qkv, 0, q_rows);
  Tensor k = Empty(q.dtype(), {t, kv_heads, d}), v = Empty(q.dtype(), {t, kv_heads, d});
  Tensor k_rows = k.View({t, kv_cols}), v_rows = v.View({t, kv_cols});
  SliceColumns(qkv, q_cols, k_rows);
  SliceColumns(qkv, values_are_keys ? q_cols : q_cols + kv_cols, v_rows);  // values: the raw keys
  for (auto [x, w] : {std::pair<Tensor*, const Tensor*>{&q, norms.q}, {&k, norms.k}}) {
    if (w != nullptr) {
      RmsNormRope(*x, *w, norms.eps, norms.one_plus_weight, positions, rope);
    } else {
      Rope(*x, positions, rope);
    }
  }
  if (norms.v) RmsNorm(v, nullptr, norms.eps, false, v);
  StoreKV(k, v, slots, k_cache, v_cache);
}

void Backend::QkvAttention(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms, const Tensor& positions,
                           const RopeTable& rope, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                           const AttentionBatch& batch, const AttentionParams& params, Tensor& out) {
  Tensor q = Empty(out.dtype(), out.shape());
  NormRopeStoreKV(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, q);
  Attention(q, k_cache, v_cache, batch, params, out);
}

void Backend::MoveRows(Tensor& x, const Tensor& moves) {
  // The host path (the CPU backend's memory): stage every source, then write.
  assert(x.device() == Device::kCPU && moves.device() == Device::kCPU);
  const int64_t n = moves.numel() / 2, row = static_cast<int64_t>(x.nbytes()) / x.size(0);
  const int32_t* m = moves.data<int32_t>();
  std::vector<char> staged(static_cast<size_t>(n * row));
  for (int64_t i = 0; i < n; ++i) std::memcpy(staged.data() + i * row, x.data<char>() + m[i] * row, row);
  for (int64_t i = 0; i < n; ++i) std::memcpy(x.data<char>() + m[n + i] * row, staged.data() + i * row, row);
}

AttentionBatch MakeAttentionBatch(Backend& backend, std::vector<SequenceSlice> seqs) {
  AttentionBatch batch;
  std::vector<int32_t> info, tables;
  for (const SequenceSlice& s : seqs) {
    info.insert(info.end(), {s.q_start, s.q_len, s.ctx_len, static_cast<int32_t>(tables.size())});
    tables.insert(tables.end(), s.block_table.begin(), s.block_table.end());
    batch.max_q_len = std::max(batch.max_q_len, s.q_len);
  }
  if (backend.device() != Device::kCPU) {  // the CPU reads the host copy
    auto upload = [&](const std::vector<int32_t>& v, Shape shape) {
      Tensor t = Tensor::Host(DType::kI32, std::move(shape));
      std::copy(v.begin(), v.end(), t.data<int32_t>());
      return backend.Upload(t);
    };
    batch.seq_info = upload(info, {static_cast<int64_t>(seqs.size()), 4});
    batch.seq_info_host = std::move(info);
    batch.block_tables = upload(tables, {static_cast<int64_t>(tables.size())});
    // Token trees: one upload of the bases and the rows' mask words (AttentionBatch::tree).
    if (std::any_of(seqs.begin(), seqs.end(), [](const SequenceSlice& s) { return s.tree_base >= 0; })) {
      int64_t rows = 0;
      for (const SequenceSlice& s : seqs) rows = std::max<int64_t>(rows, s.q_start + s.q_len);
      const auto n = static_cast<int64_t>(seqs.size());
      batch.tree_mask_offset = (n + 1) / 2 * 2;
      Tensor t = Tensor::Host(DType::kI32, {batch.tree_mask_offset + 2 * std::max<int64_t>(rows, 1)});
      std::fill_n(t.data<int32_t>(), t.numel(), 0);
      auto* masks = reinterpret_cast<uint64_t*>(t.data<int32_t>() + batch.tree_mask_offset);
      for (int64_t i = 0; i < n; ++i) {
        const SequenceSlice& s = seqs[static_cast<size_t>(i)];
        t.data<int32_t>()[i] = s.tree_base;
        if (s.tree_base < 0) continue;
        assert(static_cast<int32_t>(s.tree_mask.size()) == s.q_len);
        std::copy(s.tree_mask.begin(), s.tree_mask.end(), masks + s.q_start);
      }
      batch.tree = backend.Upload(t);
    }
  }
  batch.seqs = std::move(seqs);
  return batch;
}

}  // namespace hsx
