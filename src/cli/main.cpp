// hsx: extract hidden states, serve, generate, tokenize, chat-template, inspect, bench, manifest.
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app("hsx: hidden-state extraction and speculative-decoding inference engine");
  app.require_subcommand(1);
  hsx::cli::RegisterExtract(app);
  hsx::cli::RegisterGenerate(app);
  hsx::cli::RegisterTokenize(app);
  hsx::cli::RegisterInspect(app);
  hsx::cli::RegisterBench(app);
  hsx::cli::RegisterServe(app);
  hsx::cli::RegisterManifest(app);
  hsx::cli::RegisterChatTemplate(app);
  hsx::cli::RegisterVerifyStates(app);
  std::vector<std::string> args = hsx::cli::NormalizeServeFlags(argc, argv);
  std::vector<char*> normalized;
  for (std::string& arg : args) normalized.push_back(arg.data());
  CLI11_PARSE(app, static_cast<int>(normalized.size()), normalized.data());
  return hsx::cli::ExitCode();
}
