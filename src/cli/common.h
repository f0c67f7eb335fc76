// What the subcommands share: model loading options, the JSONL prompt reader and the
// progress line.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "engine/engine.h"
#include "engine/speculative_config.h"
#include "model/eagle3_draft.h"
#include "model/mtp_drafter.h"
#include "model/model.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace hsx::cli {

struct ModelOptions {
  std::string model;                 // a model directory, or a named config with dummy weights
  std::string load_format = "auto";  // auto | safetensors | dummy
  std::string device = "cpu";        // cpu | cuda | cuda:N
  bool batch_invariant = false;      // a prompt's results do not depend on its batch
  bool enforce_eager = false;        // no CUDA graphs (vLLM's flag)
  void Register(CLI::App& app);
  // The execution flags (--batch-invariant, --enforce-eager), which serve shares (it names
  // the model positionally).
  void RegisterExecutionFlags(CLI::App& app);
};

// The config of a model directory, or of a named config when --model names one.
Result<ModelConfig> LoadConfig(const ModelOptions& options);
Result<std::unique_ptr<Model>> LoadModel(const ModelOptions& options, Backend& backend);
// DIR/tokenizer.json when it exists; nullopt otherwise (and for named configs).
Result<std::optional<Tokenizer>> LoadTokenizerIfPresent(const std::string& model);

// What a command that runs the model needs: the backend --device names, the model on it,
// and the tokenizer and chat template when the model directory has them. Members die model
// before backend.
struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;
  // A template hsx cannot read fails only the chat requests and lines that need it.
  std::optional<ChatTemplate> chat_template;
  Status chat_template_error;
  std::unique_ptr<Eagle3Draft> eagle3;  // drafts set by ApplySpeculativeConfig; they die before the model
  std::unique_ptr<MtpDrafter> mtp;
  const Tokenizer* tokenizer_or_null() const { return tokenizer ? &*tokenizer : nullptr; }
  const ChatTemplate* chat_template_or_null() const { return chat_template ? &*chat_template : nullptr; }
};
Result<LoadedModel> LoadModelAndTokenizer(const ModelOptions& options);

// --speculative-config into the engine's settings: extraction layers (when the command
// extracts), n-gram, EAGLE-3 or MTP drafting (the draft is loaded into `loaded`). Returns
// the method.
Result<SpeculativeConfig::Method> ApplySpeculativeConfig(const std::string& text, bool extracts, LoadedModel& loaded,
                                                         EngineConfig& ec);

// One JSONL line: {"id": .., "token_ids": [..]}, {"id": .., "prompt": ".."} or {"id": ..,
// "messages": [..]} (rendered through the model's chat template, tokenized without special
// tokens as transformers does for chat; a line may set add_generation_prompt, tools and
// chat_template_kwargs).
struct PromptLine {
  int line = 0;
  std::string id;
  std::vector<int32_t> token_ids;
  Status error;  // this line alone failed; the rest goes on
};

class PromptReader {
 public:
  // `loaded` supplies the tokenizer and chat template (either may be absent).
  // `add_generation_prompt`: for messages lines that do not say (extract reads whole
  // conversations: false; generate answers them: true).
  static Result<PromptReader> Open(const std::string& path, const LoadedModel& loaded, bool add_generation_prompt);
  // The next non-blank line, or nullopt at the end of the file.
  std::optional<PromptLine> Next();
  // Non-blank lines in the file (a quick first pass, for progress and ETA).
  static int64_t CountLines(const std::string& path);

 private:
  Result<std::vector<int32_t>> RenderMessages(const std::string& text) const;
  std::string path_;
  std::unique_ptr<std::ifstream> in_;
  const Tokenizer* tokenizer_ = nullptr;
  const LoadedModel* loaded_ = nullptr;
  bool add_generation_prompt_ = false;
  int line_ = 0;
};

// Hands prompt lines to `admit` while the engine holds fewer than `max_in_flight`
// unfinished requests, so memory stays bounded on any input size; false once the
// file is exhausted.
bool ReadAhead(PromptReader& reader, const Engine& engine, size_t max_in_flight,
               const std::function<void(PromptLine&)>& admit);

// Requests done, tokens/s and ETA on stderr: redrawn in place on a terminal, a line
// every 10 s otherwise.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  void Update(int64_t done, int64_t tokens, bool force = false);
  void Finish(int64_t done, int64_t tokens);

 private:
  std::string label_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_, last_;
  bool tty_;
};

int Fail(const std::string& command, const Status& status);

}  // namespace hsx::cli
