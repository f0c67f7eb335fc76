#include "backend/communicator.h"

#include <barrier>
#include <cstring>

namespace hsx {
namespace {

// What the ranks share: each rank's published buffer and a barrier between phases.
struct CpuGroup {
  explicit CpuGroup(int size) : buffers(static_cast<size_t>(size)), barrier(size) {}
  std::vector<const float*> buffers;
  std::barrier<> barrier;
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->buffers.size()); }

  void AllReduceSum(Tensor& x) override {
    const int64_t n = x.numel();
    Publish(x.data<float>());
    sum_.assign(static_cast<size_t>(n), 0.0f);
    for (const float* b : group_->buffers)
      for (int64_t i = 0; i < n; ++i) sum_[i] += b[i];
    group_->barrier.arrive_and_wait();  // every rank has read every buffer: now overwrite
    std::memcpy(x.data<float>(), sum_.data(), static_cast<size_t>(n) * sizeof(float));
  }

  void AllGather(const Tensor& x, Tensor& out) override {
    const int64_t n = x.numel();
    Publish(x.data<float>());
    for (size_t r = 0; r < group_->buffers.size(); ++r)
      std::memcpy(out.data<float>() + r * n, group_->buffers[r], static_cast<size_t>(n) * sizeof(float));
    group_->barrier.arrive_and_wait();  // x may change once every rank has copied it
  }

 private:
  // Makes x readable by every rank; returns once all ranks have published theirs.
  void Publish(const float* x) {
    group_->buffers[static_cast<size_t>(rank_)] = x;
    group_->barrier.arrive_and_wait();
  }

  std::shared_ptr<CpuGroup> group_;
  int rank_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeCpuCommunicators(int size) {
  auto group = std::make_shared<CpuGroup>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<CpuCommunicator>(group, r));
  return comms;
}

}  // namespace hsx
