#include "server/choice_text.h"

namespace hsx {

ChoiceText::ChoiceText(std::shared_ptr<Signal> signal, const Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
                       CompletionText::Options options)
    : signal_(std::move(signal)), text_(tokenizer, prompt, std::move(options)) {}

void ChoiceText::Push(int32_t token) {
  {
    std::lock_guard<std::mutex> lock(signal_->mu);
    tokens_.push_back(token);
  }
  signal_->cv.notify_all();
}

void ChoiceText::Feed(int32_t token) {
  ++decoded_;
  if (text_.Add(token)) stop_at_ = static_cast<int>(decoded_);
}

std::optional<int> ChoiceText::Decode() {
  while (!stop_at_ && decoded_ < tokens_.size()) Feed(tokens_[decoded_]);
  if (!stop_at_ || reported_) return std::nullopt;
  reported_ = true;
  return stop_at_;
}

// The engine hands every generated id over before the sequence finishes, and cuts only
// its tail, so a finished sequence's ids are a prefix of those pushed: decoding from
// either gives the same text.
void ChoiceText::Settle(Sequence& seq) {
  if (!seq.error.ok() || seq.aborted) return;
  const std::vector<int32_t> generated = seq.generated();
  while (!stop_at_ && decoded_ < generated.size()) Feed(generated[decoded_]);
  if (!Cuts(seq)) return;
  seq.KeepGenerated(*stop_at_);
  if (seq.hidden_states.defined() && seq.hidden_states.size(0) > seq.num_capture_rows()) {
    seq.hidden_states = seq.hidden_states.Rows(0, seq.num_capture_rows());
  }
}

std::shared_ptr<const Sequence> ChoiceText::Settled(std::shared_ptr<const Sequence> seq) {
  std::lock_guard<std::mutex> lock(signal_->mu);
  if (!seq->error.ok() || seq->aborted) return seq;
  const std::vector<int32_t> generated = seq->generated();
  while (!stop_at_ && decoded_ < generated.size()) Feed(generated[decoded_]);
  if (!Cuts(*seq)) return seq;
  auto cut = std::make_shared<Sequence>(*seq);
  Settle(*cut);
  return cut;
}

// Whether a finished sequence runs past its stop string's token, or reached it without
// counting as stopped (it ended by max_tokens, or by itself, at that very token).
bool ChoiceText::Cuts(const Sequence& seq) const {
  return stop_at_ && *stop_at_ <= seq.num_generated() && (*stop_at_ < seq.num_generated() || !seq.stopped());
}

}  // namespace hsx
