// The file sinks: one safetensors file per request in a directory, as vLLM's
// ExampleHiddenStatesConnector writes them (or hs-connectors' FP8HiddenStatesConnector,
// in FP8), with vLLM's lock protocol (capture/file_lock.h) around each write.
#pragma once

#include <string>

#include "capture/capture_sink.h"
#include "capture/hidden_states_file.h"

namespace hsx {

class SafetensorsSink : public CaptureSink {
 public:
  struct Options {
    std::string dir;  // an existing directory
    StatesFormat format = StatesFormat::kAsCaptured;
    bool lock = false;       // hold "<file>.lock" while writing (vLLM's use_synchronization_lock)
    bool exclusive = false;  // never replace an existing file (serve: names clients chose); else replace atomically
  };
  explicit SafetensorsSink(Options options) : options_(std::move(options)) {}

  // Writes <dir>/<record.name>, or <dir>/<id>.safetensors; the receipt's transfer_params
  // are {"hidden_states_path": path}.
  Result<CaptureReceipt> Put(const CaptureRecord& record) override;
  std::string Describe() const override;
  const Options& options() const { return options_; }

 private:
  Options options_;
};

}  // namespace hsx
