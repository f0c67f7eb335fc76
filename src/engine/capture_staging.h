// Where a step's captured rows land on the host: two pinned buffers that alternate (the
// engine stores the previous step's rows while this step's copy runs), and the handle of
// one step's copy in flight. The capture object (hidden_state_capture.h) owns the buffers;
// the runner, which starts the copies on the device, borrows them.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "tensor/tensor.h"

namespace hsx {

// One step's captured rows on their way to a pinned host buffer.
class CapturedRows {
 public:
  CapturedRows(Tensor device_rows, Tensor device_flags, Tensor host_rows, Tensor host_flags,
               std::unique_ptr<PendingDownload> rows_copy, std::unique_ptr<PendingDownload> flags_copy)
      : device_rows_(std::move(device_rows)),
        device_flags_(std::move(device_flags)),
        host_rows_(std::move(host_rows)),
        host_flags_(std::move(host_flags)),
        rows_copy_(std::move(rows_copy)),
        flags_copy_(std::move(flags_copy)) {}

  void Wait();  // returns once rows() and non_finite() hold the step's data
  const Tensor& rows() const { return host_rows_; }  // [L, T, H] in the compute dtype
  // Per captured row ([L, T] as one list), nonzero where it holds an inf or NaN.
  const int32_t* non_finite() const { return host_flags_.data<int32_t>(); }

 private:
  Tensor device_rows_, device_flags_;  // kept alive until the copies land
  Tensor host_rows_, host_flags_;
  std::unique_ptr<PendingDownload> rows_copy_, flags_copy_;
};

class CaptureStaging {
 public:
  // max_step_rows: the scheduler's token budget. Both buffers are sized for a step this
  // large when first made (pinning 512 MB takes ~90 ms, which a buffer grown a step at a
  // time would cost again mid-run).
  explicit CaptureStaging(int64_t max_step_rows) : max_step_rows_(max_step_rows) {}

  struct Landing {
    Tensor rows;   // [L, T, H] as `captured`, on the host
    Tensor flags;  // int32 [L * T]
  };
  // The next buffer, as host views for the rows of `captured` (a device [L, T, H]) and
  // their flags; valid until the call after next.
  Landing Next(Backend& backend, const Tensor& captured);

 private:
  int64_t max_step_rows_;
  int64_t runs_ = 0;
  Tensor buffers_[2];  // rows, then (4-byte aligned) their flags
};

}  // namespace hsx
