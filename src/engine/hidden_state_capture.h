// Captured hidden states from the device's staging to each request's rows, in one object.
// It owns the pinned staging the runner's copies land in (capture_staging.h), which row of
// a step belongs to which sequence and position, the step whose copy is in flight, the
// store into each sequence's [rows, L, H] buffer (Sequence::hidden_states, the only writer
// of it), the non-finite check, and prefix caching's rows by KV slot. The engine calls it
// at fixed points of its step: Allocate (Add), AdoptCachedRows (admission onto cached
// blocks), Track (after run), Hold (a sequence that finishes with this step's rows),
// Land (end of step: the previous step's rows stored), Grow (a regenerated turn), Trim
// (retire).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "engine/capture_staging.h"
#include "engine/scheduler.h"
#include "tensor/tensor.h"

namespace hsx {

struct CaptureConfig {
  std::vector<int> layers;  // ascending unique layer ids; empty: no capture
  DType dtype = DType::kBF16;  // of the stored rows
  int64_t hidden_size = 0;
  int max_model_len = 0;
  int max_step_rows = 0;  // the scheduler's token budget (the staging's size)
  // Prefix caching: rows of shareable prompt blocks are also kept by KV slot.
  bool prefix_caching = false;
  int num_blocks = 0, block_size = 16;
};

class HiddenStateCapture {
 public:
  // Capture rows a regenerated conversation's buffer keeps beyond what it needs so far: the
  // template's known tokens after an answer (its end, the next turn's header) fit without
  // growing it.
  static constexpr int64_t kTurnHeadroomRows = 256;

  explicit HiddenStateCapture(CaptureConfig config);

  bool enabled() const { return !config_.layers.empty(); }
  // Where the runner's copies land; null without capture.
  CaptureStaging* staging() { return enabled() ? &staging_ : nullptr; }

  // A new sequence's buffer, if its request captures.
  void Allocate(Sequence& seq) const;
  // A regenerated conversation's next turn takes it to `total` tokens: its buffer grows.
  void Grow(Sequence& seq, int64_t total) const;
  // A sequence admitted onto cached blocks gets those blocks' rows (once, at admission).
  void AdoptCachedRows(Sequence& seq) const;
  // Whether seq's blocks carry what a reuser needs: rows wherever capture is on.
  bool Shareable(const Sequence& seq) const { return !cache_.defined() || seq.hidden_states.defined(); }
  // A finished sequence's buffer, trimmed to its rows.
  void Trim(Sequence& seq) const;

  // The step just run: which sequence and position each of its rows is (called before the
  // chunks' num_computed advance), and its copy.
  void Track(const std::vector<ScheduledChunk>& chunks, std::unique_ptr<CapturedRows> copy);
  // Whether the step just run captured (its sequences' blocks wait for its rows).
  bool tracking() const { return current_ != nullptr; }
  // A sequence that ends once the newest step in flight has stored its rows: the step just
  // run, else the one still landing (an abort between steps). False if none is in flight.
  bool Hold(std::unique_ptr<Sequence>& seq);
  bool in_flight() const { return current_ != nullptr || pending_ != nullptr; }

  // What storing a step's rows settled.
  struct Landed {
    // Sequences whose first `tokens` rows are stored (prefix registration may share them).
    // A sequence preempted since the step ran (its recompute holds other blocks, whose rows
    // are still to come) or failed is left out.
    std::vector<std::pair<Sequence*, int>> stored;
    std::vector<std::unique_ptr<Sequence>> finishing;  // held for these rows: done now
  };
  // Waits for the older step's copy, stores its rows and fails each sequence with a
  // non-finite row; then the step just run becomes the one landing.
  Landed Land();

  // HSX_PROFILE: host seconds waiting for copies, and storing rows.
  double wait_seconds() const { return profile_seconds_[0]; }
  double store_seconds() const { return profile_seconds_[1]; }

 private:
  // A step whose captured rows are still being copied to the host.
  struct Step {
    struct Row {
      Sequence* seq;
      int64_t pos;
      int64_t slot;     // KV slot: where the row lives in the prefix cache's rows
      int preemptions;  // the sequence's count when the row ran
    };
    std::vector<Row> rows;  // one per batch row
    std::unique_ptr<CapturedRows> copy;
    std::vector<std::unique_ptr<Sequence>> finishing;
  };
  void Store(const Step& step);
  // Fails (and stops) each sequence with a non-finite row in the step, naming the first.
  void FailNonFinite(const Step& step) const;

  CaptureConfig config_;
  CaptureStaging staging_;
  // Prefix caching with capture: rows of prompt blocks a reuser may match, by KV slot, so
  // sequences that reuse cached blocks also get those blocks' hidden states. [slots, L, H].
  Tensor cache_;
  std::unique_ptr<Step> current_, pending_;
  // HSX_PROFILE=1: seconds waiting for capture copies and storing rows.
  bool profile_ = std::getenv("HSX_PROFILE") != nullptr;
  double profile_seconds_[2] = {0, 0};
};

}  // namespace hsx
