// The decode mode of hsx bench (bench_decode.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cli/common.h"
#include "engine/sampler.h"

namespace hsx::cli {

struct DecodeBenchOptions {
  ModelOptions model;
  std::vector<int> batch_sizes = {1, 32, 128};
  int prompt_len = 512;
  int new_tokens = 256;  // generated past end-of-sequence tokens: the prompts are random
  int max_num_batched_tokens = 16384;
  double kv_cache_gib = 40;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::string speculative_config;  // vLLM's JSON (ngram, eagle3, mtp): speculative decoding
  // --spec-bench-accept-rate: each draft accepted with this probability (not lossless).
  std::optional<double> accept_rate;
  // --spec-bench-probe-drafts: with "draft_length": "adaptive", a probe's drafts at most
  // (DraftLengthConfig::probe_drafts; 0: the policy's K), to measure the default against.
  std::optional<int> probe_drafts;
  // Real prompts (JSONL as generate reads it) instead of random ones: each batch size keeps
  // that many requests in flight over all of the file's prompts, each ending at
  // end-of-sequence (unless ignore_eos) or after new_tokens.
  std::string input;
  bool ignore_eos = false;
};

int RunDecodeBench(const DecodeBenchOptions& options);

}  // namespace hsx::cli
