// vLLM's render endpoints and /tokenize's chat form: a request's prompt as the token ids the
// model would run, without running anything. POST /v1/chat/completions/render takes a chat
// completions body and answers vLLM's GenerateRequest ({"request_id", "token_ids",
// "sampling_params", "loss_mask", ...}); POST /v1/completions/render takes a completions
// body and answers a list of them, one per prompt. Both take vLLM's truncate_prompt_tokens
// (-1: max_model_len) and truncation_side ("left", the default, keeps the last tokens;
// "right" keeps the first), applied before the length check, so speculators' prepare-data
// can bound each render to its training window. POST /tokenize with "messages" renders them
// as vLLM's tokenize endpoint does (add_generation_prompt true, add_special_tokens false by
// default).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "server/completion_request.h"
#include "template/chat_template.h"

namespace hsx {

// What the render routes need of the server. `chat` null: the model has no template, or it
// could not be read (`chat_error`).
struct RenderContext {
  const CompletionLimits* limits = nullptr;
  const ChatTemplate* chat = nullptr;
  Status chat_error;
};

using RenderResult = std::variant<nlohmann::json, RequestError>;

// `ordered`: the same body with its keys in the order sent (what the template sees).
RenderResult RenderChatRequest(const nlohmann::json& body, const nlohmann::ordered_json& ordered,
                               const RenderContext& context);
RenderResult RenderCompletionRequest(const nlohmann::json& body, const RenderContext& context);
// /tokenize's chat form ({"messages", ...}): {"count", "max_model_len", "tokens", "token_strs"}.
RenderResult TokenizeMessages(const nlohmann::json& body, const nlohmann::ordered_json& ordered,
                              const RenderContext& context);

}  // namespace hsx
