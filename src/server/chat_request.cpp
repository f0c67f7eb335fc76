#include "server/chat_request.h"

#include <memory>

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
  // hsx's one-pass regenerate-and-extract: checked before anything is rendered.
  bool regenerate = false;
  if (auto it = body.find("regenerate"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return BadRequest("'regenerate' must be true or false", "regenerate");
    regenerate = it->get<bool>();
  }
  if (regenerate && !limits.extract) {
    return BadRequest("'regenerate' stores the regenerated conversation's hidden states, and this server does not "
                      "extract them (start hsx serve with --speculative-config extract_hidden_states and "
                      "--kv-transfer-config)",
                      "regenerate");
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
  json completion = body;
  for (const char* field : {"messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                            "add_generation_prompt", "max_completion_tokens", "top_logprobs", "regenerate"}) {
    completion.erase(field);
  }
  std::shared_ptr<ConversationRegeneration> regeneration;
  if (regenerate) {
    // The first answer's prompt runs; the rest of the conversation follows turn by turn.
    auto made = ConversationRegeneration::Create(*chat, *limits.tokenizer, ordered["messages"], *options);
    if (!made.ok()) return BadRequest(made.status().message(), "messages");
    regeneration = std::make_shared<ConversationRegeneration>(std::move(made).value());
    completion["prompt"] = regeneration->prompt();
    // Without a cap, each answer runs until it stops or the context is full.
    if (!body.contains("max_tokens") && !body.contains("max_completion_tokens")) completion["max_tokens"] = nullptr;
  } else {
    auto prompt = chat->Render(ordered["messages"], *options);
    if (!prompt.ok()) return BadRequest(prompt.status().message(), "messages");
    completion["prompt"] = *prompt;
  }
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
  CompletionRequest& c = std::get<CompletionRequest>(parsed);
  c.chat = true;
  if (regeneration) {
    // What one sequence of answers, each its tokens' text, stored once, cannot honour.
    if (c.n != 1) return BadRequest("'regenerate' answers each turn once: 'n' must be 1", "n");
    if (c.stream) {
      return BadRequest("'regenerate' does not stream: the response comes once the whole conversation is regenerated "
                        "and stored", "stream");
    }
    if (!c.stop.empty()) {
      return BadRequest("'stop' strings cannot end a regenerated answer (the next turn must see the answer's text as "
                        "its tokens); use stop_token_ids", "stop");
    }
    if (c.ignore_eos) return BadRequest("'ignore_eos' with 'regenerate': each answer ends at the model's end of turn", "ignore_eos");
    if (!c.skip_special_tokens) {
      return BadRequest("'regenerate' gives each answer's text as the template sees it, without special tokens: "
                        "'skip_special_tokens' must be true", "skip_special_tokens");
    }
    if (c.prompts[0].max_tokens < 1) {
      const std::string field = body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
      return BadRequest("'regenerate' needs room for an answer: the first answer's prompt has " +
                            std::to_string(c.prompts[0].ids.size()) + " tokens, and '" + field +
                            "' or max_model_len (" + std::to_string(limits.max_model_len) + ") leaves none",
                        field);
    }
    c.regeneration = std::move(regeneration);
  }
  return parsed;
}

}  // namespace hsx
