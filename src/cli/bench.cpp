// hsx bench: end-to-end extraction throughput on synthetic prompts, next to the f32 GEMM
// throughput of every GEMM library on this machine, measured in the same run. Prints JSON lines.
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "cli/bench_decode.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/extract.h"
#include "cli/gemm_libraries.h"

namespace hsx::cli {
namespace {

struct BenchOptions {
  ExtractOptions extract;
  int num_prompts = 16;
  double median_len = 256;
  int min_len = 32, max_len = 1024;
  uint64_t seed = 0;
  bool decode = false;  // run RunDecodeBench instead
};

// A --dir that bench made holds this file; bench writes into (and clears) no other.
constexpr const char* kBenchMarker = ".hsx-bench";

// The scratch directory: --dir if it is new, empty or bench's own (its earlier output
// is removed), else a fresh directory under the system's temp path.
Result<std::string> PrepareScratchDir(const std::string& requested) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (requested.empty()) {
    std::string tmpl = (fs::temp_directory_path(ec) / "hsx-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return Error(tmpl + ": cannot create: " + std::strerror(errno));
    return tmpl;
  }
  const std::string marker = requested + "/" + kBenchMarker;
  if (fs::exists(requested, ec) && !fs::is_empty(requested, ec) && !fs::exists(marker, ec)) {
    return Error("--dir " + requested + ": not empty and not made by hsx bench (it has no " + kBenchMarker +
                 " file); name a new or empty directory");
  }
  fs::remove_all(requested + "/out", ec);
  fs::create_directories(requested, ec);
  if (ec || !std::ofstream(marker)) return Error("--dir " + requested + ": cannot create: " + ec.message());
  return requested;
}

int RunBench(BenchOptions o) {
  auto config = LoadConfig(o.extract.model);
  if (!config.ok()) return Fail("bench", config.status());
  const ModelConfig& c = *config;

  // Lognormal prompt lengths around the median, clipped, fixed seed; random token ids.
  std::mt19937_64 rng(o.seed);
  std::lognormal_distribution<double> len_dist(std::log(o.median_len), 0.6);
  std::uniform_int_distribution<int> tok_dist(0, c.vocab_size - 1);
  // With --dir the prompts stay there afterwards, so a baseline can run the same workload.
  const bool keep_prompts = !o.extract.output.empty();
  auto scratch = PrepareScratchDir(o.extract.output);
  if (!scratch.ok()) return Fail("bench", scratch.status());
  const std::string dir = *scratch;
  o.extract.input = dir + "/prompts.jsonl";
  o.extract.output = dir + "/out";
  o.extract.quiet = true;
  o.extract.warmup = true;  // as the HF baseline warms up with one forward
  o.extract.shard = "0/1";  // the whole workload, even under a launcher
  int64_t total_tokens = 0;
  {
    std::ofstream prompts(o.extract.input);
    for (int i = 0; i < o.num_prompts; ++i) {
      const int len = std::clamp(static_cast<int>(len_dist(rng)), o.min_len, o.max_len);
      std::vector<int32_t> ids(len);
      for (auto& t : ids) t = tok_dist(rng);
      prompts << nlohmann::json{{"id", "b" + std::to_string(i)}, {"token_ids", ids}}.dump() << "\n";
      total_tokens += len;
    }
  }

  const ExtractResult run = RunExtract(o.extract);
  std::filesystem::remove_all(keep_prompts ? dir + "/out" : dir);
  if (run.exit_code != 0) return run.exit_code;
  const double seconds = run.seconds;

  // Forward FLOPs per token: 2 per weight used (no LM head when extracting) plus attention
  // (QK^T and PV over on average half the context).
  const int64_t params = CountParameters(c) - static_cast<int64_t>(c.vocab_size) * c.hidden_size *
                                                  (c.tie_word_embeddings ? 1 : 2);
  int64_t active = params;
  if (c.num_experts > 0) {
    active -= static_cast<int64_t>(c.num_layers) * 3 * c.hidden_size * c.moe_intermediate_size *
              (c.num_experts - c.experts_per_token);
  }
  const double mean_len = static_cast<double>(total_tokens) / o.num_prompts;
  double attn_flops = 0;
  for (const LayerSpec& l : c.layers) attn_flops += 2.0 * 2.0 * c.num_heads * l.head_dim * (mean_len / 2);
  const double flops_per_token = 2.0 * active + attn_flops;
  const double tok_s = total_tokens / seconds;
  auto line = [](const nlohmann::json& j) { std::printf("%s\n", j.dump().c_str()); };
  line({{"metric", "extract_tokens_per_s"}, {"value", tok_s}, {"model", o.extract.model.model}, {"prompts", o.num_prompts},
        {"tokens", total_tokens}, {"seconds", seconds}, {"layers", o.extract.layers}, {"device", o.extract.model.device},
        {"peak_device_gib", run.peak_device_bytes / double(1ull << 30)}, {"flops_per_token", flops_per_token},
        {"prefix_caching", o.extract.prefix_caching}, {"data_parallel_size", o.extract.data_parallel_size},
        {"quantization", QuantizationLabel(o.extract.model, c)},
        {"sink", run.sink},
        {"bytes_per_token", run.tokens > 0 ? static_cast<double>(run.bytes) / static_cast<double>(run.tokens) : 0.0}});
  if (o.extract.model.device != "cpu") return 0;  // the device run reports its own ceilings (bench/)
  // The MLP's and the attention projections' shapes at one step's rows.
  const int64_t m = std::min<int64_t>(o.extract.max_num_batched_tokens, total_tokens), h = c.hidden_size;
  const int64_t inter = c.num_experts > 0 ? c.moe_intermediate_size : c.intermediate_size;
  const std::vector<GemmLibraryResult> gemms = MeasureGemmLibraries({{m, inter, h}, {m, h, inter}, {m, h, h}});
  const GemmLibraryResult* best = &gemms.front();
  for (const GemmLibraryResult& g : gemms) {
    line({{"metric", "gemm_gflops"}, {"value", g.gflops}, {"library", g.library}, {"linked", g.linked},
          {"shapes", "[m,k]x[k,n] at m=" + std::to_string(m) + ": " + std::to_string(inter) + "x" + std::to_string(h) +
                         ", " + std::to_string(h) + "x" + std::to_string(inter) + ", " + std::to_string(h) + "x" +
                         std::to_string(h)}});
    if (g.gflops > best->gflops) best = &g;
  }
  line({{"metric", "extract_gflops"}, {"value", tok_s * flops_per_token / 1e9}, {"flops_per_token", flops_per_token}});
  line({{"metric", "fraction_of_best_gemm"}, {"value", tok_s * flops_per_token / 1e9 / best->gflops},
        {"best_gemm", best->library}, {"linked_gemm", gemms.front().library}});
  return 0;
}

}  // namespace

void RegisterBench(CLI::App& root) {
  auto o = std::make_shared<BenchOptions>();
  auto decode = std::make_shared<DecodeBenchOptions>();
  o->extract.layers = "";
  CLI::App* app = root.add_subcommand(
      "bench", "Extraction throughput on synthetic prompts vs the best GEMM library on this machine; --decode: generation throughput");
  o->extract.model.Register(*app);
  app->add_option("--layers", o->extract.layers, "Layer ids to capture (default: 2, N/2, N-3, N)");
  app->add_option("--num-prompts", o->num_prompts);
  app->add_option("--median-len", o->median_len, "Median prompt length (lognormal)");
  app->add_option("--min-len", o->min_len);
  app->add_option("--max-len", o->max_len);
  app->add_option("--max-num-batched-tokens", o->extract.max_num_batched_tokens);
  app->add_option("--max-num-seqs", o->extract.max_num_seqs);
  app->add_option("--kv-cache-gib", o->extract.kv_cache_gib);
  app->add_option("--writer-threads", o->extract.writer_threads, "File writer threads");
  app->add_option("--kv-transfer-config", o->extract.kv_transfer_config,
                  "The sink, as extract takes it (e.g. {\"kv_connector\": \"FP8HiddenStatesConnector\"})");
  AddDataParallelOption(*app, o->extract.data_parallel_size);
  app->add_flag("!--no-enable-prefix-caching", o->extract.prefix_caching, "Measure without prefix caching");
  app->add_option("--dir", o->extract.output,
                  "Scratch directory, new or empty (or an earlier bench's); prompts.jsonl stays there afterwards");
  app->add_flag("--decode", o->decode, "Measure generation per batch size instead of extraction");
  app->add_option("--batch-sizes", decode->batch_sizes, "Decode: concurrent sequences, one run each")
      ->delimiter(',')
      ->check(CLI::Range(1, 65536));
  app->add_option("--prompt-len", decode->prompt_len, "Decode: prompt tokens per sequence")->check(CLI::Range(1, 1 << 20));
  app->add_option("--new-tokens", decode->new_tokens, "Decode: tokens generated per sequence (end-of-sequence ignored)")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--temperature", decode->sampling.temperature, "Decode: 0 is greedy");
  app->add_option("--top-p", decode->sampling.top_p);
  app->add_option("--top-k", decode->sampling.top_k);
  app->add_option("--speculative-config", decode->speculative_config,
                  "Decode: vLLM's JSON (ngram, eagle3, mtp); adds the mean acceptance length and per-position rates");
  app->add_option("--input", decode->input,
                  "Decode: JSONL prompts as generate reads them (token_ids, prompt or messages) instead of random "
                  "ones; each batch size keeps that many in flight over the whole file, to end-of-sequence or "
                  "--new-tokens");
  app->add_flag("--ignore-eos", decode->ignore_eos, "Decode with --input: generate past end-of-sequence tokens");
  app->add_option("--spec-bench-accept-rate", decode->accept_rate,
                  "Decode with --speculative-config: accept each draft with this probability (a seeded "
                  "Bernoulli draw) instead of verifying it; the output is NOT the target's (benchmark only)")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--spec-bench-probe-drafts", decode->probe_drafts,
                  "Decode with \"draft_length\": \"adaptive\": a probing request drafts at most this many (0: the "
                  "K the policy chooses, the default)")
      ->check(CLI::Range(0, 64));
  app->callback([o, decode, app] {
    if (decode->accept_rate && (!o->decode || decode->speculative_config.empty())) {
      ExitCode() = Fail("bench", Error("--spec-bench-accept-rate needs --decode and --speculative-config (it forces "
                                       "the acceptance of speculative decoding's drafts)"));
      return;
    }
    if (decode->probe_drafts && (!o->decode || decode->speculative_config.find("adaptive") == std::string::npos)) {
      ExitCode() = Fail("bench", Error("--spec-bench-probe-drafts needs --decode and a --speculative-config with "
                                       "\"draft_length\": \"adaptive\" (it caps the adaptive policy's probes)"));
      return;
    }
    if (!o->decode && (!decode->input.empty() || decode->ignore_eos)) {
      ExitCode() = Fail("bench", Error("--input and --ignore-eos are for --decode (extraction benchmarks make their "
                                       "own prompts)"));
      return;
    }
    if (o->decode) {
      if (o->extract.data_parallel_size != 1) {
        ExitCode() = Fail("bench", Error("--data-parallel-size is for extraction benchmarks, not --decode"));
        return;
      }
      decode->model = o->extract.model;
      if (app->count("--kv-cache-gib") > 0) decode->kv_cache_gib = o->extract.kv_cache_gib;
      if (app->count("--max-num-batched-tokens") > 0) decode->max_num_batched_tokens = o->extract.max_num_batched_tokens;
      decode->sampling.seed = 0;
      ExitCode() = RunDecodeBench(*decode);
      return;
    }
    if (o->extract.layers.empty()) {
      auto config = LoadConfig(o->extract.model);
      if (!config.ok()) {
        ExitCode() = Fail("bench", config.status());
        return;
      }
      const int n = config->num_layers;
      // Distinct ids in order (a model of few layers would repeat some).
      const std::set<int> ids = {std::min(2, n), n / 2, std::max(0, n - 3), n};
      for (int id : ids) o->extract.layers += (o->extract.layers.empty() ? "" : ",") + std::to_string(id);
    }
    ExitCode() = RunBench(*o);
  });
}

}  // namespace hsx::cli
