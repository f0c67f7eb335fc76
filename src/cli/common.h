// What the subcommands share: model loading options, the JSONL prompt reader and the
// progress line.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
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
#include "template/conversation_regeneration.h"
#include "tokenizer/tokenizer.h"

namespace hsx::cli {

struct ModelOptions {
  std::string model;                 // a model directory, a .gguf file, or a named config with dummy weights
  std::string load_format = "auto";  // auto | safetensors | dummy
  std::string device = "cpu";        // cpu | cuda | cuda:N
  bool batch_invariant = false;      // a prompt's results do not depend on its batch
  bool enforce_eager = false;        // no CUDA graphs (vLLM's flag)
  std::string quantization;          // "" or fp8 (vLLM's flag)
  int tensor_parallel_size = 1;      // ranks: cpu threads, or GPUs from --device's index on
  std::vector<std::string> allow_unknown_config_fields;  // passed over with a warning (config_fields.h)
  void Register(CLI::App& app);
  // The execution flags (--batch-invariant, --enforce-eager, --quantization,
  // --tensor-parallel-size, --allow-unknown-config-field), which serve shares (it names the model positionally).
  void RegisterExecutionFlags(CLI::App& app);
};

// The config of a model directory, or of a named config when --model names one.
Result<ModelConfig> LoadConfig(const ModelOptions& options);
// One rank's model: all of it without a communicator, its slices with one.
Result<std::unique_ptr<Model>> LoadModel(const ModelOptions& options, Backend& backend, Communicator* comm = nullptr);
// What the benchmarks' JSON calls the run's quantization: "fp8" (--quantization), "fp8
// (checkpoint)" (an FP8 checkpoint, model/quantization_config.h) or "none".
std::string QuantizationLabel(const ModelOptions& options, const ModelConfig& config);
// DIR/tokenizer.json when it exists, a .gguf file's tokenizer.ggml.* when it has them;
// nullopt otherwise (and for named configs).
Result<std::optional<Tokenizer>> LoadTokenizerIfPresent(const std::string& model);
// The model's chat template: a directory's (ChatTemplate::Load), or a .gguf file's
// tokenizer.chat_template with its bos/eos/unk/pad token texts; nullopt when there is none.
Result<std::optional<ChatTemplate>> LoadChatTemplate(const std::string& model);

// What a command that runs the model needs: the backend --device names, the model on it,
// and the tokenizer and chat template when the model directory has them. Members die model
// before backend. With --tensor-parallel-size N, backend and model are rank 0's, and ranks
// 1..N-1 follow in peer_backends and peer_models (EngineConfig::tensor_parallel_peers).
struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::vector<std::unique_ptr<Backend>> peer_backends;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::unique_ptr<Model> model;
  std::vector<std::unique_ptr<Model>> peer_models;
  std::vector<Model*> peers() const {
    std::vector<Model*> p;
    for (const auto& m : peer_models) p.push_back(m.get());
    return p;
  }
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
// The tokenizer (if any) and chat template of --model into `loaded`, no weights.
Status LoadTokenizerAndTemplate(const std::string& model, LoadedModel& loaded);

// The layer contract of the states a run captures (capture/layer_contract.h), as __metadata__.
Result<std::map<std::string, std::string>> LayerContractMetadata(const ModelOptions& options, const LoadedModel& loaded,
                                                                 const std::vector<int>& layer_ids, DType dtype);

// --data-parallel-size M: the device of each of M replicas. cpu: M CPU replicas; cuda:N:
// cuda:N..N+M-1; cuda without an index: from the launcher's local rank (LOCAL_RANK,
// OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID) times M, so processes on one host take
// disjoint devices, or from 0 when CUDA_VISIBLE_DEVICES shows the process just M devices.
inline constexpr int kMaxDataParallelSize = 64;
// With tensor parallelism each replica takes devices_per_replica consecutive GPUs.
Result<std::vector<std::string>> ReplicaDevices(const std::string& device, int data_parallel_size,
                                                int devices_per_replica = 1);
// M copies of the model, replica r on ReplicaDevices(...)[r]; the tokenizer and chat template are loaded
// into replica 0 only. Any replica failing to load fails the whole start, naming it.
Result<std::vector<LoadedModel>> LoadReplicas(const ModelOptions& options, int data_parallel_size);
// Registers --data-parallel-size on a command.
void AddDataParallelOption(CLI::App& app, int& data_parallel_size);

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
  // A messages line's loss mask by the render-boundary rule (cli/render_boundary_mask.h),
  // when the reader makes them; empty for other lines.
  std::vector<uint8_t> loss_mask;
  // A messages line read for regeneration (MakeRegenerations): token_ids is its first
  // turn's prompt, and this drives the turns that follow.
  std::shared_ptr<ConversationRegeneration> regeneration;
  Status error;  // this line alone failed; the rest goes on
};

class PromptReader {
 public:
  // `loaded` supplies the tokenizer and chat template (either may be absent).
  // `add_generation_prompt`: for messages lines that do not say (extract reads whole
  // conversations: false; generate answers them: true). Given `keep`, lines it refuses (by
  // line number and id) are skipped before any tokenizing: a shard reads only its own lines.
  using Filter = std::function<bool(int line, const std::string& id)>;
  static Result<PromptReader> Open(const std::string& path, const LoadedModel& loaded, bool add_generation_prompt,
                                   Filter keep = {});
  // The next non-blank line, or nullopt at the end of the file.
  std::optional<PromptLine> Next();
  // Non-blank lines in the file (a quick first pass, for progress and ETA).
  static int64_t CountLines(const std::string& path);
  // Give messages lines their loss masks (extract).
  void MakeLossMasks() { loss_masks_ = true; }
  // Read messages lines for regeneration (extract --regenerate): the target answers each
  // assistant turn anew. Other lines fail.
  void MakeRegenerations() { regenerate_ = true; }

 private:
  Status RenderMessages(const std::string& text, PromptLine& p) const;
  std::string path_;
  std::unique_ptr<std::ifstream> in_;
  const Tokenizer* tokenizer_ = nullptr;
  Filter keep_;
  const LoadedModel* loaded_ = nullptr;
  bool add_generation_prompt_ = false;
  bool loss_masks_ = false;
  bool regenerate_ = false;
  int line_ = 0;
};

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

// The line-by-line JSONL commands (tokenize, chat-template): each non-blank line of `input`
// goes to `answer` with "FILE:LINE" for its errors; an answer is printed as one output line,
// an error fails that line alone (named on stderr and, with `error_lines`, as an
// {"error": ...} line that keeps outputs aligned with inputs). Returns the exit code.
using LineAnswer = std::function<Result<std::string>(const std::string& text, const std::string& where)>;
int RunJsonLines(const std::string& command, const std::string& input, bool error_lines, const LineAnswer& answer);

}  // namespace hsx::cli
