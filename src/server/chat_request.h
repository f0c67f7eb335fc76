// A /v1/chat/completions body as the completions request it amounts to: the messages
// rendered through the model's chat template become the prompt text (tokenized without the
// tokenizer's special tokens, as HF and vLLM do for chat: the template writes BOS itself),
// and chat's own fields map onto completions' (max_completion_tokens → max_tokens,
// logprobs + top_logprobs → logprobs), so sampling, stops, logprobs and hidden-state
// extraction are read and checked by ParseCompletionRequest, once for both endpoints.
// With "regenerate": true (extraction on), the prompt is the first assistant turn's and the
// request carries the ConversationRegeneration that answers every assistant turn anew in
// one sequence (engine/regeneration_request); what that cannot honour (n > 1, streaming,
// stop strings, ignore_eos) is refused by name.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "server/completion_request.h"
#include "template/chat_template.h"

namespace hsx {

// `body` is the request; `ordered` the same document with its keys in the order sent (what
// the template sees, as Python's json would give it). `chat` null: the model has no template.
std::variant<CompletionRequest, RequestError> ParseChatRequest(const nlohmann::json& body,
                                                               const nlohmann::ordered_json& ordered,
                                                               const ChatTemplate* chat,
                                                               const CompletionLimits& limits);

}  // namespace hsx
