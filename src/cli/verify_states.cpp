// hsx verify-states DIR --model M: checks a directory of hidden-state files against the
// model they are said to come from (capture/states_check.h), before a trainer spends
// days on them. Prints one line per problem and a JSON summary; exits 1 on any.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "capture/states_check.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/config_fingerprint.h"
#include "tokenizer/tokenizer_fingerprint.h"
#include "util/json.h"

namespace hsx::cli {
namespace {

struct VerifyOptions {
  ModelOptions model;
  std::string dir, input, layers;
};

// (id, path) of every file: the manifests' lines when there are any (a listed file that is
// missing is a problem), else every *.safetensors in the directory.
std::vector<std::pair<std::string, std::string>> ListFiles(const std::string& dir, std::vector<std::string>& problems) {
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> manifests;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("manifest") && name.ends_with(".jsonl")) manifests.push_back(entry.path().string());
  }
  std::sort(manifests.begin(), manifests.end());
  // A merged manifest lists the shards' lines again.
  if (std::find(manifests.begin(), manifests.end(), dir + "/manifest.jsonl") != manifests.end()) {
    manifests = {dir + "/manifest.jsonl"};
  }
  for (const std::string& m : manifests) {
    std::ifstream in(m);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      auto j = ParseJson(line, m + ":" + std::to_string(n));
      if (!j.ok() || !j->is_object() || !j->contains("id") || !j->contains("path") || !(*j)["path"].is_string()) {
        problems.push_back(m + ":" + std::to_string(n) + ": not a manifest line {\"id\", \"path\", ...}");
        continue;
      }
      files.emplace_back((*j)["id"].is_string() ? (*j)["id"].get<std::string>() : (*j)["id"].dump(),
                         (*j)["path"].get<std::string>());
    }
  }
  if (!manifests.empty()) return files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors") && name.find(".tmp.") == std::string::npos) {
      files.emplace_back(name.substr(0, name.size() - 12), entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

int RunVerifyStates(const VerifyOptions& o) {
  const char* cmd = "verify-states";
  if (!std::filesystem::is_directory(o.dir)) return Fail(cmd, Error(o.dir + ": not a directory"));
  auto config = LoadConfig(o.model);
  if (!config.ok()) return Fail(cmd, config.status());
  LoadedModel loaded;  // the tokenizer and chat template only: no weights are read
  if (Status s = LoadTokenizerAndTemplate(o.model.model, loaded); !s.ok()) return Fail(cmd, s);
  StatesExpectation e;
  e.hidden_size = config->hidden_size;
  e.num_layers = config->num_layers;
  e.vocab_size = config->vocab_size;
  auto model_hash = ModelConfigFingerprint(o.model.model);
  if (!model_hash.ok()) return Fail(cmd, model_hash.status());
  e.model_config_hash = *model_hash;
  if (loaded.tokenizer) e.tokenizer_hash = TokenizerFingerprint(*loaded.tokenizer);
  if (!o.layers.empty()) {
    auto ids = ParseJson("[" + o.layers + "]", "--layers");
    if (!ids.ok()) return Fail(cmd, Error("--layers: expected comma-separated layer ids, e.g. 2,18,33"));
    for (const auto& id : *ids) {
      if (!id.is_number_integer()) return Fail(cmd, Error("--layers: '" + id.dump() + "' is not a layer id"));
      e.layer_ids.push_back(id.get<int>());
    }
    std::sort(e.layer_ids.begin(), e.layer_ids.end());
  }
  // The prompts' token ids, where the input that made the files is given.
  std::map<std::string, std::vector<int32_t>> prompts;
  std::vector<std::string> problems;
  if (!o.input.empty()) {
    auto reader = PromptReader::Open(o.input, loaded, /*add_generation_prompt=*/false);
    if (!reader.ok()) return Fail(cmd, reader.status());
    while (auto p = reader->Next()) {
      if (p->error.ok()) prompts[p->id] = std::move(p->token_ids);
    }
  }
  const auto files = ListFiles(o.dir, problems);
  int64_t sound = 0, tokens = 0;
  std::optional<std::vector<int>> first_layers;  // without --layers, every file must hold the first file's
  for (const auto& [id, path] : files) {
    StatesExpectation expected = e;
    if (auto it = prompts.find(id); it != prompts.end()) expected.prompt_ids = it->second;
    if (expected.layer_ids.empty() && first_layers) expected.layer_ids = *first_layers;
    StatesCheck check = CheckStatesFile(path, expected);
    if (check.contract && !first_layers) first_layers = check.contract->layer_ids;
    tokens += check.num_tokens;
    if (check.problems.empty()) ++sound;
    for (auto& p : check.problems) problems.push_back(std::move(p));
  }
  for (const std::string& p : problems) std::printf("%s\n", p.c_str());
  const nlohmann::json summary{{"files", files.size()},
                               {"sound", sound},
                               {"problems", problems.size()},
                               {"tokens", tokens},
                               {"layer_ids", first_layers ? nlohmann::json(*first_layers) : nlohmann::json(nullptr)},
                               {"model_config_hash", e.model_config_hash},
                               {"tokenizer_hash", e.tokenizer_hash},
                               {"prompts_checked", prompts.size()}};
  std::printf("%s\n", summary.dump().c_str());
  if (files.empty()) return Fail(cmd, Error(o.dir + ": no hidden-state files (no manifest lines, no *.safetensors)"));
  return problems.empty() ? 0 : 1;
}

}  // namespace

void RegisterVerifyStates(CLI::App& root) {
  auto o = std::make_shared<VerifyOptions>();
  CLI::App* app = root.add_subcommand(
      "verify-states", "Check a directory of hidden-state files against the model: layers, hashes, shapes, finiteness");
  app->add_option("dir", o->dir, "The directory extract or serve wrote (its manifests, else every *.safetensors)")
      ->required();
  o->model.Register(*app);
  app->add_option("--input", o->input, "The JSONL the files were made from: each file's tokens must begin with its prompt's");
  app->add_option("--layers", o->layers, "Layer ids every file must hold (default: the first file's)");
  app->callback([o] { ExitCode() = RunVerifyStates(*o); });
}

}  // namespace hsx::cli
