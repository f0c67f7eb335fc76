#include "backend/backend.h"

#include <algorithm>
#include <utility>

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

namespace {
// x as the weight's input: FP8 codes and row scales when the weight is FP8, so that several
// projections of one input quantize it once.
Tensor InputFor(Backend& backend, const Tensor& x, const Tensor& w) {
  if (w.dtype() != DType::kF8E4M3 || x.dtype() == DType::kF8E4M3) return x;
  return backend.QuantizeRowsFp8(x.View({x.numel() / x.size(-1), x.size(-1)}));
}
}  // namespace

void Backend::Projections(const Tensor& x, const std::vector<Projection>& projections) {
  if (projections.empty()) return;
  const Tensor in = InputFor(*this, x, *projections[0].w);
  for (const Projection& p : projections) Linear(p.w->dtype() == DType::kF8E4M3 ? in : x, *p.w, p.bias, *p.y);
}

void Backend::GatedLinear(const Tensor& x, const Tensor& gate_up, Activation act, Tensor& out) {
  Tensor both = Empty(compute_dtype(), {out.numel() / out.size(-1), gate_up.size(0)});
  Linear(x, gate_up, nullptr, both);
  GatedActivation(both, act, out);
}

void Backend::NormRopeStoreKV(Tensor& q, Tensor& k, Tensor& v, const HeadNorms& norms, const Tensor& positions,
                              const RopeTable& rope, const Tensor& slots, Tensor& k_cache, Tensor& v_cache) {
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
  }
  batch.seqs = std::move(seqs);
  return batch;
}

}  // namespace hsx
