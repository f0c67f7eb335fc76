// hsx chat-template: {"messages": [...]} lines in, {"text": ...} lines out, rendered through a
// model's chat template as transformers' apply_chat_template renders them (what serve and
// extract feed the tokenizer for chat requests).
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "template/chat_template.h"
#include "util/json.h"

namespace hsx::cli {
namespace {

Result<std::string> RenderLine(const ChatTemplate& chat, const nlohmann::ordered_json& line) {
  if (!line.is_object() || !line.contains("messages")) return Error("expected {\"messages\": [...]}");
  HSX_ASSIGN_OR_RETURN(ChatOptions options, ReadChatOptions(line, false));
  return chat.Render(line["messages"], options);
}

int RunChatTemplate(const std::string& model, const std::string& input) {
  const char* cmd = "chat-template";
  auto loaded = LoadChatTemplate(model);
  if (!loaded.ok()) return Fail(cmd, loaded.status());
  if (!*loaded) {
    return Fail(cmd, Error(model + ": no chat template (no chat_template.jinja, no chat_template in "
                                   "tokenizer_config.json or the GGUF file)"));
  }
  return RunJsonLines(cmd, input, /*error_lines=*/true,
                      [&](const std::string& text, const std::string& where) -> Result<std::string> {
                        HSX_ASSIGN_OR_RETURN(nlohmann::ordered_json parsed, ParseOrderedJson(text, where));
                        Result<std::string> rendered = RenderLine(**loaded, parsed);
                        if (!rendered.ok()) return rendered.status().with_context(where);
                        return nlohmann::ordered_json{{"text", *rendered}}.dump();
                      });
}

}  // namespace

void RegisterChatTemplate(CLI::App& root) {
  auto model = std::make_shared<std::string>();
  auto input = std::make_shared<std::string>();
  CLI::App* app = root.add_subcommand("chat-template", "Render {\"messages\": [...]} JSONL lines through a model's chat template");
  app->add_option("--model", *model, "Model directory (chat_template.jinja or tokenizer_config.json)")->required();
  app->add_option("--input", *input,
                  "JSONL, a {\"messages\": [...]} object per line, optionally with add_generation_prompt "
                  "(default false, as transformers), tools and chat_template_kwargs")
      ->required();
  app->callback([model, input] { ExitCode() = RunChatTemplate(*model, *input); });
}

}  // namespace hsx::cli
