#include "engine/capture_staging.h"

#include <algorithm>

namespace hsx {

void CapturedRows::Wait() {
  rows_copy_->Wait();
  flags_copy_->Wait();
}

CaptureStaging::Landing CaptureStaging::Next(Backend& backend, const Tensor& captured) {
  // One pinned buffer holds the rows, then (4-byte aligned) their flags. Two alternate:
  // the engine still reads the previous step's while this one's copy runs.
  const int64_t flag_rows = captured.size(0) * captured.size(1);
  const int64_t flags_at = static_cast<int64_t>((captured.nbytes() + 3) / 4);
  Tensor& buffer = buffers_[runs_++ % 2];
  if (buffer.numel() < flags_at + flag_rows) {  // made once for the largest step (max_step_rows)
    const int64_t rows = std::max<int64_t>(captured.size(1), max_step_rows_);
    const int64_t row_bytes = static_cast<int64_t>(captured.nbytes()) / std::max<int64_t>(1, captured.size(1));
    const int64_t words = (row_bytes * rows + 3) / 4 + captured.size(0) * rows;
    buffer = backend.HostBuffer(DType::kI32, {words});
    // The other buffer too, the first time (not in use yet), so the next step does not pin.
    Tensor& other = buffers_[runs_ % 2];
    if (!other.defined()) other = backend.HostBuffer(DType::kI32, {words});
  }
  return {Tensor(buffer.raw(), captured.dtype(), captured.shape(), Device::kCPU, nullptr),
          Tensor(buffer.data<int32_t>() + flags_at, DType::kI32, {flag_rows}, Device::kCPU, nullptr)};
}

}  // namespace hsx
