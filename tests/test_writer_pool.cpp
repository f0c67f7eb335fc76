// Backpressure: with the writer busy and its queue full, Submit waits instead of
// buffering more; every job still runs once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "capture/writer_pool.h"

namespace hsx {
namespace {

TEST(WriterPoolTest, SubmitBlocksWhileTheQueueIsFull) {
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> ran{0};
  {
    WriterPool pool(1, 2);
    pool.Submit([&] {
      gate.wait();
      ++ran;
    });
    // Two more fill the queue once the worker holds the first (the second of these waits
    // for that if the worker has not started yet).
    pool.Submit([&] { ++ran; });
    pool.Submit([&] { ++ran; });
    auto blocked = std::async(std::launch::async, [&] { pool.Submit([&] { ++ran; }); });
    EXPECT_EQ(blocked.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
        << "a fourth job was accepted while one ran and two waited";
    release.set_value();
    EXPECT_EQ(blocked.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    pool.Drain();
    EXPECT_EQ(ran.load(), 4);
  }
}

}  // namespace
}  // namespace hsx
