#include "cli/common.h"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "util/json.h"

namespace hsx::cli {

void ModelOptions::Register(CLI::App& app) {
  app.add_option("--model", model, "Hugging Face model directory, or a named config (qwen3-8b, ...) with --load-format dummy")
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
}

Result<ModelConfig> LoadConfig(const ModelOptions& options) {
  if (std::filesystem::is_directory(options.model) || options.load_format != "dummy") return LoadModelConfig(options.model);
  return NamedModelConfig(options.model);
}

Result<std::unique_ptr<Model>> LoadModel(const ModelOptions& options, Backend& backend) {
  if (options.load_format != "dummy") return Model::Load(options.model, backend);
  HSX_ASSIGN_OR_RETURN(ModelConfig config, LoadConfig(options));
  ModelWeights weights = DummyWeights(config, backend);
  return std::make_unique<Model>(std::move(config), std::move(weights), backend);
}

Result<std::optional<Tokenizer>> LoadTokenizerIfPresent(const std::string& model) {
  const std::string path = model + "/tokenizer.json";
  if (!std::filesystem::exists(path)) return std::optional<Tokenizer>();
  HSX_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(path));
  return std::optional<Tokenizer>(std::move(tokenizer));
}

Result<LoadedModel> LoadModelAndTokenizer(const ModelOptions& options) {
  LoadedModel loaded;
  HSX_ASSIGN_OR_RETURN(loaded.backend, MakeBackend(options.device, options.batch_invariant));
  HSX_ASSIGN_OR_RETURN(loaded.model, LoadModel(options, *loaded.backend));
  HSX_ASSIGN_OR_RETURN(loaded.tokenizer, LoadTokenizerIfPresent(options.model));
  auto chat_template = ChatTemplate::Load(options.model);
  if (chat_template.ok()) loaded.chat_template = std::move(chat_template).value();
  else loaded.chat_template_error = chat_template.status();
  return loaded;
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
      HSX_ASSIGN_OR_RETURN(loaded.eagle3, Eagle3Draft::Load(spec.model, *loaded.model, *loaded.backend));
      const int k = spec.num_speculative_tokens > 0 ? spec.num_speculative_tokens
                                                    : loaded.eagle3->config().num_speculative_tokens;
      if (k <= 0) {
        return Error("--speculative-config: \"num_speculative_tokens\" is required (" + spec.model +
                     " names no proposal length)");
      }
      ec.eagle3 = {loaded.eagle3.get(), k};
      break;
    }
    case SpeculativeConfig::Method::kMtp: {
      HSX_ASSIGN_OR_RETURN(loaded.mtp, MtpDrafter::Load(spec.model, *loaded.model, *loaded.backend));
      ec.mtp = {loaded.mtp.get(), spec.num_speculative_tokens};
      break;
    }
    case SpeculativeConfig::Method::kNone:
      break;
  }
  return spec.method;
}

Result<PromptReader> PromptReader::Open(const std::string& path, const LoadedModel& loaded, bool add_generation_prompt) {
  PromptReader r;
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

// A line's messages (read again with keys in order: templates print them so) as token ids.
Result<std::vector<int32_t>> PromptReader::RenderMessages(const std::string& text) const {
  const ChatTemplate* chat = loaded_->chat_template_or_null();
  if (chat == nullptr) {
    if (!loaded_->chat_template_error.ok()) return loaded_->chat_template_error;
    return Error("has 'messages' but the model has no chat template (chat_template.jinja or tokenizer_config.json)");
  }
  if (tokenizer_ == nullptr) return Error("has 'messages' but the model has no tokenizer.json");
  HSX_ASSIGN_OR_RETURN(nlohmann::ordered_json line, ParseOrderedJson(text, "the line"));
  HSX_ASSIGN_OR_RETURN(ChatOptions options, ReadChatOptions(line, add_generation_prompt_));
  HSX_ASSIGN_OR_RETURN(std::string prompt, chat->Render(line["messages"], options));
  auto ids = tokenizer_->Encode(prompt, /*add_special_tokens=*/false);
  if (!ids.ok()) return ids.status().with_context("the rendered messages");
  return ids;
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
      auto ids = RenderMessages(text);
      if (!ids.ok()) return fail(ids.status().message());
      p.token_ids = std::move(ids).value();
    } else {
      return fail("expected field 'token_ids' (list of integers), 'prompt' (string) or 'messages' (list)");
    }
    return p;
  }
  return std::nullopt;
}

bool ReadAhead(PromptReader& reader, const Engine& engine, size_t max_in_flight,
               const std::function<void(PromptLine&)>& admit) {
  while (engine.num_unfinished() < max_in_flight) {
    std::optional<PromptLine> p = reader.Next();
    if (!p) return false;
    admit(*p);
  }
  return true;
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

}  // namespace hsx::cli
