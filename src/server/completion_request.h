// A /v1/completions body, read and checked whole before anything is submitted: every
// field hsx reads, with its type and range (a 400 naming the field); every prompt
// tokenized and measured against max_model_len in vLLM's words; the OpenAI and vLLM
// parameters hsx does not implement refused by name, as vLLM refuses what it does not
// support. Fields neither defines are ignored, as vLLM ignores them (and logs them).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/sampler.h"
#include "template/conversation_regeneration.h"
#include "tokenizer/tokenizer.h"

namespace hsx {

// What the checks need to know about the server and its model.
struct CompletionLimits {
  std::string model_name;
  int max_model_len = 0;
  int vocab_size = 0;
  const Tokenizer* tokenizer = nullptr;  // null: text prompts and stop strings are refused
  int64_t max_prompt_bytes = 0;          // longer text cannot fit max_model_len; 0: unknown
  bool extract = false;                  // hidden states are stored
  bool allow_custom_path = false;        // kv_transfer_params.hidden_states_path may name the file
  size_t max_choices = 0;                // prompts x n the server can queue at once
  int max_n = 0;                         // choices per prompt (--max-n); 0: no cap
};

struct RequestError {
  int status = 400;
  std::string message;
  std::string param;  // the field at fault; empty: none in particular
};

struct CompletionRequest {
  struct Prompt {
    std::vector<int32_t> ids;
    std::string text;  // as sent (text prompts), for echo
    bool is_text = false;
    int max_tokens = 0;  // resolved for this prompt's length
  };
  std::vector<Prompt> prompts;
  int n = 1;  // choices per prompt
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;
  bool return_token_ids = false;
  bool ignore_eos = false;
  bool add_special_tokens = true;  // text prompts get the tokenizer's BOS/EOS, as in vLLM
  // vLLM's detokenization: the text leaves out special tokens (<|im_end|>, ...) by default.
  // spaces_between_special_tokens is read and checked but, as in vLLM with a fast
  // (tokenizer.json) tokenizer, changes nothing: the tokenizer's decoder places every space.
  bool skip_special_tokens = true;
  bool spaces_between_special_tokens = true;
  int min_tokens = 0;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  std::vector<int32_t> stop_token_ids;  // the client's, beside the model's EOS
  SamplingParams sampling;  // OpenAI's and vLLM's defaults: temperature 1, top_p 1, no top_k, min_p 0, random seed
  bool include_output_tokens = false;
  std::string hidden_states_name;  // a client-chosen file name inside the storage directory
  std::vector<std::string> ignored_fields;  // unknown top-level fields (shortened), for the log
  bool chat = false;  // from /v1/chat/completions: answered in OpenAI's chat shape
  // Chat's "regenerate" (one-pass regenerate-and-extract): the conversation whose assistant
  // turns the target answers anew in one sequence; prompts[0] is its first answer's
  // prompt and prompts[0].max_tokens each answer's cap. Null: a plain request.
  std::shared_ptr<ConversationRegeneration> regeneration;
};

// The request in `body` (a parsed JSON value), or the error that answers it.
std::variant<CompletionRequest, RequestError> ParseCompletionRequest(const nlohmann::json& body,
                                                                     const CompletionLimits& limits);

// The most bytes of text that can tokenize to at most `max_model_len` tokens, so longer
// text fails before it is tokenized: a token covers at most as many bytes as its
// vocabulary string (byte-level and byte-fallback pieces spell each byte with at least
// one), and normalization shrinks text at most 4x (NFKC: the 4-byte mathematical "𝐀"
// becomes "A"). Tokenizers that delete text (a Strip or Replace-with-nothing normalizer)
// or fuse unknown characters into one token could beat this bound.
int64_t MaxPromptBytes(const Tokenizer& tokenizer, int max_model_len);

// Why text of `bytes` bytes is refused before it is tokenized (it cannot fit
// max_model_len tokens: more than limits.max_prompt_bytes), or nullopt.
std::optional<std::string> TextTooLong(size_t bytes, const CompletionLimits& limits);

// Whether a JSON value is an integer token id in [0, vocab) (2^40 must not wrap into range).
bool IsTokenId(const nlohmann::json& value, int vocab);

// `text` cut to at most `max_bytes` bytes (on a character boundary, "..." appended), so a
// message never echoes unbounded client input.
std::string Shortened(const std::string& text, size_t max_bytes = 64);

}  // namespace hsx
