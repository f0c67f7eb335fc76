// Each subcommand registers itself on the root app; its callback sets the exit code.
#pragma once

#include <CLI/CLI.hpp>

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

}  // namespace hsx::cli
