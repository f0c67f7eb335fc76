// hsx tokenize: {"text": ..} lines in, {"ids": [..]} lines out.
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"

namespace hsx::cli {
namespace {

int RunTokenize(const std::string& tokenizer_path, const std::string& input) {
  const char* cmd = "tokenize";
  auto tokenizer = Tokenizer::Load(tokenizer_path);
  if (!tokenizer.ok()) return Fail(cmd, tokenizer.status());
  std::ifstream in(input);
  if (!in) return Fail(cmd, Error(input + ": cannot open input"));
  std::string text;
  int line = 0, failed = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = input + ":" + std::to_string(line) + ": ";
    const auto j = nlohmann::json::parse(text, nullptr, false);
    Status s;
    if (j.is_discarded()) s = Error(where + "malformed JSON (expected {\"text\": ...})");
    else if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) s = Error(where + "expected a string field 'text'");
    if (s.ok()) {
      auto ids = tokenizer->Encode(j["text"].get<std::string>());
      if (ids.ok()) {
        std::printf("%s\n", nlohmann::json{{"ids", *ids}}.dump().c_str());
        continue;
      }
      s = Error(where + ids.status().message());
    }
    Fail(cmd, s);
    ++failed;
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace

void RegisterTokenize(CLI::App& root) {
  auto tokenizer = std::make_shared<std::string>();
  auto input = std::make_shared<std::string>();
  CLI::App* app = root.add_subcommand("tokenize", "Encode {\"text\"} JSONL lines with a tokenizer.json");
  app->add_option("--tokenizer", *tokenizer, "Path of a Hugging Face tokenizer.json")->required();
  app->add_option("--input", *input, "JSONL with a 'text' field per line")->required();
  app->callback([tokenizer, input] { ExitCode() = RunTokenize(*tokenizer, *input); });
}

}  // namespace hsx::cli
