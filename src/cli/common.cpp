#include "cli/common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "capture/layer_contract.h"
#include "template/render_boundary_mask.h"
#include "capture/shard_spec.h"
#include "model/config_fields.h"
#include "model/config_fingerprint.h"
#include "model/gguf_config.h"
#include "model/gguf_file.h"
#include "model/gguf_tokenizer.h"
#include "tokenizer/tokenizer_fingerprint.h"
#include "util/json.h"

namespace hsx::cli {

void ModelOptions::Register(CLI::App& app) {
  app.add_option("--model", model, "Hugging Face model directory, a .gguf file, or a named config (qwen3-8b, ...) with --load-format dummy")
      ->required();
  app.add_option("--load-format", load_format, "auto | safetensors | dummy (random weights from the config)")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  app.add_option("--device", device, "cpu (f32 reference) or cuda[:N] (bf16)");
  RegisterExecutionFlags(app);
}

void ModelOptions::RegisterExecutionFlags(CLI::App& app) {
  app.add_flag("--batch-invariant", batch_invariant,
               "A prompt's hidden states and tokens are bit-identical whatever it is batched with, chunked or "
               "cached (fixed GEMM algorithms and reduction orders; slower)");
  app.add_flag("--enforce-eager", enforce_eager,
               "Run decode steps op by op instead of replaying CUDA graphs recorded per batch size");
  app.add_option("--quantization", quantization,
                 "fp8: the decoder layers' projections as FP8 E4M3 with per-channel scales, quantized at load, and "
                 "activations quantized per token (embeddings, norms, LM head and attention stay unquantized)")
      ->check(CLI::IsMember({"fp8"}));
  app.add_option("--allow-unknown-config-field", allow_unknown_config_fields,
                 "Proceed past this unknown config.json field (repeatable) with a warning, instead of refusing the "
                 "model; hsx does not implement it, so results may differ from the reference")
      ->each([](const std::string& name) { config::AllowUnknownConfigField(name); });
  app.add_option("--tensor-parallel-size", tensor_parallel_size,
                 "Split the model over N ranks (Megatron-style): N GPUs from --device's index on (NCCL), or N "
                 "threads on the cpu")
      ->check(CLI::Range(1, 64));
}

Result<std::map<std::string, std::string>> LayerContractMetadata(const ModelOptions& options, const LoadedModel& loaded,
                                                                 const std::vector<int>& layer_ids, DType dtype) {
  LayerContract contract;
  contract.layer_ids = layer_ids;
  HSX_ASSIGN_OR_RETURN(contract.model_config_hash, ModelConfigFingerprint(options.model));
  if (loaded.tokenizer) contract.tokenizer_hash = TokenizerFingerprint(*loaded.tokenizer);
  contract.dtype = std::string(DTypeName(dtype));
  return contract.ToMetadata();
}

Result<ModelConfig> LoadConfig(const ModelOptions& options) {
  if (std::filesystem::is_directory(options.model) || options.load_format != "dummy") return LoadModelConfig(options.model);
  return NamedModelConfig(options.model);
}

Result<std::unique_ptr<Model>> LoadModel(const ModelOptions& options, Backend& backend, Communicator* comm) {
  if (!options.quantization.empty() && options.batch_invariant) {
    return Error("--quantization fp8 and --batch-invariant: batch-invariant runs use bf16 GEMMs only");
  }
  std::unique_ptr<Model> model;
  if (options.load_format != "dummy") {
    HSX_ASSIGN_OR_RETURN(model, Model::Load(options.model, backend, comm));
  } else {
    HSX_ASSIGN_OR_RETURN(ModelConfig config, LoadConfig(options));
    const Shard shard = comm ? Shard{comm->rank(), comm->size()} : Shard{};
    HSX_RETURN_IF_ERROR(CheckTensorParallel(config, shard.size).with_context(options.model));
    ModelWeights weights = DummyWeights(config, backend, 0, shard);
    model = std::make_unique<Model>(std::move(config), std::move(weights), backend, comm);
  }
  if (model->config().fp8_checkpoint && options.batch_invariant) {
    return Error(options.model + ": an FP8 checkpoint and --batch-invariant: batch-invariant runs use bf16 GEMMs only");
  }
  if (options.quantization == "fp8") HSX_RETURN_IF_ERROR(model->QuantizeWeightsFp8());
  return model;
}

std::string QuantizationLabel(const ModelOptions& options, const ModelConfig& config) {
  if (config.fp8_checkpoint) return "fp8 (checkpoint)";
  return options.quantization.empty() ? "none" : options.quantization;
}

// The device of rank r: the cpu for every rank, or the r-th GPU from --device's index.
static Result<std::string> RankDevice(const std::string& device, int rank) {
  if (device == "cpu" || rank == 0) return device;
  int first = 0;
  if (device.rfind("cuda:", 0) == 0) first = std::atoi(device.c_str() + 5);
  return "cuda:" + std::to_string(first + rank);
}

Result<std::optional<Tokenizer>> LoadTokenizerIfPresent(const std::string& model) {
  if (IsGgufPath(model)) {
    HSX_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::Open(model));
    if (!file.Find("tokenizer.ggml.model")) return std::optional<Tokenizer>();
    HSX_ASSIGN_OR_RETURN(Tokenizer tokenizer, GgufTokenizer(file));
    return std::optional<Tokenizer>(std::move(tokenizer));
  }
  const std::string path = model + "/tokenizer.json";
  if (!std::filesystem::exists(path)) return std::optional<Tokenizer>();
  HSX_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(path));
  return std::optional<Tokenizer>(std::move(tokenizer));
}

// One replica's model on loaded.backend (options.device), split over
// --tensor-parallel-size ranks on the devices from there on.
static Status LoadRanks(const ModelOptions& options, LoadedModel& loaded) {
  const int n = options.tensor_parallel_size;
  if (n == 1) {
    HSX_ASSIGN_OR_RETURN(loaded.model, LoadModel(options, *loaded.backend));
  } else {
    std::vector<Backend*> ranks = {loaded.backend.get()};
    for (int r = 1; r < n; ++r) {
      HSX_ASSIGN_OR_RETURN(const std::string device, RankDevice(options.device, r));
      HSX_ASSIGN_OR_RETURN(auto backend, MakeBackend(device, options.batch_invariant));
      ranks.push_back(backend.get());
      loaded.peer_backends.push_back(std::move(backend));
    }
    HSX_ASSIGN_OR_RETURN(loaded.comms, MakeCommunicators(ranks));
    for (int r = 0; r < n; ++r) {  // each rank reads only its slices of the mapped checkpoint
      ranks[r]->PinThread();
      HSX_ASSIGN_OR_RETURN(auto model, LoadModel(options, *ranks[r], loaded.comms[r].get()));
      (r == 0 ? loaded.model : loaded.peer_models.emplace_back()) = std::move(model);
    }
    ranks[0]->PinThread();
  }
  return Status();
}

// A GGUF file's own chat template (tokenizer.chat_template), with the special tokens
// transformers' GGUF conversion gives tokenizer_config.json: the texts of
// tokenizer.ggml.tokens at the bos/eos/unk/padding ids. nullopt when the file has none.
static Result<std::optional<ChatTemplate>> LoadGgufChatTemplate(const std::string& path) {
  HSX_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::Open(path));
  if (!file.Find("tokenizer.chat_template")) return std::optional<ChatTemplate>();
  HSX_ASSIGN_OR_RETURN(std::string source, file.String("tokenizer.chat_template"));
  tmpl::ValueDict special_tokens;
  if (file.Find("tokenizer.ggml.tokens")) {
    HSX_ASSIGN_OR_RETURN(const std::vector<GgufValue>* tokens, file.Array("tokenizer.ggml.tokens", GgufType::kString));
    for (auto [name, key] : {std::pair{"bos_token", "tokenizer.ggml.bos_token_id"},
                             std::pair{"eos_token", "tokenizer.ggml.eos_token_id"},
                             std::pair{"unk_token", "tokenizer.ggml.unknown_token_id"},
                             std::pair{"pad_token", "tokenizer.ggml.padding_token_id"}}) {
      if (!file.Find(key)) continue;
      HSX_ASSIGN_OR_RETURN(const uint64_t id, file.Unsigned(key));
      if (id < tokens->size()) special_tokens.emplace_back(name, tmpl::Value((*tokens)[id].s));
    }
  }
  auto created = ChatTemplate::Create(source, std::move(special_tokens));
  if (!created.ok()) return created.status().with_context(path + ": tokenizer.chat_template");
  return std::optional<ChatTemplate>(std::move(created).value());
}

Result<std::optional<ChatTemplate>> LoadChatTemplate(const std::string& model) {
  return IsGgufPath(model) ? LoadGgufChatTemplate(model) : ChatTemplate::Load(model);
}

// The tokenizer and chat template of the model's directory (or GGUF file) into `loaded`; a
// template hsx cannot read is kept as the error chat requests will get.
Status LoadTokenizerAndTemplate(const std::string& model, LoadedModel& loaded) {
  HSX_ASSIGN_OR_RETURN(loaded.tokenizer, LoadTokenizerIfPresent(model));
  auto chat_template = LoadChatTemplate(model);
  if (chat_template.ok()) loaded.chat_template = std::move(chat_template).value();
  else loaded.chat_template_error = chat_template.status();
  return Status();
}

Result<LoadedModel> LoadModelAndTokenizer(const ModelOptions& options) {
  LoadedModel loaded;
  HSX_ASSIGN_OR_RETURN(loaded.backend, MakeBackend(options.device, options.batch_invariant));
  HSX_RETURN_IF_ERROR(LoadRanks(options, loaded));
  HSX_RETURN_IF_ERROR(LoadTokenizerAndTemplate(options.model, loaded));
  return loaded;
}

Result<std::vector<std::string>> ReplicaDevices(const std::string& device, int data_parallel_size,
                                                int devices_per_replica) {
  const int m = data_parallel_size, gpus = m * devices_per_replica;
  if (m < 1 || m > kMaxDataParallelSize) {
    return Error("--data-parallel-size " + std::to_string(m) + ": expected 1 to " + std::to_string(kMaxDataParallelSize));
  }
  if (device == "cpu") return std::vector<std::string>(static_cast<size_t>(m), "cpu");
  int first = 0;
  if (device == "cuda") {
    // A launcher that gives each process its own devices (srun --gpus-per-task) leaves it
    // exactly M visible: they are cuda:0..M-1 whatever its local rank.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const bool own_devices =
        visible != nullptr && *visible != '\0' && std::count(visible, visible + std::strlen(visible), ',') + 1 == gpus;
    HSX_ASSIGN_OR_RETURN(const int local_rank, ResolveLocalRank(ProcessEnv()));
    first = own_devices ? 0 : local_rank * gpus;
  } else if (device.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    const long index = std::strtol(device.c_str() + 5, &end, 10);
    if (device.size() == 5 || *end != '\0' || index < 0 || index > 1 << 20) return Error("--device: '" + device + "' is not cuda:N");
    first = static_cast<int>(index);
  } else {
    return Error("--device: '" + device + "' is not one of cpu, cuda, cuda:N");
  }
  std::vector<std::string> devices;
  for (int r = 0; r < m; ++r) devices.push_back("cuda:" + std::to_string(first + r * devices_per_replica));
  return devices;
}

Result<std::vector<LoadedModel>> LoadReplicas(const ModelOptions& options, int data_parallel_size) {
  HSX_ASSIGN_OR_RETURN(std::vector<std::string> devices,
                       ReplicaDevices(options.device, data_parallel_size, options.tensor_parallel_size));
  auto fail = [&](size_t r, const Status& s) {
    if (devices.size() == 1) return s;
    return s.with_context("--data-parallel-size " + std::to_string(devices.size()) + ": replica " + std::to_string(r) +
                          " on " + devices[r]);
  };
  // Every device first: a missing one fails before any weights are read.
  std::vector<LoadedModel> replicas(devices.size());
  for (size_t r = 0; r < devices.size(); ++r) {
    auto backend = MakeBackend(devices[r], options.batch_invariant);
    if (!backend.ok()) return fail(r, backend.status());
    replicas[r].backend = std::move(backend).value();
  }
  for (size_t r = 0; r < devices.size(); ++r) {
    ModelOptions own = options;
    own.device = devices[r];
    if (Status s = LoadRanks(own, replicas[r]); !s.ok()) return fail(r, s);
  }
  HSX_RETURN_IF_ERROR(LoadTokenizerAndTemplate(options.model, replicas[0]));
  return replicas;
}

void AddDataParallelOption(CLI::App& app, int& data_parallel_size) {
  app.add_option("--data-parallel-size", data_parallel_size,
                 "Engine replicas, each a whole copy of the model on its own device (cuda:N, N+1, ...; on cpu, "
                 "CPU replicas); requests are split between them")
      ->check(CLI::Range(1, kMaxDataParallelSize));
}

Result<SpeculativeConfig::Method> ApplySpeculativeConfig(const std::string& text, bool extracts, LoadedModel& loaded,
                                                         EngineConfig& ec) {
  HSX_ASSIGN_OR_RETURN(SpeculativeConfig spec, ParseSpeculativeConfig(text, loaded.model->config().num_layers));
  switch (spec.method) {
    case SpeculativeConfig::Method::kExtractHiddenStates:
      if (!extracts) return Error("--speculative-config: method extract_hidden_states is for extract and serve");
      ec.capture_layers = spec.capture_layers;
      break;
    case SpeculativeConfig::Method::kNgram:
      ec.ngram = spec.ngram;
      break;
    case SpeculativeConfig::Method::kEagle3: {
      if (!loaded.peer_models.empty()) {
        return Error("--speculative-config: EAGLE-3 drafts do not run with --tensor-parallel-size > 1 yet");
      }
      HSX_ASSIGN_OR_RETURN(loaded.eagle3, Eagle3Draft::Load(spec.model, *loaded.model, *loaded.backend));
      const int k = spec.num_speculative_tokens > 0 ? spec.num_speculative_tokens
                                                    : loaded.eagle3->config().num_speculative_tokens;
      if (k <= 0) {
        return Error("--speculative-config: \"num_speculative_tokens\" is required (" + spec.model +
                     " names no proposal length)");
      }
      ec.eagle3 = {loaded.eagle3.get(), k, spec.token_tree, spec.dynamic_tree};
      // CUDA's tree rows run on the mma.sync and split-KV kernels, not the batch-invariant
      // tiling's: refused here, not tokens that depend on the batch later.
      if ((spec.token_tree || spec.dynamic_tree) && loaded.backend->device() != Device::kCPU &&
          loaded.backend->batch_invariant()) {
        return Error("--speculative-config: tree drafts do not run with --batch-invariant on the " +
                     loaded.backend->name() + " backend (its tree rows are not batch-invariant); "
                     "leave one of them out");
      }
      break;
    }
    case SpeculativeConfig::Method::kMtp: {
      if (!loaded.peer_models.empty()) {
        return Error("--speculative-config: MTP drafts do not run with --tensor-parallel-size > 1 yet");
      }
      HSX_ASSIGN_OR_RETURN(loaded.mtp, MtpDrafter::Load(spec.model, *loaded.model, *loaded.backend));
      ec.mtp = {loaded.mtp.get(), spec.num_speculative_tokens};
      break;
    }
    case SpeculativeConfig::Method::kNone:
      break;
  }
  ec.draft_length.adaptive = spec.adaptive_draft_length;
  return spec.method;
}

Result<PromptReader> PromptReader::Open(const std::string& path, const LoadedModel& loaded, bool add_generation_prompt,
                                         Filter keep) {
  PromptReader r;
  r.keep_ = std::move(keep);
  r.path_ = path;
  r.in_ = std::make_unique<std::ifstream>(path);
  if (!*r.in_) return Error(path + ": cannot open input");
  r.tokenizer_ = loaded.tokenizer_or_null();
  r.loaded_ = &loaded;
  r.add_generation_prompt_ = add_generation_prompt;
  return r;
}

int64_t PromptReader::CountLines(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) n += line.find_first_not_of(" \t\r") != std::string::npos;
  return n;
}

// A line's messages (read again with keys in order: templates print them so) as token ids,
// and their loss mask when asked for.
Status PromptReader::RenderMessages(const std::string& text, PromptLine& p) const {
  const ChatTemplate* chat = loaded_->chat_template_or_null();
  if (chat == nullptr) {
    if (!loaded_->chat_template_error.ok()) return loaded_->chat_template_error;
    return Error("has 'messages' but the model has no chat template (chat_template.jinja, tokenizer_config.json or "
                 "a GGUF file's tokenizer.chat_template)");
  }
  if (tokenizer_ == nullptr) return Error("has 'messages' but the model has no tokenizer.json");
  HSX_ASSIGN_OR_RETURN(nlohmann::ordered_json line, ParseOrderedJson(text, "the line"));
  HSX_ASSIGN_OR_RETURN(ChatOptions options, ReadChatOptions(line, add_generation_prompt_));
  if (regenerate_) {
    HSX_ASSIGN_OR_RETURN(ConversationRegeneration regeneration,
                         ConversationRegeneration::Create(*chat, *tokenizer_, line["messages"], options));
    p.regeneration = std::make_shared<ConversationRegeneration>(std::move(regeneration));
    p.token_ids = p.regeneration->prompt();
    return {};
  }
  HSX_ASSIGN_OR_RETURN(std::string prompt, chat->Render(line["messages"], options));
  auto ids = tokenizer_->Encode(prompt, /*add_special_tokens=*/false);
  if (!ids.ok()) return ids.status().with_context("the rendered messages");
  p.token_ids = std::move(ids).value();
  if (loss_masks_) {
    HSX_ASSIGN_OR_RETURN(p.loss_mask, RenderBoundaryLossMask(*chat, *tokenizer_, line["messages"], options, p.token_ids));
  }
  return {};
}

std::optional<PromptLine> PromptReader::Next() {
  std::string text;
  while (std::getline(*in_, text)) {
    ++line_;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    PromptLine p;
    p.line = line_;
    const std::string where = path_ + ":" + std::to_string(line_);
    auto fail = [&](const std::string& why) {
      p.error = Error(where + ": " + why);
      return p;
    };
    // A dataset line is untrusted: ParseJson bounds its nesting and never throws.
    const auto parsed = ParseJson(text, "malformed JSON (expected one object per line)");
    if (!parsed.ok()) return fail(parsed.status().message());
    const nlohmann::json& j = *parsed;
    if (!j.is_object()) return fail("expected a JSON object, got " + std::string(j.type_name()));
    if (!j.contains("id")) return fail("missing field 'id'");
    if (j["id"].is_string()) p.id = j["id"].get<std::string>();
    else if (j["id"].is_number_integer()) p.id = std::to_string(j["id"].get<int64_t>());
    else return fail("field 'id' must be a string or an integer");
    if (keep_ && !keep_(p.line, p.id)) continue;
    if (regenerate_ && !j.contains("messages")) return fail("--regenerate answers 'messages' lines; this line has none");
    if (j.contains("token_ids")) {
      const auto& ids = j["token_ids"];
      if (!ids.is_array()) return fail("field 'token_ids' must be a list of integers");
      for (const auto& t : ids) {
        if (!t.is_number_integer()) return fail("field 'token_ids' must be a list of integers");
        const int64_t v = t.get<int64_t>();
        if (v < INT32_MIN || v > INT32_MAX) return fail("token id " + std::to_string(v) + " is out of range");
        p.token_ids.push_back(static_cast<int32_t>(v));
      }
    } else if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) return fail("field 'prompt' must be a string");
      if (tokenizer_ == nullptr) return fail("has 'prompt' text but the model has no tokenizer.json; give 'token_ids'");
      auto ids = tokenizer_->Encode(j["prompt"].get<std::string>());
      if (!ids.ok()) return fail("field 'prompt': " + ids.status().message());
      p.token_ids = std::move(ids).value();
    } else if (j.contains("messages")) {
      if (Status s = RenderMessages(text, p); !s.ok()) return fail(s.message());
    } else {
      return fail("expected field 'token_ids' (list of integers), 'prompt' (string) or 'messages' (list)");
    }
    return p;
  }
  return std::nullopt;
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), start_(std::chrono::steady_clock::now()), last_(start_),
      tty_(::isatty(STDERR_FILENO) != 0) {}

static std::string Clock(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", static_cast<long>(s / 3600), static_cast<long>(s / 60 % 60),
                static_cast<long>(s % 60));
  return buf;
}

void Progress::Update(int64_t done, int64_t tokens, bool force) {
  const auto now = std::chrono::steady_clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  if (!force && since_last < (tty_ ? 0.5 : 10.0)) return;
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? tokens / elapsed : 0;
  const double eta = done > 0 && total_ > done ? elapsed * (total_ - done) / done : 0;
  std::fprintf(stderr, "%s[%s] %ld/%ld requests, %.0f tok/s, elapsed %s, ETA %s%s", tty_ ? "\r" : "", label_.c_str(),
               static_cast<long>(done), static_cast<long>(total_), rate, Clock(elapsed).c_str(), Clock(eta).c_str(),
               tty_ ? "" : "\n");
}

void Progress::Finish(int64_t done, int64_t tokens) {
  Update(done, tokens, true);
  if (tty_) std::fprintf(stderr, "\n");
}

int Fail(const std::string& command, const Status& status) {
  // On a terminal, first clear the progress line this may interrupt.
  std::fprintf(stderr, "%shsx %s: error: %s\n", ::isatty(STDERR_FILENO) ? "\r\033[K" : "", command.c_str(),
               status.message().c_str());
  return 1;
}

int RunJsonLines(const std::string& command, const std::string& input, bool error_lines, const LineAnswer& answer) {
  std::ifstream in(input);
  if (!in) return Fail(command, Error(input + ": cannot open input"));
  std::string text;
  int line = 0, failed = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = input + ":" + std::to_string(line);
    Result<std::string> out = answer(text, where);
    if (out.ok()) {
      std::printf("%s\n", out->c_str());
      continue;
    }
    Fail(command, out.status());
    if (error_lines) {
      const nlohmann::json error{{"error", out.status().message()}};
      std::printf("%s\n", error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    ++failed;
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace hsx::cli
