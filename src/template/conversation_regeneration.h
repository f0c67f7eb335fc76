// One conversation regenerated turn by turn in one sequence, as speculators'
// regenerate-responses does it over HTTP (each assistant turn answered anew by the target,
// its answer fed into the next turn's context), for one-pass regenerate-and-extract: the
// engine keeps one sequence and asks, when a turn's generation ends, for the known tokens
// that follow it (Request::next_turn), so no token runs twice.
//
// The known tokens are the template's own text between the regenerated answer and the
// next generation prompt (or the conversation's end). The template must render each
// turn's context as the sequence holds it (no rewriting or trimming of earlier answers),
// else the line fails naming the turn. The answer's tokens are the ones the target
// generated, not a re-tokenization of its text.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace hsx {

class ConversationRegeneration {
 public:
  // messages: a conversation with at least one assistant turn after the first message;
  // messages after the last assistant turn are dropped (as speculators drops them).
  // The error names what is missing. Keeps pointers to chat and tokenizer.
  static Result<ConversationRegeneration> Create(const ChatTemplate& chat, const Tokenizer& tokenizer,
                                                 nlohmann::ordered_json messages, ChatOptions options);

  // The first turn's prompt: the conversation before the first assistant turn, with the
  // generation prompt.
  const std::vector<int32_t>& prompt() const { return prompt_; }

  // Called when the current turn's generation ends; tokens: the sequence's so far,
  // turn_start: where this turn's generated tokens begin, stop_token_ids: the request's
  // (an answer that ended with one has it in the template's place). Returns the known tokens that
  // follow and whether another turn is generated after them (false: a last turn of known
  // tokens); nullopt once every turn is done, or on failure (error() says why).
  struct Next {
    std::vector<int32_t> known;
    bool generate = false;
  };
  std::optional<Next> TurnEnded(const std::vector<int32_t>& tokens, int turn_start,
                                const std::vector<int32_t>& stop_token_ids);

  const Status& error() const { return error_; }
  // [begin, end) of each generated answer in the final tokens (the loss mask's ones).
  const std::vector<std::pair<int, int>>& generated_spans() const { return spans_; }
  // The conversation with the regenerated answers.
  const nlohmann::ordered_json& messages() const { return messages_; }
  // Each regenerated answer's index in messages(), in order; fewer than the conversation's
  // assistant turns when it ended early (max_model_len).
  std::vector<size_t> answered_turns() const {
    return {assistant_turns_.begin(), assistant_turns_.begin() + static_cast<std::ptrdiff_t>(spans_.size())};
  }

 private:
  Result<std::string> Render(size_t turns, bool add_generation_prompt) const;
  const ChatTemplate* chat_ = nullptr;
  const Tokenizer* tokenizer_ = nullptr;
  nlohmann::ordered_json messages_;
  ChatOptions options_;
  std::vector<size_t> assistant_turns_;  // indices into messages_
  size_t next_ = 0;                      // the assistant turn being generated
  std::vector<int32_t> prompt_;
  std::string text_;  // the text the sequence's tokens stand for
  std::vector<std::pair<int, int>> spans_;
  Status error_;
};

}  // namespace hsx
