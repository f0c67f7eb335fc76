#include "server/openai_server.h"

#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>

#include "capture/file_lock.h"
#include "capture/hidden_states_file.h"
#include "server/http_server.h"
#include "server/peer_socket.h"

namespace hsx {
namespace {

using json = nlohmann::json;

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
void ReplyError(httplib::Response& res, int code, const std::string& message, const std::string& param = "") {
  const char* type = code == 401 ? "authentication_error"
                     : code == 404 ? "not_found_error"
                     : code == 503 ? "server_overloaded"
                     : code >= 500 ? "internal_error"
                                   : "invalid_request_error";
  json body = {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json() : json(param)}, {"code", code}}}};
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void ReplyJson(httplib::Response& res, const json& body) {
  res.status = 200;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A request field that must be a non-negative integer, or the field's default.
std::optional<std::string> NonNegativeInt(const json& body, const char* key, int& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number_integer() || body[key].get<int64_t>() < 0 || body[key].get<int64_t>() > INT32_MAX) {
    return std::string("'") + key + "' must be a non-negative integer";
  }
  out = body[key].get<int>();
  return std::nullopt;
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

OpenAiServer::OpenAiServer(ServerConfig config, EngineService& engine, const Tokenizer* tokenizer,
                           std::vector<int32_t> eos_token_ids)
    : config_(std::move(config)),
      engine_(engine),
      tokenizer_(tokenizer),
      eos_token_ids_(std::move(eos_token_ids)),
      http_(std::make_unique<HttpServer>(static_cast<size_t>(std::max(1, config_.http_threads)))) {
  if (!config_.storage_dir.empty()) writers_ = std::make_unique<WriterPool>(config_.writer_threads, 64);
  Routes();
}

OpenAiServer::~OpenAiServer() { Stop(); }

Status OpenAiServer::Run() {
  if (!http_->Listen(config_.host, config_.port, 1024)) {
    return Error("--host " + config_.host + " --port " + std::to_string(config_.port) + ": cannot listen (address in use?)");
  }
  return {};
}

void OpenAiServer::Stop() {
  http_->stop();
  if (writers_) writers_->Drain();
}

void OpenAiServer::Routes() {
  // Every route checks the bearer token first when one is configured.
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    if (config_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") != "Bearer " + config_.api_key) {
      ReplyError(res, 401, "missing or wrong API key (expected 'Authorization: Bearer <key>')");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });

  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    ReplyJson(res, {{"object", "list"},
                    {"data", {{{"id", config_.model_name}, {"object", "model"}, {"created", Now()}, {"owned_by", "hsx"},
                               {"max_model_len", config_.max_model_len}}}}});
  });

  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Metrics(), "text/plain; version=0.0.4");
  });

  http_->Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (tokenizer_ == nullptr) return ReplyError(res, 400, "this model has no tokenizer.json");
    const json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("prompt") || !body["prompt"].is_string()) {
      return ReplyError(res, 400, "expected a JSON object with a string field 'prompt'", "prompt");
    }
    auto ids = tokenizer_->Encode(body["prompt"].get<std::string>());
    if (!ids.ok()) return ReplyError(res, 400, ids.status().message(), "prompt");
    ReplyJson(res, {{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", config_.max_model_len}});
  });

  http_->Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (tokenizer_ == nullptr) return ReplyError(res, 400, "this model has no tokenizer.json");
    const json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
      return ReplyError(res, 400, "expected a JSON object with a list field 'tokens'", "tokens");
    }
    std::vector<int32_t> ids;
    for (const auto& t : body["tokens"]) {
      if (!t.is_number_integer()) return ReplyError(res, 400, "'tokens' must be a list of integers", "tokens");
      ids.push_back(t.get<int32_t>());
    }
    auto text = tokenizer_->Decode(ids);
    if (!text.ok()) return ReplyError(res, 400, text.status().message(), "tokens");
    ReplyJson(res, {{"prompt", *text}});
  });

  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) return ReplyError(res, 400, "the request body is not valid JSON");
    if (!body.is_object()) return ReplyError(res, 400, "the request body must be a JSON object");
    if (body.contains("model") && (!body["model"].is_string() || body["model"].get<std::string>() != config_.model_name)) {
      return ReplyError(res, 404, "the model '" + body["model"].dump() + "' does not exist; this server has '" +
                                      config_.model_name + "'", "model");
    }
    if (body.contains("stream") && !body["stream"].is_null() && !body["stream"].is_boolean()) {
      return ReplyError(res, 400, "'stream' must be true or false", "stream");
    }
    const bool stream = body.value("stream", false);
    int max_tokens = 16;
    if (auto e = NonNegativeInt(body, "max_tokens", max_tokens)) return ReplyError(res, 400, *e, "max_tokens");
    SamplingParams sampling;
    auto given = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
    if (given("temperature")) {
      if (!body["temperature"].is_number() || body["temperature"].get<double>() < 0) {
        return ReplyError(res, 400, "'temperature' must be a number >= 0", "temperature");
      }
      sampling.temperature = body["temperature"].get<float>();
    }
    if (given("top_p")) {
      if (!body["top_p"].is_number() || !(body["top_p"].get<double>() > 0 && body["top_p"].get<double>() <= 1)) {
        return ReplyError(res, 400, "'top_p' must be a number in (0, 1]", "top_p");
      }
      sampling.top_p = body["top_p"].get<float>();
    }
    if (given("top_k")) {
      if (!body["top_k"].is_number_integer() || body["top_k"].get<int64_t>() < -1) {
        return ReplyError(res, 400, "'top_k' must be an integer >= -1 (-1 or 0: no limit)", "top_k");
      }
      sampling.top_k = static_cast<int>(std::min<int64_t>(body["top_k"].get<int64_t>(), INT32_MAX));
    }
    if (given("seed")) {
      if (!body["seed"].is_number_integer()) return ReplyError(res, 400, "'seed' must be an integer", "seed");
      sampling.seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
    }
    const bool return_token_ids = body.value("return_token_ids", false);

    // prompt: text, token ids, or a list of either.
    if (!body.contains("prompt")) return ReplyError(res, 400, "missing field 'prompt'", "prompt");
    std::vector<std::vector<int32_t>> prompts;
    auto add_prompt = [&](const json& p) -> std::optional<std::string> {
      if (p.is_string()) {
        if (tokenizer_ == nullptr) return "text prompts need a tokenizer.json; send token ids";
        auto ids = tokenizer_->Encode(p.get<std::string>());
        if (!ids.ok()) return ids.status().message();
        prompts.push_back(std::move(ids).value());
        return std::nullopt;
      }
      if (p.is_array()) {
        std::vector<int32_t> ids;
        for (const auto& t : p) {
          if (!t.is_number_integer()) return "token id prompts must be lists of integers";
          const int64_t v = t.get<int64_t>();
          if (v < INT32_MIN || v > INT32_MAX) return "token id " + std::to_string(v) + " is out of range";
          ids.push_back(static_cast<int32_t>(v));
        }
        prompts.push_back(std::move(ids));
        return std::nullopt;
      }
      return "'prompt' must be a string, a list of token ids, or a list of either";
    };
    const json& prompt = body["prompt"];
    const bool batch = prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array());
    if (batch) {
      for (const auto& p : prompt)
        if (auto e = add_prompt(p)) return ReplyError(res, 400, *e, "prompt");
    } else if (auto e = add_prompt(prompt)) {
      return ReplyError(res, 400, *e, "prompt");
    }
    if (stream && prompts.size() != 1) return ReplyError(res, 400, "streaming takes a single prompt", "stream");

    // Where the hidden states go: <storage>/<request id>.safetensors, or a custom path
    // inside the storage directory when the server allows it.
    const bool extract = !config_.storage_dir.empty();
    std::string custom_path;
    bool include_output_tokens = false;
    if (body.contains("kv_transfer_params") && !body["kv_transfer_params"].is_null()) {
      const json& kv = body["kv_transfer_params"];
      if (!kv.is_object()) return ReplyError(res, 400, "'kv_transfer_params' must be an object", "kv_transfer_params");
      if (kv.contains("include_output_tokens") && !kv["include_output_tokens"].is_null()) {
        if (!kv["include_output_tokens"].is_boolean()) {
          return ReplyError(res, 400, "'kv_transfer_params.include_output_tokens' must be true or false",
                            "kv_transfer_params");
        }
        include_output_tokens = kv["include_output_tokens"].get<bool>();
      }
      if (kv.contains("hidden_states_path") && !kv["hidden_states_path"].is_null()) {
        if (!extract || !config_.allow_custom_path) {
          return ReplyError(res, 400, "a custom hidden_states_path needs --allow-custom-save-path", "kv_transfer_params");
        }
        if (!kv["hidden_states_path"].is_string() || prompts.size() != 1) {
          return ReplyError(res, 400, "hidden_states_path must be a string, for a single prompt", "kv_transfer_params");
        }
        namespace fs = std::filesystem;
        const fs::path root = fs::weakly_canonical(config_.storage_dir);
        const fs::path target = fs::weakly_canonical(root / kv["hidden_states_path"].get<std::string>());
        const auto rel = target.lexically_relative(root);
        if (rel.empty() || *rel.begin() == ".." || target.filename().empty()) {
          return ReplyError(res, 400, "hidden_states_path must stay inside the shared storage path",
                            "kv_transfer_params");
        }
        custom_path = target.string();
        std::error_code ec;
        fs::create_directories(target.parent_path(), ec);
      }
    }

    // Submit every prompt; each finishes through its own promise.
    const std::string id = "cmpl-" + std::to_string(Now()) + "-" + std::to_string(next_id_++);
    std::vector<std::future<Completion>> futures;
    auto abort_all = [&] {
      for (size_t i = 0; i < futures.size(); ++i) engine_.Abort(id + "-" + std::to_string(i));
    };
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto promise = std::make_shared<std::promise<Completion>>();
      futures.push_back(promise->get_future());
      Request r;
      r.id = id + "-" + std::to_string(i);
      r.prompt = prompts[i];
      r.max_new_tokens = max_tokens;
      r.capture = extract;
      r.include_output_tokens = include_output_tokens;
      r.sampling = sampling;
      if (!body.value("ignore_eos", false)) r.stop_token_ids = eos_token_ids_;
      const std::string path = !custom_path.empty() ? custom_path : config_.storage_dir + "/" + r.id + ".safetensors";
      if (stream) return Stream(std::move(r), extract ? path : "", return_token_ids, max_tokens, res);
      const bool accepted = engine_.Submit(std::move(r), [this, promise, path = extract ? path : ""](
                                                             const Status& status, std::unique_ptr<Sequence> seq) {
        promise->set_value(Finish(status, std::move(seq), path));
      });
      if (!accepted) {
        futures.pop_back();
        abort_all();  // the prompts already in would answer nobody
        res.set_header("Retry-After", "1");
        return ReplyError(res, 503, "the server is at capacity; retry shortly");
      }
    }

    // Wait without delaying the answer (a result wakes us at once), looking at the
    // client every 50 ms: one that went away cancels its prompts and frees their blocks.
    ClientWatch client(req);
    for (auto& f : futures) {
      while (f.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
        if (client.Gone()) return abort_all();  // nobody is left to read a response
      }
    }

    json choices = json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    std::string first_path;
    for (size_t i = 0; i < futures.size(); ++i) {
      Completion c = futures[i].get();
      if (!c.status.ok()) return ReplyError(res, c.server_error ? 500 : 400, c.status.message(), c.server_error ? "" : "prompt");
      // The answer waits for the file, so a write that fails (a full disk) fails the request.
      if (c.written.valid() && !c.written.get().ok()) return ReplyError(res, 500, c.written.get().message());
      const std::vector<int32_t> out = c.seq->generated();
      json choice = {{"index", i}, {"text", ""}, {"logprobs", nullptr},
                     {"finish_reason", c.seq->num_generated() < max_tokens ? "stop" : "length"}};
      if (tokenizer_ != nullptr) {
        auto text = tokenizer_->Decode(out);
        if (text.ok()) choice["text"] = *text;
      }
      if (return_token_ids) {
        choice["prompt_token_ids"] = c.seq->request().prompt;
        choice["token_ids"] = out;
      }
      if (extract) {
        choice["kv_transfer_params"] = {{"hidden_states_path", c.hidden_states_path}};
        if (first_path.empty()) first_path = c.hidden_states_path;
      }
      prompt_tokens += c.seq->prompt_len();
      completion_tokens += static_cast<int64_t>(out.size());
      choices.push_back(std::move(choice));
    }
    json response = {{"id", id}, {"object", "text_completion"}, {"created", Now()}, {"model", config_.model_name},
                     {"choices", choices},
                     {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                                {"total_tokens", prompt_tokens + completion_tokens}}}};
    if (extract) response["kv_transfer_params"] = {{"hidden_states_path", first_path}};
    ReplyJson(res, response);
  });
}

// A finished request: with extraction on, lock its file (before the response names it)
// and queue the write, which releases the lock when the file is complete.
OpenAiServer::Completion OpenAiServer::Finish(const Status& status, std::unique_ptr<Sequence> seq,
                                              const std::string& path) {
  Completion c{status, std::move(seq), path, false};
  if (!c.status.ok() || path.empty()) return c;
  std::shared_ptr<FileLock> lock;
  if (config_.use_lock) {
    auto acquired = FileLock::Acquire(path + ".lock");
    if (!acquired.ok()) return {acquired.status(), nullptr, "", true};
    lock = std::move(acquired).value();
  }
  std::shared_ptr<Sequence> shared(c.seq.release());
  auto written = std::make_shared<std::promise<Status>>();
  c.written = written->get_future().share();
  writers_->Submit([this, shared, lock, path, written]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    Status status = WriteHiddenStatesTo(path, *shared);
    write_micros_ += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    ++(status.ok() ? files_written_ : file_errors_);
    if (!status.ok()) std::fprintf(stderr, "hsx serve: error: %s\n", status.message().c_str());
    lock.reset();  // the file is complete (or absent): readers may go ahead
    written->set_value(std::move(status));
  });
  c.seq = std::make_unique<Sequence>(*shared);  // the response needs only its tokens
  return c;
}

// stream: true as server-sent events, one chunk per token in OpenAI's completion-chunk
// shape, then a chunk with the finish reason (and kv_transfer_params), then [DONE].
// A client that goes away cancels its request, which frees its KV blocks.
void OpenAiServer::Stream(Request request, const std::string& path, bool return_token_ids, int max_tokens,
                          httplib::Response& res) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> tokens;
    bool finished = false;
    Completion result;
  };
  auto state = std::make_shared<State>();
  const std::string id = request.id;
  request.on_token = [state](int32_t token) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->tokens.push_back(token);
    state->cv.notify_one();
    return false;
  };
  const bool accepted = engine_.Submit(std::move(request), [this, state, path](const Status& status,
                                                                              std::unique_ptr<Sequence> seq) {
    Completion c = Finish(status, std::move(seq), path);
    std::lock_guard<std::mutex> lock(state->mu);
    state->result = std::move(c);
    state->finished = true;
    state->cv.notify_one();
  });
  if (!accepted) {
    res.set_header("Retry-After", "1");
    return ReplyError(res, 503, "the server is at capacity; retry shortly");
  }
  const int64_t created = Now();
  auto sent = std::make_shared<size_t>(0);
  auto text_so_far = std::make_shared<std::string>();
  res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->finished || state->tokens.size() > *sent; });
    auto chunk = [&](json choice) {
      json body = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", config_.model_name},
                   {"choices", json::array({std::move(choice)})}};
      return "data: " + body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
    };
    std::string out;
    if (state->tokens.size() > *sent) {
      std::vector<int32_t> fresh(state->tokens.begin() + static_cast<int64_t>(*sent), state->tokens.end());
      std::string delta;
      if (tokenizer_ != nullptr) {
        auto text = tokenizer_->Decode(state->tokens);  // the text so far, minus what was sent
        if (text.ok() && text->compare(0, text_so_far->size(), *text_so_far) == 0) {
          delta = text->substr(text_so_far->size());
          *text_so_far = *text;
        }
      }
      json choice = {{"index", 0}, {"text", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (return_token_ids) choice["token_ids"] = fresh;
      out += chunk(std::move(choice));
      *sent = state->tokens.size();
    }
    const bool done = state->finished;
    if (done) {
      const Completion& c = state->result;
      const bool write_failed = c.status.ok() && c.written.valid() && !c.written.get().ok();
      if (!c.status.ok() || write_failed) {
        const Status& failure = write_failed ? c.written.get() : c.status;
        const int code = write_failed || c.server_error ? 500 : 400;
        out += "data: " + json{{"error", {{"message", failure.message()}, {"code", code}}}}.dump() + "\n\n";
      } else {
        json last = {{"index", 0}, {"text", ""}, {"logprobs", nullptr},
                     {"finish_reason", c.seq->num_generated() < max_tokens ? "stop" : "length"}};
        if (return_token_ids) last["prompt_token_ids"] = c.seq->request().prompt;
        std::string final_chunk = chunk(std::move(last));
        if (!c.hidden_states_path.empty()) {
          json body = json::parse(final_chunk.substr(6));
          body["kv_transfer_params"] = {{"hidden_states_path", c.hidden_states_path}};
          final_chunk = "data: " + body.dump() + "\n\n";
        }
        out += final_chunk;
      }
      out += "data: [DONE]\n\n";
    }
    lock.unlock();
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      engine_.Abort(id);  // the client is gone: free its blocks
      return false;
    }
    if (done) sink.done();
    return true;
  }, [this, state, id](bool success) {
    std::lock_guard<std::mutex> lock(state->mu);
    if (!success && !state->finished) engine_.Abort(id);
  });
}

std::string OpenAiServer::Metrics() const {
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
  metric("hsx_prompt_tokens_total", "counter", "Prompt tokens accepted", static_cast<double>(s.prompt_tokens));
  metric("hsx_generation_tokens_total", "counter", "Tokens generated", static_cast<double>(s.generation_tokens));
  metric("hsx_computed_tokens_total", "counter", "Tokens run through the model", static_cast<double>(s.tokens_computed));
  metric("hsx_queue_depth", "gauge", "Requests submitted but not yet admitted", static_cast<double>(s.queued));
  metric("hsx_running_requests", "gauge", "Requests admitted and unfinished", static_cast<double>(s.running));
  metric("hsx_batch_tokens", "gauge", "Tokens in the last engine step", static_cast<double>(s.last_batch_tokens));
  metric("hsx_kv_cache_usage_ratio", "gauge", "Fraction of KV blocks held by requests",
         s.total_blocks ? 1.0 - static_cast<double>(s.free_blocks) / s.total_blocks : 0.0);
  metric("hsx_prefix_cache_hit_rate", "gauge", "Prompt tokens served from cached blocks", s.prefix_cache_hit_rate);
  metric("hsx_hidden_state_files_total", "counter", "Hidden-state files written", static_cast<double>(files_written_.load()));
  metric("hsx_hidden_state_file_errors_total", "counter", "Hidden-state files that failed", static_cast<double>(file_errors_.load()));
  metric("hsx_hidden_state_write_seconds_total", "counter", "Time spent writing hidden-state files",
         static_cast<double>(write_micros_.load()) / 1e6);
  return out.str();
}

}  // namespace hsx
