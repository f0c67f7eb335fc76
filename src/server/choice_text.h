// One choice's text, made on server threads from the token ids the engine thread hands
// over. The engine thread only appends each generated id (Push: a lock, an append, a
// notify); the waiting handler detokenizes them as they come (CompletionText) and, when a
// stop string completes, has the engine finish the request at that token
// (EngineService::FinishAt). The engine may have run on, or ended the request by itself,
// before that arrives, so whoever gets the finished sequence (the handler for its answer,
// a writer for its file) cuts it back to the stop string's token (Settle): the same tokens,
// logprobs, rows and finish reason as if the engine had stopped there. vLLM's output
// processor also detokenizes outside its engine core, then aborts the request; hsx
// finishes it instead, so its hidden states are still stored, up to the stop.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "engine/sequence.h"
#include "server/completion_text.h"

namespace hsx {

class ChoiceText {
 public:
  // Wakes one HTTP request's handler: its choices' Push and results notify it. Its lock
  // guards the choices' state: every method but Push and Settled is called holding it.
  struct Signal {
    std::mutex mu;
    std::condition_variable cv;
    void Notify() {
      { std::lock_guard<std::mutex> lock(mu); }  // a waiter is either before its check or waiting
      cv.notify_all();
    }
  };

  ChoiceText(std::shared_ptr<Signal> signal, const Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
             CompletionText::Options options);

  // On the engine thread: appends under the signal's lock and notifies it.
  void Push(int32_t token);

  // Decodes the ids pushed so far; the number of generated tokens the choice keeps, the
  // first time a stop string ends its text (the caller then has the engine finish there).
  std::optional<int> Decode();
  // Whether ids wait for Decode (none do once a stop string is found).
  bool undecoded() const { return !stop_at_ && decoded_ < tokens_.size(); }
  // The ids pushed so far (a stop string's request may get a few past its stop).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // How many of them belong to the choice: through the stop string's token once one is found.
  size_t kept() const { return stop_at_ ? static_cast<size_t>(*stop_at_) : tokens_.size(); }
  CompletionText& text() { return text_; }
  // A finished sequence: decodes its ids not yet decoded, then cuts it back to its stop
  // string's token (Sequence::KeepGenerated, and its rows to those it keeps).
  void Settle(Sequence& seq);

  // Settle for a sequence others share, taking the lock: the same one when nothing is cut,
  // else a cut copy (its rows still shared).
  std::shared_ptr<const Sequence> Settled(std::shared_ptr<const Sequence> seq);

  Signal& signal() { return *signal_; }

 private:
  void Feed(int32_t token);
  bool Cuts(const Sequence& seq) const;

  std::shared_ptr<Signal> signal_;
  CompletionText text_;
  std::vector<int32_t> tokens_;  // pushed by the engine thread
  size_t decoded_ = 0;           // generated ids given to text_ (from tokens_ or a finished sequence)
  std::optional<int> stop_at_;   // generated tokens through the one that completed a stop string
  bool reported_ = false;        // Decode has returned stop_at_
};

}  // namespace hsx
