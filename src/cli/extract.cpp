// hsx extract: hidden states of chosen layers for every prompt of a JSONL file, one
// <id>.safetensors per request, a manifest line per file, resumable. The input's lines go
// through the data-parallel dispatcher (EngineReplicas, one engine per replica) to the
// capture sink; a manifest line follows each record the sink holds.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "capture/hidden_states_file.h"
#include "capture/kv_transfer_config.h"
#include "capture/safetensors_sink.h"
#include "capture/manifest.h"
#include "capture/shard_manifests.h"
#include "capture/shard_spec.h"
#include "capture/writer_pool.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/extract.h"
#include "engine/capture_record.h"
#include "engine/engine_replicas.h"
#include "engine/regeneration_request.h"
#include "util/atomic_file.h"
#include "util/stable_hash.h"

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

// A regenerated conversation's request: sampled as the flags say (each line with its own
// seed), answers ended by the model's end-of-turn tokens.
void RegenerationRequest(Request& request, std::shared_ptr<ConversationRegeneration> regeneration,
                         const ExtractOptions::Regenerate& flags, int max_model_len, std::vector<int32_t> stop_token_ids) {
  request.stop_token_ids = std::move(stop_token_ids);
  request.sampling.temperature = flags.temperature;
  request.sampling.top_p = flags.top_p;
  if (flags.seed) request.sampling.seed = *flags.seed + StableHash(request.id);
  MakeRegenerationRequest(request, std::move(regeneration), flags.max_tokens, max_model_len);
}

// An input line on its way through the dispatcher: what its record needs besides the
// finished sequence (a messages line's loss mask, a regenerated conversation's answers).
struct ExtractLine {
  int line = 0;
  std::vector<uint8_t> loss_mask;
  std::shared_ptr<ConversationRegeneration> regeneration;
};

// One EngineService per replica, each built with its device pinned and given `warmup_tokens`
// (> 0) throwaway prompt tokens first (ExtractOptions::warmup), all replicas at once,
// behind the dispatcher that routes as serve's does.
Result<std::unique_ptr<EngineReplicas>> StartReplicas(std::vector<LoadedModel>& replicas, const EngineConfig& config,
                                                      size_t max_in_flight, int warmup_tokens) {
  std::vector<std::unique_ptr<EngineService>> services;
  std::vector<std::future<Status>> warmups;
  for (LoadedModel& r : replicas) {
    r.backend->PinThread();
    EngineConfig own = config;
    own.tensor_parallel_peers = r.peers();
    services.push_back(std::make_unique<EngineService>(*r.model, own, max_in_flight));
    if (warmup_tokens <= 0) continue;
    const ModelConfig& mc = r.model->config();
    const int n = std::max(1, std::min(warmup_tokens, mc.max_model_len()) - 1);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i % mc.vocab_size;
    auto promise = std::make_shared<std::promise<Status>>();
    warmups.push_back(promise->get_future());
    if (!services.back()->Submit(Request{"hsx-warmup", std::move(ids), 0},
                                 [promise](const Status& s, std::unique_ptr<Sequence>) { promise->set_value(s); })) {
      return Error("warmup: the engine refused its request");
    }
  }
  for (auto& w : warmups) {
    if (Status s = w.get(); !s.ok()) return s;
  }
  return std::make_unique<EngineReplicas>(std::move(services), config.block_size, std::max<size_t>(1, max_in_flight / 2));
}

}  // namespace

ExtractResult RunExtract(const ExtractOptions& o) {
  const char* cmd = "extract";
  auto shard = ResolveShard(o.shard, ProcessEnv());
  if (!shard.ok()) return {Fail(cmd, shard.status())};
  auto replicas = LoadReplicas(o.model, o.data_parallel_size);
  if (!replicas.ok()) return {Fail(cmd, replicas.status())};
  const LoadedModel& loaded = replicas->front();
  const ModelConfig& config = loaded.model->config();
  auto layers = ParseLayerIds(o.layers, config.num_layers);
  if (!layers.ok()) return {Fail(cmd, layers.status())};
  DType dtype = config.dtype;
  if (!o.dtype.empty()) {
    auto parsed = ParseFloatDTypeName(o.dtype);
    if (!parsed) return {Fail(cmd, Error("--dtype: '" + o.dtype + "' is not one of float32, bfloat16, float16"))};
    dtype = *parsed;
  }
  auto reader = PromptReader::Open(o.input, loaded, /*add_generation_prompt=*/false,
                                   [&](int line, const std::string& id) { return shard->Owns(line, id); });
  if (!reader.ok()) return {Fail(cmd, reader.status())};
  reader->MakeLossMasks();  // messages lines' files carry loss_mask [T]
  if (o.regenerate.on) reader->MakeRegenerations();
  if (Status s = PrepareOutputDir(o.output); !s.ok()) return {Fail(cmd, s)};
  // Absolute paths in the manifest, as vLLM reports them, so readers need not know our cwd.
  const std::string out_dir = std::filesystem::absolute(o.output).lexically_normal().string();
  auto contract = LayerContractMetadata(o.model, loaded, *layers, dtype);
  if (!contract.ok()) return {Fail(cmd, contract.status())};
  // Where the states go: files in the output directory, or the sink --kv-transfer-config names.
  std::unique_ptr<CaptureSink> sink;
  std::string connector = "files";
  if (o.kv_transfer_config.empty()) {
    sink = std::make_unique<SafetensorsSink>(SafetensorsSink::Options{.dir = out_dir});
  } else {
    auto kv = ParseKvTransferConfig(o.kv_transfer_config, "--kv-transfer-config", out_dir);
    if (!kv.ok()) return {Fail(cmd, kv.status())};
    if (kv->writes_files() && kv->storage_dir != out_dir) {
      return {Fail(cmd, Error("--kv-transfer-config: shared_storage_path " + kv->storage_dir + " is not --output " +
                              out_dir + ", where extract keeps its files and manifest (leave it out)"))};
    }
    kv->use_lock = false;  // the manifest line, appended once a file is complete, is extract's signal
    auto made = MakeCaptureSink(*kv, /*exclusive_names=*/false);
    if (!made.ok()) return {Fail(cmd, made.status().with_context("--kv-transfer-config"))};
    sink = std::move(made).value();
    connector = kv->name;
  }
  if (shard->sharded()) {
    nlohmann::json settings{{"model", o.model.model}, {"load_format", o.model.load_format}, {"layers", *layers},
                            {"dtype", std::string(DTypeName(dtype))}};
    if (connector != "files" && connector != "ExampleHiddenStatesConnector") settings["kv_connector"] = connector;
    if (Status s = WriteOrCheckShardConfig(out_dir, *shard, settings); !s.ok()) return {Fail(cmd, s)};
    if (Status s = SetShardDone(out_dir, *shard, false); !s.ok()) return {Fail(cmd, s)};
  }
  const std::string manifest_path = out_dir + "/" + shard->ManifestName();
  auto manifest = Manifest::Open(manifest_path);
  if (!manifest.ok()) return {Fail(cmd, manifest.status())};
  // A shard that owns no line still leaves its (empty) manifest, so merge sees it ran.
  if (shard->sharded() && !std::ofstream(manifest_path, std::ios::app)) {
    return {Fail(cmd, Error(manifest_path + ": cannot create"))};
  }
  for (const std::string& w : manifest->warnings()) std::fprintf(stderr, "hsx extract: warning: %s\n", w.c_str());
  // Files a killed run was writing; a live writer's (another hsx in this directory) stay,
  // and so do other shards' (on a shared file system their pids are another host's).
  const std::string suffix = ".safetensors";
  auto owned = [&](const std::string& target) {
    if (target == shard->ConfigName()) return true;
    const bool state_file = target.size() > suffix.size() && target.ends_with(suffix);
    return state_file && shard->Owns(0, target.substr(0, target.size() - suffix.size()));
  };
  auto stale = RemoveStaleTempFiles(out_dir, shard->sharded() ? std::function<bool(const std::string&)>(owned) : nullptr);
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
  // The dispatcher: one engine per replica on its own thread, each holding at most
  // max_in_flight requests (bounded memory on any input).
  const size_t max_in_flight = static_cast<size_t>(std::max(1, o.max_num_seqs)) * 2;  // per replica
  auto dispatcher = StartReplicas(*replicas, ec, max_in_flight, o.warmup ? o.max_num_batched_tokens : 0);
  if (!dispatcher.ok()) return {Fail(cmd, dispatcher.status())};
  EngineReplicas& engines = **dispatcher;
  // Each replica's first step waits for a step's worth of prompt tokens (or a full queue, or
  // the end of the input): stepping on the first few requests the reader hands over makes a
  // short step and one step more in all, and waiting for more keeps the GPU idle while the
  // reader parses the rest (for a short input, all of it).
  engines.GatherNextStep(o.max_num_batched_tokens);

  const int max_model_len = engines.engine_config().max_model_len;
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int64_t> written{0}, failed{0}, tokens_done{0}, left_unwritten{0}, write_failures{0};
  std::atomic<uint64_t> bytes_written{0};
  std::mutex out_mu;
  auto report = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(out_mu);
    failed += Fail(cmd, s);
  };
  // The reader waits here while every replica holds max_in_flight; a finished request (or a
  // stop) wakes it.
  std::mutex room_mu;
  std::condition_variable room_cv;
  std::atomic<bool> stopping{false};
  auto wake_reader = [&] {
    { std::lock_guard<std::mutex> lock(room_mu); }  // the reader is between Submit and its wait, or waiting
    room_cv.notify_all();
  };
  // A full disk fails every later write too: stop at the first such error, or after
  // max_write_failures in a row, instead of computing the rest of the dataset for nothing.
  int consecutive_write_failures = 0;  // under out_mu
  std::string stop_reason;             // under out_mu
  auto write_failed = [&](const Status& s) {  // under out_mu
    failed += Fail(cmd, s);
    ++write_failures;
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
    engines.AbortAll();  // requests under way are cancelled: the resumed run does them
    wake_reader();
  };
  // A shard's share of the lines is about 1/n of them (ids hash evenly).
  Progress progress(shard->sharded() ? "hsx extract " + std::to_string(shard->index) + "/" + std::to_string(shard->count)
                                     : "hsx extract",
                    PromptReader::CountLines(o.input) / shard->count - static_cast<int64_t>(manifest->size()));
  std::unordered_map<std::string, int> seen;  // id -> line, within this input
  int64_t skipped = 0;
  {
    WriterPool writers(o.writer_threads, static_cast<size_t>(std::max(1, o.writer_queue)));
    // A line that failed after admission (an inf or NaN row, a regeneration that went
    // wrong): reported, and told to the sink, as serve does, so that a reader waiting for
    // its id meets Mooncake's ":error" marker instead of timing out. On a writer thread:
    // the sink may be a network store.
    auto failed_after_admission = [&](std::shared_ptr<const Sequence> seq, int line, Status why) {
      writers.Submit([&, seq, line, why] {
        const Status marker = sink->PutFailure(CaptureRecordOf(*seq, "", *contract), why);
        report(Error(o.input + ":" + std::to_string(line) + ": " + why.message() +
                     (marker.ok() ? "" : "; " + marker.message())));
      });
    };
    // The sink side: a finished request's record goes to a writer thread (Submit blocks
    // while the writers' queue is full: a slow disk makes the engines wait), which puts it
    // in the sink and appends its manifest line. Runs on the replica's engine thread.
    auto finished = [&](const std::shared_ptr<ExtractLine>& line, const Status& status, std::unique_ptr<Sequence> done) {
      wake_reader();  // its room in the dispatcher is free
      if (stopping) {  // cancelled, or finished unwritten: the resumed run does it
        if (status.ok()) ++left_unwritten;
        return;
      }
      if (done == nullptr) {  // the engine refused it (Engine::Add)
        report(Error(o.input + ":" + std::to_string(line->line) + ": " + status.message()));
      } else if (!status.ok()) {
        failed_after_admission(std::move(done), line->line, status);
      } else if (line->regeneration && !line->regeneration->error().ok()) {
        failed_after_admission(std::move(done), line->line, line->regeneration->error());
      } else {
        std::shared_ptr<Sequence> seq(std::move(done));
        writers.Submit([&, seq, line] {
          if (stopping) {
            ++left_unwritten;  // for the resumed run
            return;
          }
          CaptureRecord record = CaptureRecordOf(*seq, "", *contract);
          if (line->regeneration) {  // 1 on the answers the target generated
            record.extras.emplace_back(
                "loss_mask", RegenerationLossMask(*line->regeneration, static_cast<int64_t>(record.token_ids.size())));
          } else if (!line->loss_mask.empty()) {
            std::vector<uint8_t>& mask = line->loss_mask;
            mask.resize(record.token_ids.size());
            Tensor loss_mask = Tensor::Host(DType::kI64, {static_cast<int64_t>(mask.size())});
            std::copy(mask.begin(), mask.end(), loss_mask.data<int64_t>());
            record.extras.emplace_back("loss_mask", std::move(loss_mask));
          }
          auto receipt = sink->Put(record);
          std::lock_guard<std::mutex> lock(out_mu);
          Result<std::string> out_line =
              receipt.ok() ? manifest->Append(seq->id(), receipt->location, static_cast<int64_t>(record.token_ids.size()),
                                              receipt->transfer_params.contains("hidden_states_path")
                                                  ? nlohmann::json(nullptr)
                                                  : receipt->transfer_params)
                           : receipt.status();
          if (!out_line.ok()) return write_failed(out_line.status());
          consecutive_write_failures = 0;
          if (!o.quiet) std::printf("%s\n", out_line->c_str());
          ++written;
          tokens_done += static_cast<int64_t>(record.token_ids.size());
          bytes_written += receipt->bytes;
        });
      }
      std::lock_guard<std::mutex> lock(out_mu);
      progress.Update(written + failed, tokens_done);
    };

    // The input side: each owned, new, valid line becomes a request for the dispatcher,
    // which routes it as serve's (a shared first block to one replica's prefix cache,
    // others by load).
    while (!stopping) {
      std::optional<PromptLine> p = reader->Next();
      if (!p) break;
      if (!shard->Owns(p->line, p->id)) continue;  // an unreadable line: one shard reports it
      if (!p->error.ok()) {
        report(p->error);
        continue;
      }
      const std::string where = o.input + ":" + std::to_string(p->line) + ": ";
      if (manifest->Contains(p->id)) {
        ++skipped;
        continue;
      }
      if (auto [it, fresh] = seen.emplace(p->id, p->line); !fresh) {
        report(Error(where + "duplicate id '" + p->id + "' (first on line " + std::to_string(it->second) + ")"));
        continue;
      }
      if (Status s = ValidateRequestId(p->id); !s.ok()) {
        report(Error(where + s.message()));
        continue;
      }
      Request request{p->id, std::move(p->token_ids), 0};
      if (p->regeneration) {
        if (static_cast<int>(request.prompt.size()) >= max_model_len) {
          report(Error(where + "the first answer's prompt fills max_model_len " + std::to_string(max_model_len)));
          continue;
        }
        RegenerationRequest(request, p->regeneration, o.regenerate, max_model_len, config.eos_token_ids);
      }
      auto line = std::make_shared<ExtractLine>(ExtractLine{p->line, std::move(p->loss_mask), std::move(p->regeneration)});
      EngineReplicas::Callback done = [&finished, line](const Status& s, std::unique_ptr<Sequence> seq) {
        finished(line, s, std::move(seq));
      };
      // A refused request stays with us (Submit takes a copy): try again once one finishes.
      std::unique_lock<std::mutex> lock(room_mu);
      while (!stopping && !engines.Submit(request, done)) room_cv.wait(lock);
    }
    engines.Shutdown();  // the end of the input: every replica finishes what it holds
  }  // and the writers write what they hold
  if (stopping) {
    Fail(cmd, Error("stopped early: " + stop_reason + "; " + std::to_string(written.load()) +
                    " files written this run, " + std::to_string(left_unwritten.load()) +
                    " finished requests and the rest of the input left undone. Run the same command again "
                    "once the cause is fixed: it resumes where this run stopped"));
  }
  progress.Finish(written + failed, tokens_done);
  // Failed lines stay failed in any later run; failed writes may not, so they leave the shard unfinished.
  if (shard->sharded() && !stopping && write_failures == 0) {
    if (Status s = SetShardDone(out_dir, *shard, true); !s.ok()) failed += Fail(cmd, s);
  }
  std::fflush(stdout);
  if (!o.quiet) {
    const EngineService::Stats total = engines.stats();
    std::string per_replica;
    const std::vector<EngineService::Stats> replica_stats = engines.replica_stats();
    for (size_t r = 0; r < replica_stats.size(); ++r) {
      const uint64_t requests = replica_stats[r].requests_finished + replica_stats[r].requests_failed - (o.warmup ? 1 : 0);
      per_replica += (r ? ", " : "; requests per replica: ") + std::to_string(requests);
    }
    std::fprintf(stderr,
                 "hsx extract: wrote %ld files to %s, skipped %ld already in the manifest, %ld failed; "
                 "prefix cache hit rate %.1f%%%s\n",
                 static_cast<long>(written.load()), o.output.c_str(), static_cast<long>(skipped),
                 static_cast<long>(failed.load()), 100.0 * total.prefix_cache_hit_rate,
                 engines.size() > 1 ? per_replica.c_str() : "");
    // Where the engine threads' time went (host wall time per stage, summed over replicas;
    // blocking downloads count in run): against the run's wall time, what is left is the
    // dispatch around the steps.
    std::string stages;
    for (int i = 0; i < EngineStats::kNumStages; ++i) {
      stages += std::string(i ? ", " : "") + EngineStats::kStageNames[i] + " " +
                std::to_string(total.engine.stage_seconds[i]).substr(0, 6) + " s";
    }
    std::fprintf(stderr, "hsx extract: engine host time: %s; %lu steps\n", stages.c_str(),
                 static_cast<unsigned long>(total.engine.steps));
  }
  size_t peak = 0;
  for (const LoadedModel& r : *replicas) peak = std::max(peak, r.backend->peak_memory_bytes());
  // The engines go with `dispatcher`, each destroyed with its device pinned (~EngineService).
  return {failed > 0 || stopping ? 1 : 0, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          written.load(), tokens_done.load(), bytes_written.load(), connector, peak};
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
  app->add_flag("--regenerate", o->regenerate.on,
                "One pass over messages lines: the target answers each assistant turn anew (as speculators' "
                "regenerate-responses), and the file holds the whole regenerated conversation's states with "
                "loss_mask 1 on the answers");
  app->add_option("--max-tokens", o->regenerate.max_tokens, "--regenerate: tokens per answer at most")
      ->check(CLI::Range(1, 1 << 24));
  app->add_option("--temperature", o->regenerate.temperature, "--regenerate: sampling temperature (0: greedy)")
      ->check(CLI::Range(0.0, 100.0));
  app->add_option("--top-p", o->regenerate.top_p, "--regenerate: nucleus sampling")->check(CLI::Range(0.0, 1.0));
  app->add_option("--seed", o->regenerate.seed, "--regenerate: each line samples with this plus a hash of its id");
  app->add_option("--kv-transfer-config", o->kv_transfer_config,
                  "vLLM's JSON naming the sink: ExampleHiddenStatesConnector (the default), FP8HiddenStatesConnector "
                  "(hs-connectors' FP8 files) or MooncakeHiddenStatesConnector; files go to --output");
  app->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Token budget per forward step");
  app->add_option("--max-num-seqs", o->max_num_seqs, "Sequences per step at most");
  app->add_option("--kv-cache-gib", o->kv_cache_gib, "KV cache size in GiB");
  AddDataParallelOption(*app, o->data_parallel_size);
  app->add_option("--writer-threads", o->writer_threads, "File writer threads");
  app->add_flag("!--no-enable-prefix-caching", o->prefix_caching,
                "Compute shared prompt prefixes again instead of reusing cached blocks and their states");
  app->add_option("--max-write-failures", o->max_write_failures,
                  "Stop after this many file writes fail in a row (a full disk stops at once)")
      ->check(CLI::PositiveNumber);
  app->add_option("--shard", o->shard,
                  "i/n: do shard i (from 0) of n, the lines whose id hashes to i, into manifest.shard-I-of-N.jsonl "
                  "(default: from mpirun's, srun's or torchrun's environment; join with hsx manifest merge)");
  app->add_option("--writer-queue", o->writer_queue,
                  "Finished requests waiting for a writer at most; beyond it the engine waits (backpressure)");
  app->callback([o] { ExitCode() = RunExtract(*o).exit_code; });
}

}  // namespace hsx::cli
