#include "backend/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <string>

namespace hsx {
namespace {

std::string NcclError(const char* what, ncclResult_t r) {
  return std::string("NCCL ") + what + ": " + ncclGetErrorString(r);
}

// A failed collective mid-forward has no caller to return to (the ops return nothing):
// as with a failed kernel launch, the process ends with the reason.
void Check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  std::fprintf(stderr, "hsx: %s\n", NcclError(what, r).c_str());
  std::abort();
}

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kF32:
      return ncclFloat32;
    case DType::kI32:
      return ncclInt32;
    default:
      break;
  }
  std::fprintf(stderr, "hsx: NCCL: no collective for dtype %s\n", std::string(DTypeName(dtype)).c_str());
  std::abort();
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), stream_(stream) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void AllReduceSum(Tensor& x) override {
    Check(ncclAllReduce(x.raw(), x.raw(), static_cast<size_t>(x.numel()), NcclType(x.dtype()), ncclSum, comm_, stream_),
          "all-reduce");
  }

  void AllGather(const Tensor& x, Tensor& out) override {
    Check(ncclAllGather(x.raw(), out.raw(), static_cast<size_t>(x.numel()), NcclType(x.dtype()), comm_, stream_),
          "all-gather");
  }

 private:
  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> MakeNcclCommunicators(const std::vector<CudaBackend*>& backends) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  const int n = static_cast<int>(backends.size());
  std::vector<int> devices;
  for (CudaBackend* b : backends) {
    for (int d : devices) {
      if (d == b->device_index()) {
        return Error("--tensor-parallel-size " + std::to_string(n) + ": two ranks on cuda:" + std::to_string(d) +
                     " (each rank needs its own GPU)");
      }
    }
    devices.push_back(b->device_index());
  }
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  if (const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data()); r != ncclSuccess) {
    return Error("--tensor-parallel-size " + std::to_string(n) + ": " + NcclError("init", r));
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(
        std::make_unique<NcclCommunicator>(comms[r], r, n, static_cast<cudaStream_t>(backends[r]->compute_stream())));
  }
  return out;
}

}  // namespace hsx
