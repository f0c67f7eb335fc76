#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/draft_tree_kernel.h"
#include "backend/cuda/sampling_kernel.h"
#include "backend/cuda/verification_kernel.h"
#include "backend/verification.h"

namespace hsx {

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device_index, bool batch_invariant) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Error("--device cuda: no CUDA device is visible");
  }
  if (device_index >= count) return Error("--device cuda: device " + std::to_string(device_index) + " does not exist");
  auto impl = std::make_unique<Impl>();
  impl->device = device_index;
  impl->batch_invariant = batch_invariant;
  HSX_CUDA_CHECK(cudaSetDevice(device_index));
  cudaDeviceProp prop;
  HSX_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  impl->name = std::string("cuda:") + prop.name;
  const char* attention = std::getenv("HSX_ATTENTION");
  impl->hopper_attention = prop.major == 9 && !(attention && std::string(attention) == "mma");
  impl->decode_attention = !batch_invariant && EnvOn("HSX_DECODE_ATTENTION");
  impl->gemv = !batch_invariant && EnvOn("HSX_GEMV");
  impl->moe_gemv = !batch_invariant && EnvOn("HSX_MOE_GEMV");
  impl->sm_count = prop.multiProcessorCount;
  HSX_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  HSX_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->copy_stream, cudaStreamNonBlocking));
  Check(cublasLtCreate(&impl->lt), "cublasLtCreate");
  Check(cublasCreate(&impl->blas), "cublasCreate");
  Check(cublasSetStream(impl->blas, impl->stream), "cublasSetStream");
  impl->workspace = impl->allocator->Allocate(GemmPlans::kWorkspaceBytes);
  impl->gemm.lt = impl->lt;
  impl->gemm.stream = impl->stream;
  impl->gemm.workspace = impl->workspace.get();
  impl->gemm.batch_invariant = batch_invariant;
  impl->gemm.profile = impl->profile;
  if (impl->profile) {
    HSX_CUDA_CHECK(cudaEventCreate(&impl->t0));
    HSX_CUDA_CHECK(cudaEventCreate(&impl->t1));
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  // Data-parallel replicas on other devices are destroyed from one thread: make ours current.
  cudaSetDevice(impl_->device);
  cudaStreamSynchronize(impl_->stream);
  if (impl_->profile) {
    double total = 0;
    for (const auto& [name, e] : impl_->profile_ms) total += e.first;
    for (const auto& [name, e] : impl_->profile_ms)
      std::fprintf(stderr, "hsx profile: %-18s %10.1f ms %5.1f%% %8ld calls\n", name.c_str(), e.first,
                   100.0 * e.first / total, static_cast<long>(e.second));
  }
  for (auto& [key, p] : impl_->gemm.plans) GemmPlans::DestroyPlan(p);
  cublasLtDestroy(impl_->lt);
  cublasDestroy(impl_->blas);
  cudaStreamDestroy(impl_->stream);
  cudaStreamDestroy(impl_->copy_stream);
}

std::string CudaBackend::name() const { return impl_->name; }
bool CudaBackend::batch_invariant() const { return impl_->batch_invariant; }
size_t CudaBackend::peak_memory_bytes() const { return impl_->allocator->peak(); }

Tensor CudaBackend::Empty(DType dtype, Shape shape) {
  const size_t bytes = static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype);
  std::shared_ptr<void> owner = impl_->allocator->Allocate(bytes);
  void* p = owner.get();
  return Tensor(p, dtype, std::move(shape), Device::kCUDA, std::move(owner));
}

Tensor CudaBackend::Upload(const Tensor& host) {
  Tensor t = Empty(host.dtype(), host.shape());
  HSX_CUDA_CHECK(cudaMemcpyAsync(t.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, impl_->stream));
  return t;
}

Tensor CudaBackend::UploadWeight(const Tensor& host) {
  if (host.dtype() == DType::kBF16 || (host.dtype() != DType::kF32 && host.dtype() != DType::kF16)) return Upload(host);
  const Tensor raw = Upload(host);
  Tensor t = Empty(DType::kBF16, host.shape());
  cuda::ConvertToBF16(raw.raw(), host.dtype() == DType::kF32 ? 0 : 1, host.numel(), B(t), impl_->stream);
  HSX_LAUNCH_CHECK();
  return t;
}

Tensor CudaBackend::Download(const Tensor& t) {
  Tensor host = Tensor::Host(t.dtype(), t.shape());
  HSX_CUDA_CHECK(cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, impl_->stream));
  HSX_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  return host;
}

Tensor CudaBackend::HostBuffer(DType dtype, Shape shape) {
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype));
  void* p = nullptr;
  HSX_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  std::shared_ptr<void> owner(p, [](void* q) { cudaFreeHost(q); });
  return Tensor(p, dtype, std::move(shape), Device::kCPU, std::move(owner));
}

void CudaBackend::DownloadTo(const Tensor& t, Tensor& host) {
  Impl::Timer timer(*impl_, "download");
  HSX_CUDA_CHECK(cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, impl_->stream));
  HSX_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

namespace {
struct CudaPendingDownload final : PendingDownload {
  cudaEvent_t done = nullptr;
  ~CudaPendingDownload() override { cudaEventDestroy(done); }
  void Wait() override { HSX_CUDA_CHECK(cudaEventSynchronize(done)); }
};
}  // namespace

std::unique_ptr<PendingDownload> CudaBackend::DownloadAsync(const Tensor& t, Tensor& host) {
  auto pending = std::make_unique<CudaPendingDownload>();
  cudaEvent_t ready;
  HSX_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  HSX_CUDA_CHECK(cudaEventCreateWithFlags(&pending->done, cudaEventDisableTiming));
  HSX_CUDA_CHECK(cudaEventRecord(ready, impl_->stream));
  HSX_CUDA_CHECK(cudaStreamWaitEvent(impl_->copy_stream, ready));
  HSX_CUDA_CHECK(cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, impl_->copy_stream));
  HSX_CUDA_CHECK(cudaEventRecord(pending->done, impl_->copy_stream));
  HSX_CUDA_CHECK(cudaEventDestroy(ready));  // released once the copy stream has passed it
  return pending;
}

void CudaBackend::Copy(const Tensor& src, Tensor& dst) {
  Impl::Timer timer(*impl_, "copy");
  HSX_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, impl_->stream));
}

void CudaBackend::Synchronize() { HSX_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

void CudaBackend::UploadTo(const Tensor& host, Tensor& dst) {
  HSX_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, impl_->stream));
}

void CudaBackend::PinThread() { HSX_CUDA_CHECK(cudaSetDevice(impl_->device)); }
int CudaBackend::device_index() const { return impl_->device; }
void* CudaBackend::compute_stream() const { return impl_->stream; }

// HSX_PROFILE times each op with events and synchronizes, which a recording cannot hold.
bool CudaBackend::can_record() const { return !impl_->profile; }

namespace {
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void Replay() override { HSX_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};
}  // namespace

std::unique_ptr<DeviceGraph> CudaBackend::Record(const std::function<void()>& work) {
  // Relaxed: an allocation the graph pool lacks may cudaMalloc while recording.
  HSX_CUDA_CHECK(cudaStreamBeginCapture(impl_->stream, cudaStreamCaptureModeRelaxed));
  impl_->allocator->set_recording(true);
  work();
  impl_->allocator->set_recording(false);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(impl_->stream, &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    std::fprintf(stderr, "hsx: recording a CUDA graph failed (%s); running without\n", cudaGetErrorString(ended));
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "hsx: instantiating a CUDA graph failed (%s); running without\n", cudaGetErrorString(made));
    return nullptr;
  }
  return std::make_unique<CudaGraph>(exec, impl_->stream);
}

void CudaBackend::FillUniform(Tensor& t, uint64_t seed, float lo, float hi) {
  cuda::FillUniform(B(t), t.numel(), seed, lo, hi, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Embed(const Tensor& table, const Tensor& ids, float scale, Tensor& out) {
  Impl::Timer timer(*impl_, "embed");
  cuda::Embed(B(table), ids.data<int32_t>(), ids.numel(), table.size(1), scale, B(out), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t m = RowsOf(x), k = x.size(-1), n = w.size(0);
  if (m == 0) return;
  // cuBLASLt reads x and w while writing y, and tuning writes y before the real call.
  if (Overlap(y, x) || Overlap(y, w)) {
    std::fprintf(stderr, "hsx: Linear's output overlaps its input or weight\n");
    std::abort();
  }
  if (w.dtype() == DType::kF8E4M3) return LinearFp8(x, w, bias, y);
  const bool gemv = impl_->gemv && x.dtype() == DType::kBF16 && w.dtype() == DType::kBF16 &&
                    (y.dtype() == DType::kBF16 || y.dtype() == DType::kF32) &&
                    cuda::GemvSupports(x.raw(), w.raw(), m, k);
  // Planning (and tuning) comes before the timer so the profile shows only the GEMM.
  const GemmPlans::Plan* p = gemv ? nullptr : &impl_->gemm.GetPlan(m, n, k, y.dtype(), w.raw(), x.raw(), y.raw());
  const std::string gemv_label = gemv && impl_->profile ? GemmPlans::LinearLabel(n, k) : std::string();
  Impl::Timer timer(*impl_, gemv ? std::string_view(gemv_label) : std::string_view(p->label));
  if (gemv) {
    cuda::Gemv(B(x), B(w), m, n, k, y.raw(), y.dtype() == DType::kF32, impl_->stream, impl_->programmatic);
    HSX_LAUNCH_CHECK();
  } else {
    Check(impl_->gemm.Matmul(*p, p->algo, w.raw(), x.raw(), y.raw()), "cublasLtMatmul");
  }
  if (bias != nullptr) {
    cuda::AddBias(y.raw(), y.dtype() == DType::kF32, B(*bias), m, n, impl_->stream);
    HSX_LAUNCH_CHECK();
  }
}

// x comes quantized per row, or is quantized here (tensor/float8.h's rule) into scratch
// that lives until the stream has used it: the allocator reuses memory in stream order.
void CudaBackend::LinearFp8(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t m = RowsOf(x), k = x.size(-1), n = w.size(0);
  if ((x.dtype() != DType::kBF16 && x.dtype() != DType::kF8E4M3) || y.dtype() != DType::kBF16 ||
      w.row_scales() == nullptr) {
    std::fprintf(stderr, "hsx: an FP8 Linear takes bf16 or FP8 x, bf16 y and a weight with row scales\n");
    std::abort();
  }
  const Tensor xq = x.dtype() == DType::kF8E4M3 ? x : QuantizeRowsFp8(x.View({m, k}));
  const float* w_scales = w.row_scales()->data<float>();
  const GemmPlans::Plan& p = impl_->gemm.GetPlan(m, n, k, y.dtype(), w.raw(), xq.raw(), y.raw(),
                                       std::make_pair(w_scales, xq.row_scales()->data<float>()));
  Impl::Timer timer(*impl_, p.label);
  Check(impl_->gemm.Matmul(p, p.algo, w.raw(), xq.raw(), y.raw()), "cublasLtMatmul (fp8)");
  if (bias != nullptr) {
    cuda::AddBias(y.raw(), y.dtype() == DType::kF32, B(*bias), m, n, impl_->stream);
    HSX_LAUNCH_CHECK();
  }
}

Tensor CudaBackend::QuantizeRowsFp8(const Tensor& x) {
  const int64_t n = x.size(0), k = x.size(1);
  if (x.dtype() != DType::kBF16 || k % 16 != 0) {  // FP8 GEMMs read 16-byte rows
    std::fprintf(stderr, "hsx: FP8 rows are quantized from bf16 with a multiple of 16 columns (got %s, %ld)\n",
                 std::string(DTypeName(x.dtype())).c_str(), static_cast<long>(k));
    std::abort();
  }
  Tensor q = Empty(DType::kF8E4M3, x.shape());
  Tensor scales = Empty(DType::kF32, {n});
  Impl::Timer timer(*impl_, "quantize_fp8");
  cuda::QuantizeRowsFp8(B(x), n, k, q.data<uint8_t>(), scales.data<float>(), impl_->stream);
  HSX_LAUNCH_CHECK();
  return q.WithRowScales(scales);
}

Tensor CudaBackend::RmsNormFp8(Tensor& x, const Tensor* branch, const Tensor* w, float eps, bool one_plus_weight) {
  const int64_t rows = RowsOf(x), dim = x.size(-1);
  if (impl_->fp8_fused_inputs && x.dtype() == DType::kBF16 && dim % 16 == 0) {  // FP8 GEMMs read 16-byte rows
    Tensor q = Empty(DType::kF8E4M3, {rows, dim});
    Tensor scales = Empty(DType::kF32, {rows});
    Impl::Timer timer(*impl_, branch != nullptr ? "add_rmsnorm_fp8" : "rmsnorm_fp8");
    if (cuda::RmsNormFp8(B(x), branch != nullptr ? B(*branch) : nullptr, w != nullptr ? B(*w) : nullptr, rows, dim,
                         eps, one_plus_weight, q.data<uint8_t>(), scales.data<float>(), impl_->stream)) {
      HSX_LAUNCH_CHECK();
      return q.WithRowScales(scales);
    }
  }
  return Backend::RmsNormFp8(x, branch, w, eps, one_plus_weight);
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor* w, float eps, bool one_plus_weight, Tensor& y) {
  Impl::Timer timer(*impl_, "rmsnorm");
  cuda::RmsNorm(B(x), w ? B(*w) : nullptr, RowsOf(x), x.size(-1), eps, one_plus_weight, B(y), impl_->stream,
                impl_->programmatic);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::AddRmsNorm(Tensor& residual, const Tensor& branch, const Tensor* w, float eps, bool one_plus_weight,
                             Tensor& y) {
  Impl::Timer timer(*impl_, "add_rmsnorm");
  cuda::AddRmsNorm(B(residual), B(branch), w ? B(*w) : nullptr, RowsOf(residual), residual.size(-1), eps,
                   one_plus_weight, B(y), impl_->stream, impl_->programmatic);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Add(Tensor& acc, const Tensor& x) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Add(B(acc), B(x), acc.numel(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Multiply(Tensor& acc, const Tensor& x) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Multiply(B(acc), B(x), acc.numel(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Scale(Tensor& x, float s) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Scale(B(x), x.numel(), s, nullptr, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::ScaleByTensor(Tensor& x, const Tensor& scalar) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Scale(B(x), x.numel(), 1.0f, B(scalar), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Softcap(Tensor& x, float cap) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Softcap(x.raw(), x.dtype() == DType::kF32, x.numel(), cap, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Activate(Tensor& x, Activation act) {
  Impl::Timer timer(*impl_, "elementwise");
  cuda::Activate(B(x), x.numel(), act == Activation::kSilu ? 0 : 1, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::GatedLinear(const Tensor& x, const Tensor& gate_up, Activation act, Tensor& out) {
  const int64_t m = RowsOf(x), k = x.size(-1), n = gate_up.size(0) / 2;
  const bool fused = impl_->gemv && impl_->gated_gemv && out.dtype() == DType::kBF16 &&
                     gate_up.dtype() == DType::kBF16 && cuda::GemvSupports(x.raw(), gate_up.raw(), m, k);
  if (!fused) return Backend::GatedLinear(x, gate_up, act, out);
  if (Overlap(out, x)) {
    std::fprintf(stderr, "hsx: GatedLinear's output overlaps its input\n");
    std::abort();
  }
  const std::string label = impl_->profile ? "gated " + GemmPlans::LinearLabel(2 * n, k) : std::string();
  Impl::Timer timer(*impl_, label);
  cuda::GatedGemv(B(x), B(gate_up), m, n, k, act == Activation::kSilu ? 0 : 1, B(out), impl_->stream,
                  impl_->programmatic);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::GatedActivation(const Tensor& gate_up, Activation act, Tensor& out) {
  Impl::Timer timer(*impl_, "gated_act");
  const int64_t cols = out.size(-1);
  cuda::GatedActivation(B(gate_up), B(gate_up) + cols, RowsOf(out), cols, 2 * cols, act == Activation::kSilu ? 0 : 1,
                        B(out), impl_->stream);
  HSX_LAUNCH_CHECK();
}

Tensor CudaBackend::GatedActivationFp8(const Tensor& gate_up, Activation act) {
  const int64_t rows = RowsOf(gate_up), cols = gate_up.size(-1) / 2;
  if (impl_->fp8_fused_inputs && gate_up.dtype() == DType::kBF16 && cols % 16 == 0) {  // FP8 GEMMs read 16-byte rows
    Tensor q = Empty(DType::kF8E4M3, {rows, cols});
    Tensor scales = Empty(DType::kF32, {rows});
    Impl::Timer timer(*impl_, "gated_act_fp8");
    if (cuda::GatedActivationFp8(B(gate_up), B(gate_up) + cols, rows, cols, 2 * cols,
                                 act == Activation::kSilu ? 0 : 1, q.data<uint8_t>(), scales.data<float>(),
                                 impl_->stream)) {
      HSX_LAUNCH_CHECK();
      return q.WithRowScales(scales);
    }
  }
  return Backend::GatedActivationFp8(gate_up, act);
}

namespace {
// The args of NormRopeStore for x [T, heads, D] alone (q's part).
cuda::NormRopeStoreArgs HeadArgs(Tensor& x, const Tensor* w, float eps, bool one_plus_weight, const Tensor& positions,
                                 const RopeTable& rope) {
  cuda::NormRopeStoreArgs a;
  a.q_in = B(x);
  a.q_stride = x.size(1) * x.size(2);
  a.q = B(x);
  a.q_norm = w != nullptr ? B(*w) : nullptr;
  a.q_heads = static_cast<int>(x.size(1));
  a.positions = positions.data<int32_t>();
  a.inv_freq = rope.inv_freq.data<float>();
  a.rotary_dims = rope.rotary_dims;
  a.tokens = x.size(0);
  a.dim = static_cast<int>(x.size(2));
  a.eps = eps;
  a.one_plus_weight = one_plus_weight;
  return a;
}
}  // namespace

void CudaBackend::Rope(Tensor& x, const Tensor& positions, const RopeTable& rope) {
  Impl::Timer timer(*impl_, "rope");
  LaunchNormRopeStore(HeadArgs(x, nullptr, 0.0f, false, positions, rope), FusedNormRopeTakes(x.size(0)));
}

void CudaBackend::RmsNormRope(Tensor& x, const Tensor& w, float eps, bool one_plus_weight, const Tensor& positions,
                              const RopeTable& rope) {
  Impl::Timer timer(*impl_, "norm_rope");
  LaunchNormRopeStore(HeadArgs(x, &w, eps, one_plus_weight, positions, rope), FusedNormRopeTakes(x.size(0)));
}

// The one-warp-per-head kernel (norm_rope_store.cu) for decode-sized steps, the per-token
// one (norm_rope.cu) for prefill. They give the same bits (tested); batch-invariant runs
// still keep the one kernel for every size.
bool CudaBackend::FusedNormRopeTakes(int64_t tokens) const {
  return !impl_->batch_invariant && tokens <= kFusedNormRopeMaxTokens;
}

void CudaBackend::NormRopeStoreKV(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms,
                                  const Tensor& positions, const RopeTable& rope, const Tensor& slots, Tensor& k_cache,
                                  Tensor& v_cache, Tensor& q) {
  if (qkv.dtype() != DType::kBF16)
    return Backend::NormRopeStoreKV(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, q);
  Impl::Timer timer(*impl_, "norm_rope_store");
  LaunchNormRopeStore(FusedRowsArgs(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, q),
                      impl_->fuse_norm_rope_store && FusedNormRopeTakes(q.size(0)));
}

// The one-warp-per-head kernel for decode-sized steps (launched programmatically when the
// backend is), the per-token one for prefill: the same bits.
void CudaBackend::LaunchNormRopeStore(const cuda::NormRopeStoreArgs& a, bool decode_sized) {
  if (decode_sized) {
    cuda::NormRopeStore(a, impl_->stream, impl_->programmatic);
  } else {
    cuda::NormRopeStoreRows(a, impl_->stream);
  }
  HSX_LAUNCH_CHECK();
}

// NormRopeStore's args for the fused q/k/v rows (NormRopeStoreKV's), q written to q.
cuda::NormRopeStoreArgs CudaBackend::FusedRowsArgs(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms,
                                                   const Tensor& positions, const RopeTable& rope, const Tensor& slots,
                                                   Tensor& k_cache, Tensor& v_cache, Tensor& q) {
  const int64_t q_cols = q.size(1) * q.size(2), kv_cols = k_cache.size(1) * k_cache.size(2);
  cuda::NormRopeStoreArgs a = HeadArgs(q, norms.q, norms.eps, norms.one_plus_weight, positions, rope);
  a.q_in = B(qkv);
  a.q_stride = qkv.size(-1);
  a.k = B(qkv) + q_cols;
  a.k_norm = norms.k != nullptr ? B(*norms.k) : nullptr;
  a.v = values_are_keys ? a.k : a.k + kv_cols;
  a.kv_stride = qkv.size(-1);
  a.v_norm = norms.v;
  a.kv_heads = static_cast<int>(k_cache.size(1));
  a.slots = slots.data<int32_t>();
  a.k_cache = B(k_cache);
  a.v_cache = B(v_cache);
  return a;
}

void CudaBackend::StoreKV(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache) {
  Impl::Timer timer(*impl_, "store_kv");
  cuda::StoreKV(B(k), B(v), slots.data<int32_t>(), k.size(0), k.numel() / k.size(0), v.numel() / v.size(0),
                B(k_cache), B(v_cache), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::Attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                            const AttentionParams& params, Tensor& out) {
  Impl::Timer timer(*impl_, "attention");
  cuda::AttentionArgs a = AttentionArgsFor(k_cache, v_cache, batch, params, out);
  a.q = B(q);
  if (!LaunchAttention(a)) {
    std::fprintf(stderr, "hsx: CUDA attention supports head dims 16, 32, 64, 128, 256, 512; got %d\n", a.head_dim);
    std::abort();
  }
  HSX_LAUNCH_CHECK();
}

// The split-KV decode kernel makes its own inputs (attention_decode.cu) where it takes the
// step and NormRopeStoreKV would run its one-warp-per-head kernel; else the two ops.
void CudaBackend::QkvAttention(const Tensor& qkv, bool values_are_keys, const HeadNorms& norms,
                               const Tensor& positions, const RopeTable& rope, const Tensor& slots, Tensor& k_cache,
                               Tensor& v_cache, const AttentionBatch& batch, const AttentionParams& params,
                               Tensor& out) {
  if (FusesAttentionInputs(qkv, k_cache, rope, batch, out)) {
    Impl::Timer timer(*impl_, "qkv_attention");
    cuda::AttentionArgs a = AttentionArgsFor(k_cache, v_cache, batch, params, out);
    a.inputs = FusedRowsArgs(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, out);
    a.inputs.q = nullptr;  // q stays in the kernel
    a.q = nullptr;
    if (LaunchAttention(a)) {
      HSX_LAUNCH_CHECK();
      return;
    }
  }
  Backend::QkvAttention(qkv, values_are_keys, norms, positions, rope, slots, k_cache, v_cache, batch, params, out);
}

bool CudaBackend::FusesAttentionInputs(const Tensor& qkv, const Tensor& k_cache, const RopeTable& rope,
                                       const AttentionBatch& batch, const Tensor& out) const {
  if (!impl_->fuse_attention_inputs || !impl_->fuse_norm_rope_store || !FusedNormRopeTakes(out.size(0)) ||
      !DecodeAttentionTakes(batch.max_q_len) || qkv.dtype() != DType::kBF16 || rope.rotary_dims > out.size(2))
    return false;
  return PlanDecode(static_cast<int>(batch.seq_info.size(0)), batch.max_q_len, static_cast<int>(out.size(1)),
                    static_cast<int>(k_cache.size(1)), static_cast<int>(out.size(2)))
      .fused_inputs;
}

cuda::DecodeSplits CudaBackend::PlanDecode(int num_seqs, int max_q_len, int num_heads, int kv_heads,
                                           int head_dim) const {
  int capacity = 0;
  if (impl_->decode_cluster_merge) {
    auto [it, added] = impl_->decode_cluster_capacity.try_emplace(head_dim, 0);
    if (added) it->second = cuda::DecodeClusterCapacity(head_dim);
    capacity = it->second;
  }
  return cuda::PlanDecodeSplits(num_seqs, max_q_len, num_heads, kv_heads, head_dim, impl_->sm_count, capacity);
}

bool CudaBackend::DecodeAttentionTakes(int max_q_len) const {
  return impl_->decode_attention && max_q_len <= impl_->decode_attention_rows;
}

cuda::AttentionArgs CudaBackend::AttentionArgsFor(const Tensor& k_cache, const Tensor& v_cache,
                                                  const AttentionBatch& batch, const AttentionParams& params,
                                                  Tensor& out) const {
  cuda::AttentionArgs a;
  a.k_cache = B(k_cache);
  a.v_cache = B(v_cache);
  a.cache_slots = k_cache.size(0);
  a.out = B(out);
  a.seq_info = batch.seq_info.data<int32_t>();
  a.host_seq_info = batch.seq_info_host.data();
  a.block_tables = batch.block_tables.data<int32_t>();
  a.num_seqs = static_cast<int>(batch.seq_info.size(0));  // a recorded batch has no host slices
  a.max_q_len = batch.max_q_len;
  a.num_heads = static_cast<int>(out.size(1));
  a.kv_heads = static_cast<int>(k_cache.size(1));
  a.head_dim = static_cast<int>(out.size(2));
  a.block_size = params.block_size;
  a.sliding_window = params.sliding_window;
  a.scale = params.scale;
  a.softcap = params.softcap;
  a.sinks = params.sinks != nullptr ? params.sinks->data<float>() : nullptr;
  if (batch.tree.defined()) {
    a.tree_base = batch.tree.data<int32_t>();
    a.tree_mask = reinterpret_cast<const uint64_t*>(batch.tree.data<int32_t>() + batch.tree_mask_offset);
  }
  a.hopper = impl_->hopper_attention;
  a.batch_invariant = impl_->batch_invariant;
  a.programmatic = impl_->programmatic;
  return a;
}

// Plans the split-KV chunks of a decode step, then launches; false (nothing launched) for
// an unsupported head dim.
bool CudaBackend::LaunchAttention(cuda::AttentionArgs& a) {
  Tensor workspace;  // freed after the launch: the allocator reuses memory in stream order
  if (DecodeAttentionTakes(a.max_q_len)) {
    const cuda::DecodeSplits splits = PlanDecode(a.num_seqs, a.max_q_len, a.num_heads, a.kv_heads, a.head_dim);
    a.decode_splits = splits.count;
    a.decode_cluster_merge = splits.cluster_merge;
    const size_t bytes = cuda::DecodeAttentionWorkspaceBytes(a.num_seqs, a.max_q_len, a.num_heads, a.head_dim,
                                                             a.decode_splits, a.decode_cluster_merge);
    if (bytes > 0) {
      workspace = Empty(DType::kF32, {static_cast<int64_t>(bytes / sizeof(float))});
      a.decode_workspace = workspace.data<float>();
    }
  }
  return cuda::Attention(a, impl_->stream);
}

void CudaBackend::GatherRows(const Tensor& x, const std::vector<int32_t>& rows, Tensor& out) {
  Impl::Timer timer(*impl_, "gather");
  Tensor host = Tensor::Host(DType::kI32, {static_cast<int64_t>(rows.size())});
  std::copy(rows.begin(), rows.end(), host.data<int32_t>());
  const Tensor idx = Upload(host);
  cuda::GatherRows(x.raw(), idx.data<int32_t>(), static_cast<int64_t>(rows.size()),
                   static_cast<int64_t>(x.nbytes() / x.size(0)), out.raw(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::GatherRowsAt(const Tensor& x, const Tensor& rows, Tensor& out) {
  Impl::Timer timer(*impl_, "gather");
  cuda::GatherRows(x.raw(), rows.data<int32_t>(), rows.numel(), static_cast<int64_t>(x.nbytes() / x.size(0)), out.raw(),
                   impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::MoveRows(Tensor& x, const Tensor& moves) {
  Impl::Timer timer(*impl_, "move_rows");
  const int64_t n = moves.numel() / 2, row_bytes = static_cast<int64_t>(x.nbytes()) / x.size(0);
  Tensor scratch;  // freed after the launch: the allocator reuses memory in stream order
  if (const int64_t bytes = cuda::MoveRowsScratchBytes(n, row_bytes); bytes > 0) scratch = Empty(DType::kI32, {bytes / 4});
  cuda::MoveRows(x.raw(), moves.data<int32_t>(), n, row_bytes, scratch.defined() ? scratch.raw() : nullptr,
                 impl_->stream);
  HSX_LAUNCH_CHECK();
}

namespace {

// Plain data of 4-byte words (SamplingRow, TokenAdjust, int32) to the device, at least one word.
Tensor UploadWords(Backend& backend, const void* data, size_t bytes) {
  Tensor host = Tensor::Host(DType::kI32, {static_cast<int64_t>(std::max<size_t>(bytes / 4, 1))});
  if (bytes > 0) std::memcpy(host.raw(), data, bytes);
  return backend.Upload(host);
}

}  // namespace

SampledTokens CudaBackend::Sample(const Tensor& logits, const SamplingBatch& batch, const SampledAhead& ahead) {
  Impl::Timer timer(*impl_, "sample");
  const auto rows = static_cast<int32_t>(logits.size(0));
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const int32_t width = batch.max_logprobs;
  // Parameters up; one download of every result.
  const Tensor params = UploadWords(*this, batch.rows.data(), batch.rows.size() * sizeof(SamplingRow));
  const Tensor adjust = UploadWords(*this, batch.adjust.data(), batch.adjust.size() * sizeof(TokenAdjust));
  Tensor work = Empty(DType::kF32, {rows, 2 * vocab});  // sampling_device.cuh's row scratch
  Tensor out = Empty(DType::kI32, {2 * rows + 2 * rows * width});
  cuda::Sample(logits.data<float>(), rows, vocab, static_cast<const SamplingRow*>(params.raw()),
               static_cast<const TokenAdjust*>(adjust.raw()), width, work.data<float>(), out.data<int32_t>(),
               impl_->stream);
  HSX_LAUNCH_CHECK();
  Tensor host;
  if (ahead) {
    // The download waits for the sampling alone (on the copy stream), not for what `ahead`
    // queues after it.
    if (!impl_->sample_host.defined() || impl_->sample_host.numel() < out.numel()) {
      impl_->sample_host = HostBuffer(DType::kI32, {out.numel()});
    }
    host = impl_->sample_host.Rows(0, out.numel());
    const std::unique_ptr<PendingDownload> download = DownloadAsync(out, host);
    ahead(out.Rows(0, rows));
    download->Wait();
  } else {
    host = Download(out);
  }
  const int32_t* words = host.data<int32_t>();
  SampledTokens result;
  result.tokens.assign(words, words + rows);
  result.logprobs.resize(rows);
  std::memcpy(result.logprobs.data(), words + rows, rows * sizeof(float));
  result.top_ids.assign(words + 2 * rows, words + 2 * rows + rows * width);
  result.top_logprobs.resize(static_cast<size_t>(rows) * width);
  std::memcpy(result.top_logprobs.data(), words + 2 * rows + rows * width, result.top_logprobs.size() * sizeof(float));
  return result;
}

void CudaBackend::GreedyTokens(const Tensor& logits, const Tensor* offsets, Tensor& tokens) {
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const auto k = static_cast<int32_t>(tokens.dim() > 1 ? tokens.size(1) : 1);
  if (k > vocab) {
    std::fprintf(stderr, "hsx: GreedyTokens: %d tokens asked of a row of %d\n", k, vocab);
    std::abort();
  }
  cuda::GreedyTokens(logits.data<float>(), static_cast<int32_t>(logits.size(0)), vocab, k,
                     offsets != nullptr ? offsets->data<int32_t>() : nullptr, tokens.data<int32_t>(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::TopLogprobs(const Tensor& logits, const Tensor* offsets, Tensor& ids, Tensor& logprobs) {
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const auto k = static_cast<int32_t>(ids.size(1));
  if (k > vocab) {
    std::fprintf(stderr, "hsx: TopLogprobs: %d tokens asked of a row of %d\n", k, vocab);
    std::abort();
  }
  cuda::TopLogprobs(logits.data<float>(), static_cast<int32_t>(logits.size(0)), vocab, k,
                    offsets != nullptr ? offsets->data<int32_t>() : nullptr, ids.data<int32_t>(),
                    logprobs.data<float>(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::ExpandDraftTrees(const Tensor& ids, const Tensor& logprobs, int d, DraftTreeState& state,
                                   Tensor* next_ids, Tensor* next_rows, Tensor* next_masks) {
  cuda::ExpandDraftTrees(ids.data<int32_t>(), logprobs.data<float>(), static_cast<int32_t>(state.tokens.size(0)),
                         state.topk, d, state.tokens.size(1), state.tokens.data<int32_t>(), state.scores.data<float>(),
                         state.parents.data<int32_t>(), state.frontier.data<int32_t>(),
                         static_cast<uint64_t*>(state.masks.raw()),
                         next_ids != nullptr ? next_ids->data<int32_t>() : nullptr,
                         next_rows != nullptr ? next_rows->data<int32_t>() : nullptr,
                         next_masks != nullptr ? static_cast<uint64_t*>(next_masks->raw()) : nullptr, impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::SelectDraftTrees(const DraftTreeState& state, const Tensor& limits, Tensor& out) {
  cuda::SelectDraftTrees(state.tokens.data<int32_t>(), state.scores.data<float>(), state.parents.data<int32_t>(),
                         static_cast<int32_t>(state.tokens.size(0)), state.tokens.size(1), limits.data<int32_t>(),
                         static_cast<int32_t>(out.size(1) / 2), out.data<int32_t>(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

VerifiedTokens CudaBackend::VerifyDrafts(const Tensor& logits, const Tensor* draft_probs, const VerificationBatch& batch,
                                         Tensor* target_probs) {
  Impl::Timer timer(*impl_, "verify");
  if (!batch.parents.empty()) {
    // Token trees. Greedy trees need each row's greedy token alone: the Sample op's, a few
    // words a row; others run the tree kernels. Target probabilities (tests) and draft
    // probabilities (trees take one-hot drafts only) take the host's rules.
    if (target_probs == nullptr && draft_probs == nullptr && IsGreedyTree(batch)) {
      VerificationRowBegins(batch, logits.size(0), static_cast<int32_t>(logits.size(1)));
      return VerifyGreedyTree(Sample(logits, batch.sampling), batch);
    }
    if (target_probs == nullptr && draft_probs == nullptr) return VerifyTree(logits, batch);
    const Tensor host_logits = Download(logits);
    Tensor host_probs;
    if (target_probs != nullptr) host_probs = Tensor::Host(DType::kF32, target_probs->shape());
    const Tensor host_draft_probs = draft_probs != nullptr ? Download(*draft_probs) : Tensor();
    VerifiedTokens v = VerifyDraftsOnHost(host_logits, draft_probs != nullptr ? &host_draft_probs : nullptr, batch,
                                          target_probs != nullptr ? &host_probs : nullptr);
    if (target_probs != nullptr) UploadTo(host_probs, *target_probs);
    return v;
  }
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const std::vector<int32_t> begins = VerificationRowBegins(batch, logits.size(0), vocab);
  const auto requests = static_cast<int32_t>(batch.num_drafts.size());
  const int32_t rows = begins.back(), width = batch.sampling.max_logprobs;
  VerifiedTokens result;
  if (requests == 0) return result;
  // Row begins, each row's draft index (-1: a bonus row) and the drafts, in one upload.
  std::vector<int32_t> index(begins);
  for (int32_t r = 0, d = 0; r < requests; ++r) {
    for (int32_t j = 0; j < batch.num_drafts[r]; ++j) index.push_back(d++);
    index.push_back(-1);
  }
  index.insert(index.end(), batch.drafts.begin(), batch.drafts.end());
  const Tensor params = UploadWords(*this, batch.sampling.rows.data(), batch.sampling.rows.size() * sizeof(SamplingRow));
  const Tensor adjust =
      UploadWords(*this, batch.sampling.adjust.data(), batch.sampling.adjust.size() * sizeof(TokenAdjust));
  const Tensor indices = UploadWords(*this, index.data(), index.size() * sizeof(int32_t));
  Tensor work = Empty(DType::kF32, {rows, 2 * vocab});  // sampling_device.cuh's row scratch
  const int64_t result_words = requests + 2 * rows + 2 * static_cast<int64_t>(rows) * width;
  Tensor out = Empty(DType::kI32, {result_words + rows});  // the rows' accept flags after the results
  cuda::VerifyDrafts(logits.data<float>(), rows, requests, vocab, static_cast<const SamplingRow*>(params.raw()),
                     static_cast<const TokenAdjust*>(adjust.raw()), width, indices.data<int32_t>(),
                     draft_probs ? draft_probs->data<float>() : nullptr,
                     target_probs ? target_probs->data<float>() : nullptr, batch.forced_accept_rate, work.data<float>(),
                     out.data<int32_t>(),
                     impl_->stream);
  HSX_LAUNCH_CHECK();
  const Tensor host = Download(out.Rows(0, result_words));
  const int32_t* words = host.data<int32_t>();
  result.num_accepted.assign(words, words + requests);
  words += requests;
  SampledTokens& e = result.emitted;
  e.tokens.assign(words, words + rows);
  e.logprobs.resize(rows);
  std::memcpy(e.logprobs.data(), words + rows, rows * sizeof(float));
  e.top_ids.assign(words + 2 * rows, words + 2 * rows + static_cast<int64_t>(rows) * width);
  e.top_logprobs.resize(static_cast<size_t>(rows) * width);
  std::memcpy(e.top_logprobs.data(), words + 2 * rows + static_cast<int64_t>(rows) * width,
              e.top_logprobs.size() * sizeof(float));
  return result;
}

VerifiedTokens CudaBackend::VerifyTree(const Tensor& logits, const VerificationBatch& batch) {
  const auto vocab = static_cast<int32_t>(logits.size(1));
  const std::vector<int32_t> begins = VerificationRowBegins(batch, logits.size(0), vocab);
  const auto requests = static_cast<int32_t>(batch.num_drafts.size());
  const int32_t rows = begins.back(), width = batch.sampling.max_logprobs;
  VerifiedTokens result;
  if (requests == 0) return result;
  // Row begins, each row's first child, the children's tokens and node indices, in one upload.
  std::vector<int32_t> index(begins), child_begin(static_cast<size_t>(rows) + 1, 0), tokens, nodes;
  for (int32_t r = 0; r < requests; ++r) {
    const int32_t first_draft = begins[r] - r, n = batch.num_drafts[r];
    for (int32_t j = 0; j <= n; ++j) {  // node row j: the root (0) or node j - 1
      child_begin[begins[r] + j] = static_cast<int32_t>(tokens.size());
      for (int32_t i = 0; i < n; ++i) {
        const int32_t parent = batch.parents[first_draft + i];
        if (parent < -1 || parent >= i) {
          std::fprintf(stderr, "hsx: VerifyDrafts: a tree node's parent is %d, expected one before node %d\n", parent, i);
          std::abort();
        }
        if (parent == j - 1) {
          tokens.push_back(batch.drafts[first_draft + i]);
          nodes.push_back(i);
        }
      }
    }
  }
  child_begin[rows] = static_cast<int32_t>(tokens.size());
  index.insert(index.end(), child_begin.begin(), child_begin.end());
  index.insert(index.end(), tokens.begin(), tokens.end());
  index.insert(index.end(), nodes.begin(), nodes.end());
  const Tensor params = UploadWords(*this, batch.sampling.rows.data(), batch.sampling.rows.size() * sizeof(SamplingRow));
  const Tensor adjust =
      UploadWords(*this, batch.sampling.adjust.data(), batch.sampling.adjust.size() * sizeof(TokenAdjust));
  const Tensor indices = UploadWords(*this, index.data(), index.size() * sizeof(int32_t));
  Tensor work = Empty(DType::kF32, {rows, 2 * vocab});  // sampling_device.cuh's row scratch
  Tensor by_row = Empty(DType::kI32, {3 * static_cast<int64_t>(rows) + 2 * static_cast<int64_t>(rows) * width});
  const int64_t result_words = requests + 2 * rows + 2 * static_cast<int64_t>(rows) * width;
  Tensor out = Empty(DType::kI32, {result_words + rows});  // the results, then the path
  cuda::VerifyTree(logits.data<float>(), rows, requests, vocab, static_cast<const SamplingRow*>(params.raw()),
                   static_cast<const TokenAdjust*>(adjust.raw()), width, indices.data<int32_t>(),
                   batch.forced_accept_rate, work.data<float>(), by_row.data<int32_t>(), out.data<int32_t>(),
                   impl_->stream);
  HSX_LAUNCH_CHECK();
  const Tensor host = Download(out);
  const int32_t* words = host.data<int32_t>();
  result.num_accepted.assign(words, words + requests);
  words += requests;
  SampledTokens& e = result.emitted;
  e.tokens.assign(words, words + rows);
  e.logprobs.resize(rows);
  std::memcpy(e.logprobs.data(), words + rows, rows * sizeof(float));
  e.top_ids.assign(words + 2 * rows, words + 2 * rows + static_cast<int64_t>(rows) * width);
  e.top_logprobs.resize(static_cast<size_t>(rows) * width);
  std::memcpy(e.top_logprobs.data(), words + 2 * rows + static_cast<int64_t>(rows) * width,
              e.top_logprobs.size() * sizeof(float));
  words += 2 * rows + 2 * static_cast<int64_t>(rows) * width;
  result.path.assign(words, words + rows);
  return result;
}

void CudaBackend::SliceColumns(const Tensor& x, int64_t begin, Tensor& out) {
  cuda::SliceColumns(B(x), x.size(0), x.size(-1), begin, out.size(-1), B(out), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::DraftLayerInput(const Tensor& table, const Tensor& ids, const Tensor& hidden,
                                  const Tensor& embed_norm, const Tensor& hidden_norm, float eps, bool normed_residual,
                                  Tensor& out, Tensor& residual) {
  if (table.dtype() == DType::kBF16 && hidden.dtype() == DType::kBF16 && embed_norm.dtype() == DType::kBF16 &&
      hidden_norm.dtype() == DType::kBF16) {
    Impl::Timer timer(*impl_, "draft_layer_input");
    if (cuda::DraftLayerInput(B(table), ids.data<int32_t>(), B(hidden), B(embed_norm), B(hidden_norm), ids.numel(),
                              hidden.size(-1), eps, normed_residual, B(out), B(residual), impl_->stream)) {
      HSX_LAUNCH_CHECK();
      return;
    }
  }
  Backend::DraftLayerInput(table, ids, hidden, embed_norm, hidden_norm, eps, normed_residual, out, residual);
}

void CudaBackend::WriteColumns(const Tensor& x, int64_t begin, Tensor& out) {
  // A plain copy: an f32 column moves as two bf16 ones.
  const int64_t per = static_cast<int64_t>(DTypeSize(x.dtype()) / 2);
  cuda::WriteColumns(B(x), x.size(0), per * x.size(-1), per * begin, per * out.size(-1), B(out), impl_->stream);
  HSX_LAUNCH_CHECK();
}

void CudaBackend::CentroidMaskedLogits(const Tensor& x, const Tensor& centroid_logits, const Tensor& token_ordering,
                                       const Tensor& lm_head, int top_k, Tensor& logits) {
  if (!cuda::CentroidMaskedLogits(B(x), centroid_logits.data<float>(), token_ordering.data<int32_t>(), B(lm_head),
                                  x.size(0), static_cast<int>(x.size(1)), static_cast<int>(centroid_logits.size(1)),
                                  static_cast<int>(token_ordering.size(1)), top_k, logits.size(1),
                                  logits.data<float>(), impl_->stream)) {
    std::fprintf(stderr, "hsx: CUDA centroid head supports top_k in [1, min(256, centroids)] and <= 8192 centroids; got %d of %lld\n",
                 top_k, static_cast<long long>(centroid_logits.size(1)));
    std::abort();
  }
  HSX_LAUNCH_CHECK();
}

void CudaBackend::FlagNonFiniteRows(const Tensor& x, Tensor& flags) {
  cuda::FlagNonFiniteRows(B(x), flags.numel(), x.size(-1), flags.data<int32_t>(), impl_->stream);
  HSX_LAUNCH_CHECK();
}

}  // namespace hsx
