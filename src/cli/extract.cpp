// hsx extract: hidden states of chosen layers for every prompt of a JSONL file, one
// <id>.safetensors per request, a manifest line per file, resumable.
#include <algorithm>
#include <chrono>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "capture/hidden_states_file.h"
#include "capture/manifest.h"
#include "capture/writer_pool.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/extract.h"
#include "engine/engine.h"
#include "util/atomic_file.h"

namespace hsx::cli {
namespace {

Result<std::vector<int>> ParseLayerIds(const std::string& text, int num_layers) {
  std::vector<int> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') return Error("--layers: '" + item + "' is not an integer (expected e.g. 2,18,33,36)");
    if (v < 0 || v > num_layers) {
      return Error("--layers: layer id " + item + " is out of range [0, " + std::to_string(num_layers) + "] for this " +
                   std::to_string(num_layers) + "-layer model");
    }
    if (std::find(ids.begin(), ids.end(), v) != ids.end()) return Error("--layers: layer id " + item + " is given twice");
    ids.push_back(static_cast<int>(v));
  }
  if (ids.empty()) return Error("--layers: expected at least one layer id");
  std::sort(ids.begin(), ids.end());
  return ids;
}

Status PrepareOutputDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return Error("--output " + dir + ": cannot create directory: " + (ec ? ec.message() : "a file is in the way"));
  }
  const std::string probe = dir + "/.hsx-write-probe";
  Status s = WriteFileAtomic(probe, {"ok"});
  if (!s.ok()) return Error("--output " + dir + ": not writable: " + s.message());
  std::filesystem::remove(probe, ec);
  return {};
}

}  // namespace

ExtractResult RunExtract(const ExtractOptions& o) {
  const char* cmd = "extract";
  auto loaded = LoadModelAndTokenizer(o.model);
  if (!loaded.ok()) return {Fail(cmd, loaded.status())};
  const ModelConfig& config = loaded->model->config();
  auto layers = ParseLayerIds(o.layers, config.num_layers);
  if (!layers.ok()) return {Fail(cmd, layers.status())};
  DType dtype = config.dtype;
  if (!o.dtype.empty()) {
    auto parsed = ParseFloatDTypeName(o.dtype);
    if (!parsed) return {Fail(cmd, Error("--dtype: '" + o.dtype + "' is not one of float32, bfloat16, float16"))};
    dtype = *parsed;
  }
  auto reader = PromptReader::Open(o.input, *loaded, /*add_generation_prompt=*/false);
  if (!reader.ok()) return {Fail(cmd, reader.status())};
  if (Status s = PrepareOutputDir(o.output); !s.ok()) return {Fail(cmd, s)};
  // Absolute paths in the manifest, as vLLM reports them, so readers need not know our cwd.
  const std::string out_dir = std::filesystem::absolute(o.output).lexically_normal().string();
  auto manifest = Manifest::Open(out_dir + "/manifest.jsonl");
  if (!manifest.ok()) return {Fail(cmd, manifest.status())};
  for (const std::string& w : manifest->warnings()) std::fprintf(stderr, "hsx extract: warning: %s\n", w.c_str());
  // Files a killed run was writing; a live writer's (another hsx in this directory) stay.
  auto stale = RemoveStaleTempFiles(out_dir);
  if (!stale.ok()) return {Fail(cmd, stale.status())};
  if (*stale > 0) std::fprintf(stderr, "hsx extract: removed %d temp file(s) of an interrupted run\n", *stale);
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.kv_cache_bytes = static_cast<size_t>(o.kv_cache_gib * (1ull << 30));
  ec.capture_layers = *layers;
  ec.capture_dtype = dtype;
  ec.enable_prefix_caching = o.prefix_caching;
  ec.graphs = !o.model.enforce_eager;
  Engine engine(*loaded->model, ec);
  if (o.warmup) {
    const int n = std::max(1, std::min(o.max_num_batched_tokens, config.max_position_embeddings) - 1);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i % config.vocab_size;
    if (Status s = engine.Add(Request{"hsx-warmup", std::move(ids), 0}); !s.ok()) return {Fail(cmd, s)};
    while (engine.has_work()) engine.Step();
  }

  const auto start = std::chrono::steady_clock::now();
  std::atomic<int64_t> written{0}, failed{0}, tokens_done{0}, left_unwritten{0};
  std::mutex out_mu;
  auto report = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(out_mu);
    failed += Fail(cmd, s);
  };
  // A full disk fails every later write too: stop at the first such error, or after
  // max_write_failures in a row, instead of computing the rest of the dataset for nothing.
  int consecutive_write_failures = 0;  // under out_mu
  std::string stop_reason;             // under out_mu
  std::atomic<bool> stopping{false};
  auto write_failed = [&](const Status& s) {  // under out_mu
    failed += Fail(cmd, s);
    ++consecutive_write_failures;
    if (stopping) return;
    if (IsOutOfSpace(s)) {
      stop_reason = "the disk is full";
    } else if (consecutive_write_failures >= o.max_write_failures) {
      stop_reason = std::to_string(consecutive_write_failures) + " writes failed in a row";
    } else {
      return;
    }
    stopping = true;
  };
  Progress progress("hsx extract", PromptReader::CountLines(o.input) - static_cast<int64_t>(manifest->size()));
  std::unordered_map<std::string, int> seen;  // id -> line, within this input
  int64_t skipped = 0;
  bool more_input = true;
  const size_t max_in_flight = static_cast<size_t>(std::max(1, o.max_num_seqs)) * 2;
  auto admit = [&](PromptLine& p) {
    if (!p.error.ok()) return report(p.error);
    const std::string where = o.input + ":" + std::to_string(p.line) + ": ";
    if (manifest->Contains(p.id)) {
      ++skipped;
      return;
    }
    if (auto [it, fresh] = seen.emplace(p.id, p.line); !fresh) {
      return report(Error(where + "duplicate id '" + p.id + "' (first on line " + std::to_string(it->second) + ")"));
    }
    if (Status s = ValidateRequestId(p.id); !s.ok()) return report(Error(where + s.message()));
    if (Status s = engine.Add(Request{p.id, std::move(p.token_ids), 0}); !s.ok()) report(Error(where + s.message()));
  };
  {
    WriterPool writers(o.writer_threads, static_cast<size_t>(std::max(1, o.writer_queue)));
    while ((more_input || engine.has_work()) && !stopping) {
      if (more_input) more_input = ReadAhead(*reader, engine, max_in_flight, admit);
      for (auto& done : engine.Step()) {
        if (!done->error.ok()) {
          report(Error(o.input + ":" + std::to_string(seen[done->id()]) + ": " + done->error.message()));
          continue;
        }
        std::shared_ptr<Sequence> seq(std::move(done));
        writers.Submit([&, seq] {
          if (stopping) {
            ++left_unwritten;  // for the resumed run
            return;
          }
          auto path = WriteHiddenStatesFile(out_dir, *seq);
          std::lock_guard<std::mutex> lock(out_mu);
          Result<std::string> line = path.ok() ? manifest->Append(seq->id(), *path, seq->prompt_len()) : path.status();
          if (!line.ok()) return write_failed(line.status());
          consecutive_write_failures = 0;
          if (!o.quiet) std::printf("%s\n", line->c_str());
          ++written;
          tokens_done += seq->prompt_len();
        });
      }
      progress.Update(written + failed, tokens_done);
    }
  }
  if (stopping) {
    Fail(cmd, Error("stopped early: " + stop_reason + "; " + std::to_string(written.load()) +
                    " files written this run, " + std::to_string(left_unwritten.load()) +
                    " finished requests and the rest of the input left undone. Run the same command again "
                    "once the cause is fixed: it resumes where this run stopped"));
  }
  progress.Finish(written + failed, tokens_done);
  std::fflush(stdout);
  if (!o.quiet) {
    std::fprintf(stderr,
                 "hsx extract: wrote %ld files to %s, skipped %ld already in the manifest, %ld failed; "
                 "prefix cache hit rate %.1f%%\n",
                 static_cast<long>(written.load()), o.output.c_str(), static_cast<long>(skipped),
                 static_cast<long>(failed.load()), 100.0 * engine.prefix_cache_hit_rate());
  }
  return {failed > 0 || stopping ? 1 : 0, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          written.load(), tokens_done.load(), loaded->backend->peak_memory_bytes()};
}

void RegisterExtract(CLI::App& root) {
  auto o = std::make_shared<ExtractOptions>();
  CLI::App* app = root.add_subcommand("extract", "Write the hidden states of chosen layers for every prompt");
  o->model.Register(*app);
  app->add_option("--layers", o->layers, "Layer ids, comma separated (vLLM convention: 0 = embeddings, N = last layer)")
      ->required();
  app->add_option("--input", o->input, "JSONL: {\"id\", \"token_ids\"} or {\"id\", \"prompt\"} per line")->required();
  app->add_option("--output", o->output, "Output directory: <id>.safetensors and manifest.jsonl")->required();
  app->add_option("--dtype", o->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's dtype)");
  app->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Token budget per forward step");
  app->add_option("--max-num-seqs", o->max_num_seqs, "Sequences per step at most");
  app->add_option("--kv-cache-gib", o->kv_cache_gib, "KV cache size in GiB");
  app->add_option("--writer-threads", o->writer_threads, "File writer threads");
  app->add_flag("!--no-enable-prefix-caching", o->prefix_caching,
                "Compute shared prompt prefixes again instead of reusing cached blocks and their states");
  app->add_option("--max-write-failures", o->max_write_failures,
                  "Stop after this many file writes fail in a row (a full disk stops at once)")
      ->check(CLI::PositiveNumber);
  app->add_option("--writer-queue", o->writer_queue,
                  "Finished requests waiting for a writer at most; beyond it the engine waits (backpressure)");
  app->callback([o] { ExitCode() = RunExtract(*o).exit_code; });
}

}  // namespace hsx::cli
