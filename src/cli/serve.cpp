// hsx serve MODEL: the OpenAI-style server, taking vLLM's flag shapes for hidden-state
// extraction (--speculative-config, --kv-transfer-config) so its clients work unchanged.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "capture/kv_transfer_config.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine_replicas.h"
#include "server/openai_server.h"
#include "util/atomic_file.h"

namespace hsx::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  ServerConfig server;
  std::string speculative_config, kv_transfer_config;
  int max_num_batched_tokens = 8192, max_num_seqs = 256, max_queued = 1024;
  int data_parallel_size = 1;
  double kv_cache_gib = 2.0;
  double drain_timeout = 30;  // seconds
  bool prefix_caching = true;
};

// Temp files of this host's writers that died between write and rename (a serve killed
// with -9); those of live writers and of other hosts sharing the storage stay. A file
// that cannot be removed is worth a warning, not a server that will not start.
void RemoveDeadWritersTempFiles(const std::string& storage_dir) {
  auto removed = RemoveStaleTempFiles(storage_dir);
  if (!removed.ok()) {
    std::fprintf(stderr, "hsx serve: warning: %s\n", removed.status().message().c_str());
  } else if (*removed > 0) {
    std::fprintf(stderr, "hsx serve: removed %d temp file(s) of dead writers in %s\n", *removed, storage_dir.c_str());
  }
}

// SIGTERM/SIGINT. While the model loads there is nothing to drain, so a signal ends the
// process at once (it used to wait in a pipe nobody read yet, and was lost). Once serving,
// a signal writes a byte to a pipe (all a handler may safely do); a waiting thread reads
// it and drains the server, and cuts the drain short on a second one or at the deadline.
std::atomic<bool> g_serving{false};
int g_signal_pipe[2] = {-1, -1};
extern "C" void OnStopSignal(int) {
  if (!g_serving.load()) {
    static const char kMessage[] = "hsx serve: stopped by a signal before serving began (while loading the model)\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    ::_exit(0);
  }
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
}

// Waits for a byte on the signal pipe: true if one came within `timeout_ms` (-1: no limit).
bool WaitForSignal(int timeout_ms) {
  pollfd p{g_signal_pipe[0], POLLIN, 0};
  int n;
  while ((n = ::poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  char byte;
  return n > 0 && ::read(g_signal_pipe[0], &byte, 1) == 1;
}

int RunServe(ServeOptions o) {
  const char* cmd = "serve";
  if (::pipe(g_signal_pipe) != 0) return Fail(cmd, Error("cannot create the signal pipe"));
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  auto replicas = LoadReplicas(o.model, o.data_parallel_size);
  if (!replicas.ok()) return Fail(cmd, replicas.status());
  const LoadedModel& loaded = replicas->front();
  const ModelConfig& mc = loaded.model->config();

  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.kv_cache_bytes = static_cast<size_t>(o.kv_cache_gib * (1ull << 30));
  ec.capture_dtype = mc.dtype;
  ec.enable_prefix_caching = o.prefix_caching;
  ec.graphs = !o.model.enforce_eager;
  std::vector<EngineConfig> configs(replicas->size(), ec);  // a replica's drafts are its own
  for (size_t r = 0; r < replicas->size() && !o.speculative_config.empty(); ++r) {
    auto method = ApplySpeculativeConfig(o.speculative_config, /*extracts=*/true, (*replicas)[r], configs[r]);
    if (!method.ok()) return Fail(cmd, method.status());
  }
  std::unique_ptr<CaptureSink> sink;
  if (!o.kv_transfer_config.empty()) {
    auto kv = ParseKvTransferConfig(o.kv_transfer_config);
    if (!kv.ok()) return Fail(cmd, kv.status());
    if (o.server.allow_custom_path && !kv->writes_files()) {
      return Fail(cmd, Error("--allow-custom-save-path names files: the kv connector writes none"));
    }
    auto made = MakeCaptureSink(*kv, /*exclusive_names=*/true);
    if (!made.ok()) return Fail(cmd, made.status().with_context("--kv-transfer-config"));
    sink = std::move(made).value();
    o.server.sink = sink.get();
    auto contract = LayerContractMetadata(o.model, loaded, configs[0].capture_layers, ec.capture_dtype);
    if (!contract.ok()) return Fail(cmd, contract.status());
    o.server.capture_metadata = std::move(contract).value();
    o.server.writer_threads = kv->writer_threads;
    if (kv->writes_files()) {
      o.server.storage_dir = kv->storage_dir;
      RemoveDeadWritersTempFiles(o.server.storage_dir);
    }
  }
  if (configs[0].capture_layers.empty() != (sink == nullptr)) {
    return Fail(cmd, Error("hidden-state extraction needs both --speculative-config and --kv-transfer-config"));
  }
  if (o.server.model_name.empty()) o.server.model_name = o.model.model;
  o.server.max_model_len = mc.max_model_len();

  std::vector<std::unique_ptr<EngineService>> services;
  for (size_t r = 0; r < replicas->size(); ++r) {
    configs[r].max_model_len = mc.max_model_len();
    configs[r].tensor_parallel_peers = (*replicas)[r].peers();
    (*replicas)[r].backend->PinThread();  // the engine's device memory on its own device
    services.push_back(std::make_unique<EngineService>(*(*replicas)[r].model, configs[r], static_cast<size_t>(o.max_queued)));
  }
  // A prefix's replica keeps its requests until it has a full batch more than the least loaded.
  EngineReplicas service(std::move(services), configs[0].block_size, static_cast<size_t>(std::max(1, o.max_num_seqs)));
  if (!loaded.chat_template_error.ok()) {
    std::fprintf(stderr, "hsx serve: warning: chat completions are off: %s\n", loaded.chat_template_error.message().c_str());
  }
  OpenAiServer server(o.server, service, loaded.tokenizer_or_null(), mc.eos_token_ids, loaded.chat_template_or_null(),
                      loaded.chat_template_error);
  std::atomic<bool> run_ended{false}, cut_short{false};
  std::thread waiter([&] {
    if (!WaitForSignal(-1) || run_ended) return;
    server.Stop();
    std::fprintf(stderr,
                 "hsx serve: draining: new connections are refused, requests under way finish (at most %gs; "
                 "a second signal stops at once)\n",
                 o.drain_timeout);
    const bool second = WaitForSignal(static_cast<int>(std::min(o.drain_timeout * 1000.0, double{INT_MAX})));
    if (run_ended) return;
    std::fprintf(stderr, "hsx serve: %s: cancelling the requests still under way\n",
                 second ? "a second signal" : "the drain deadline passed");
    cut_short = true;
    server.StopNow();
  });
  g_serving = true;  // from here a signal goes to the waiter (Stop before Run makes Run return at once)
  std::fprintf(stderr, "hsx serve: %s on http://%s:%d%s\n", o.server.model_name.c_str(), o.server.host.c_str(),
               o.server.port, sink ? (", hidden states to " + sink->Describe()).c_str() : "");
  const Status run = server.Run();
  run_ended = true;
  const char byte = 0;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);  // wakes the waiter
  waiter.join();
  if (!run.ok()) return Fail(cmd, run);
  service.Shutdown();
  std::fprintf(stderr, "hsx serve: stopped%s\n", cut_short ? " (requests were cancelled)" : "");
  return cut_short ? 1 : 0;
}

// vLLM's flags that shape only its Python front end (API server processes, renderer
// workers, uvicorn, request logging), which hsx's one C++ process has no use for:
// accepted, so vLLM command lines (speculators' launch_vllm.py writes --api-server-count and
// --renderer-num-workers) run unchanged, and named in a note. Valued, then bare flags.
constexpr const char* kFrontEndOptions[] = {"--api-server-count", "--renderer-num-workers", "--uvicorn-log-level",
                                            "--max-log-len", "--allowed-origins", "--allowed-methods",
                                            "--allowed-headers", "--root-path", "--middleware"};
constexpr const char* kFrontEndFlags[] = {"--disable-log-requests", "--enable-log-requests", "--disable-log-stats",
                                          "--disable-uvicorn-access-log", "--disable-fastapi-docs",
                                          "--enable-server-load-tracking", "--disable-frontend-multiprocessing"};

}  // namespace

std::vector<std::string> NormalizeServeFlags(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (argc < 2 || args[1] != "serve") return args;
  for (size_t i = 2; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--") break;  // what follows is positional
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) continue;
    const size_t end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  }
  return args;
}

void RegisterServe(CLI::App& root) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* app = root.add_subcommand("serve", "OpenAI-compatible server (vLLM's hidden-state extraction protocol)");
  app->add_option("model", o->model.model, "Hugging Face model directory, a .gguf file, or a named config with dummy weights")
      ->required();
  app->add_option("--load-format", o->model.load_format)->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  app->add_option("--device", o->model.device, "cpu or cuda[:N]");
  o->model.RegisterExecutionFlags(*app);
  AddDataParallelOption(*app, o->data_parallel_size);
  app->add_option("--host", o->server.host, "Address to bind (default 127.0.0.1)");
  app->add_option("--port", o->server.port);
  app->add_option("--api-key", o->server.api_key, "Require 'Authorization: Bearer KEY'");
  app->add_option("--served-model-name", o->server.model_name);
  app->add_option("--speculative-config", o->speculative_config, "vLLM's JSON; method extract_hidden_states (with --kv-transfer-config), ngram, eagle3 or mtp");
  app->add_option("--kv-transfer-config", o->kv_transfer_config, "vLLM's JSON; ExampleHiddenStatesConnector, FP8HiddenStatesConnector or MooncakeHiddenStatesConnector");
  app->add_flag("--allow-custom-save-path", o->server.allow_custom_path,
                "Let requests name kv_transfer_params.hidden_states_path (inside shared_storage_path)");
  app->add_option("--max-num-batched-tokens", o->max_num_batched_tokens);
  app->add_option("--max-num-seqs", o->max_num_seqs);
  app->add_option("--max-queued-requests", o->max_queued, "Beyond this, requests get 503 with Retry-After");
  app->add_option("--max-n", o->server.max_n, "Most choices (n) one request may ask for; more is a 400 (default 128)")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--kv-cache-gib", o->kv_cache_gib);
  app->add_option("--http-threads", o->server.http_threads,
                  "Client connections served at once (an idle keep-alive connection holds one)")
      ->check(CLI::Range(1, 65536));
  app->add_option("--http-header-timeout", o->server.header_timeout,
                  "Seconds a client has to send a request's line and headers (default 10)")
      ->check(CLI::Range(0.001, 3600.0));
  app->add_option("--http-read-timeout", o->server.read_timeout,
                  "Seconds a client may pause while sending a request body (default 5)")
      ->check(CLI::Range(0.001, 3600.0));
  app->add_option("--http-body-timeout", o->server.body_timeout,
                  "Seconds a client has to send a whole request body, from its headers (default 30)")
      ->check(CLI::Range(0.001, 86400.0));
  app->add_option("--http-max-incoming-bodies", o->server.max_incoming_bodies,
                  "Connections that may be sending a request body at once; beyond them a body that has not "
                  "arrived within a second gets 503 (default: a quarter of --http-threads)")
      ->check(CLI::Range(0, 65536));
  app->add_option("--drain-timeout", o->drain_timeout,
                  "On SIGTERM/SIGINT, seconds to let requests under way finish before cancelling them (default 30)")
      ->check(CLI::Range(0.0, 86400.0));
  app->add_option("--max-body-bytes", o->server.max_body_bytes, "Larger request bodies get 413 (default 32 MiB)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 40));
  app->add_flag("!--no-enable-prefix-caching", o->prefix_caching);
  auto ignored = std::make_shared<std::vector<std::string>>();
  for (const char* name : kFrontEndOptions) {
    app->add_option_function<std::string>(name, [ignored, name](const std::string&) { ignored->push_back(name); },
                                          "vLLM front-end option: accepted and ignored");
  }
  for (const char* name : kFrontEndFlags) {
    app->add_flag_function(name, [ignored, name](int64_t) { ignored->push_back(name); },
                           "vLLM front-end flag: accepted and ignored");
  }
  app->callback([o, ignored] {
    for (const std::string& name : *ignored) {
      std::fprintf(stderr, "hsx serve: note: ignoring %s (a vLLM front-end setting; hsx serves from one process)\n",
                   name.c_str());
    }
    ExitCode() = RunServe(*o);
  });
}

}  // namespace hsx::cli
