// hsx bench --decode: generation throughput per batch size on synthetic prompts, next to
// the memory-traffic bound (weights plus KV read once per step) at the device's copy
// bandwidth measured in the same run; or, with --input, on real prompts, each batch size a
// closed loop over the file (the serve-in-the-loop evaluation of a draft: acceptance as
// the engine measures it on the prompts it will serve). Prints JSON lines.
#include "cli/bench_decode.h"

#include <chrono>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/common.h"
#include "engine/engine.h"
#include "model/decode_traffic.h"

namespace hsx::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Bytes per second of a device-to-device copy (read + write), best of a few; the
// bandwidth a decode step's weight reads can reach.
double CopyBandwidth(Backend& backend) {
  const int64_t n = int64_t{1} << 29;  // 1 GiB of bf16 each way
  Tensor a = backend.Empty(DType::kBF16, {n}), b = backend.Empty(DType::kBF16, {n});
  backend.FillUniform(a, 1, -1.0f, 1.0f);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    backend.Synchronize();
    const auto t0 = Clock::now();
    backend.Copy(a, b);
    backend.Synchronize();
    best = std::max(best, 2.0 * static_cast<double>(a.nbytes()) / Seconds(t0, Clock::now()));
  }
  return best;
}


// vLLM's figures between two snapshots of the engine's counters: tokens per verification
// (accepted drafts + the one always emitted) and the acceptance rate of each draft position.
void AddSpeculativeFigures(const EngineStats& start, const EngineStats& end, nlohmann::json& result) {
  const uint64_t drafts = end.num_drafts - start.num_drafts;
  if (drafts == 0) return;
  const uint64_t accepted = end.num_accepted_tokens - start.num_accepted_tokens;
  std::vector<double> per_position;
  for (size_t i = 0; i < end.num_accepted_tokens_per_pos.size(); ++i) {
    const uint64_t before = i < start.num_accepted_tokens_per_pos.size() ? start.num_accepted_tokens_per_pos[i] : 0;
    per_position.push_back(static_cast<double>(end.num_accepted_tokens_per_pos[i] - before) / drafts);
  }
  result["mean_acceptance_length"] = 1.0 + static_cast<double>(accepted) / drafts;
  result["acceptance_rate_per_position"] = per_position;
  result["verifications"] = drafts;
  result["draft_tokens"] = end.num_draft_tokens - start.num_draft_tokens;
  result["accepted_tokens"] = accepted;
}

// With "draft_length": "adaptive": request-steps by the K chosen (both runs), and the cost
// model's figures at the end, in ms (target steps by computed rows, on graphs and eager, and
// what an eager step costs over a graph's; draft rounds by requests x K):
// what the policy chose by, to read beside the tok/s it got.
nlohmann::json AdaptiveFigures(const Drafter& drafter) {
  const DraftCostModel& cost = drafter.cost_model();
  nlohmann::json target = nlohmann::json::object(), eager = nlohmann::json::object(), draft = nlohmann::json::object();
  for (const auto& [rows, seconds] : cost.target_figures()) target[std::to_string(rows)] = 1e3 * seconds;
  for (const auto& [rows, seconds] : cost.eager_figures()) eager[std::to_string(rows)] = 1e3 * seconds;
  for (const auto& [key, seconds] : cost.draft_figures())
    draft[std::to_string(key.first) + "x" + std::to_string(key.second)] = 1e3 * seconds;
  return {{"request_steps_by_k", drafter.chosen_lengths()},
          {"target_ms_by_rows", target},
          {"eager_target_ms_by_rows", eager},
          {"eager_penalty_ms", 1e3 * cost.eager_penalty()},
          {"draft_ms_by_requests_x_k", draft}};
}

struct PromptRun {
  int64_t requests = 0, output_tokens = 0;
  double seconds = 0;
  uint64_t steps = 0;
  EngineStats start, end;
};

// The file's prompts through `engine`, `batch` in flight: a request that ends lets the
// next line in (at most max_prompts lines; 0: all). Prefill is part of the time, as in a
// serving benchmark's output throughput. A line that cannot run fails the bench, named.
Result<PromptRun> RunPrompts(const DecodeBenchOptions& o, const LoadedModel& loaded, Engine& engine, Backend& backend,
                             int batch, int new_tokens, int max_prompts) {
  HSX_ASSIGN_OR_RETURN(PromptReader reader, PromptReader::Open(o.input, loaded, /*add_generation_prompt=*/true));
  PromptRun run;
  int read = 0;
  auto add_next = [&]() -> Result<bool> {
    if (max_prompts > 0 && read >= max_prompts) return false;
    std::optional<PromptLine> p = reader.Next();
    if (!p) return false;
    if (!p->error.ok()) return p->error;
    Request r;
    r.id = "p" + std::to_string(read++);  // ids in the file may repeat; the engine's may not
    r.prompt = std::move(p->token_ids);
    r.max_new_tokens = new_tokens;
    r.capture = false;
    r.sampling = o.sampling;
    if (r.sampling.seed) r.sampling.seed = *r.sampling.seed + read;
    if (!o.ignore_eos) r.stop_token_ids = loaded.model->config().eos_token_ids;
    const Status added = engine.Add(std::move(r));
    if (!added.ok()) return Error(o.input + ":" + std::to_string(p->line) + ": " + added.message());
    return true;
  };
  backend.Synchronize();
  run.start = engine.stats();
  const auto t0 = Clock::now();
  for (int i = 0; i < batch; ++i) {
    HSX_ASSIGN_OR_RETURN(const bool more, add_next());
    if (!more) break;
  }
  while (engine.has_work()) {
    for (const auto& seq : engine.Step()) {
      run.output_tokens += seq->num_generated();
      ++run.requests;
      HSX_RETURN_IF_ERROR(add_next().status());
    }
  }
  backend.Synchronize();
  run.seconds = Seconds(t0, Clock::now());
  run.end = engine.stats();
  run.steps = run.end.steps - run.start.steps;
  if (run.requests == 0) return Error(o.input + ": no prompts");
  return run;
}

}  // namespace

int RunDecodeBench(const DecodeBenchOptions& o) {
  auto loaded = LoadModelAndTokenizer(o.model);
  if (!loaded.ok()) return Fail("bench", loaded.status());
  Model& model = *loaded->model;
  Backend& backend = *loaded->backend;
  const ModelConfig& c = model.config();
  const DType dtype = backend.compute_dtype();
  // Weights a decode step reads, in the bytes they are stored in (with --quantization fp8 the
  // projections' 1-byte codes and row scales): rank 0's, which under tensor parallelism are
  // its slices, as its KV is its share of the heads.
  const int ranks = o.model.tensor_parallel_size;
  const double weight_bytes = static_cast<double>(DecodeWeightBytes(model.weights()));
  const double bandwidth = backend.device() == Device::kCPU ? 0.0 : CopyBandwidth(backend);
  const int64_t kv_per_token = KvBytesPerToken(model.rank_config(), dtype);
  auto line = [](const nlohmann::json& j) { std::printf("%s\n", j.dump().c_str()); };
  if (bandwidth > 0) line({{"metric", "device_copy_bandwidth_gbps"}, {"value", bandwidth / 1e9}, {"device", o.model.device}});

  EngineConfig spec;  // the speculative settings every batch size's engine takes
  if (!o.speculative_config.empty()) {
    auto method = ApplySpeculativeConfig(o.speculative_config, /*extracts=*/false, *loaded, spec);
    if (!method.ok()) return Fail("bench", method.status());
  }
  if (o.accept_rate) spec.spec_bench_accept_rate = static_cast<float>(*o.accept_rate);
  if (o.probe_drafts) spec.draft_length.policy.probe_drafts = *o.probe_drafts;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  for (int batch : o.batch_sizes) {
    EngineConfig ec = spec;
    ec.kv_cache_bytes = static_cast<size_t>(o.kv_cache_gib * (1ull << 30));
    ec.scheduler.max_num_seqs = batch;  // the batch runs at once: its buckets alone get graphs at start-up
    ec.scheduler.max_num_batched_tokens = std::max(o.max_num_batched_tokens, batch);
    ec.enable_prefix_caching = false;  // random prompts share nothing; keep the bookkeeping out
    ec.graphs = !o.model.enforce_eager;
    ec.tensor_parallel_peers = loaded->peers();
    Engine engine(model, ec);
    const int64_t graphs_at_start = engine.runner().graphs_recorded();
    if (!o.input.empty()) {
      // Warm-up on the first prompts (first-use costs), then the whole file.
      auto warm = RunPrompts(o, *loaded, engine, backend, batch, 4, batch);
      auto run = warm.ok() ? RunPrompts(o, *loaded, engine, backend, batch, o.new_tokens, 0) : warm;
      if (!run.ok()) return Fail("bench", run.status());
      nlohmann::json result = {
          {"metric", "decode_tokens_per_s"}, {"value", run->output_tokens / run->seconds}, {"batch", batch},
          {"model", o.model.model}, {"input", o.input}, {"prompts", run->requests},
          {"output_tokens", run->output_tokens}, {"seconds", run->seconds}, {"max_new_tokens", o.new_tokens},
          {"steps", run->steps}, {"tokens_per_step", static_cast<double>(run->output_tokens) / std::max<uint64_t>(run->steps, 1)},
          {"temperature", o.sampling.temperature}, {"top_p", o.sampling.top_p}, {"top_k", o.sampling.top_k},
          {"device", o.model.device}, {"tensor_parallel_size", ranks}, {"quantization", QuantizationLabel(o.model, c)}};
      if (!o.speculative_config.empty()) result["speculative_config"] = o.speculative_config;
      AddSpeculativeFigures(run->start, run->end, result);
      if (o.accept_rate) result["forced_accept_rate"] = *o.accept_rate;
      line(result);
      continue;
    }
    EngineStats decode_start, decode_end;  // the engine's counters around the decode phase
    auto run = [&](int new_tokens, double* decode_seconds, int64_t* decode_tokens, uint64_t* decode_steps) -> Status {
      for (int i = 0; i < batch; ++i) {
        Request r;
        r.id = "d" + std::to_string(i);
        r.prompt.resize(o.prompt_len);
        for (int32_t& t : r.prompt) t = token(rng);
        r.max_new_tokens = new_tokens;
        r.capture = false;
        r.sampling = o.sampling;
        if (r.sampling.seed) r.sampling.seed = *r.sampling.seed + i;
        HSX_RETURN_IF_ERROR(engine.Add(std::move(r)));
      }
      // Decode phase: from the step that finished the last prompt to the end; its tokens
      // are those appended after it (with speculative decoding, several a step).
      const int64_t prompt_tokens = static_cast<int64_t>(batch) * o.prompt_len;
      const uint64_t tokens0 = engine.stats().tokens_computed;
      std::optional<Clock::time_point> start;
      uint64_t steps_at_start = 0;
      while (engine.has_work()) {
        for (const auto& seq : engine.Step()) {
          if (seq->num_generated() != new_tokens) return Error("request " + seq->id() + " ended early");
        }
        const int64_t computed = static_cast<int64_t>(engine.stats().tokens_computed - tokens0);
        if (!start && computed >= prompt_tokens) {
          backend.Synchronize();
          start = Clock::now();
          steps_at_start = engine.stats().steps;
          decode_start = engine.stats();
        }
      }
      backend.Synchronize();
      *decode_seconds = Seconds(*start, Clock::now());
      *decode_tokens = static_cast<int64_t>(engine.stats().tokens_generated - decode_start.tokens_generated);
      *decode_steps = engine.stats().steps - steps_at_start;
      decode_end = engine.stats();
      return {};
    };
    double seconds = 0;
    int64_t tokens = 0;
    uint64_t steps = 0;
    Status warm = run(4, &seconds, &tokens, &steps);  // first-use costs (GEMM tuning, allocator)
    const Clock::time_point whole = Clock::now();
    if (warm.ok()) warm = run(o.new_tokens, &seconds, &tokens, &steps);
    if (!warm.ok()) return Fail("bench", warm);
    const double whole_seconds = Seconds(whole, Clock::now());
    const double step_ms = 1e3 * seconds / std::max<uint64_t>(steps, 1);
    // The bound: each step reads the weights once (a MoE's experts: those its batch is
    // expected to use) and every sequence's KV (mean context).
    const double mean_context = o.prompt_len + o.new_tokens / 2.0;
    const double step_weight_bytes = ExpectedDecodeWeightBytes(model.weights(), batch, c.experts_per_token);
    const double step_bytes = step_weight_bytes + static_cast<double>(batch) * mean_context * kv_per_token;
    const double bound_tok_s = bandwidth > 0 ? batch * bandwidth / step_bytes : 0.0;
    const double tok_s = tokens / seconds;
    nlohmann::json result = {
        {"metric", "decode_tokens_per_s"}, {"value", tok_s}, {"batch", batch}, {"model", o.model.model},
        {"prompt_len", o.prompt_len}, {"new_tokens", o.new_tokens}, {"step_ms", step_ms}, {"steps", steps},
        {"temperature", o.sampling.temperature}, {"top_p", o.sampling.top_p}, {"top_k", o.sampling.top_k},
        {"bound_tokens_per_s", bound_tok_s}, {"fraction_of_bound", bound_tok_s > 0 ? tok_s / bound_tok_s : 0.0},
        {"device", o.model.device}, {"tensor_parallel_size", ranks},
        {"quantization", QuantizationLabel(o.model, c)},
        {"weight_bytes_per_step", step_weight_bytes}, {"weight_bytes", weight_bytes}};
    if (!o.speculative_config.empty()) result["speculative_config"] = o.speculative_config;
    AddSpeculativeFigures(decode_start, decode_end, result);
    if (o.accept_rate && result.contains("verifications")) result["forced_accept_rate"] = *o.accept_rate;  // not the target's output
    nlohmann::json stages;
    for (size_t i = 0; i < std::size(EngineStats::kStageNames); ++i) {
      stages[EngineStats::kStageNames[i]] =
          1e3 * (decode_end.stage_seconds[i] - decode_start.stage_seconds[i]) / std::max<uint64_t>(steps, 1);
    }
    result["stage_ms_per_step"] = stages;  // host time per stage (engine.h), decode phase
    // The whole run, prefill included: where the KV cache holds only part of the batch at
    // once the requests run in waves, and the decode phase (from the last prompt's prefill)
    // covers a different share of the work in each configuration; this figure does not.
    result["end_to_end_tokens_per_s"] = static_cast<double>(batch) * o.new_tokens / whole_seconds;
    // Graph use over both runs: steps, verification steps, draft rounds (and of those, EAGLE-3
    // rounds whose first pass was in the graph) that replayed one.
    const ModelRunner& runner = engine.runner();
    const Drafter* drafter = engine.drafter();
    result["graph_replays"] = {{"steps", runner.graph_replays()},
                               {"verification", runner.verify_graph_replays()},
                               {"packed_verification", runner.packed_graph_steps()},
                               {"draft_rounds", drafter ? drafter->graph_replays() : 0},
                               {"draft_first_passes", drafter ? drafter->first_pass_graph_replays() : 0},
                               {"draft_kv_only_passes", drafter ? drafter->kv_only_graph_replays() : 0},
                               {"draft_eager_first_passes", drafter ? drafter->eager_first_passes() : 0},
                               {"draft_kv_passes_ahead", drafter ? drafter->kv_passes_ahead() : 0},
                               {"step_graphs_recorded_at_start", graphs_at_start},
                               {"step_graphs_recorded_later", runner.graphs_recorded() - graphs_at_start},
                               {"launch_ms_per_step", runner.graph_replays() > 0
                                                          ? 1e3 * runner.graph_launch_seconds() / runner.graph_replays()
                                                          : 0.0}};
    if (drafter != nullptr && drafter->adaptive()) {
      result["draft_length"] = AdaptiveFigures(*drafter);
      if (o.probe_drafts) result["draft_length"]["probe_drafts"] = *o.probe_drafts;
    }
    // Over both runs: a preempted request's blocks were freed and its tokens are recomputed.
    result["preemptions"] = engine.num_preemptions();
    line(result);
  }
  return 0;
}

}  // namespace hsx::cli
