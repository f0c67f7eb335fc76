// The OpenAI-style HTTP front end of hsx serve, shaped like vLLM's server so existing
// clients work unchanged: /v1/completions and /v1/chat/completions (with vLLM's hidden-state
// extraction through kv_transfer_params, and hsx's one-pass regenerate-and-extract: chat's
// "regenerate"), their /render forms, /v1/models, /health, /metrics,
// /tokenize (a prompt or chat messages), /detokenize.
#pragma once

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capture/capture_sink.h"
#include "capture/writer_pool.h"
#include "server/completion_request.h"
#include "server/choice_text.h"
#include "server/completion_text.h"
#include "engine/engine_replicas.h"
#include "server/save_names.h"
#include "server/render_request.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
struct Request;
struct Response;
}

namespace hsx {

class HttpServer;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;     // empty: no authentication
  std::string model_name;  // what /v1/models lists and requests may name
  int max_model_len = 0;
  // Hidden-state extraction (vLLM's extract_hidden_states with a kv connector): finished
  // requests go to `sink`; off when it is null.
  CaptureSink* sink = nullptr;
  // The file sinks' directory, where clients may name files (allow_custom_path); empty
  // for a store.
  std::string storage_dir;
  int writer_threads = 8;
  bool allow_custom_path = false;
  // Every record's layer contract (safetensors __metadata__).
  std::map<std::string, std::string> capture_metadata;
  // Connections served at once (each holds a thread while open, idle keep-alive ones too).
  int http_threads = 512;
  double header_timeout = 10;  // seconds for a request's line and headers, as a whole
  double read_timeout = 5;     // seconds for each wait for more of a request body
  double body_timeout = 30;    // seconds for a whole request body, from its headers
  // Connections receiving a request body at once (0: a quarter of http_threads); beyond
  // them a body that has not arrived gets 503, so slow uploads cannot hold every thread.
  int max_incoming_bodies = 0;
  // Larger request bodies get 413 (a 4096-token prompt as JSON ids is ~25 KB).
  size_t max_body_bytes = 32u << 20;
  // Choices one request may ask for (n); OpenAI's own cap. Its sequences run as one
  // group that the scheduler shares slots with others.
  int max_n = 128;
};

class OpenAiServer {
 public:
  // `chat_template` null: /v1/chat/completions answers that the model has none, or why
  // its template could not be read (`chat_template_error`).
  OpenAiServer(ServerConfig config, EngineReplicas& engine, const Tokenizer* tokenizer, std::vector<int32_t> eos_token_ids,
               const ChatTemplate* chat_template = nullptr, Status chat_template_error = {});
  ~OpenAiServer();
  // Serves until Stop and every connection has closed; an error if the address cannot
  // be bound.
  Status Run();
  // Begins the drain: new connections are refused, new requests on open ones get 503,
  // requests under way (streaming or not) finish and write their files. Returns at once.
  void Stop();
  // Cuts the drain short: every unfinished request fails, waits on slow clients end.
  // Files are written whole or not at all; Run returns once every handler has answered.
  void StopNow();

 private:
  void Routes();
  struct Written {
    Result<CaptureReceipt> receipt;
    // A failed put's or request's kv_transfer_params (the sink's FailureTransferParams),
    // which its error response carries, so that a reader can wait for the failure marker.
    nlohmann::json failure_params;
  };
  struct Completion {
    Status status;
    std::unique_ptr<Sequence> seq;
    bool server_error = false;  // the request was fine; the server could not store its output
    // Its states' put when extracting; for a request that failed after admission, its
    // failure marker's put.
    std::shared_future<Written> written;
  };
  // name: the record's place in the sink (a file name in storage_dir; empty: the sink's rule).
  // regeneration: a regenerated conversation's (its record carries loss_mask; its failure
  // to regenerate fails the request). choice: a choice with stop strings, whose writer cuts
  // the sequence back to its stop (ChoiceText::Settled) before its states are put.
  Completion Finish(const Status& status, std::unique_ptr<Sequence> seq, const std::string& name, SaveNames::Claim claim,
                    std::shared_ptr<const ConversationRegeneration> regeneration = nullptr,
                    std::shared_ptr<ChoiceText> choice = nullptr);
  nlohmann::json RegenerationResponse(const CompletionRequest& c, const Sequence& seq, const std::string& id,
                                      const nlohmann::json& transfer_params) const;
  nlohmann::json LogprobsJson(const std::vector<int32_t>& generated, const std::vector<Sequence::TokenLogprobs>& logprobs,
                              size_t first, size_t end, int64_t text_offset, bool chat) const;
  void Complete(const CompletionRequest& c, const httplib::Request& req, httplib::Response& res);
  using RenderFunction = std::variant<nlohmann::json, RequestError> (*)(const nlohmann::json&, const nlohmann::ordered_json&,
                                                                         const RenderContext&);
  void Render(httplib::Response& res, const nlohmann::json& body, const std::string& text, RenderFunction render);
  static void Reply(httplib::Response& res, const std::variant<nlohmann::json, RequestError>& result);
  void Stream(Request request, const std::string& name, SaveNames::Claim claim, const CompletionRequest& c,
              const httplib::Request& req, httplib::Response& res);
  Request EngineRequest(const CompletionRequest& c, size_t p, int j, std::string id) const;
  static CompletionText::Options TextOptions(const CompletionRequest& c, const Request& r);
  std::string PromptText(const CompletionRequest::Prompt& prompt) const;
  std::string Metrics() const;

  ServerConfig config_;
  EngineReplicas& engine_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  Status chat_template_error_;
  std::vector<int32_t> eos_token_ids_;
  CompletionLimits limits_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<WriterPool> writers_;
  SaveNames save_names_;  // the storage directory's names in use
  std::atomic<bool> cut_short_{false};
  std::atomic<uint64_t> http_requests_{0}, records_written_{0}, record_errors_{0};
  std::atomic<uint64_t> write_micros_{0};
};

}  // namespace hsx
