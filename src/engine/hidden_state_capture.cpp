#include "engine/hidden_state_capture.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "util/thread_pool.h"

namespace hsx {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

size_t RowBytes(const Tensor& rows) { return rows.nbytes() / static_cast<size_t>(rows.size(0)); }

}  // namespace

HiddenStateCapture::HiddenStateCapture(CaptureConfig config)
    : config_(std::move(config)), staging_(config_.max_step_rows) {
  if (config_.prefix_caching && enabled()) {
    // Host pages are committed only as rows land in them.
    cache_ = Tensor::Host(config_.dtype, {static_cast<int64_t>(config_.num_blocks) * config_.block_size,
                                          static_cast<int64_t>(config_.layers.size()), config_.hidden_size});
  }
}

void HiddenStateCapture::Allocate(Sequence& seq) const {
  if (!seq.request().capture || !enabled()) return;
  // A conversation regenerated turn by turn also holds the known tokens after each
  // answer: room for them from the start, so a single answer's conversation never
  // grows its buffer (large buffers are mmapped: rows never written take no memory).
  const int64_t rows = seq.request().next_turn
                           ? std::min<int64_t>(config_.max_model_len, seq.max_capture_rows() + kTurnHeadroomRows)
                           : seq.max_capture_rows();
  seq.hidden_states =
      Tensor::Host(config_.dtype, {rows, static_cast<int64_t>(config_.layers.size()), config_.hidden_size});
}

void HiddenStateCapture::Grow(Sequence& seq, int64_t total) const {
  const Tensor& old = seq.hidden_states;
  if (!old.defined() || old.size(0) >= total) return;
  // On the engine thread: grown at least twofold (and with room for the next known
  // tokens), so a conversation of many turns copies its rows O(log turns) times, and
  // only the rows computed so far (the step in flight stores its rows into the new one).
  const int64_t rows =
      std::min<int64_t>(config_.max_model_len, std::max<int64_t>(total + kTurnHeadroomRows, 2 * old.size(0)));
  Tensor grown = Tensor::Host(old.dtype(), {rows, old.size(1), old.size(2)});
  const int64_t written = std::min<int64_t>(seq.num_computed, old.size(0));
  std::memcpy(grown.raw(), old.raw(), static_cast<size_t>(written) * RowBytes(old));
  seq.hidden_states = std::move(grown);
}

void HiddenStateCapture::AdoptCachedRows(Sequence& seq) const {
  const int cached = seq.num_cached_tokens;
  seq.num_cached_tokens = 0;
  if (cached == 0 || !cache_.defined() || !seq.hidden_states.defined()) return;
  const size_t row_bytes = RowBytes(seq.hidden_states);
  for (int pos = 0; pos < cached; ++pos) {
    const int64_t slot = SlotOf(seq.block_table, pos, config_.block_size);
    std::memcpy(seq.hidden_states.data<char>() + pos * row_bytes, cache_.data<char>() + slot * row_bytes, row_bytes);
  }
}

void HiddenStateCapture::Trim(Sequence& seq) const {
  if (seq.hidden_states.defined()) seq.hidden_states = seq.hidden_states.Rows(0, seq.num_capture_rows());
}

// Which sequence, position and KV slot each row of a step's capture belongs to.
void HiddenStateCapture::Track(const std::vector<ScheduledChunk>& chunks, std::unique_ptr<CapturedRows> copy) {
  auto step = std::make_unique<Step>();
  for (const auto& [seq, n] : chunks) {
    for (int i = 0; i < n; ++i) {
      const int64_t pos = seq->num_computed + i;
      step->rows.push_back({seq, pos, SlotOf(seq->block_table, pos, config_.block_size), seq->preemptions});
    }
  }
  step->copy = std::move(copy);
  current_ = std::move(step);
}

bool HiddenStateCapture::Hold(std::unique_ptr<Sequence>& seq) {
  Step* newest = current_ ? current_.get() : pending_.get();
  if (!newest) return false;
  newest->finishing.push_back(std::move(seq));
  return true;
}

HiddenStateCapture::Landed HiddenStateCapture::Land() {
  Landed landed;
  if (pending_) {
    const auto t0 = Clock::now();
    pending_->copy->Wait();
    const auto t1 = Clock::now();
    Store(*pending_);
    FailNonFinite(*pending_);
    profile_seconds_[0] += Seconds(t0, t1);
    profile_seconds_[1] += Seconds(t1, Clock::now());
    // A failed sequence's rows are not shared: its block with the bad row is never registered.
    for (const auto& row : pending_->rows) {
      if (row.seq->preemptions != row.preemptions || !row.seq->error.ok()) continue;
      landed.stored.emplace_back(row.seq, static_cast<int>(row.pos) + 1);
    }
    landed.finishing = std::move(pending_->finishing);
  }
  pending_ = std::move(current_);
  return landed;
}

// Copies a step's rows out of its [L, T, H] capture (now on the host) into each
// sequence's [rows, L, H] buffer by position, converting to the output dtype; rows in
// parallel. Positions are absolute, so a recompute after preemption rewrites the same
// rows instead of adding any. With prefix caching, a row of a full prompt block (the only
// rows a reuser can match: BlockManager::Commit) is also kept by KV slot.
void HiddenStateCapture::Store(const Step& step) {
  const Tensor& captured = step.copy->rows();
  // total is the capture's row stride: a graph-replayed step's padded rows follow the real ones.
  const int64_t layers = captured.size(0), total = captured.size(1), h = captured.size(2);
  const size_t in_size = DTypeSize(captured.dtype());
  const int bs = config_.block_size;
  ThreadPool::Global().ParallelFor(static_cast<int64_t>(step.rows.size()), [&](int64_t b, int64_t e) {
    std::vector<float> f32(static_cast<size_t>(h));
    for (int64_t r = b; r < e; ++r) {
      const auto& [seq, pos, slot, preemptions] = step.rows[r];
      Tensor& dst = seq->hidden_states;
      if (!dst.defined() || pos >= dst.size(0)) continue;
      const size_t out_size = DTypeSize(dst.dtype());
      for (int64_t l = 0; l < layers; ++l) {
        const char* src = captured.data<char>() + (l * total + r) * h * in_size;
        char* out = dst.data<char>() + (pos * layers + l) * h * out_size;
        if (captured.dtype() == dst.dtype()) {
          std::memcpy(out, src, h * in_size);
        } else {
          ConvertToF32(captured.dtype(), src, f32.data(), f32.size());
          ConvertFromF32(f32.data(), dst.dtype(), out, f32.size());
        }
      }
      if (cache_.defined() && pos < static_cast<int64_t>(seq->prompt_len() / bs) * bs) {
        const size_t row_bytes = static_cast<size_t>(layers * h) * out_size;
        std::memcpy(cache_.data<char>() + slot * row_bytes, dst.data<char>() + pos * row_bytes, row_bytes);
      }
    }
  });
}

// Names the lowest layer, then the lowest position in it, where the inf or NaN is: where
// it arose (attention may spread it to earlier positions, as 0 * NaN in P·V).
void HiddenStateCapture::FailNonFinite(const Step& step) const {
  const int64_t layers = step.copy->rows().size(0), total = step.copy->rows().size(1);
  const int32_t* flags = step.copy->non_finite();
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t r = 0; r < static_cast<int64_t>(step.rows.size()); ++r) {  // padded rows after them: not read
      Sequence& seq = *step.rows[r].seq;
      if (flags[l * total + r] == 0 || !seq.hidden_states.defined() || !seq.error.ok()) continue;
      seq.error = Error("request '" + seq.id() + "': the hidden state of layer " +
                        std::to_string(config_.layers[l]) + " at token position " +
                        std::to_string(step.rows[r].pos) + " is not finite (inf or NaN); its states are not stored");
      seq.Stop();  // ends once its prompt has run; its remaining steps are wasted, not written
    }
  }
}

}  // namespace hsx
