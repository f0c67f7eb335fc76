#include "server/render_request.h"

#include <random>

namespace hsx {
namespace {

using json = nlohmann::json;

RequestError BadRequest(const std::string& message, const std::string& param) { return {400, message, param}; }

// A random request id (vLLM's random_uuid(): 32 hex digits).
std::string RandomId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 2; ++i) {
    uint64_t r = rng();
    for (int k = 0; k < 16; ++k, r >>= 4) id += kHex[r & 15];
  }
  return id;
}

// vLLM's truncate_prompt_tokens and truncation_side, read from `body`.
struct Truncation {
  int64_t keep = -2;  // -2: none
  bool left = true;   // keep the last tokens
};

std::variant<Truncation, RequestError> ReadTruncation(const json& body, int max_model_len) {
  Truncation t;
  if (auto f = body.find("truncate_prompt_tokens"); f != body.end() && !f->is_null()) {
    if (!f->is_number_integer() || f->get<int64_t>() < -1) {
      return BadRequest("'truncate_prompt_tokens' must be an integer >= -1", "truncate_prompt_tokens");
    }
    t.keep = f->get<int64_t>() == -1 ? max_model_len : f->get<int64_t>();
    if (t.keep > max_model_len) {
      return BadRequest("'truncate_prompt_tokens' (" + std::to_string(t.keep) +
                            ") is larger than max_model_len (" + std::to_string(max_model_len) + ")",
                        "truncate_prompt_tokens");
    }
  }
  if (auto f = body.find("truncation_side"); f != body.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "left" && *f != "right")) {
      return BadRequest("'truncation_side' must be \"left\" or \"right\"", "truncation_side");
    }
    t.left = *f == "left";
  }
  return t;
}

void Truncate(std::vector<int32_t>& ids, const Truncation& t) {
  if (t.keep < 0 || static_cast<int64_t>(ids.size()) <= t.keep) return;
  const auto keep = static_cast<std::ptrdiff_t>(t.keep);
  if (t.left) {
    ids.erase(ids.begin(), ids.end() - keep);
  } else {
    ids.resize(static_cast<size_t>(keep));
  }
}

// The sampling fields a render request may carry, checked by the completions parser (as a
// completions body of the prompt's ids) and answered in vLLM's SamplingParams shape.
constexpr const char* kSamplingFields[] = {
    "model", "n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "max_tokens",
    "min_tokens", "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens", "logprobs"};

std::variant<json, RequestError> GenerateRequest(const json& body, std::vector<int32_t> ids, const CompletionLimits& limits,
                                                 const std::string& request_id) {
  json completion = json::object();
  for (const char* field : kSamplingFields) {
    if (auto f = body.find(field); f != body.end()) completion[field] = *f;
  }
  // Without max_tokens vLLM lets a render's request run to max_model_len.
  if (!completion.contains("max_tokens")) completion["max_tokens"] = nullptr;
  completion["prompt"] = ids;
  auto parsed = ParseCompletionRequest(completion, limits);
  if (auto* error = std::get_if<RequestError>(&parsed)) return *error;
  const CompletionRequest& c = std::get<CompletionRequest>(parsed);
  const SamplingParams& s = c.sampling;
  json sampling = {{"n", c.n},
                   {"presence_penalty", s.presence_penalty},
                   {"frequency_penalty", s.frequency_penalty},
                   {"repetition_penalty", s.repetition_penalty},
                   {"temperature", s.temperature},
                   {"top_p", s.top_p},
                   {"top_k", s.top_k},
                   {"min_p", s.min_p},
                   {"seed", s.seed ? json(static_cast<int64_t>(*s.seed)) : json()},
                   {"stop", c.stop},
                   {"stop_token_ids", c.stop_token_ids},
                   {"ignore_eos", c.ignore_eos},
                   {"max_tokens", c.prompts[0].max_tokens},
                   {"min_tokens", c.min_tokens},
                   {"logprobs", s.logprobs >= 0 ? json(s.logprobs) : json()},
                   {"include_stop_str_in_output", c.include_stop_str_in_output},
                   {"skip_special_tokens", c.skip_special_tokens},
                   {"spaces_between_special_tokens", c.spaces_between_special_tokens}};
  return json{{"request_id", request_id},
              {"token_ids", c.prompts[0].ids},
              {"features", nullptr},
              {"sampling_params", std::move(sampling)},
              {"model", limits.model_name},
              {"stream", false},
              {"stream_options", nullptr},
              {"cache_salt", body.value("cache_salt", json())},
              {"priority", 0},
              {"kv_transfer_params", nullptr}};
}

// The messages of `ordered` rendered through the template and tokenized without the
// tokenizer's special tokens unless add_special_tokens (the template writes BOS).
std::variant<std::vector<int32_t>, RequestError> RenderMessages(const json& body, const nlohmann::ordered_json& ordered,
                                                                const RenderContext& context,
                                                                bool default_add_generation_prompt) {
  if (!body.is_object()) return BadRequest("expected a JSON object", "");
  if (!body.contains("messages")) return BadRequest("missing field 'messages'", "messages");
  if (context.chat == nullptr) {
    if (!context.chat_error.ok()) {
      return BadRequest("this model's chat template cannot be used: " + context.chat_error.message(), "messages");
    }
    return BadRequest("this model has no chat template (no chat_template.jinja, no chat_template in "
                      "tokenizer_config.json or the GGUF file)",
                      "messages");
  }
  const Tokenizer* tokenizer = context.limits->tokenizer;
  if (tokenizer == nullptr) return BadRequest("this model has no tokenizer.json to tokenize messages with", "messages");
  if (auto f = body.find("continue_final_message"); f != body.end() && !f->is_null()) {
    if (!f->is_boolean()) return BadRequest("'continue_final_message' must be true or false", "continue_final_message");
    if (f->get<bool>()) return BadRequest("'continue_final_message' is not supported by hsx", "continue_final_message");
  }
  if (auto f = body.find("chat_template"); f != body.end() && !f->is_null()) {
    return BadRequest("'chat_template' (a template per request) is not supported by hsx", "chat_template");
  }
  auto options = ReadChatOptions(ordered, default_add_generation_prompt);
  if (!options.ok()) {
    const std::string& m = options.status().message();
    return BadRequest(m, m.substr(0, m.find(':')));
  }
  auto text = context.chat->Render(ordered["messages"], *options);
  if (!text.ok()) return BadRequest(text.status().message(), "messages");
  bool add_special = false;
  if (auto f = body.find("add_special_tokens"); f != body.end() && !f->is_null()) {
    if (!f->is_boolean()) return BadRequest("'add_special_tokens' must be true or false", "add_special_tokens");
    add_special = f->get<bool>();
  }
  auto ids = tokenizer->Encode(*text, add_special);
  if (!ids.ok()) return BadRequest(ids.status().message(), "messages");
  return std::move(ids).value();
}

// The loss mask vLLM answers for return_loss_mask: it needs the template's {% generation %}
// spans, which hsx's renderer does not track yet, so it is null, as vLLM answers for a
// template without generation tags (clients then derive the mask from render boundaries).
std::variant<json, RequestError> LossMask(const json& body) {
  if (auto f = body.find("return_loss_mask"); f != body.end() && !f->is_null() && !f->is_boolean()) {
    return BadRequest("'return_loss_mask' must be true or false", "return_loss_mask");
  }
  return json();
}

}  // namespace

RenderResult RenderChatRequest(const json& body, const nlohmann::ordered_json& ordered, const RenderContext& context) {
  auto ids = RenderMessages(body, ordered, context, /*default_add_generation_prompt=*/true);
  if (auto* error = std::get_if<RequestError>(&ids)) return *error;
  auto truncation = ReadTruncation(body, context.limits->max_model_len);
  if (auto* error = std::get_if<RequestError>(&truncation)) return *error;
  auto mask = LossMask(body);
  if (auto* error = std::get_if<RequestError>(&mask)) return *error;
  std::vector<int32_t>& tokens = std::get<std::vector<int32_t>>(ids);
  Truncate(tokens, std::get<Truncation>(truncation));
  json sampling_body = body;
  if (body.contains("max_completion_tokens")) {
    if (body.contains("max_tokens")) {
      return BadRequest("give 'max_completion_tokens' or 'max_tokens', not both", "max_completion_tokens");
    }
    sampling_body["max_tokens"] = body["max_completion_tokens"];
  }
  sampling_body.erase("logprobs");  // chat's is a bool; render answers no logprobs setting
  auto generate = GenerateRequest(sampling_body, std::move(tokens), *context.limits, "chatcmpl-" + RandomId());
  if (auto* error = std::get_if<RequestError>(&generate)) {
    if (error->param == "prompt") error->param = "messages";
    return *error;
  }
  json& out = std::get<json>(generate);
  out["loss_mask"] = std::get<json>(mask);
  return std::move(out);
}

RenderResult RenderCompletionRequest(const json& body, const RenderContext& context) {
  if (!body.is_object()) return BadRequest("expected a JSON object", "");
  const CompletionLimits& limits = *context.limits;
  auto truncation = ReadTruncation(body, limits.max_model_len);
  if (auto* error = std::get_if<RequestError>(&truncation)) return *error;
  const auto prompt = body.find("prompt");
  if (prompt == body.end()) return BadRequest("missing field 'prompt'", "prompt");
  bool add_special = true;
  if (auto f = body.find("add_special_tokens"); f != body.end() && !f->is_null()) {
    if (!f->is_boolean()) return BadRequest("'add_special_tokens' must be true or false", "add_special_tokens");
    add_special = f->get<bool>();
  }
  // One prompt (text or ids) or a list of them, each tokenized and truncated before the
  // completions parser checks it.
  std::vector<json> prompts;
  const bool many = prompt->is_array() && !prompt->empty() && ((*prompt)[0].is_string() || (*prompt)[0].is_array());
  if (many) {
    for (const json& p : *prompt) prompts.push_back(p);
  } else {
    prompts.push_back(*prompt);
  }
  json out = json::array();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string what = many ? "prompt[" + std::to_string(i) + "]" : "prompt";
    std::vector<int32_t> ids;
    if (prompts[i].is_string()) {
      if (limits.tokenizer == nullptr) return BadRequest(what + ": text prompts need the model's tokenizer.json", "prompt");
      auto encoded = limits.tokenizer->Encode(prompts[i].get<std::string>(), add_special);
      if (!encoded.ok()) return BadRequest(what + ": " + encoded.status().message(), "prompt");
      ids = std::move(encoded).value();
    } else if (prompts[i].is_array()) {
      for (const json& t : prompts[i]) {
        if (!IsTokenId(t, limits.vocab_size)) {
          return BadRequest(what + ": " + Shortened(t.dump()) + " is not a token id in [0, " +
                                std::to_string(limits.vocab_size) + ")",
                            "prompt");
        }
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    } else {
      return BadRequest(what + ": must be a string, a list of token ids, or a list of either", "prompt");
    }
    Truncate(ids, std::get<Truncation>(truncation));
    auto generate = GenerateRequest(body, std::move(ids), limits, "cmpl-" + RandomId() + "-" + std::to_string(i));
    if (auto* error = std::get_if<RequestError>(&generate)) {
      if (error->param == "prompt" && many) error->message = what + ": " + error->message;
      return *error;
    }
    out.push_back(std::move(std::get<json>(generate)));
  }
  return out;
}

RenderResult TokenizeMessages(const json& body, const nlohmann::ordered_json& ordered, const RenderContext& context) {
  if (body.contains("prompt")) return BadRequest("give 'prompt' or 'messages', not both", "messages");
  auto ids = RenderMessages(body, ordered, context, /*default_add_generation_prompt=*/true);
  if (auto* error = std::get_if<RequestError>(&ids)) return *error;
  const std::vector<int32_t>& tokens = std::get<std::vector<int32_t>>(ids);
  json token_strs = nullptr;
  if (auto f = body.find("return_token_strs"); f != body.end() && !f->is_null()) {
    if (!f->is_boolean()) return BadRequest("'return_token_strs' must be true or false", "return_token_strs");
    if (f->get<bool>()) {
      token_strs = json::array();
      for (int32_t id : tokens) token_strs.push_back(context.limits->tokenizer->IdToToken(id));
    }
  }
  return json{{"count", tokens.size()}, {"max_model_len", context.limits->max_model_len}, {"tokens", tokens},
              {"token_strs", std::move(token_strs)}};
}

}  // namespace hsx
