#include "template/conversation_regeneration.h"

#include <algorithm>
#include <cstring>

namespace hsx {

Result<ConversationRegeneration> ConversationRegeneration::Create(const ChatTemplate& chat, const Tokenizer& tokenizer,
                                                                  nlohmann::ordered_json messages, ChatOptions options) {
  ConversationRegeneration r;
  r.chat_ = &chat;
  r.tokenizer_ = &tokenizer;
  r.options_ = std::move(options);
  if (!messages.is_array()) return Error("'messages' must be a list");
  for (size_t j = 1; j < messages.size(); ++j) {
    if (messages[j].is_object() && messages[j].value("role", "") == "assistant") r.assistant_turns_.push_back(j);
  }
  if (r.assistant_turns_.empty()) return Error("'messages' has no assistant turn after the first message to regenerate");
  messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(r.assistant_turns_.back() + 1), messages.end());
  r.messages_ = std::move(messages);
  HSX_ASSIGN_OR_RETURN(r.text_, r.Render(r.assistant_turns_[0], true));
  HSX_ASSIGN_OR_RETURN(r.prompt_, tokenizer.Encode(r.text_, /*add_special_tokens=*/false));
  return r;
}

Result<std::string> ConversationRegeneration::Render(size_t turns, bool add_generation_prompt) const {
  nlohmann::ordered_json prefix = nlohmann::ordered_json::array();
  for (size_t i = 0; i < turns; ++i) prefix.push_back(messages_[i]);
  ChatOptions o = options_;
  o.add_generation_prompt = add_generation_prompt;
  return chat_->Render(prefix, o);
}

std::optional<ConversationRegeneration::Next> ConversationRegeneration::TurnEnded(const std::vector<int32_t>& tokens,
                                                                                 int turn_start,
                                                                                 const std::vector<int32_t>& stop_token_ids) {
  if (next_ >= assistant_turns_.size() || !error_.ok()) return std::nullopt;
  const size_t turn = assistant_turns_[next_];
  auto fail = [&](const std::string& why) -> std::optional<Next> {
    error_ = Error("messages[" + std::to_string(turn) + "]: " + why);
    return std::nullopt;
  };
  std::vector<int32_t> answer(tokens.begin() + turn_start, tokens.end());
  spans_.emplace_back(turn_start, static_cast<int>(tokens.size()));
  // The answer's text, without the stop token it may have ended with.
  const bool stopped = !answer.empty() &&
                       std::find(stop_token_ids.begin(), stop_token_ids.end(), answer.back()) != stop_token_ids.end();
  auto content = tokenizer_->Decode(stopped ? std::vector<int32_t>(answer.begin(), answer.end() - 1) : answer,
                                    /*skip_special_tokens=*/true);
  if (!content.ok()) return fail(content.status().message());
  std::string stop_text;
  if (stopped) {
    auto text = tokenizer_->Decode({answer.back()}, /*skip_special_tokens=*/false);
    if (!text.ok()) return fail(text.status().message());
    stop_text = *text;
  }
  // The template's view of the context this answer was generated in must be the text the
  // sequence holds: a template that rewrites earlier turns once later ones follow (Qwen3
  // strips reasoning), or trims an answer, would have the next turns see another history.
  auto context = Render(turn, true);
  if (!context.ok()) return fail(context.status().message());
  if (*context != text_) {
    return fail("the template renders the conversation before this turn differently from the sequence that "
                "generated it (it rewrites or trims earlier answers), so the turns cannot share one sequence; "
                "regenerate it turn by turn through hsx serve");
  }
  // What follows the answer, from a render with a placeholder in its place.
  static constexpr const char* kPlaceholder = "HSXREGENERATEDANSWER7f3a91";
  messages_[turn]["content"] = kPlaceholder;
  const bool last = next_ + 1 == assistant_turns_.size();
  auto after = last ? Render(turn + 1, false) : Render(assistant_turns_[next_ + 1], true);
  messages_[turn]["content"] = *content;
  if (!after.ok()) return fail(after.status().message());
  const size_t at = after->find(kPlaceholder);
  if (at == std::string::npos || after->compare(0, at, *context) != 0) {
    return fail("the template does not render this turn's context as the start of the conversation that follows "
                "it, so the turns cannot share one sequence");
  }
  std::string rest = after->substr(at + std::strlen(kPlaceholder));
  // A stop token the model ended with stands for the template's own text of it.
  if (stopped && rest.compare(0, stop_text.size(), stop_text) == 0) rest = rest.substr(stop_text.size());
  auto known = tokenizer_->Encode(rest, /*add_special_tokens=*/false);
  if (!known.ok()) return fail(known.status().message());
  text_ = *context + *content + stop_text + rest;
  ++next_;
  return Next{std::move(known).value(), !last};
}

}  // namespace hsx
