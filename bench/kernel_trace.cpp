// A CUDA injection library that writes every kernel's and copy's GPU start and duration to a CSV, for
// seeing where a decode step's time goes when the profilers that draw timelines are not at
// hand (the device machine has Nsight Compute, which serializes kernels, but not Nsight
// Systems). Kernels replayed from CUDA graphs are reported one by one, so the idle gaps
// between them (launch latency, host waits) show. The columns are those of
// `nsys stats --report cuda_gpu_trace`, which bench/decode_step_profile.py reads.
//
// Usage: CUDA_INJECTION64_PATH=libhsx_kernel_trace.so HSX_KERNEL_TRACE=trace.csv hsx ...
// The CUDA driver loads the library at the process's first CUDA call and runs
// InitializeInjection; CUPTI hands filled record buffers back on its own thread.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

constexpr size_t kBufferBytes = 8u << 20;
std::FILE* out = nullptr;
std::mutex out_mutex;

std::string Demangled(const char* name) {
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  for (char& c : result) {
    if (c == '"') c = '\'';  // the name is one quoted CSV field
  }
  return result;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::lock_guard<std::mutex> lock(out_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    if (out == nullptr) continue;
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {  // no grid: the parser tells copies apart by that
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      std::fprintf(out, "%llu,%llu,,,,%u,\"[memcpy %s %llu bytes]\"\n", static_cast<unsigned long long>(m->start),
                   static_cast<unsigned long long>(m->end - m->start), m->streamId,
                   m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD ? "HtoD"
                   : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH" : "other",
                   static_cast<unsigned long long>(m->bytes));
      continue;
    }
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(out, "%llu,%llu,%d,%d,%d,%u,\"%s\"\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end - k->start), k->gridX, k->gridY, k->gridZ, k->streamId,
                 Demangled(k->name).c_str());
  }
  std::free(buffer);
}

void Finish() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(out_mutex);
  if (out != nullptr) std::fclose(out);
  out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("HSX_KERNEL_TRACE");
  out = std::fopen(path != nullptr ? path : "kernel_trace.csv", "w");
  if (out == nullptr) {
    std::perror("hsx kernel trace: HSX_KERNEL_TRACE");
    return 0;
  }
  std::fprintf(out, "\"Start (ns)\",\"Duration (ns)\",\"GrdX\",\"GrdY\",\"GrdZ\",\"Strm\",\"Name\"\n");
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "hsx kernel trace: CUPTI refused kernel or copy activity records\n");
    return 0;
  }
  std::atexit(Finish);
  return 1;
}
