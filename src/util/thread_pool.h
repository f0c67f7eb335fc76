// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hsx {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Splits [0, n) into contiguous ranges, runs fn(begin, end) on each (the caller's
  // thread takes one) and returns when all are done. Not reentrant; calls from several
  // threads (CPU tensor-parallel ranks, CPU data-parallel replicas) take turns.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool, one thread per hardware thread.
  static ThreadPool& Global();

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex turn_mu_;  // held by the caller whose job runs
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace hsx
