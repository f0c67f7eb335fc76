#include "server/chat_request.h"

namespace hsx {
namespace {

using json = nlohmann::json;

RequestError BadRequest(const std::string& message, const std::string& param) { return {400, message, param}; }

}  // namespace

std::variant<CompletionRequest, RequestError> ParseChatRequest(const json& body, const nlohmann::ordered_json& ordered,
                                                               const ChatTemplate* chat, const CompletionLimits& limits) {
  if (!body.is_object()) return BadRequest("expected a JSON object", "");
  if (!body.contains("messages")) return BadRequest("missing field 'messages'", "messages");
  // Completions' fields that chat does not have: refused rather than silently reinterpreted.
  for (const char* field : {"prompt", "echo", "suffix", "best_of"}) {
    if (body.contains(field)) return BadRequest(std::string("'") + field + "' is not a chat completions field", field);
  }
  if (chat == nullptr) {
    return BadRequest("this model has no chat template (no chat_template.jinja, no chat_template in "
                      "tokenizer_config.json or the GGUF file); use /v1/completions",
                      "messages");
  }
  if (limits.tokenizer == nullptr) return BadRequest("this model has no tokenizer.json to tokenize messages with", "messages");

  auto options = ReadChatOptions(ordered, /*default_add_generation_prompt=*/true);
  if (!options.ok()) {
    const std::string& m = options.status().message();
    return BadRequest(m, m.substr(0, m.find(':')));
  }
  auto prompt = chat->Render(ordered["messages"], *options);
  if (!prompt.ok()) return BadRequest(prompt.status().message(), "messages");

  json completion = body;
  for (const char* field : {"messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                            "add_generation_prompt", "max_completion_tokens", "top_logprobs"}) {
    completion.erase(field);
  }
  completion["prompt"] = *prompt;
  if (!completion.contains("add_special_tokens")) completion["add_special_tokens"] = false;
  if (body.contains("max_completion_tokens")) {
    if (body.contains("max_tokens")) return BadRequest("give 'max_completion_tokens' or 'max_tokens', not both", "max_completion_tokens");
    completion["max_tokens"] = body["max_completion_tokens"];
  }
  // Chat asks for logprobs with a bool and counts alternatives in top_logprobs; completions
  // takes the count in logprobs.
  const json logprobs = body.value("logprobs", json());
  const json top = body.value("top_logprobs", json());
  if (!logprobs.is_null() && !logprobs.is_boolean()) return BadRequest("'logprobs' must be true or false", "logprobs");
  const bool wants_logprobs = logprobs.is_boolean() && logprobs.get<bool>();
  if (!top.is_null() && !wants_logprobs) return BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  completion.erase("logprobs");
  if (wants_logprobs) completion["logprobs"] = top.is_null() ? json(0) : top;

  auto parsed = ParseCompletionRequest(completion, limits);
  if (auto* error = std::get_if<RequestError>(&parsed)) {
    // Name the fields as the client wrote them.
    if (error->param == "prompt") error->param = "messages";
    if (error->param == "logprobs" && !top.is_null()) error->param = "top_logprobs";
    if (error->param == "max_tokens" && body.contains("max_completion_tokens")) error->param = "max_completion_tokens";
    return parsed;
  }
  std::get<CompletionRequest>(parsed).chat = true;
  return parsed;
}

}  // namespace hsx
