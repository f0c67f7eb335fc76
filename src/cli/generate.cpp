// hsx generate: greedy continuations of JSONL prompts, one JSON line per request.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "engine/engine_replicas.h"

namespace hsx::cli {
namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string input;
  int max_tokens = 16;
  bool ignore_eos = false;
  bool skip_special_tokens = true;  // the text leaves out special tokens (vLLM's default)
  double kv_cache_gib = 1.0;
  std::string speculative_config;  // vLLM's JSON: ngram or eagle3
  int data_parallel_size = 1;
};

int RunGenerate(const GenerateOptions& o) {
  const char* cmd = "generate";
  auto replicas = LoadReplicas(o.model, o.data_parallel_size);
  if (!replicas.ok()) return Fail(cmd, replicas.status());
  const Tokenizer* tok = replicas->front().tokenizer_or_null();
  const ModelConfig& mc = replicas->front().model->config();
  auto reader = PromptReader::Open(o.input, replicas->front(), /*add_generation_prompt=*/true);
  if (!reader.ok()) return Fail(cmd, reader.status());
  EngineConfig ec;
  ec.kv_cache_bytes = static_cast<size_t>(o.kv_cache_gib * (1ull << 30));
  ec.graphs = !o.model.enforce_eager;
  // Each replica's engine on its own thread (EngineService), requests routed as serve does.
  const size_t max_in_flight = 2 * static_cast<size_t>(ec.scheduler.max_num_seqs);  // per replica
  std::vector<std::unique_ptr<EngineService>> services;
  for (LoadedModel& r : *replicas) {
    EngineConfig own = ec;  // a replica's drafts are its own
    if (!o.speculative_config.empty()) {
      auto method = ApplySpeculativeConfig(o.speculative_config, /*extracts=*/false, r, own);
      if (!method.ok()) return Fail(cmd, method.status());
    }
    own.tensor_parallel_peers = r.peers();
    r.backend->PinThread();
    services.push_back(std::make_unique<EngineService>(*r.model, own, max_in_flight));
  }
  EngineReplicas engines(std::move(services), ec.block_size, max_in_flight / 2);
  std::mutex out_mu;
  std::condition_variable freed;
  int failed = 0;  // under out_mu
  while (std::optional<PromptLine> p = reader->Next()) {
    if (!p->error.ok()) {
      std::lock_guard<std::mutex> lock(out_mu);
      failed += Fail(cmd, p->error);
      continue;
    }
    Request r{p->id, std::move(p->token_ids), o.max_tokens};
    if (!o.ignore_eos) r.stop_token_ids = mc.eos_token_ids;
    auto done = [&, where = o.input + ":" + std::to_string(p->line) + ": "](const Status& s, std::unique_ptr<Sequence> seq) {
      std::lock_guard<std::mutex> lock(out_mu);
      freed.notify_one();
      if (!s.ok()) {
        failed += Fail(cmd, Error(where + s.message()));
        return;
      }
      nlohmann::json out = {{"id", seq->id()}, {"token_ids", seq->generated()}};
      if (tok != nullptr) {
        auto text = tok->Decode(seq->generated(), o.skip_special_tokens);
        if (text.ok()) out["text"] = *text;
      }
      std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    };
    // Every replica full: wait for a request to finish (bounded memory on any input).
    std::unique_lock<std::mutex> lock(out_mu);
    while (!engines.Submit(r, done)) freed.wait_for(lock, std::chrono::milliseconds(50));
  }
  engines.Shutdown();  // finishes every request
  if (const EngineStats st = engines.stats().engine; st.num_draft_tokens > 0) {
    std::fprintf(stderr, "hsx generate: speculative decoding accepted %lu of %lu drafts (%.1f%%)\n",
                 static_cast<unsigned long>(st.num_accepted_tokens), static_cast<unsigned long>(st.num_draft_tokens),
                 100.0 * st.num_accepted_tokens / st.num_draft_tokens);
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace

void RegisterGenerate(CLI::App& root) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* app = root.add_subcommand("generate", "Greedy generation for every prompt of a JSONL file");
  o->model.Register(*app);
  app->add_option("--input", o->input, "JSONL: {\"id\", \"token_ids\"} or {\"id\", \"prompt\"} per line")->required();
  app->add_option("--max-tokens", o->max_tokens, "New tokens per request")->check(CLI::NonNegativeNumber);
  app->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  app->add_flag("--skip-special-tokens,!--no-skip-special-tokens", o->skip_special_tokens,
                "The output text leaves out special tokens (<|im_end|>, ...), as vLLM's default (token_ids keep them)");
  app->add_option("--kv-cache-gib", o->kv_cache_gib, "KV cache size in GiB");
  AddDataParallelOption(*app, o->data_parallel_size);
  app->add_option("--speculative-config", o->speculative_config,
                  "vLLM's JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": K, \"prompt_lookup_max\": n} or "
                  "{\"method\": \"eagle3\" or \"mtp\", \"model\": DIR, \"num_speculative_tokens\": K}: drafts verified losslessly");
  app->callback([o] { ExitCode() = RunGenerate(*o); });
}

}  // namespace hsx::cli
