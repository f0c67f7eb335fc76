// Writer threads with a bounded queue: Submit blocks while the queue is full, so a
// disk slower than the model makes the engine wait instead of buffering without limit.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hsx {

class WriterPool {
 public:
  WriterPool(int num_threads, size_t max_queued);
  ~WriterPool();  // finishes every queued job
  WriterPool(const WriterPool&) = delete;
  WriterPool& operator=(const WriterPool&) = delete;

  void Submit(std::function<void()> job);
  void Drain();  // returns when every submitted job has run

 private:
  void Loop();

  size_t max_queued_;
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_, idle_;
  std::deque<std::function<void()>> queue_;
  int active_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace hsx
