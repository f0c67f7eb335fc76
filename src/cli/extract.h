// hsx extract, callable from other commands (bench runs the very same path).
#pragma once

#include <optional>
#include <string>

#include "cli/common.h"

namespace hsx::cli {

struct ExtractOptions {
  ModelOptions model;
  std::string layers, input, output, dtype;
  std::string shard;  // "i/n"; empty: the launcher's environment, else the whole input
  // vLLM's JSON naming the sink (capture/kv_transfer_config.h); empty: bf16/f32 files in output.
  std::string kv_transfer_config;
  int max_num_batched_tokens = 8192;
  int max_num_seqs = 256;
  double kv_cache_gib = 2.0;
  int data_parallel_size = 1;  // engine replicas, one per device
  int writer_threads = 8;  // as serve's num_writer_threads; 2 could not keep up with an H200
  int writer_queue = 16;
  int max_write_failures = 8;  // in a row, then stop (a full disk stops at the first)
  bool prefix_caching = true;
  // One pass: the target answers every assistant turn of each messages line anew, and the
  // file holds the states of the whole regenerated conversation, loss_mask 1 on the answers.
  struct Regenerate {
    bool on = false;
    int max_tokens = 2048;  // per answer
    float temperature = 1.0f;
    float top_p = 1.0f;
    std::optional<uint64_t> seed;  // each line draws with seed + a hash of its id; none: random
  } regenerate;
  bool quiet = false;  // no per-file lines on stdout, no summary
  // One untimed step of max_num_batched_tokens throwaway tokens first, so that kernel
  // loading and GEMM plans for full steps stay out of the timed run (benchmarks).
  bool warmup = false;
};

struct ExtractResult {
  int exit_code = 0;
  double seconds = 0;  // from the first request queued to the last file written (no model loading)
  int64_t files = 0, tokens = 0;
  uint64_t bytes = 0;  // what the sink holds for them (the files' sizes)
  std::string sink;    // "files", or the kv_connector of --kv-transfer-config
  size_t peak_device_bytes = 0;
};

ExtractResult RunExtract(const ExtractOptions& options);

}  // namespace hsx::cli
