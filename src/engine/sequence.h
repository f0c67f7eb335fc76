// One request's life in the engine: its tokens, how many have KV in the cache, the
// cache blocks it holds and the hidden-state rows captured so far.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/draft_length.h"
#include "engine/sampler.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace hsx {

class Sequence;

struct Request {
  std::string id;
  std::vector<int32_t> prompt;
  int max_new_tokens = 0;  // 0: prefill only (extraction)
  bool capture = true;     // keep hidden states of the prompt's tokens
  // Also keep the rows of generated tokens fed back through the model: all tokens but
  // the last, which never runs (vLLM's kv_transfer_params include_output_tokens).
  bool include_output_tokens = false;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these
  int min_new_tokens = 0;  // stop tokens are not sampled before this many new tokens
  SamplingParams sampling;
  // Called on the engine's thread with each generated token, to hand it over (streaming;
  // the server's stop strings, which it matches on its own threads and ends the request
  // with Engine::FinishAt): keep it cheap, the engine thread waits for it.
  std::function<void(int32_t)> on_token;
  // The client request this is one choice of (a completion's n choices share one); the
  // scheduler shares sequence slots between groups, so one large request cannot starve
  // the others. Empty: a group of its own.
  std::string group;
  // Several turns in one sequence (one-pass regenerate-and-extract): when a turn's
  // generation ends (a stop token or string, or its max_new_tokens), next_turn is asked on
  // the engine thread for the known tokens that follow (the end of the turn, the next
  // message, the generation prompt) and how many to generate after them. The sequence goes
  // on where it is, nothing run twice; nullopt ends it as usual.
  struct Turn {
    std::vector<int32_t> known;
    int max_new_tokens = 0;  // 0: a last turn of known tokens only, each of which runs (the last too)
  };
  std::function<std::optional<Turn>(const Sequence&)> next_turn;
};

class Sequence {
 public:
  explicit Sequence(Request request)
      : request_(std::move(request)),
        tokens_(request_.prompt),
        turn_start_(static_cast<int>(request_.prompt.size())),
        turn_max_new_tokens_(request_.max_new_tokens),
        seed_(request_.sampling.seed ? *request_.sampling.seed : RandomSeed()) {}

  const std::string& id() const { return request_.id; }
  const std::string& group() const { return request_.group.empty() ? request_.id : request_.group; }
  const Request& request() const { return request_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int num_tokens() const { return static_cast<int>(tokens_.size()); }
  int prompt_len() const { return static_cast<int>(request_.prompt.size()); }
  int num_generated() const { return num_tokens() - prompt_len(); }
  std::vector<int32_t> generated() const { return {tokens_.begin() + prompt_len(), tokens_.end()}; }

  // Tokens whose KV is in the cache; the rest are computed by coming steps.
  int num_computed = 0;
  // Speculative decoding: tokens proposed after the known ones, fed (and verified) with
  // the next step; cleared once verified or when the sequence is preempted.
  std::vector<int32_t> drafts;
  // Tree drafts: drafts[i]'s parent (an index into drafts, -1: the last known token),
  // parents first; empty: the drafts are a chain.
  std::vector<int32_t> draft_parents;
  // Keeps the first n drafts (a tree's first n nodes are a tree: parents come first).
  void KeepDrafts(size_t n) {
    if (drafts.size() > n) drafts.resize(n);
    if (draft_parents.size() > n) draft_parents.resize(n);
  }
  DraftHistory draft_history;  // its drafts' acceptance, for adaptive draft lengths (the drafter's)
  // The token a step feeds at position p: a known one, or a draft past them.
  int32_t token_at(int p) const { return p < num_tokens() ? tokens_[p] : drafts[p - num_tokens()]; }
  int num_scheduled_tokens() const { return num_tokens() + static_cast<int>(drafts.size()); }
  std::vector<int32_t> block_table;
  // Prefix caching: chained hashes of the leading full prompt blocks registered so far,
  // and how many leading tokens came from cached blocks at the last admission (their
  // captured rows are still to be copied in by the engine).
  std::vector<uint64_t> block_hashes;
  int num_cached_tokens = 0;
  int preemptions = 0;  // times its blocks were taken back for a later recompute
  // Host [rows, L, H] in the output dtype, filled by position as steps run: room for
  // max_capture_rows() while running, trimmed to num_capture_rows() once finished.
  Tensor hidden_states;
  int64_t max_capture_rows() const {
    return prompt_len() + (request_.include_output_tokens ? std::max<int64_t>(0, request_.max_new_tokens - 1) : 0);
  }
  int num_capture_rows() const {
    if (all_known_run_) return num_tokens();
    return request_.include_output_tokens ? std::max(prompt_len(), num_tokens() - 1) : prompt_len();
  }

  // The current turn (Request::next_turn; a single-turn request has one): where its
  // generated tokens begin and how many it has.
  int turn_start() const { return turn_start_; }
  int turn_generated() const { return num_tokens() - turn_start_; }
  int turn_max_new_tokens() const { return turn_max_new_tokens_; }
  bool wants_more_tokens() const { return !stopped_ && turn_generated() < turn_max_new_tokens_; }
  // Tokens that have run before the sequence may end: the prompt's, or after a last turn
  // of known tokens only, every token.
  int must_compute() const { return all_known_run_ ? num_tokens() : prompt_len(); }
  // Appends a finished turn's known continuation and starts the next turn.
  void BeginTurn(const Request::Turn& turn) {
    tokens_.insert(tokens_.end(), turn.known.begin(), turn.known.end());
    turn_start_ = num_tokens();
    turn_max_new_tokens_ = turn.max_new_tokens;
    all_known_run_ = turn.max_new_tokens == 0;
    stopped_ = false;
  }
  void Append(int32_t token) { tokens_.push_back(token); }
  void Stop() { stopped_ = true; }
  // Keeps only the first n generated tokens (n at most num_generated()) and their logprobs,
  // and counts as stopped there: a stop string found after the engine ran on
  // (Engine::FinishAt; the server, for a sequence that ended first). Rows past the new end
  // go where hidden_states is trimmed to num_capture_rows() (the engine's Retire).
  void KeepGenerated(int n) {
    tokens_.resize(static_cast<size_t>(prompt_len() + n));
    if (logprobs.size() > static_cast<size_t>(n)) logprobs.resize(static_cast<size_t>(n));
    num_computed = std::min(num_computed, num_tokens());
    KeepDrafts(0);
    stopped_ = true;
  }
  // Ended by a stop token or string rather than by reaching max_new_tokens.
  bool stopped() const { return stopped_; }
  // Set when the request was cancelled (a client went away): it ends without a result.
  bool aborted = false;
  // Set when the request failed while running (a captured row held inf or NaN): it ends
  // without a file, and its consumer reports this error for it.
  Status error;
  // The random stream of its draws: the request's seed, or a random one, so a seed
  // reproduces its tokens whatever the batch.
  uint64_t seed() const { return seed_; }
  // Raw logprobs of each generated token, when the request asks for them.
  struct TokenLogprobs {
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;
  };
  std::vector<TokenLogprobs> logprobs;

 private:
  Request request_;
  std::vector<int32_t> tokens_;
  int turn_start_;
  int turn_max_new_tokens_;
  bool all_known_run_ = false;
  bool stopped_ = false;
  uint64_t seed_;
  static uint64_t RandomSeed() {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) | device();
  }
};

}  // namespace hsx
