#include "capture/writer_pool.h"

namespace hsx {

WriterPool::WriterPool(int num_threads, size_t max_queued) : max_queued_(max_queued == 0 ? 1 : max_queued) {
  for (int i = 0; i < (num_threads < 1 ? 1 : num_threads); ++i) threads_.emplace_back([this] { Loop(); });
}

WriterPool::~WriterPool() {
  Drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  not_empty_.notify_all();
  for (auto& t : threads_) t.join();
}

void WriterPool::Submit(std::function<void()> job) {
  std::unique_lock<std::mutex> lock(mu_);
  not_full_.wait(lock, [this] { return queue_.size() < max_queued_; });
  queue_.push_back(std::move(job));
  not_empty_.notify_one();
}

void WriterPool::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && active_ == 0; });
}

void WriterPool::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      not_empty_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      ++active_;
      not_full_.notify_one();
    }
    job();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
      if (queue_.empty() && active_ == 0) idle_.notify_all();
    }
  }
}

}  // namespace hsx
