#include "server/completion_request.h"

#include <algorithm>
#include <climits>
#include <limits>
#include <optional>
#include <set>

namespace hsx {
namespace {

using json = nlohmann::json;

// OpenAI's completion default, which vLLM keeps; an explicit null means "what fits".
constexpr int kDefaultMaxTokens = 16;
// A custom file name leaves room in NAME_MAX (255) for the ".lock" and temp-file suffixes.
constexpr size_t kMaxFileNameBytes = 200;
// Stops are checked on the engine thread for every token: bound the work per token.
constexpr size_t kMaxStopStrings = 64, kMaxStopStringBytes = 1024, kMaxStopTokenIds = 1024;
constexpr int64_t kMaxLogprobs = 20;  // vLLM's default max_logprobs

// Reads typed fields of one JSON object. Absent and null fields read as nullopt; a field
// of another type, or out of range, records an error that names it (the first one wins;
// later reads then return nullopt).
class FieldReader {
 public:
  // `prefix` names a nested object ("kv_transfer_params"), which is then the param.
  FieldReader(const json& object, std::string prefix = "") : object_(object), prefix_(std::move(prefix)) {}

  const json* Get(const std::string& key) const {
    if (error_) return nullptr;
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<bool> Bool(const std::string& key) {
    const json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return Fail(key, "must be true or false");
    return v->get<bool>();
  }
  std::optional<int64_t> Int(const std::string& key, int64_t min, int64_t max = INT64_MAX) {
    const json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    const bool in_range = v->is_number_integer() && !(v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX) &&
                          v->get<int64_t>() >= min && v->get<int64_t>() <= max;
    if (!in_range) {
      return Fail(key, "must be an integer " + (max == INT64_MAX ? ">= " + std::to_string(min)
                                                                 : "in [" + std::to_string(min) + ", " +
                                                                       std::to_string(max) + "]"));
    }
    return v->get<int64_t>();
  }
  std::optional<double> Number(const std::string& key) {
    const json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return Fail(key, "must be a number");
    return v->get<double>();
  }
  std::optional<std::string> String(const std::string& key) {
    const json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return Fail(key, "must be a string");
    return v->get<std::string>();
  }
  const json* Object(const std::string& key) {
    const json* v = Get(key);
    if (v == nullptr || v->is_object()) return v;
    Fail(key, "must be an object");
    return nullptr;
  }
  // Records an error about `key`; returns nullopt so readers can `return Fail(...)`.
  std::nullopt_t Fail(const std::string& key, const std::string& what) {
    Refuse(key, what);
    return std::nullopt;
  }
  // The error about `key` (or the one recorded before it).
  RequestError Refuse(const std::string& key, const std::string& what) {
    if (!error_) error_ = RequestError{400, "'" + Name(key) + "' " + what, prefix_.empty() ? key : prefix_};
    return *error_;
  }
  std::string Name(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  const std::optional<RequestError>& error() const { return error_; }

 private:
  const json& object_;
  std::string prefix_;
  std::optional<RequestError> error_;
};

// Every top-level field hsx reads, implements or knowingly ignores; others are logged.
const std::set<std::string>& KnownFields() {
  static const std::set<std::string> kKnown = {
      // OpenAI
      "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
      "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
      // vLLM's extras that hsx implements or refuses below
      "top_k", "ignore_eos", "min_tokens", "stop_token_ids", "include_stop_str_in_output", "return_token_ids",
      "kv_transfer_params", "use_beam_search", "min_p", "repetition_penalty", "length_penalty", "allowed_token_ids",
      "prompt_logprobs", "truncate_prompt_tokens", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
      "response_format", "logits_processors", "prompt_embeds", "priority", "add_special_tokens",
      "skip_special_tokens", "spaces_between_special_tokens",
      // vLLM's extras that do not change what hsx computes
      "request_id", "cache_salt",
      "return_tokens_as_token_ids", "guided_decoding_backend", "guided_whitespace_pattern", "vllm_xargs"};
  return kKnown;
}

// Parameters hsx does not implement: given with anything but their neutral value, the
// request is refused by name rather than answered as if they were honoured.
std::optional<RequestError> RefuseUnsupported(const json& body) {
  auto is_number = [](const json& v, double neutral) { return v.is_number() && v.get<double>() == neutral; };
  struct Rule {
    const char* name;
    bool (*neutral)(const json&);
  };
  static const Rule kRules[] = {
      {"suffix", [](const json&) { return false; }},
      {"logit_bias", [](const json& v) { return v.is_object() && v.empty(); }},
      {"prompt_logprobs", [](const json&) { return false; }},
      {"allowed_token_ids", [](const json&) { return false; }},
      {"truncate_prompt_tokens", [](const json&) { return false; }},
      {"guided_json", [](const json&) { return false; }},
      {"guided_regex", [](const json&) { return false; }},
      {"guided_choice", [](const json&) { return false; }},
      {"guided_grammar", [](const json&) { return false; }},
      {"logits_processors", [](const json&) { return false; }},
      {"prompt_embeds", [](const json&) { return false; }},
      {"use_beam_search", [](const json& v) { return v.is_boolean() && !v.get<bool>(); }},
      {"response_format", [](const json& v) { return v.is_object() && v.value("type", json()) == "text"; }},
  };
  for (const Rule& rule : kRules) {
    auto it = body.find(rule.name);
    if (it != body.end() && !it->is_null() && !rule.neutral(*it)) {
      return RequestError{400, std::string("'") + rule.name + "' is not supported by hsx", rule.name};
    }
  }
  static const std::pair<const char*, double> kNeutralNumbers[] = {
      {"length_penalty", 1.0}, {"priority", 0.0}};
  for (const auto& [name, neutral] : kNeutralNumbers) {
    auto it = body.find(name);
    if (it != body.end() && !it->is_null() && !is_number(*it, neutral)) {
      std::string value = neutral == 0.0 ? "0" : "1";
      return RequestError{400, std::string("'") + name + "' is not supported by hsx (only " + value + ")", name};
    }
  }
  return std::nullopt;
}

// vLLM's words for a prompt that does not fit.
std::string PromptTooLong(size_t tokens, int max_model_len) {
  return "This model's maximum context length is " + std::to_string(max_model_len) + " tokens. However, your request has " +
         std::to_string(tokens) + " input tokens. Please reduce the length of the input messages.";
}

// One prompt: text (encoded with the tokenizer's special tokens or without) or token ids
// (taken as they are, as vLLM takes them). `what` names it in errors ("prompt", "prompt[3]").
std::optional<RequestError> ReadPrompt(const json& p, const std::string& what, const CompletionLimits& limits,
                                       bool add_special_tokens, CompletionRequest::Prompt& out) {
  auto fail = [&](const std::string& message) { return RequestError{400, what + ": " + message, "prompt"}; };
  auto too_long = [&](size_t tokens) { return static_cast<int64_t>(tokens) > limits.max_model_len; };
  if (p.is_string()) {
    if (limits.tokenizer == nullptr) return fail("text prompts need the model's tokenizer.json; send token ids");
    out.text = p.get<std::string>();
    out.is_text = true;
    if (auto too_long = TextTooLong(out.text.size(), limits)) return fail(*too_long);
    auto ids = limits.tokenizer->Encode(out.text, add_special_tokens);
    if (!ids.ok()) return fail(ids.status().message());
    out.ids = std::move(ids).value();
  } else if (p.is_array()) {
    if (too_long(p.size())) return fail(PromptTooLong(p.size(), limits.max_model_len));  // before converting it
    out.ids.reserve(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      const json& t = p[i];
      if (!t.is_number_integer()) return fail("token id prompts must be lists of integers");
      if (!IsTokenId(t, limits.vocab_size)) {
        return fail("token id " + t.dump() + " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                    std::to_string(limits.vocab_size) + ")");
      }
      out.ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    return fail("must be a string, a list of token ids, or a list of either");
  }
  if (out.ids.empty()) return fail("empty prompt (expected at least one token)");
  if (too_long(out.ids.size())) return fail(PromptTooLong(out.ids.size(), limits.max_model_len));
  return std::nullopt;
}

// A file name the client may choose inside the storage directory: one plain name, so
// nothing can be created, locked or named outside it.
std::optional<std::string> CheckFileName(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return "must be a file name, not '" + name + "'";
  if (name.size() > kMaxFileNameBytes) {
    return "is " + std::to_string(name.size()) + " bytes; at most " + std::to_string(kMaxFileNameBytes) + " are allowed";
  }
  for (unsigned char c : name) {
    if (c == '/') return "must be a file name inside the shared storage path, without '/'";
    if (c < 0x20 || c == 0x7f) return "must not contain control characters (NUL included)";
  }
  // Names of the directory's own bookkeeping: another file's lock, a writer's temp file
  // (removed as stale), extract's manifests.
  if (name.ends_with(".lock")) return "must not end in '.lock' (the names of the files' locks)";
  if (name.find(".tmp.") != std::string::npos) return "must not contain '.tmp.' (the names of temporary files)";
  if (name.starts_with("manifest.") && name.ends_with(".jsonl")) {
    return "must not be a manifest's name (manifest.jsonl, manifest.shard-*.jsonl)";
  }
  return std::nullopt;
}

}  // namespace

bool IsTokenId(const json& t, int vocab) {
  if (t.is_number_unsigned()) return t.get<uint64_t>() < static_cast<uint64_t>(vocab);
  return t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab;
}

std::string Shortened(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;  // not inside a character
  return text.substr(0, end) + "...";
}

std::optional<std::string> TextTooLong(size_t bytes, const CompletionLimits& limits) {
  if (limits.max_prompt_bytes <= 0 || static_cast<int64_t>(bytes) <= limits.max_prompt_bytes) return std::nullopt;
  return "the text is " + std::to_string(bytes) + " bytes, more than " + std::to_string(limits.max_prompt_bytes) +
         " bytes can hold in max_model_len " + std::to_string(limits.max_model_len) + " tokens";
}

int64_t MaxPromptBytes(const Tokenizer& tokenizer, int max_model_len) {
  size_t longest = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) longest = std::max(longest, tokenizer.IdToToken(id).size());
  return 4 * static_cast<int64_t>(longest) * max_model_len;
}

std::variant<CompletionRequest, RequestError> ParseCompletionRequest(const json& body, const CompletionLimits& limits) {
  if (!body.is_object()) return RequestError{400, "the request body must be a JSON object", ""};
  FieldReader f(body);
  CompletionRequest r;

  if (auto model = f.String("model"); model && *model != limits.model_name) {
    return RequestError{404, "The model `" + Shortened(*model) + "` does not exist; this server has `" +
                                 limits.model_name + "`", "model"};
  }
  if (auto e = RefuseUnsupported(body)) return *e;
  if (auto it = body.find("regenerate"); it != body.end() && !it->is_null()) {  // silently ignored, it would mislead
    return RequestError{400, "'regenerate' is a /v1/chat/completions field (it answers the assistant turns of 'messages' anew)",
                        "regenerate"};
  }

  // Scalars first (cheap), then prompts (tokenization).
  r.stream = f.Bool("stream").value_or(false);
  r.echo = f.Bool("echo").value_or(false);
  r.skip_special_tokens = f.Bool("skip_special_tokens").value_or(true);
  r.spaces_between_special_tokens = f.Bool("spaces_between_special_tokens").value_or(true);
  r.return_token_ids = f.Bool("return_token_ids").value_or(false);
  r.ignore_eos = f.Bool("ignore_eos").value_or(false);
  r.include_stop_str_in_output = f.Bool("include_stop_str_in_output").value_or(false);
  r.add_special_tokens = f.Bool("add_special_tokens").value_or(true);
  r.n = static_cast<int>(f.Int("n", 1, INT32_MAX).value_or(1));
  if (limits.max_n > 0 && r.n > limits.max_n) {  // n sequences each hold a slot and KV blocks
    return RequestError{400, "'n' is " + std::to_string(r.n) + "; this server takes at most " +
                                 std::to_string(limits.max_n) + " choices per prompt (--max-n)", "n"};
  }
  if (auto best_of = f.Int("best_of", 1, INT32_MAX); best_of && *best_of != r.n) {
    return RequestError{400, "'best_of' other than n is not supported by hsx", "best_of"};
  }
  const bool max_tokens_null = body.contains("max_tokens") && body["max_tokens"].is_null();
  const std::optional<int64_t> max_tokens = f.Int("max_tokens", 0);
  const int64_t min_tokens = f.Int("min_tokens", 0).value_or(0);
  // Absent, OpenAI's and vLLM's default: sampling at temperature 1, not greedy (the
  // other defaults are SamplingParams' own; without a seed each choice draws a random one).
  r.sampling.temperature = 1.0f;
  if (auto t = f.Number("temperature")) {
    if (*t < 0) return f.Refuse("temperature", "must be a number >= 0");
    r.sampling.temperature = static_cast<float>(*t);
  }
  if (auto p = f.Number("top_p")) {
    if (!(*p > 0 && *p <= 1)) return f.Refuse("top_p", "must be a number in (0, 1]");
    r.sampling.top_p = static_cast<float>(*p);
  }
  if (auto k = f.Int("top_k", -1)) r.sampling.top_k = static_cast<int>(std::min<int64_t>(*k, INT32_MAX));
  if (auto k = f.Int("logprobs", 0, kMaxLogprobs)) {
    // With echo, OpenAI's logprobs cover the prompt's tokens too.
    if (r.echo) return f.Refuse("logprobs", "with echo needs the prompt's logprobs, which hsx does not compute");
    r.sampling.logprobs = static_cast<int>(*k);
  }
  // vLLM's ranges; the device sampler applies them (backend/sampling.h).
  if (auto p = f.Number("min_p")) {
    if (!(*p >= 0 && *p <= 1)) return f.Refuse("min_p", "must be a number in [0, 1]");
    r.sampling.min_p = static_cast<float>(*p);
  }
  for (auto [name, field] : {std::pair{"presence_penalty", &r.sampling.presence_penalty},
                             std::pair{"frequency_penalty", &r.sampling.frequency_penalty}}) {
    if (auto v = f.Number(name)) {
      if (!(*v >= -2 && *v <= 2)) return f.Refuse(name, "must be a number in [-2, 2]");
      *field = static_cast<float>(*v);
    }
  }
  if (auto v = f.Number("repetition_penalty")) {
    if (!(*v > 0 && *v <= 1e4)) return f.Refuse("repetition_penalty", "must be a number in (0, 10000]");
    r.sampling.repetition_penalty = static_cast<float>(*v);
  }
  if (auto seed = f.Int("seed", INT64_MIN)) r.sampling.seed = static_cast<uint64_t>(*seed);
  f.String("user");
  if (const json* options = f.Object("stream_options")) {
    if (!r.stream) return RequestError{400, "'stream_options' needs stream: true", "stream_options"};
    FieldReader o(*options, "stream_options");
    r.include_usage = o.Bool("include_usage").value_or(false);
    if (o.Bool("continuous_usage_stats").value_or(false)) {
      return RequestError{400, "'stream_options.continuous_usage_stats' is not supported by hsx", "stream_options"};
    }
    if (o.error()) return *o.error();
  }
  if (const json* stop = f.Get("stop")) {
    const bool list = stop->is_array();
    if (!stop->is_string() && !(list && std::all_of(stop->begin(), stop->end(), [](const json& s) { return s.is_string(); }))) {
      return f.Refuse("stop", "must be a string or a list of strings");
    }
    if (list && stop->size() > kMaxStopStrings) {
      return f.Refuse("stop", "takes at most " + std::to_string(kMaxStopStrings) + " strings");
    }
    for (const json& s : list ? *stop : json::array({*stop})) r.stop.push_back(s.get<std::string>());
    for (const std::string& s : r.stop) {
      if (s.empty()) return RequestError{400, "'stop' cannot contain an empty string", "stop"};
      if (s.size() > kMaxStopStringBytes) {
        return f.Refuse("stop", "strings must be at most " + std::to_string(kMaxStopStringBytes) + " bytes");
      }
    }
    if (!r.stop.empty() && limits.tokenizer == nullptr) {
      return RequestError{400, "'stop' strings need the model's tokenizer.json; use stop_token_ids", "stop"};
    }
  }
  if (const json* ids = f.Get("stop_token_ids")) {
    if (!ids->is_array()) return f.Refuse("stop_token_ids", "must be a list of token ids");
    if (ids->size() > kMaxStopTokenIds) {
      return f.Refuse("stop_token_ids", "takes at most " + std::to_string(kMaxStopTokenIds) + " ids");
    }
    for (const json& t : *ids) {
      if (!IsTokenId(t, limits.vocab_size)) {
        return RequestError{400, "'stop_token_ids': " + Shortened(t.dump()) + " is not a token id in [0, " +
                                     std::to_string(limits.vocab_size) + ")", "stop_token_ids"};
      }
      r.stop_token_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  }
  if (const json* kv = f.Object("kv_transfer_params")) {
    FieldReader k(*kv, "kv_transfer_params");
    r.include_output_tokens = k.Bool("include_output_tokens").value_or(false);
    if (auto name = k.String("hidden_states_path")) {
      if (!limits.extract || !limits.allow_custom_path) {
        return RequestError{400, "a custom hidden_states_path needs --allow-custom-save-path", "kv_transfer_params"};
      }
      if (auto bad = CheckFileName(*name)) {
        return RequestError{400, "'kv_transfer_params.hidden_states_path' " + *bad, "kv_transfer_params"};
      }
      r.hidden_states_name = *name;
    }
    if (k.error()) return *k.error();
  }
  if (f.error()) return *f.error();
  for (const auto& [key, value] : body.items()) {
    if (!KnownFields().count(key)) r.ignored_fields.push_back(Shortened(key));
  }

  // prompt: text, token ids, or a list of either.
  if (!body.contains("prompt") || body["prompt"].is_null()) return RequestError{400, "missing field 'prompt'", "prompt"};
  const json& prompt = body["prompt"];
  const bool batch = prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array());
  const size_t count = batch ? prompt.size() : 1;
  if (count * static_cast<size_t>(r.n) > limits.max_choices) {  // before tokenizing any of it
    return RequestError{400, "the request has " + std::to_string(count * static_cast<size_t>(r.n)) +
                                 " choices (prompts x n); this server queues at most " +
                                 std::to_string(limits.max_choices) + " (--max-queued-requests)", "n"};
  }
  r.prompts.resize(count);
  for (size_t i = 0; i < count; ++i) {
    auto& p = r.prompts[i];
    const std::string what = batch ? "prompt[" + std::to_string(i) + "]" : "prompt";
    if (auto e = ReadPrompt(batch ? prompt[i] : prompt, what, limits, r.add_special_tokens, p)) return *e;
    const int64_t room = limits.max_model_len - static_cast<int64_t>(p.ids.size());
    const int64_t wanted = max_tokens ? *max_tokens : max_tokens_null ? room : kDefaultMaxTokens;
    if (wanted > room) {
      // vLLM's words, so clients that parse them to shrink max_tokens keep working.
      return RequestError{400, "'max_tokens' is too large: " + std::to_string(wanted) +
                                   ". This model's maximum context length is " + std::to_string(limits.max_model_len) +
                                   " tokens and your request has " + std::to_string(p.ids.size()) + " input tokens (" +
                                   std::to_string(wanted) + " > " + std::to_string(limits.max_model_len) + " - " +
                                   std::to_string(p.ids.size()) + ")." + (batch ? " (" + what + ")" : ""),
                          "max_tokens"};
    }
    if (min_tokens > wanted) {
      return RequestError{400, "min_tokens must be less than or equal to max_tokens=" + std::to_string(wanted) +
                                   ", got " + std::to_string(min_tokens) + ".", "min_tokens"};
    }
    p.max_tokens = static_cast<int>(wanted);
  }
  r.min_tokens = static_cast<int>(min_tokens);
  if (r.stream && (r.prompts.size() != 1 || r.n != 1)) {
    return RequestError{400, "streaming takes a single prompt and n = 1", "stream"};
  }
  if (!r.hidden_states_name.empty() && (r.prompts.size() != 1 || r.n != 1)) {
    return RequestError{400, "a custom hidden_states_path names one file: a single prompt and n = 1",
                        "kv_transfer_params"};
  }
  return r;
}

}  // namespace hsx
