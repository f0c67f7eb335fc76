// The capture object alone, fed steps by hand (host rows standing in for the runner's
// copies): each row lands in its sequence's buffer at its position whatever the step's
// layout, a preempted sequence's stale step neither registers its blocks nor outlives its
// recompute, a finite row never fails and a non-finite one fails only its sequence, and a
// sequence admitted onto cached blocks gets the rows of the sequence that computed them.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/hidden_state_capture.h"

namespace hsx {
namespace {

constexpr int kLayers = 2, kHidden = 3, kBlock = 2;

struct Done final : PendingDownload {
  void Wait() override {}
};

// The value a step writes for (sequence tag, position, layer, element): distinct, exact in
// f32; `run` tells a recompute's rows from the first run's.
float Value(int tag, int64_t pos, int layer, int e, int run) {
  return static_cast<float>(run * 10000 + tag * 1000 + pos * 10 + layer * 4 + e);
}

// One step's capture, [L, T + pad, H] as a replayed graph leaves it (padded rows after the
// real ones), already "on the host"; `bad` row gets an inf in layer 1.
std::unique_ptr<CapturedRows> StepRows(const std::vector<std::pair<int, ScheduledChunk>>& chunks, int run,
                                       int pad = 0, int bad = -1) {
  int64_t t = 0;
  for (const auto& c : chunks) t += c.second.num_tokens;
  const int64_t total = t + pad;
  Tensor rows = Tensor::Host(DType::kF32, {kLayers, total, kHidden});
  Tensor flags = Tensor::Host(DType::kI32, {kLayers * total});
  int64_t r = 0;
  for (const auto& [tag, chunk] : chunks) {
    for (int i = 0; i < chunk.num_tokens; ++i, ++r) {
      for (int l = 0; l < kLayers; ++l) {
        for (int e = 0; e < kHidden; ++e) {
          rows.data<float>()[(l * total + r) * kHidden + e] = Value(tag, chunk.seq->num_computed + i, l, e, run);
        }
      }
    }
  }
  for (int64_t p = t; p < total; ++p) {  // padding: garbage that must never be stored or flagged
    for (int l = 0; l < kLayers; ++l) {
      for (int e = 0; e < kHidden; ++e) rows.data<float>()[(l * total + p) * kHidden + e] = -1.0f;
      flags.data<int32_t>()[l * total + p] = 1;
    }
  }
  if (bad >= 0) {
    rows.data<float>()[(1 * total + bad) * kHidden] = INFINITY;
    flags.data<int32_t>()[1 * total + bad] = 1;
  }
  return std::make_unique<CapturedRows>(Tensor(), Tensor(), std::move(rows), std::move(flags),
                                        std::make_unique<Done>(), std::make_unique<Done>());
}

std::vector<ScheduledChunk> Chunks(const std::vector<std::pair<int, ScheduledChunk>>& tagged) {
  std::vector<ScheduledChunk> out;
  for (const auto& t : tagged) out.push_back(t.second);
  return out;
}

// Runs a tagged step: tracked, then num_computed advances (as Engine::Step does).
void RunStep(HiddenStateCapture& capture, const std::vector<std::pair<int, ScheduledChunk>>& tagged, int run,
            int pad = 0, int bad = -1) {
  capture.Track(Chunks(tagged), StepRows(tagged, run, pad, bad));
  for (const auto& t : tagged) t.second.seq->num_computed += t.second.num_tokens;
}

std::unique_ptr<Sequence> MakeSeq(const std::string& id, int prompt_len) {
  Request r;
  r.id = id;
  r.prompt.assign(prompt_len, 5);
  return std::make_unique<Sequence>(std::move(r));
}

CaptureConfig Config(bool prefix_caching) {
  CaptureConfig c;
  c.layers = {3, 7};
  c.dtype = DType::kF32;
  c.hidden_size = kHidden;
  c.max_model_len = 64;
  c.max_step_rows = 16;
  c.prefix_caching = prefix_caching;
  c.num_blocks = 16;
  c.block_size = kBlock;
  return c;
}

void ExpectRows(const Sequence& seq, int tag, int64_t from, int64_t to, int run) {
  for (int64_t pos = from; pos < to; ++pos) {
    for (int l = 0; l < kLayers; ++l) {
      for (int e = 0; e < kHidden; ++e) {
        ASSERT_EQ(seq.hidden_states.data<float>()[(pos * kLayers + l) * kHidden + e], Value(tag, pos, l, e, run))
            << seq.id() << " pos " << pos << " layer " << l << " element " << e;
      }
    }
  }
}

TEST(HiddenStateCaptureTest, TwoSequencesWithAPreemptionBetweenStepsStoreEachRowByValue) {
  HiddenStateCapture capture(Config(/*prefix_caching=*/false));
  auto a = MakeSeq("a", 6), b = MakeSeq("b", 5);
  capture.Allocate(*a);
  capture.Allocate(*b);
  ASSERT_EQ(a->hidden_states.shape(), (Shape{6, kLayers, kHidden}));
  a->block_table = {0, 1, 2};
  b->block_table = {3, 4, 5};

  // Step 1: a's first 4 rows, b's first 3, on a padded (replayed) layout.
  RunStep(capture, {{1, {a.get(), 4}}, {2, {b.get(), 3}}}, /*run=*/0, /*pad=*/3);
  EXPECT_TRUE(capture.Land().stored.empty());  // nothing was in flight before
  // a is preempted before step 1's rows land: its blocks go, it recomputes from 0 elsewhere.
  a->block_table = {6, 7, 8};
  a->num_computed = 0;
  ++a->preemptions;
  // Step 2: a's recompute of 0..3 (other values: run 1), b's last 2 rows.
  RunStep(capture, {{2, {b.get(), 2}}, {1, {a.get(), 4}}}, /*run=*/1);
  HiddenStateCapture::Landed first = capture.Land();  // step 1's rows
  // a's stale rows are stored (its recompute rewrites them next) but register nothing.
  ASSERT_EQ(first.stored.size(), 3u);
  for (const auto& [seq, tokens] : first.stored) EXPECT_EQ(seq, b.get());
  EXPECT_EQ(first.stored.back().second, 3);
  ExpectRows(*a, 1, 0, 4, /*run=*/0);
  ExpectRows(*b, 2, 0, 3, 0);
  // b finishes with step 2: held until its rows land.
  ASSERT_TRUE(capture.Hold(b));
  EXPECT_EQ(b, nullptr);
  EXPECT_TRUE(capture.in_flight());
  HiddenStateCapture::Landed second = capture.Land();  // step 2's rows
  ASSERT_EQ(second.finishing.size(), 1u);
  std::unique_ptr<Sequence> done = std::move(second.finishing[0]);
  ExpectRows(*done, 2, 0, 3, 0);
  ExpectRows(*done, 2, 3, 5, 1);
  ExpectRows(*a, 1, 0, 4, /*run=*/1);  // the recompute's rows replaced the stale ones
  ASSERT_EQ(second.stored.size(), 6u);
  EXPECT_EQ(second.stored[1], std::make_pair(done.get(), 5));
  EXPECT_EQ(second.stored[5], std::make_pair(a.get(), 4));
  EXPECT_TRUE(a->error.ok());
  EXPECT_TRUE(done->error.ok());
  EXPECT_FALSE(capture.in_flight());
  EXPECT_FALSE(capture.Hold(a));  // nothing in flight: the caller retires it
}

TEST(HiddenStateCaptureTest, ANonFiniteRowFailsOnlyItsSequenceNamingLayerAndPosition) {
  HiddenStateCapture capture(Config(/*prefix_caching=*/true));
  auto a = MakeSeq("a", 4), b = MakeSeq("b", 4);
  capture.Allocate(*a);
  capture.Allocate(*b);
  a->block_table = {0, 1};
  b->block_table = {2, 3};
  RunStep(capture, {{1, {a.get(), 4}}, {2, {b.get(), 4}}}, 0, /*pad=*/0, /*bad=*/6);  // b's position 2
  capture.Land();
  HiddenStateCapture::Landed landed = capture.Land();
  EXPECT_TRUE(a->error.ok());
  ASSERT_FALSE(b->error.ok());
  EXPECT_EQ(b->error.message(),
            "request 'b': the hidden state of layer 7 at token position 2 is not finite (inf or NaN); "
            "its states are not stored");
  EXPECT_TRUE(b->stopped());
  for (const auto& [seq, tokens] : landed.stored) EXPECT_EQ(seq, a.get()) << "a failed sequence registers nothing";
}

TEST(HiddenStateCaptureTest, ASequenceOnCachedBlocksGetsTheRowsOfTheOneThatComputedThem) {
  HiddenStateCapture capture(Config(/*prefix_caching=*/true));
  auto a = MakeSeq("a", 5);
  capture.Allocate(*a);
  a->block_table = {9, 4, 11};
  RunStep(capture, {{1, {a.get(), 5}}}, 0);
  capture.Land();
  capture.Land();
  // c matches a's two full prompt blocks (4 tokens) and computes the rest itself.
  auto c = MakeSeq("c", 5);
  capture.Allocate(*c);
  c->block_table = {9, 4, 2};
  c->num_computed = c->num_cached_tokens = 4;
  capture.AdoptCachedRows(*c);
  EXPECT_EQ(c->num_cached_tokens, 0);
  ExpectRows(*c, 1, 0, 4, 0);
  EXPECT_TRUE(capture.Shareable(*c));
  Request no_capture;
  no_capture.id = "n";
  no_capture.prompt = {1, 2, 3};
  no_capture.capture = false;
  Sequence n(no_capture);
  capture.Allocate(n);
  EXPECT_FALSE(n.hidden_states.defined());
  EXPECT_FALSE(capture.Shareable(n)) << "blocks without rows must not be shared when capture is on";
}

}  // namespace
}  // namespace hsx
