// A sink that keeps records in memory: the second implementation of CaptureSink, for
// tests of what extract and serve hand over, without a file system.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "capture/capture_sink.h"

namespace hsx {

class MemorySink : public CaptureSink {
 public:
  Result<CaptureReceipt> Put(const CaptureRecord& record) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = record.name.empty() ? record.id : record.name;
    if (!records_.emplace(key, record).second) return Error("request '" + record.id + "': '" + key + "' is already stored");
    return CaptureReceipt{key, {{"memory_key", key}}};
  }
  Status PutFailure(const CaptureRecord& record, const Status& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    failures_[record.id] = why.message();
    return {};
  }
  std::string Describe() const override { return "memory"; }

  std::map<std::string, CaptureRecord> records() const {
    std::lock_guard<std::mutex> lock(mu_);
    return records_;
  }
  std::map<std::string, std::string> failures() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, CaptureRecord> records_;
  std::map<std::string, std::string> failures_;
};

}  // namespace hsx
