#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#ifdef HSX_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#ifdef HSX_HAS_NCCL
#include "backend/cuda/nccl_communicator.h"
#endif

namespace hsx {

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& device, bool batch_invariant) {
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(batch_invariant));
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
#ifdef HSX_HAS_CUDA
    int index = 0;
    if (device.size() > 5) {
      char* end = nullptr;
      index = static_cast<int>(std::strtol(device.c_str() + 5, &end, 10));
      if (*end != '\0' || index < 0) return Error("--device: '" + device + "' is not cuda:N");
    }
    HSX_ASSIGN_OR_RETURN(auto cuda, CudaBackend::Create(index, batch_invariant));
    return std::unique_ptr<Backend>(std::move(cuda));
#else
    return Error("--device " + device + ": this hsx was built without CUDA (configure with -DHSX_CUDA=ON)");
#endif
  }
  return Error("--device: '" + device + "' is not one of cpu, cuda, cuda:N");
}

Result<std::vector<std::unique_ptr<Communicator>>> MakeCommunicators(const std::vector<Backend*>& backends) {
  if (backends.front()->device() == Device::kCPU) return MakeCpuCommunicators(static_cast<int>(backends.size()));
#ifdef HSX_HAS_NCCL
  std::vector<CudaBackend*> cuda;
  for (Backend* b : backends) cuda.push_back(static_cast<CudaBackend*>(b));
  return MakeNcclCommunicators(cuda);
#else
  return Error("--tensor-parallel-size " + std::to_string(backends.size()) + ": this hsx was built without NCCL, which tensor parallelism on GPUs needs");
#endif
}

}  // namespace hsx
