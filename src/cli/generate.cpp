// hsx generate: greedy continuations of JSONL prompts, one JSON line per request.
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"

namespace hsx::cli {
namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string input;
  int max_tokens = 16;
  bool ignore_eos = false;
  double kv_cache_gib = 1.0;
  std::string speculative_config;  // vLLM's JSON: ngram or eagle3
};

int RunGenerate(const GenerateOptions& o) {
  const char* cmd = "generate";
  auto loaded = LoadModelAndTokenizer(o.model);
  if (!loaded.ok()) return Fail(cmd, loaded.status());
  const Tokenizer* tok = loaded->tokenizer_or_null();
  auto reader = PromptReader::Open(o.input, *loaded, /*add_generation_prompt=*/true);
  if (!reader.ok()) return Fail(cmd, reader.status());
  EngineConfig ec;
  ec.kv_cache_bytes = static_cast<size_t>(o.kv_cache_gib * (1ull << 30));
  ec.graphs = !o.model.enforce_eager;
  if (!o.speculative_config.empty()) {
    auto method = ApplySpeculativeConfig(o.speculative_config, /*extracts=*/false, *loaded, ec);
    if (!method.ok()) return Fail(cmd, method.status());
  }
  Engine engine(*loaded->model, ec);
  int failed = 0;
  const size_t max_in_flight = 2 * static_cast<size_t>(ec.scheduler.max_num_seqs);
  auto admit = [&](PromptLine& p) {
    Status s = p.error;
    if (s.ok()) {
      Request r{p.id, std::move(p.token_ids), o.max_tokens};
      if (!o.ignore_eos) r.stop_token_ids = loaded->model->config().eos_token_ids;
      s = engine.Add(std::move(r));
      if (!s.ok()) s = Error(o.input + ":" + std::to_string(p.line) + ": " + s.message());
    }
    if (!s.ok()) failed += Fail(cmd, s);
  };
  bool more_input = true;
  while (more_input || engine.has_work()) {
    if (more_input) more_input = ReadAhead(*reader, engine, max_in_flight, admit);
    for (const auto& seq : engine.Step()) {
      nlohmann::json out = {{"id", seq->id()}, {"token_ids", seq->generated()}};
      if (tok != nullptr) {
        auto text = tok->Decode(seq->generated());
        if (text.ok()) out["text"] = *text;
      }
      std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
  }
  if (const EngineStats& st = engine.stats(); st.num_draft_tokens > 0) {
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
  app->add_option("--kv-cache-gib", o->kv_cache_gib, "KV cache size in GiB");
  app->add_option("--speculative-config", o->speculative_config,
                  "vLLM's JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": K, \"prompt_lookup_max\": n} or "
                  "{\"method\": \"eagle3\" or \"mtp\", \"model\": DIR, \"num_speculative_tokens\": K}: drafts verified losslessly");
  app->callback([o] { ExitCode() = RunGenerate(*o); });
}

}  // namespace hsx::cli
