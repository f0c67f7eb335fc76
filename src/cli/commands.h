// Each subcommand registers itself on the root app; its callback sets the exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace hsx::cli {

inline int& ExitCode() {
  static int code = 0;
  return code;
}

void RegisterExtract(CLI::App& root);
void RegisterGenerate(CLI::App& root);
void RegisterTokenize(CLI::App& root);
void RegisterInspect(CLI::App& root);
void RegisterBench(CLI::App& root);
void RegisterServe(CLI::App& root);
void RegisterManifest(CLI::App& root);
void RegisterChatTemplate(CLI::App& root);
void RegisterVerifyStates(CLI::App& root);

// `hsx serve`'s arguments with vLLM's flag spellings made hsx's: a flag's name may use
// underscores for its dashes (--kv_transfer_config, --max_num_seqs=8), as vLLM's parser
// accepts. Other commands' arguments are returned as they are.
std::vector<std::string> NormalizeServeFlags(int argc, char** argv);

}  // namespace hsx::cli
