#include "server/openai_server.h"

#include <httplib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string_view>

#include "engine/capture_record.h"
#include "engine/regeneration_request.h"
#include "server/chat_request.h"
#include "server/http_server.h"
#include "server/peer_socket.h"
#include "server/render_request.h"
#include "util/json.h"

namespace hsx {
namespace {

using json = nlohmann::json;

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
// `transfer_params`: a failed request's kv_transfer_params, beside the error (see Written).
void ReplyError(httplib::Response& res, int code, const std::string& message, const std::string& param = "",
                const json& transfer_params = nullptr) {
  const char* type = code == 401 ? "authentication_error"
                     : code == 404 ? "not_found_error"
                     : code == 503 ? "server_overloaded"
                     : code >= 500 ? "internal_error"
                                   : "invalid_request_error";
  json body = {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json() : json(param)}, {"code", code}}}};
  if (!transfer_params.is_null()) body["kv_transfer_params"] = transfer_params;
  res.status = code;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void ReplyJson(httplib::Response& res, const json& body) {
  res.status = 200;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// Characters of valid UTF-8 text (what Python's len counts): its bytes that start one.
int64_t CharCount(std::string_view text) {
  return std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A request id as vLLM makes them: "cmpl-" ("chatcmpl-" for chat) and a random (version 4) UUID's 32 hex digits
// from the OS's random source, so servers, or a restarted server, sharing one storage
// directory never name the same file (ids made of the time and a counter did).
std::string NewRequestId(std::string id) {
  thread_local std::random_device source;  // getrandom(2) or /dev/urandom in libstdc++
  std::array<uint8_t, 16> bytes;
  for (size_t i = 0; i < bytes.size(); i += 4) {
    const uint32_t r = source();
    for (size_t k = 0; k < 4; ++k) bytes[i + k] = static_cast<uint8_t>(r >> (8 * k));
  }
  bytes[6] = static_cast<uint8_t>((bytes[6] & 0x0f) | 0x40);  // version 4
  bytes[8] = static_cast<uint8_t>((bytes[8] & 0x3f) | 0x80);  // RFC 4122 variant
  static constexpr char kHex[] = "0123456789abcdef";
  for (uint8_t b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

// Reads a POST body of at most `max_bytes`, a chunked one too (cpp-httplib's own limit
// covers only Content-Length); false when it is larger.
bool ReadBody(const httplib::ContentReader& content, size_t max_bytes, std::string& body, bool& too_large) {
  too_large = false;
  return content([&](const char* data, size_t n) {
    if (body.size() + n > max_bytes) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
}

// Whether the client of a waiting handler has gone; finds its socket on first use, so
// requests answered quickly never look for it.
class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& req) : req_(req) {}
  bool Gone() {
    if (fd_ == kUnknown) fd_ = FindPeerSocket(req_.local_addr, req_.local_port, req_.remote_addr, req_.remote_port);
    return fd_ >= 0 && PeerHasClosed(fd_);
  }

 private:
  static constexpr int kUnknown = -2;
  const httplib::Request& req_;
  int fd_ = kUnknown;
};

}  // namespace

OpenAiServer::OpenAiServer(ServerConfig config, EngineReplicas& engine, const Tokenizer* tokenizer,
                           std::vector<int32_t> eos_token_ids, const ChatTemplate* chat_template,
                           Status chat_template_error)
    : config_(std::move(config)),
      engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      chat_template_error_(std::move(chat_template_error)),
      eos_token_ids_(std::move(eos_token_ids)),
      http_(std::make_unique<HttpServer>(
          HttpServer::Limits{.threads = static_cast<size_t>(std::max(1, config_.http_threads)),
                             .header_seconds = config_.header_timeout,
                             .read_seconds = config_.read_timeout,
                             .body_seconds = config_.body_timeout,
                             .max_incoming_bodies = static_cast<size_t>(std::max(0, config_.max_incoming_bodies))})) {
  if (config_.sink != nullptr) writers_ = std::make_unique<WriterPool>(config_.writer_threads, 64);
  limits_.model_name = config_.model_name;
  limits_.max_model_len = config_.max_model_len;
  limits_.vocab_size = engine_.model_config().vocab_size;
  limits_.tokenizer = tokenizer_;
  limits_.max_prompt_bytes = tokenizer_ ? MaxPromptBytes(*tokenizer_, config_.max_model_len) : 0;
  limits_.extract = config_.sink != nullptr;
  limits_.allow_custom_path = config_.allow_custom_path && !config_.storage_dir.empty();
  limits_.max_choices = engine_.max_queued();
  limits_.max_n = config_.max_n;
  Routes();
}

OpenAiServer::~OpenAiServer() {
  Stop();
  if (writers_) writers_->Drain();  // the writes of requests whose clients left
}

Status OpenAiServer::Run() {
  if (!http_->Listen(config_.host, config_.port, 1024)) {
    return Error("--host " + config_.host + " --port " + std::to_string(config_.port) + ": cannot listen (address in use?)");
  }
  return {};
}

void OpenAiServer::Stop() { http_->StopAccepting(); }

void OpenAiServer::StopNow() {
  cut_short_ = true;
  engine_.AbortAll();
  http_->Cut();
}

void OpenAiServer::Routes() {
  // Every route checks the bearer token first when one is configured.
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    if (http_->stopping()) {  // draining: only requests already under way are served
      res.set_header("Connection", "close");
      ReplyError(res, 503, "the server is shutting down");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (config_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") != "Bearer " + config_.api_key) {
      ReplyError(res, 401, "missing or wrong API key (expected 'Authorization: Bearer <key>')");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // A handler that throws answers a 500 (without cpp-httplib's EXCEPTION_WHAT header,
  // which would echo paths); the server goes on.
  http_->set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "hsx serve: error: %s %s: %s\n", req.method.c_str(), req.path.c_str(), what.c_str());
    ReplyError(res, 500, "internal error while handling the request (the server log has the cause)");
  });

  // Every POST body: at most --max-body-bytes (413), then JSON nested at most
  // kMaxJsonDepth levels (400), before a handler sees it.
  http_->set_payload_max_length(config_.max_body_bytes);
  // Handlers get the parsed body and its text (chat re-reads it with its keys in order).
  using JsonHandler = std::function<void(const httplib::Request&, httplib::Response&, const json&, const std::string&)>;
  auto post_json = [this](const std::string& pattern, JsonHandler handler) {
    http_->Post(pattern, [this, handler](const httplib::Request& req, httplib::Response& res,
                                         const httplib::ContentReader& content) {
      std::string text;
      bool too_large = false;
      const bool read = ReadBody(content, config_.max_body_bytes, text, too_large);
      if (too_large || res.status == 413) {
        res.set_header("Connection", "close");  // the rest of the body is not read
        return ReplyError(res, 413, "the request body is larger than " + std::to_string(config_.max_body_bytes) +
                                        " bytes (--max-body-bytes)");
      }
      if (!read) {  // 408 past a deadline, 503 when stopping, else 400
        const HttpServer::BodyError why = HttpServer::LastBodyError();
        return ReplyError(res, why.status, why.message);
      }
      auto body = ParseJson(text, "the request body");
      if (!body.ok()) return ReplyError(res, 400, Shortened(body.status().message(), 300));
      handler(req, res, *body, text);
    });
  };

  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });

  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    ReplyJson(res, {{"object", "list"},
                    {"data", {{{"id", config_.model_name}, {"object", "model"}, {"created", Now()}, {"owned_by", "hsx"},
                               {"max_model_len", config_.max_model_len}}}}});
  });

  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Metrics(), "text/plain; version=0.0.4");
  });

  post_json("/tokenize", [this](const httplib::Request&, httplib::Response& res, const json& body, const std::string& text) {
    if (tokenizer_ == nullptr) return ReplyError(res, 400, "this model has no tokenizer.json");
    if (body.is_object() && body.contains("messages")) return Render(res, body, text, TokenizeMessages);
    if (!body.is_object() || !body.contains("prompt") || !body["prompt"].is_string()) {
      return ReplyError(res, 400, "expected a JSON object with a string field 'prompt'", "prompt");
    }
    // vLLM's add_special_tokens: true (the default) adds the tokenizer's BOS/EOS.
    const auto add_special = body.find("add_special_tokens");
    const bool absent = add_special == body.end() || add_special->is_null();
    if (!absent && !add_special->is_boolean()) {
      return ReplyError(res, 400, "'add_special_tokens' must be true or false", "add_special_tokens");
    }
    const std::string& prompt = body["prompt"].get_ref<const std::string&>();
    // As for completions: text that cannot fit max_model_len is not tokenized (it costs memory in proportion).
    if (auto too_long = TextTooLong(prompt.size(), limits_)) return ReplyError(res, 400, "'prompt': " + *too_long, "prompt");
    auto ids = tokenizer_->Encode(prompt, absent || add_special->get<bool>());
    if (!ids.ok()) return ReplyError(res, 400, ids.status().message(), "prompt");
    ReplyJson(res, {{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", config_.max_model_len}});
  });

  post_json("/detokenize", [this](const httplib::Request&, httplib::Response& res, const json& body, const std::string&) {
    if (tokenizer_ == nullptr) return ReplyError(res, 400, "this model has no tokenizer.json");
    if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
      return ReplyError(res, 400, "expected a JSON object with a list field 'tokens'", "tokens");
    }
    if (config_.max_model_len > 0 && body["tokens"].size() > static_cast<size_t>(config_.max_model_len)) {  // no sequence is longer
      return ReplyError(res, 400, "'tokens' has " + std::to_string(body["tokens"].size()) + " ids, more than max_model_len (" +
                                      std::to_string(config_.max_model_len) + ")", "tokens");
    }
    std::vector<int32_t> ids;
    for (const auto& t : body["tokens"]) {
      if (!IsTokenId(t, tokenizer_->vocab_size())) {
        return ReplyError(res, 400, "'tokens': " + Shortened(t.dump()) + " is not a token id in [0, " +
                                        std::to_string(tokenizer_->vocab_size()) + ")", "tokens");
      }
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    auto text = tokenizer_->Decode(ids);
    if (!text.ok()) return ReplyError(res, 400, text.status().message(), "tokens");
    ReplyJson(res, {{"prompt", *text}});
  });

  // vLLM's render endpoints (server/render_request): the token ids a request would run.
  post_json("/v1/chat/completions/render", [this](const httplib::Request&, httplib::Response& res, const json& body,
                                                  const std::string& text) { Render(res, body, text, RenderChatRequest); });
  post_json("/v1/completions/render", [this](const httplib::Request&, httplib::Response& res, const json& body,
                                             const std::string&) {
    Reply(res, RenderCompletionRequest(body, {&limits_, chat_template_, chat_template_error_}));
  });

  post_json("/v1/completions", [this](const httplib::Request& req, httplib::Response& res, const json& body, const std::string&) {
    auto parsed = ParseCompletionRequest(body, limits_);
    if (const auto* e = std::get_if<RequestError>(&parsed)) return ReplyError(res, e->status, e->message, e->param);
    Complete(std::get<CompletionRequest>(parsed), req, res);
  });

  post_json("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res, const json& body,
                                           const std::string& text) {
    auto ordered = ParseOrderedJson(text, "the request body");  // parsed once already: cannot fail
    if (!ordered.ok()) return ReplyError(res, 400, Shortened(ordered.status().message(), 300));
    if (chat_template_ == nullptr && !chat_template_error_.ok()) {
      return ReplyError(res, 400, "this model's chat template cannot be used: " + chat_template_error_.message(), "messages");
    }
    auto parsed = ParseChatRequest(body, *ordered, chat_template_, limits_);
    if (const auto* e = std::get_if<RequestError>(&parsed)) return ReplyError(res, e->status, e->message, e->param);
    Complete(std::get<CompletionRequest>(parsed), req, res);
  });
}

// A render's answer or its error.
void OpenAiServer::Reply(httplib::Response& res, const std::variant<json, RequestError>& result) {
  if (const auto* e = std::get_if<RequestError>(&result)) return ReplyError(res, e->status, e->message, e->param);
  ReplyJson(res, std::get<json>(result));
}

// A chat-shaped render (messages through the template): the body, and its text parsed again
// with its keys in order, as the template sees them.
void OpenAiServer::Render(httplib::Response& res, const json& body, const std::string& text, RenderFunction render) {
  auto ordered = ParseOrderedJson(text, "the request body");  // parsed once already: cannot fail
  if (!ordered.ok()) return ReplyError(res, 400, "the request body is not JSON");
  Reply(res, render(body, *ordered, {&limits_, chat_template_, chat_template_error_}));
}

// A checked request (completions or chat) run to its answer, streamed or whole.
void OpenAiServer::Complete(const CompletionRequest& c, const httplib::Request& req, httplib::Response& res) {
  if (!c.ignored_fields.empty()) {
    std::string names;
    for (const std::string& f : c.ignored_fields) names += (names.empty() ? "" : ", ") + f;
    std::fprintf(stderr, "hsx serve: warning: ignoring unknown request fields: %s\n", Shortened(names, 300).c_str());
  }

  // One engine request per choice, all checked before any is submitted, so a bad one
  // fails the request before anything runs or is written.
  const bool extract = config_.sink != nullptr;
  const std::string id = NewRequestId(c.chat ? "chatcmpl-" : "cmpl-");
  std::vector<Request> requests;
  std::vector<std::string> names;        // each record's place in the sink
  std::vector<SaveNames::Claim> claims;  // each file's name, held until it is written
  for (size_t p = 0; p < c.prompts.size(); ++p) {
    for (int j = 0; j < c.n; ++j) {
      Request r = EngineRequest(c, p, j, id + "-" + std::to_string(requests.size()));
      r.group = id;  // the n choices share the scheduler as one request
      if (c.regeneration) MakeRegenerationRequest(r, c.regeneration, c.prompts[p].max_tokens, config_.max_model_len);
      if (Status s = engine_.Validate(r); !s.ok()) return ReplyError(res, 400, s.message(), "prompt");
      names.push_back(c.hidden_states_name);
      if (extract && !config_.storage_dir.empty()) {
        const std::string name = c.hidden_states_name.empty() ? r.id + ".safetensors" : c.hidden_states_name;
        auto claim = save_names_.ClaimName(config_.storage_dir, name);
        if (const auto* taken = std::get_if<std::string>(&claim)) {
          return ReplyError(res, 409, "'kv_transfer_params.hidden_states_path' " + *taken, "kv_transfer_params");
        }
        claims.push_back(std::get<SaveNames::Claim>(std::move(claim)));
      } else {
        claims.emplace_back();
      }
      requests.push_back(std::move(r));
    }
  }
  if (c.stream) return Stream(std::move(requests[0]), names[0], claims[0], c, req, res);

  // Each choice finishes through its own promise. With stop strings, the engine thread
  // hands each choice's tokens over as they come and this thread decodes them, ending a
  // choice at its stop string (ChoiceText); else its text is built once it is done.
  const bool stop_strings = tokenizer_ != nullptr && !c.stop.empty();
  auto signal = std::make_shared<ChoiceText::Signal>();
  std::vector<std::shared_ptr<ChoiceText>> outputs;  // each choice's
  std::vector<std::future<Completion>> futures;
  std::vector<std::pair<Request, EngineService::Callback>> submits;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto choice = std::make_shared<ChoiceText>(signal, tokenizer_, requests[i].prompt, TextOptions(c, requests[i]));
    if (stop_strings) {
      requests[i].on_token = [weak = std::weak_ptr<ChoiceText>(choice)](int32_t token) {
        if (const std::shared_ptr<ChoiceText> choice = weak.lock()) choice->Push(token);
      };
    }
    auto promise = std::make_shared<std::promise<Completion>>();
    futures.push_back(promise->get_future());
    submits.emplace_back(std::move(requests[i]), [this, promise, signal, name = names[i], claim = claims[i],
                                                  regeneration = c.regeneration,
                                                  settle = stop_strings ? choice : nullptr](const Status& status,
                                                                                            std::unique_ptr<Sequence> seq) {
      promise->set_value(Finish(status, std::move(seq), name, claim, regeneration, settle));
      signal->Notify();
    });
    outputs.push_back(std::move(choice));
  }
  if (!engine_.SubmitAll(std::move(submits))) {
    res.set_header("Retry-After", "1");
    return ReplyError(res, 503, "the server is at capacity; retry shortly");
  }
  auto abort_all = [&] {
    for (size_t i = 0; i < futures.size(); ++i) engine_.Abort(id + "-" + std::to_string(i));
  };

  // Wait without delaying the answer (a result or a token wakes us at once), decoding the
  // tokens that came and finishing each choice whose stop string they complete, and
  // looking at the client every 50 ms: one that went away cancels its prompts and frees
  // their blocks.
  ClientWatch client(req);
  auto look = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  for (;;) {
    std::vector<std::pair<size_t, int>> stops;  // choice, tokens it keeps
    bool all_done = true;
    {
      std::unique_lock<std::mutex> lock(signal->mu);
      for (size_t i = 0; i < outputs.size(); ++i) {
        if (auto n = outputs[i]->Decode()) stops.emplace_back(i, *n);
        all_done = all_done && futures[i].wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      }
      if (all_done) break;
      if (stops.empty()) signal->cv.wait_until(lock, look);
    }
    for (const auto& [i, n] : stops) engine_.FinishAt(id + "-" + std::to_string(i), n);
    if (std::chrono::steady_clock::now() >= look) {
      if (client.Gone()) return abort_all();  // nobody is left to read a response
      look = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    }
  }

  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const auto& p : c.prompts) prompt_tokens += static_cast<int64_t>(p.ids.size());
  json first_transfer;
  for (size_t i = 0; i < futures.size(); ++i) {
    Completion r = futures[i].get();
    // A failed request's answer waits for its failure marker, and carries what a reader
    // waits for it with.
    const json failure_params = r.written.valid() ? r.written.get().failure_params : json();
    if (!r.status.ok()) {
      std::string message = r.status.message();
      if (r.written.valid() && !r.written.get().receipt.ok()) message += "; " + r.written.get().receipt.status().message();
      return ReplyError(res, r.server_error ? 500 : 400, message,
                        r.server_error ? "" : c.regeneration ? "messages" : "prompt", failure_params);
    }
    // The answer waits for the states' put, so one that fails (a full disk) fails the request.
    if (r.written.valid() && !r.written.get().receipt.ok()) {
      return ReplyError(res, 500, r.written.get().receipt.status().message(), "", failure_params);
    }
    if (c.regeneration) {
      if (c.regeneration->generated_spans().empty()) return ReplyError(res, 500, "the conversation ended before its first answer");
      return ReplyJson(res, RegenerationResponse(c, *r.seq, id, r.written.get().receipt->transfer_params));
    }
    std::string text;
    {  // its tokens up to its stop string (the engine may have run on), and their text
      std::lock_guard<std::mutex> lock(signal->mu);
      outputs[i]->Settle(*r.seq);
      outputs[i]->text().Finish();
      text = outputs[i]->text().text();
    }
    const std::vector<int32_t> out = r.seq->generated();
    const auto& prompt = c.prompts[i / static_cast<size_t>(c.n)];
    json choice = {{"index", i}, {"text", (c.echo ? PromptText(prompt) : "") + text},
                   {"logprobs", c.sampling.logprobs >= 0
                                    ? LogprobsJson(out, r.seq->logprobs, 0, out.size(), 0, c.chat) : json()},
                   {"finish_reason", r.seq->stopped() ? "stop" : "length"}};
    if (c.chat) choice["message"] = {{"role", "assistant"}, {"content", choice["text"]}}, choice.erase("text");
    // vLLM's places: a completion choice carries its prompt's ids, a chat response (one
    // prompt) carries them at the top level.
    if (c.return_token_ids) {
      if (!c.chat) choice["prompt_token_ids"] = prompt.ids;
      choice["token_ids"] = out;
    }
    if (r.written.valid()) {
      choice["kv_transfer_params"] = r.written.get().receipt->transfer_params;
      if (first_transfer.is_null()) first_transfer = choice["kv_transfer_params"];
    }
    completion_tokens += static_cast<int64_t>(out.size());
    choices.push_back(std::move(choice));
  }
  json response = {{"id", id}, {"object", c.chat ? "chat.completion" : "text_completion"}, {"created", Now()}, {"model", config_.model_name},
                   {"choices", choices},
                   {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                              {"total_tokens", prompt_tokens + completion_tokens}}}};
  if (extract) response["kv_transfer_params"] = first_transfer;
  if (c.chat && c.return_token_ids) response["prompt_token_ids"] = c.prompts[0].ids;
  ReplyJson(res, response);
}

// A regenerated conversation's answer: vLLM's chat shape for its last answer (its prompt
// is everything before it: top-level prompt_token_ids, the choice's token_ids, with
// return_token_ids), and "regeneration" for the whole conversation: its messages through
// the last regenerated answer, each with the target's text, and each answer's message
// index, finish reason (and token ids). Usage counts the conversation: the template's
// tokens as prompt, every answer's as completion.
nlohmann::json OpenAiServer::RegenerationResponse(const CompletionRequest& c, const Sequence& seq, const std::string& id,
                                                  const json& transfer_params) const {
  const ConversationRegeneration& regeneration = *c.regeneration;
  const std::vector<std::pair<int, int>>& spans = regeneration.generated_spans();  // the first answer always ends
  const std::vector<size_t> turns = regeneration.answered_turns();
  const std::vector<int32_t>& tokens = seq.tokens();
  const std::vector<int32_t>& stops = seq.request().stop_token_ids;
  auto ids = [&](int begin, int end) { return std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + end); };
  auto finish_reason = [&](std::pair<int, int> span) {
    const bool stopped = span.second > span.first &&
                         std::find(stops.begin(), stops.end(), tokens[static_cast<size_t>(span.second - 1)]) != stops.end();
    return stopped ? "stop" : "length";
  };
  json messages = json::array();
  for (size_t i = 0; i <= turns.back(); ++i) messages.push_back(json(regeneration.messages()[i]));
  json answers = json::array();
  int64_t generated = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    json answer = {{"message_index", turns[k]}, {"finish_reason", finish_reason(spans[k])}};
    if (c.return_token_ids) answer["token_ids"] = ids(spans[k].first, spans[k].second);
    answers.push_back(std::move(answer));
    generated += spans[k].second - spans[k].first;
  }
  const auto [begin, end] = spans.back();
  const std::vector<int32_t> last = ids(begin, end);
  json logprobs;
  if (c.sampling.logprobs >= 0) {  // the last answer's: the last of every answer's logprobs
    const size_t first = seq.logprobs.size() - std::min(seq.logprobs.size(), last.size());
    const std::vector<Sequence::TokenLogprobs> own(seq.logprobs.begin() + static_cast<std::ptrdiff_t>(first), seq.logprobs.end());
    logprobs = LogprobsJson(last, own, 0, last.size(), 0, /*chat=*/true);
  }
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", messages.back().value("content", json(""))}}},
                 {"logprobs", logprobs},
                 {"finish_reason", finish_reason(spans.back())}};
  if (c.return_token_ids) choice["token_ids"] = last;
  choice["kv_transfer_params"] = transfer_params;
  const int64_t total = seq.num_tokens();
  json response = {{"id", id}, {"object", "chat.completion"}, {"created", Now()}, {"model", config_.model_name},
                   {"choices", json::array({std::move(choice)})},
                   {"usage", {{"prompt_tokens", total - generated}, {"completion_tokens", generated}, {"total_tokens", total}}},
                   {"kv_transfer_params", transfer_params},
                   {"regeneration", {{"messages", std::move(messages)}, {"answers", std::move(answers)}}}};
  if (c.return_token_ids) {
    response["prompt_token_ids"] = ids(0, begin);
    response["regeneration"]["token_ids"] = tokens;
  }
  return response;
}

// Choice j of prompt p as an engine request. With a seed, choice j samples with seed + j
// (as vLLM's parallel sampling does), so the n choices differ yet reproduce.
Request OpenAiServer::EngineRequest(const CompletionRequest& c, size_t p, int j, std::string id) const {
  Request r;
  r.id = std::move(id);
  r.prompt = c.prompts[p].ids;
  r.max_new_tokens = c.prompts[p].max_tokens;
  r.min_new_tokens = c.min_tokens;
  r.capture = config_.sink != nullptr;
  r.include_output_tokens = c.include_output_tokens;
  r.sampling = c.sampling;
  if (r.sampling.seed) r.sampling.seed = *r.sampling.seed + static_cast<uint64_t>(j);
  if (!c.ignore_eos) r.stop_token_ids = eos_token_ids_;
  r.stop_token_ids.insert(r.stop_token_ids.end(), c.stop_token_ids.begin(), c.stop_token_ids.end());
  return r;
}

CompletionText::Options OpenAiServer::TextOptions(const CompletionRequest& c, const Request& r) {
  return {c.stop, c.include_stop_str_in_output, c.min_tokens, r.stop_token_ids, c.skip_special_tokens};
}

// What echo prepends: the prompt as sent, or its token ids decoded.
std::string OpenAiServer::PromptText(const CompletionRequest::Prompt& prompt) const {
  if (prompt.is_text || tokenizer_ == nullptr) return prompt.text;
  auto text = tokenizer_->Decode(prompt.ids);
  return text.ok() ? *text : "";
}

// OpenAI's completion logprobs for tokens [first, end): per token its text, its raw
// logprob, the top ones (with the drawn token, as vLLM returns them) and its offset in the
// choice's text, counted in characters as vLLM counts them: `text_offset` for the first,
// then each token's text after the one before (a stream starts each chunk at the
// characters it has sent). Token texts are decoded one token at a time; without a
// tokenizer they read "token_id:<id>", as vLLM's return_tokens_as_token_ids writes them.
// Chat's shape instead (`chat`): {"content": [{"token", "logprob", "bytes", "top_logprobs":
// [{"token", "logprob", "bytes"}]}]}, the token's UTF-8 bytes as numbers.
nlohmann::json OpenAiServer::LogprobsJson(const std::vector<int32_t>& generated,
                                          const std::vector<Sequence::TokenLogprobs>& logprobs, size_t first,
                                          size_t end, int64_t text_offset, bool chat) const {
  auto text_of = [&](int32_t id) {
    if (tokenizer_ != nullptr) {
      if (auto text = tokenizer_->Decode({id}); text.ok()) return *text;
    }
    return "token_id:" + std::to_string(id);
  };
  if (chat) {
    auto entry = [&](int32_t id, float logprob) {
      const std::string text = text_of(id);
      return json{{"token", text}, {"logprob", logprob}, {"bytes", std::vector<uint8_t>(text.begin(), text.end())}};
    };
    json content = json::array();
    for (size_t i = first; i < end && i < generated.size() && i < logprobs.size(); ++i) {
      json token = entry(generated[i], logprobs[i].logprob);
      token["top_logprobs"] = json::array();
      for (const auto& [id, lp] : logprobs[i].top) token["top_logprobs"].push_back(entry(id, lp));
      content.push_back(std::move(token));
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (size_t i = first; i < end && i < generated.size() && i < logprobs.size(); ++i) {
    const std::string text = text_of(generated[i]);
    tokens.push_back(text);
    token_logprobs.push_back(logprobs[i].logprob);
    json entries = json::object();
    for (const auto& [id, lp] : logprobs[i].top) entries[text_of(id)] = lp;
    entries[text] = logprobs[i].logprob;
    top.push_back(std::move(entries));
    offsets.push_back(text_offset);
    text_offset += CharCount(text);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

// A finished request: with extraction on, queue the put of its states (the sink owns its
// protocol: a file and its lock, a store), which the response waits for. A request that
// failed after admission is reported to the sink, whose readers may be waiting for it.
OpenAiServer::Completion OpenAiServer::Finish(const Status& status, std::unique_ptr<Sequence> seq,
                                              const std::string& name, SaveNames::Claim claim,
                                              std::shared_ptr<const ConversationRegeneration> regeneration,
                                              std::shared_ptr<ChoiceText> choice) {
  Completion c{status, std::move(seq), !status.ok() && cut_short_};  // failed by StopNow: not the client's fault
  // A turn the template could not continue in one sequence ended it early: it fails, no file.
  if (c.status.ok() && regeneration && !regeneration->error().ok()) c.status = regeneration->error();
  if (config_.sink == nullptr || c.seq == nullptr) return c;
  std::shared_ptr<const Sequence> shared(c.seq.release());
  auto written = std::make_shared<std::promise<Written>>();
  if (!c.status.ok()) {
    // A cancelled request's client is gone: nobody waits for its states.
    if (!shared->aborted) {
      c.written = written->get_future().share();
      writers_->Submit([this, shared, name, written, why = c.status] {
        const CaptureRecord record = CaptureRecordOf(*shared, name, config_.capture_metadata);
        Status marker = config_.sink->PutFailure(record, why);
        written->set_value({marker.ok() ? Result<CaptureReceipt>(CaptureReceipt{}) : Result<CaptureReceipt>(marker),
                            config_.sink->FailureTransferParams(record)});
      });
    }
    c.seq = std::make_unique<Sequence>(*shared);
    return c;
  }
  c.written = written->get_future().share();
  writers_->Submit([this, shared, name, written, claim, regeneration, choice]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    // Its stop string may have been found after the engine ran on: the rows up to it.
    const std::shared_ptr<const Sequence> kept = choice ? choice->Settled(shared) : shared;
    CaptureRecord record = CaptureRecordOf(*kept, name, config_.capture_metadata);
    if (regeneration) {  // 1 on the answers the target generated, as extract --regenerate's files
      record.extras.emplace_back("loss_mask", RegenerationLossMask(*regeneration, static_cast<int64_t>(record.token_ids.size())));
    }
    Written w{config_.sink->Put(record), nullptr};
    write_micros_ += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    ++(w.receipt.ok() ? records_written_ : record_errors_);
    if (!w.receipt.ok()) {
      std::fprintf(stderr, "hsx serve: error: %s\n", w.receipt.status().message().c_str());
      w.failure_params = config_.sink->FailureTransferParams(record);
    }
    claim.reset();  // the name is now the file's on disk, or free
    written->set_value(std::move(w));
  });
  c.seq = std::make_unique<Sequence>(*shared);  // the response needs only its tokens
  return c;
}

// stream: true as server-sent events, one chunk per token in OpenAI's completion-chunk
// shape (text held back while it could still become a stop string; with logprobs, the
// logprobs of the chunk's tokens, as vLLM sends them), then a chunk with the finish
// reason (and kv_transfer_params), the usage chunk when asked for, then [DONE]. A client
// that goes away cancels its request, which frees its KV blocks: a write fails, or,
// while there is nothing to write (a long prefill, tokens held for their logprobs), the
// watch on its socket says so. `req` outlives the content provider (cpp-httplib writes
// the response before its process_request returns).
void OpenAiServer::Stream(Request request, const std::string& name, SaveNames::Claim claim, const CompletionRequest& c,
                          const httplib::Request& req, httplib::Response& res) {
  // The choice (its tokens as the engine thread hands them over, its text) and the stream's
  // progress, under the choice's signal's lock.
  struct State {
    std::shared_ptr<ChoiceText::Signal> signal = std::make_shared<ChoiceText::Signal>();
    std::shared_ptr<ChoiceText> choice;
    // Its tokens' logprobs, when asked for. The engine's on_token passes only the token, so
    // these come with the finished sequence and a stream with logprobs holds its tokens
    // (and their text) until then.
    std::vector<Sequence::TokenLogprobs> logprobs;
    bool finished = false;
    bool settled = false;  // the finished sequence is cut back to its stop string
    Completion result;
    size_t sent_tokens = 0, sent_text = 0;
    int64_t sent_chars = 0;  // characters of sent_text, where the next chunk's text_offset starts
    bool echoed = false;
    std::chrono::steady_clock::time_point look = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  };
  auto state = std::make_shared<State>();
  state->choice = std::make_shared<ChoiceText>(state->signal, tokenizer_, request.prompt, TextOptions(c, request));
  const std::string id = request.id;
  // The engine thread only hands the token over; this stream's thread decodes it (with
  // logprobs too, while its tokens are held), and ends the request at a stop string. A
  // weak reference: once the stream is gone, nothing keeps what is pushed.
  request.on_token = [weak = std::weak_ptr<ChoiceText>(state->choice)](int32_t token) {
    if (const std::shared_ptr<ChoiceText> choice = weak.lock()) choice->Push(token);
  };
  const bool stop_strings = tokenizer_ != nullptr && !c.stop.empty();
  const bool accepted = engine_.Submit(
      std::move(request), [this, state, name, claim, settle = stop_strings ? state->choice : nullptr](
                              const Status& status, std::unique_ptr<Sequence> seq) {
        Completion done = Finish(status, std::move(seq), name, claim, nullptr, settle);
        {
          std::lock_guard<std::mutex> lock(state->signal->mu);
          state->result = std::move(done);
          state->finished = true;
        }
        state->signal->cv.notify_all();
      });
  if (!accepted) {
    res.set_header("Retry-After", "1");
    return ReplyError(res, 503, "the server is at capacity; retry shortly");
  }
  const int64_t created = Now();
  const std::string echo = c.echo ? PromptText(c.prompts[0]) : "";
  const bool return_token_ids = c.return_token_ids, include_usage = c.include_usage;
  const bool logprobs = c.sampling.logprobs >= 0;
  const bool chat = c.chat;
  const int64_t prompt_tokens = static_cast<int64_t>(c.prompts[0].ids.size());
  const std::vector<int32_t> prompt_ids = return_token_ids ? c.prompts[0].ids : std::vector<int32_t>();
  auto client = std::make_shared<ClientWatch>(req);
  res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
    try {
      std::unique_lock<std::mutex> lock(state->signal->mu);
      ChoiceText& own = *state->choice;
      // Tokens go out once their logprobs (when asked for) are known, and their text with
      // them; none past a stop string's token, which the engine may have run beyond.
      auto sendable = [&] { return logprobs ? std::min(own.kept(), state->logprobs.size()) : own.kept(); };
      // Wakes for each token to decode, so the client is looked at every 50 ms by the clock.
      for (;;) {
        const bool woke = state->signal->cv.wait_until(lock, state->look, [&] {
          return state->finished || own.undecoded() || sendable() > state->sent_tokens;
        });
        if (std::chrono::steady_clock::now() >= state->look) {
          state->look = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
          lock.unlock();  // finding the socket reads /proc: never with the engine thread waiting
          const bool gone = client->Gone();
          lock.lock();
          if (gone) {
            engine_.Abort(id);
            return false;
          }
        }
        if (woke) break;
      }
      const std::optional<int> stop_at = own.Decode();
      if (stop_at && !state->finished) {  // the engine ends it there; its result wakes us
        lock.unlock();
        engine_.FinishAt(id, *stop_at);
        lock.lock();
      }
      if (state->finished && state->result.written.valid()) {
        // Its put settles the sequence under this lock (ChoiceText::Settled): wait without it.
        const std::shared_future<Written> written = state->result.written;
        lock.unlock();
        written.wait();
        lock.lock();
      }
      auto chunk = [&](json choices, json usage = nullptr) {
        json body = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                     {"model", config_.model_name},
                     {"choices", std::move(choices)}};
        if (!usage.is_null()) body["usage"] = std::move(usage);
        return "data: " + body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
      };
      const bool done = state->finished;
      const Completion& result = state->result;
      const bool write_failed = done && result.status.ok() && result.written.valid() && !result.written.get().receipt.ok();
      const bool failed = done && (!result.status.ok() || write_failed);
      if (done && !failed && !state->settled) {  // the tokens up to its stop string, and their logprobs
        own.Settle(*state->result.seq);
        state->logprobs = state->result.seq->logprobs;
        own.text().Finish();
        state->settled = true;
      }
      const std::vector<int32_t>& tokens = own.tokens();
      const size_t ready_tokens = sendable();
      const bool held = ready_tokens < own.kept();
      std::string out;
      const std::string& text = own.text().text();
      const size_t ready = failed || held ? state->sent_text : own.text().ready();
      // A chat stream's first chunk names the role, even before any text.
      if (ready_tokens > state->sent_tokens || ready > state->sent_text || ((chat || !echo.empty()) && !state->echoed)) {
        const std::string delta = (state->echoed ? "" : echo) + text.substr(state->sent_text, ready - state->sent_text);
        json choice = {{"index", 0}, {"text", delta},
                       {"logprobs", logprobs ? LogprobsJson(tokens, state->logprobs, state->sent_tokens,
                                                            ready_tokens, state->sent_chars, chat)
                                             : json()},
                       {"finish_reason", nullptr}};
        if (chat) {
          choice["delta"] = state->echoed ? json{{"content", delta}} : json{{"role", "assistant"}, {"content", delta}};
          choice.erase("text");
        }
        // vLLM sends the prompt's ids once, with the first chunk: at a chat chunk's top
        // level, in a completion chunk's choice.
        const bool first = !state->echoed;
        if (return_token_ids) {
          choice["token_ids"] = std::vector<int32_t>(tokens.begin() + static_cast<int64_t>(state->sent_tokens),
                                                     tokens.begin() + static_cast<int64_t>(ready_tokens));
          if (first && !chat) choice["prompt_token_ids"] = prompt_ids;
        }
        std::string text_chunk = chunk(json::array({std::move(choice)}));
        if (first && chat && return_token_ids) {
          json body = json::parse(text_chunk.substr(6));
          body["prompt_token_ids"] = prompt_ids;
          text_chunk = "data: " + body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        }
        out += text_chunk;
        state->sent_tokens = ready_tokens;
        state->sent_text = ready;
        state->sent_chars += CharCount(delta);
        state->echoed = true;
      }
      if (failed) {
        std::string message = write_failed ? result.written.get().receipt.status().message() : result.status.message();
        if (!write_failed && result.written.valid() && !result.written.get().receipt.ok()) {
          message += "; " + result.written.get().receipt.status().message();  // its failure marker's put failed too
        }
        const int code = write_failed || result.server_error ? 500 : 400;
        json event = {{"error", {{"message", message}, {"code", code}}}};
        if (result.written.valid() && !result.written.get().failure_params.is_null()) {
          event["kv_transfer_params"] = result.written.get().failure_params;
        }
        out += "data: " + event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
      } else if (done) {
        json last = {{"index", 0}, {"text", ""}, {"logprobs", nullptr},
                     {"finish_reason", result.seq->stopped() ? "stop" : "length"}};
        if (chat) last["delta"] = json::object(), last.erase("text");
        json body = json::parse(chunk(json::array({std::move(last)})).substr(6));
        if (result.written.valid()) body["kv_transfer_params"] = result.written.get().receipt->transfer_params;
        out += "data: " + body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        if (include_usage) {
          const int64_t generated = result.seq->num_generated();
          out += chunk(json::array(), {{"prompt_tokens", prompt_tokens}, {"completion_tokens", generated},
                                       {"total_tokens", prompt_tokens + generated}});
        }
      }
      if (done) out += "data: [DONE]\n\n";
      lock.unlock();
      if (!out.empty() && !sink.write(out.data(), out.size())) {
        engine_.Abort(id);  // the client is gone: free its blocks
        return false;
      }
      if (done) sink.done();
      return true;
    } catch (const std::exception& e) {  // never let a stream take the server down
      std::fprintf(stderr, "hsx serve: error: stream %s: %s\n", id.c_str(), e.what());
      engine_.Abort(id);
      return false;
    }
  }, [this, state, id](bool success) {
    std::lock_guard<std::mutex> lock(state->signal->mu);
    if (!success && !state->finished) engine_.Abort(id);
  });
}

std::string OpenAiServer::Metrics() const {
  const std::vector<EngineService::Stats> replicas = engine_.replica_stats();
  const EngineService::Stats s = engine_.stats();
  std::ostringstream out;
  auto metric = [&](const char* name, const char* type, const char* help, double value, const char* labels = "") {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
        << name << labels << " " << value << "\n";
  };
  metric("hsx_http_requests_total", "counter", "HTTP requests received", static_cast<double>(http_requests_.load()));
  out << "# HELP hsx_requests_total Generation requests that ended, by outcome\n# TYPE hsx_requests_total counter\n"
      << "hsx_requests_total{status=\"finished\"} " << s.requests_finished << "\n"
      << "hsx_requests_total{status=\"failed\"} " << s.requests_failed << "\n";
  out << "# HELP hsx_replica_requests_total Generation requests that ended, by data-parallel replica\n"
      << "# TYPE hsx_replica_requests_total counter\n";
  for (size_t r = 0; r < replicas.size(); ++r) {
    out << "hsx_replica_requests_total{replica=\"" << r << "\"} "
        << replicas[r].requests_finished + replicas[r].requests_failed << "\n";
  }
  metric("hsx_prompt_tokens_total", "counter", "Prompt tokens accepted", static_cast<double>(s.prompt_tokens));
  metric("hsx_generation_tokens_total", "counter", "Tokens generated", static_cast<double>(s.generation_tokens));
  metric("hsx_computed_tokens_total", "counter", "Tokens run through the model", static_cast<double>(s.tokens_computed));
  metric("hsx_queue_depth", "gauge", "Requests submitted but not yet admitted", static_cast<double>(s.queued));
  metric("hsx_running_requests", "gauge", "Requests admitted and unfinished", static_cast<double>(s.running));
  metric("hsx_batch_tokens", "gauge", "Tokens in the last engine step", static_cast<double>(s.last_batch_tokens));
  metric("hsx_kv_cache_usage_ratio", "gauge", "Fraction of KV blocks held by requests",
         s.total_blocks ? 1.0 - static_cast<double>(s.free_blocks) / s.total_blocks : 0.0);
  metric("hsx_prefix_cache_hit_rate", "gauge", "Prompt tokens served from cached blocks", s.prefix_cache_hit_rate);
  // Speculative decoding under vLLM's names.
  const EngineStats& e = s.engine;
  metric("vllm:spec_decode_num_drafts_total", "counter", "Verifications of at least one draft token",
         static_cast<double>(e.num_drafts));
  metric("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified",
         static_cast<double>(e.num_draft_tokens));
  metric("vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted",
         static_cast<double>(e.num_accepted_tokens));
  out << "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Draft tokens accepted, by position\n"
      << "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (size_t i = 0; i < e.num_accepted_tokens_per_pos.size(); ++i) {
    out << "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"" << i << "\"} "
        << e.num_accepted_tokens_per_pos[i] << "\n";
  }
  metric("hsx_hidden_state_files_total", "counter", "Requests' hidden states stored (files, or store objects)", static_cast<double>(records_written_.load()));
  metric("hsx_hidden_state_file_errors_total", "counter", "Requests' hidden states that failed to store", static_cast<double>(record_errors_.load()));
  metric("hsx_hidden_state_write_seconds_total", "counter", "Time spent writing hidden-state files",
         static_cast<double>(write_micros_.load()) / 1e6);
  return out.str();
}

}  // namespace hsx
