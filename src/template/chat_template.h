// A model's chat template, rendered as transformers' apply_chat_template renders it: the
// messages as given, `tools` and `documents` (None unless given), `add_generation_prompt`, the
// special tokens of tokenizer_config.json (bos_token, eos_token, ...) and any extra variables
// (vLLM's chat_template_kwargs, such as Qwen3's enable_thinking).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "template/template.h"
#include "template/value.h"
#include "util/status.h"

namespace hsx {

// The chat template source of a model directory, as transformers 5 resolves it:
// chat_template.jinja, else tokenizer_config.json's "chat_template" (a string, or a list of
// {"name", "template"} from which "default" is taken); nullopt when there is none. A GGUF
// file's tokenizer.chat_template is read by the CLI's loader (cli/common.cpp).
Result<std::optional<std::string>> FindChatTemplate(const std::string& model_dir);

struct ChatOptions {
  bool add_generation_prompt = true;
  nlohmann::ordered_json tools;                        // null: none
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more template variables (they win over the rest)
};

// The options a request or JSONL line gives beside its messages: "add_generation_prompt"
// (a bool; `default_add_generation_prompt` when absent), "tools" (an array or null) and
// "chat_template_kwargs" (an object); errors name the field.
Result<ChatOptions> ReadChatOptions(const nlohmann::ordered_json& object, bool default_add_generation_prompt);

class ChatTemplate {
 public:
  // The model's template and special tokens; nullopt when the directory has no template.
  static Result<std::optional<ChatTemplate>> Load(const std::string& model_dir);
  // `special_tokens`: name → token text (bos_token, eos_token, ...).
  static Result<ChatTemplate> Create(const std::string& source, tmpl::ValueDict special_tokens);

  // The prompt text for `messages`. They are checked first, errors naming the field
  // ("messages[1].role: expected a string"): an array of objects, each with a string role and a
  // content that is a string, null or an array of {"type": "text", "text": ...} parts.
  Result<std::string> Render(const nlohmann::ordered_json& messages, const ChatOptions& options) const;

 private:
  tmpl::Template template_;
  tmpl::ValueDict special_tokens_;
};

}  // namespace hsx
