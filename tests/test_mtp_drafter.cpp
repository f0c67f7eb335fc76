// The Gemma 4 MTP drafter against golden_mtp_vllm*.safetensors: HF 5.17's own assistant
// forward (f32), driven as vLLM and SGLang drive it (constant position p, the target's
// KV of positions 0..p, the post-norm target hidden at p, then the drafter's own argmax
// and post-projection). tests/data/mtp holds copies of ../shared/fixtures/mtp (made by
// fixtures/generators/make_mtp_vllm_golden.py): the random centroid-head assistant and
// the hand-set dense-head "copy" assistant, whose drafts get accepted.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/mtp_drafter.h"
#include "test_util.h"
#include "util/text_file.h"

#ifdef HSX_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace hsx {
namespace {

constexpr int kDrafts = 4;  // drafts a round in the goldens
constexpr int kBlock = 16;

std::string MtpPath(const std::string& rel) { return test::DataPath("mtp/" + rel); }

struct Fixture {
  std::string assistant, golden;
  bool centroid_head;
};
void PrintTo(const Fixture& f, std::ostream* os) { *os << f.assistant; }

const Fixture kRandom{"gemma4_assistant", "golden_mtp_vllm.safetensors", true};
const Fixture kCopy{"gemma4_assistant_copy", "golden_mtp_vllm_copy.safetensors", false};

int NumPrompts(const SafetensorsFile& golden) {
  int n = 0;
  while (golden.Get("prompt_" + std::to_string(n)).ok()) ++n;
  return n;
}

std::vector<float> Floats(const SafetensorsFile& golden, const std::string& name) {
  return test::AsFloats(golden.Get(name).value());
}
std::vector<int32_t> Ids(const SafetensorsFile& golden, const std::string& name) {
  return test::AsIds(golden.Get(name).value());
}

// A host f32 matrix in the backend's compute dtype, on its device.
Tensor UploadRows(Backend& backend, const std::vector<float>& values, int64_t cols) {
  Tensor t = Tensor::Host(backend.compute_dtype(), {static_cast<int64_t>(values.size()) / cols, cols});
  ConvertFromF32(values.data(), t.dtype(), t.raw(), values.size());
  return backend.Upload(t);
}

// One drafting row per (prompt, round) of a golden file: all of them run as one batch.
struct Rows {
  std::vector<int> prompt, round;
  MtpDraftBatch batch;
};

Rows GoldenRows(const SafetensorsFile& golden, const std::vector<std::vector<int32_t>>& block_tables) {
  Rows rows;
  for (int k = 0; k < static_cast<int>(block_tables.size()); ++k) {
    const std::vector<int32_t> pos = Ids(golden, "round_pos_" + std::to_string(k));
    const std::vector<int32_t> tokens = Ids(golden, "round_token_" + std::to_string(k));
    for (size_t r = 0; r < pos.size(); ++r) {
      SequenceSlice s;
      s.q_start = static_cast<int32_t>(rows.batch.seqs.size());
      s.q_len = 1;
      s.ctx_len = pos[r] + 1;
      s.block_table = block_tables[k];
      rows.batch.seqs.push_back(s);
      rows.batch.tokens.push_back(tokens[r]);
      rows.prompt.push_back(k);
      rows.round.push_back(static_cast<int>(r));
    }
  }
  return rows;
}

// Row i of a golden [R, 4, W] tensor at draft step s, for every drafting row.
std::vector<float> GoldenStep(const SafetensorsFile& golden, const Rows& rows, const std::string& key, int step,
                              int64_t width) {
  std::vector<float> out;
  for (size_t i = 0; i < rows.prompt.size(); ++i) {
    const std::vector<float> all = Floats(golden, key + "_" + std::to_string(rows.prompt[i]));
    const auto at = all.begin() + (rows.round[i] * kDrafts + step) * width;
    out.insert(out.end(), at, at + width);
  }
  return out;
}
std::vector<int32_t> GoldenTokens(const SafetensorsFile& golden, const Rows& rows, int step) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < rows.prompt.size(); ++i)
    out.push_back(Ids(golden, "draft_tokens_" + std::to_string(rows.prompt[i]))[rows.round[i] * kDrafts + step]);
  return out;
}

// Logits of one step against the golden's. A centroid head's golden fills the unselected
// tokens with min(selected) - 1 (HF), hsx with the lowest float (vLLM): rows whose selected
// sets differ are marked in *flipped and left out; elsewhere only selected logits are
// compared. Returns max |error| / max |golden|.
double LogitError(const std::vector<float>& mine, const std::vector<float>& gold, int64_t vocab, bool centroid_head,
                  std::vector<bool>* flipped) {
  std::vector<float> a, b;
  flipped->assign(gold.size() / vocab, false);
  for (size_t row = 0; row * vocab < gold.size(); ++row) {
    const float* g = gold.data() + row * vocab;
    const float* m = mine.data() + row * vocab;
    const float fill = *std::min_element(g, g + vocab);
    auto gold_selected = [&](int64_t v) { return !centroid_head || g[v] > fill; };
    bool same_set = true;
    for (int64_t v = 0; v < vocab && centroid_head; ++v)
      same_set &= gold_selected(v) == (m[v] != std::numeric_limits<float>::lowest());
    if (!same_set) {
      (*flipped)[row] = true;
      continue;
    }
    for (int64_t v = 0; v < vocab; ++v) {
      if (!gold_selected(v)) continue;
      a.push_back(m[v]);
      b.push_back(g[v]);
    }
  }
  return test::RelativeMaxError(a, b);
}

// The arg max of each golden row must be the drafter's wherever the golden's top two are
// further apart than `margin` (0: always), in rows that selected the golden's centroids.
int TokenMismatches(const std::vector<int32_t>& mine, const std::vector<int32_t>& gold,
                    const std::vector<float>& gold_logits, int64_t vocab, float margin, const std::vector<bool>& flipped) {
  int n = 0;
  for (size_t row = 0; row < gold.size(); ++row) {
    if (flipped[row]) continue;
    std::vector<float> g(gold_logits.begin() + row * vocab, gold_logits.begin() + (row + 1) * vocab);
    std::partial_sort(g.begin(), g.begin() + 2, g.end(), std::greater<float>());
    if (g[0] - g[1] > margin) n += mine[row] != gold[row];
  }
  return n;
}

class MtpGoldenTest : public ::testing::TestWithParam<Fixture> {};

// End to end on the CPU: hsx's target fills its paged KV cache and gives the post-norm
// hidden; the drafter chains its own tokens and hidden states through 4 steps for every
// round of every prompt, all rounds in one batch (different sequences and positions).
TEST_P(MtpGoldenTest, CpuDraftsChainedFromHsxTargetMatchGolden) {
  CpuBackend backend;
  auto target = Model::Load(MtpPath("gemma4_target"), backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto drafter = MtpDrafter::Load(MtpPath(GetParam().assistant), **target, backend);
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  EXPECT_EQ((*drafter)->target_kv_layers(), (std::vector<int>{4, 5}));  // the golden's kv_layers metadata
  SafetensorsFile golden = test::Golden(MtpPath(GetParam().golden));
  const ModelConfig& tc = (*target)->config();
  const int64_t h = tc.hidden_size, vocab = tc.vocab_size;

  // The target over prompt + the first 15 greedy tokens of every prompt, one packed
  // forward: its cache then holds every position any round reads (KV is causal).
  KVCache cache(tc, backend, 32, kBlock);
  ForwardBatch fb;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> starts;
  int next_block = 0;
  for (int k = 0; k < NumPrompts(golden); ++k) {
    std::vector<int32_t> ids = Ids(golden, "prompt_" + std::to_string(k));
    const std::vector<int32_t> greedy = Ids(golden, "greedy_" + std::to_string(k));
    ids.insert(ids.end(), greedy.begin(), greedy.end() - 1);
    SequenceSlice s;
    s.q_start = static_cast<int32_t>(fb.token_ids.size());
    s.q_len = s.ctx_len = static_cast<int32_t>(ids.size());
    for (size_t i = 0; i < ids.size(); i += kBlock) s.block_table.push_back(next_block++);
    for (size_t i = 0; i < ids.size(); ++i) {
      fb.token_ids.push_back(ids[i]);
      fb.positions.push_back(static_cast<int32_t>(i));
      fb.slot_mapping.push_back(s.block_table[i / kBlock] * kBlock + static_cast<int32_t>(i % kBlock));
    }
    fb.seqs.push_back(s);
    tables.push_back(s.block_table);
    starts.push_back(s.q_start);
  }
  ASSERT_LE(next_block, cache.num_blocks());
  ForwardOutput fo = (*target)->Forward(fb, cache, {tc.num_layers});
  Tensor last = fo.captured.View({static_cast<int64_t>(fb.token_ids.size()), h});
  Tensor normed = backend.Empty(DType::kF32, last.shape());
  backend.RmsNorm(last, &(*target)->weights().final_norm, tc.rms_norm_eps, tc.norm_one_plus_weight, normed);

  Rows rows = GoldenRows(golden, tables);
  std::vector<int32_t> hidden_rows;
  for (size_t i = 0; i < rows.prompt.size(); ++i)
    hidden_rows.push_back(starts[rows.prompt[i]] + rows.batch.seqs[i].ctx_len - 1);
  Tensor hidden = backend.Empty(DType::kF32, {static_cast<int64_t>(hidden_rows.size()), h});
  backend.GatherRows(normed, hidden_rows, hidden);
  std::vector<float> gold_hidden;
  for (size_t i = 0; i < rows.prompt.size(); ++i) {
    const std::vector<float> all = Floats(golden, "round_hidden_" + std::to_string(rows.prompt[i]));
    gold_hidden.insert(gold_hidden.end(), all.begin() + rows.round[i] * h, all.begin() + (rows.round[i] + 1) * h);
  }
  EXPECT_LE(test::RelativeMaxError(test::AsFloats(hidden), gold_hidden), 1e-4) << "the target's post-norm hidden";

  for (int step = 0; step < kDrafts; ++step) {
    const MtpDraftOutput out = (*drafter)->Step(rows.batch, hidden, cache);
    const std::vector<float> gold_logits = GoldenStep(golden, rows, "draft_logits", step, vocab);
    std::vector<bool> flipped;
    const double logit_error = LogitError(test::AsFloats(out.logits), gold_logits, vocab, GetParam().centroid_head,
                                          &flipped);
    const double hidden_error =
        test::RelativeMaxError(test::AsFloats(out.hidden), GoldenStep(golden, rows, "draft_fed_hidden", step, h));
    std::printf("[mtp cpu chained] %s step %d: %zu rows, logits %.2e, hidden %.2e\n", GetParam().assistant.c_str(),
                step + 1, rows.prompt.size(), logit_error, hidden_error);
    // The target's own f32 error (within 1e-4 of HF's) enters through the KV cache and
    // the first hidden; the random drafter amplifies it about 3x a step (the teacher-forced
    // test below, on the golden's K/V and inputs, holds every step to 1e-5).
    const double tolerance = step == 0 ? 1e-4 : 1e-3;
    EXPECT_LE(logit_error, tolerance) << "step " << step + 1;
    EXPECT_LE(hidden_error, tolerance) << "step " << step + 1;
    EXPECT_EQ(std::count(flipped.begin(), flipped.end(), true), 0) << "step " << step + 1 << ": rows whose selected centroid tokens differ";
    EXPECT_EQ(out.tokens, GoldenTokens(golden, rows, step)) << "step " << step + 1;
    rows.batch.tokens = out.tokens;
    hidden = out.hidden;
  }
}

// The drafter alone on `backend`: the golden's target K/V written into a paged cache, the
// golden's inputs at every step (its round hidden, then its draft tokens and fed hidden
// states), so that no error carries over from the target or from an earlier step.
struct TeacherForcedError {
  double logits = 0, hidden = 0;
  int rows = 0, set_flips = 0, token_mismatches = 0;
};

TeacherForcedError RunTeacherForced(Backend& backend, const Fixture& fixture, float token_margin_fraction) {
  TeacherForcedError err;
  auto target = Model::Load(MtpPath("gemma4_target"), backend);
  EXPECT_TRUE(target.ok()) << target.status().message();
  if (!target.ok()) return err;
  auto drafter = MtpDrafter::Load(MtpPath(fixture.assistant), **target, backend);
  EXPECT_TRUE(drafter.ok()) << drafter.status().message();
  if (!drafter.ok()) return err;
  SafetensorsFile golden = test::Golden(MtpPath(fixture.golden));
  const ModelConfig& tc = (*target)->config();
  const int64_t h = tc.hidden_size, vocab = tc.vocab_size;

  KVCache cache(tc, backend, 32, kBlock);
  std::vector<std::vector<int32_t>> tables;
  int next_block = 0;
  for (int k = 0; k < NumPrompts(golden); ++k) {
    const std::string ks = std::to_string(k);
    const int64_t len = golden.Get("target_k_full_" + ks).value().size(1);
    std::vector<int32_t> table, slots;
    for (int64_t i = 0; i < len; i += kBlock) table.push_back(next_block++);
    for (int64_t i = 0; i < len; ++i) slots.push_back(table[i / kBlock] * kBlock + static_cast<int32_t>(i % kBlock));
    const Tensor slot_tensor = backend.Upload([&] {
      Tensor t = Tensor::Host(DType::kI32, {len});
      std::copy(slots.begin(), slots.end(), t.data<int32_t>());
      return t;
    }());
    for (int layer : (*drafter)->target_kv_layers()) {
      const std::string kind = tc.layers[layer].sliding ? "sliding_" : "full_";
      const Tensor gk = golden.Get("target_k_" + kind + ks).value();  // [kv heads, len, head dim]
      const int64_t heads = gk.size(0), hd = gk.size(2);
      auto token_major = [&](const std::vector<float>& v) {  // -> [len, kv heads, head dim]
        std::vector<float> out(v.size());
        for (int64_t hh = 0; hh < heads; ++hh)
          for (int64_t t = 0; t < len; ++t)
            std::copy_n(v.begin() + (hh * len + t) * hd, hd, out.begin() + (t * heads + hh) * hd);
        return out;
      };
      const Tensor kt = UploadRows(backend, token_major(test::AsFloats(gk)), heads * hd).View({len, heads, hd});
      const Tensor vt =
          UploadRows(backend, token_major(Floats(golden, "target_v_" + kind + ks)), heads * hd).View({len, heads, hd});
      backend.StoreKV(kt, vt, slot_tensor, cache.k(layer), cache.v(layer));
    }
    tables.push_back(table);
  }
  EXPECT_LE(next_block, cache.num_blocks());

  Rows rows = GoldenRows(golden, tables);
  std::vector<float> hidden_in;
  for (size_t i = 0; i < rows.prompt.size(); ++i) {
    const std::vector<float> all = Floats(golden, "round_hidden_" + std::to_string(rows.prompt[i]));
    hidden_in.insert(hidden_in.end(), all.begin() + rows.round[i] * h, all.begin() + (rows.round[i] + 1) * h);
  }
  for (int step = 0; step < kDrafts; ++step) {
    const MtpDraftOutput out = (*drafter)->Step(rows.batch, UploadRows(backend, hidden_in, h), cache);
    const std::vector<float> gold_logits = GoldenStep(golden, rows, "draft_logits", step, vocab);
    std::vector<bool> flipped;
    err.logits = std::max(err.logits, LogitError(test::AsFloats(backend.Download(out.logits)), gold_logits, vocab,
                                                 fixture.centroid_head, &flipped));
    err.set_flips += static_cast<int>(std::count(flipped.begin(), flipped.end(), true));
    err.rows += static_cast<int>(rows.prompt.size());
    err.hidden = std::max(err.hidden, test::RelativeMaxError(test::AsFloats(backend.Download(out.hidden)),
                                                             GoldenStep(golden, rows, "draft_fed_hidden", step, h)));
    float max_logit = 0.0f;
    for (float v : gold_logits) max_logit = std::max(max_logit, std::abs(v));
    const std::vector<int32_t> gold_tokens = GoldenTokens(golden, rows, step);
    err.token_mismatches +=
        TokenMismatches(out.tokens, gold_tokens, gold_logits, vocab, token_margin_fraction * max_logit, flipped);
    rows.batch.tokens = gold_tokens;
    hidden_in = GoldenStep(golden, rows, "draft_fed_hidden", step, h);
  }
  return err;
}

TEST_P(MtpGoldenTest, CpuTeacherForcedOnGoldenKvMatchesGolden) {
  CpuBackend backend;
  const TeacherForcedError err = RunTeacherForced(backend, GetParam(), 0.0f);
  std::printf("[mtp cpu teacher-forced] %s: logits %.2e, hidden %.2e\n", GetParam().assistant.c_str(), err.logits,
              err.hidden);
  EXPECT_LE(err.logits, 1e-5);
  EXPECT_LE(err.hidden, 1e-5);
  EXPECT_EQ(err.set_flips, 0);
  EXPECT_EQ(err.token_mismatches, 0);
}

#ifdef HSX_HAS_CUDA
// bf16 on the device. No HF bf16 run of the assistant exists to scale a tolerance from, so
// the bound is set from bf16's precision: 5e-2 of the largest logit or hidden value after
// two layers (the H200 measured 3.5e-2 / 3.9e-2 with the centroid head, 3.9e-3 / 1.1e-2
// dense), below the target fixture's own bf16 error (0.14; HF's 0.19); the arg max must agree
// wherever the golden's top two logits are more than twice that apart; near-tied centroid
// scores may pick another cluster in bf16, in at most a tenth of the rows.
TEST_P(MtpGoldenTest, CudaBf16TeacherForcedOnGoldenKvMatchesGolden) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  constexpr double kTolerance = 5e-2;
  const TeacherForcedError err = RunTeacherForced(**gpu, GetParam(), static_cast<float>(2 * kTolerance));
  std::printf("[mtp cuda bf16 teacher-forced] %s: logits %.2e, hidden %.2e, %d of %d rows chose other centroids\n",
              GetParam().assistant.c_str(), err.logits, err.hidden, err.set_flips, err.rows);
  EXPECT_LE(err.logits, kTolerance);
  EXPECT_LE(err.hidden, kTolerance);
  EXPECT_EQ(err.token_mismatches, 0);
  EXPECT_LE(err.set_flips * 10, err.rows) << err.set_flips << " of " << err.rows << " rows chose other centroids";
}
#endif

INSTANTIATE_TEST_SUITE_P(Assistants, MtpGoldenTest, ::testing::Values(kRandom, kCopy),
                         [](const auto& info) { return info.param.centroid_head ? "centroid_head" : "dense_head"; });

// ---- the centroid-masked head op --------------------------------------------------------

// The reference written out: top_k clusters by value (NaN lowest, ties to the lower
// index), their tokens' dot products, the lowest float elsewhere.
std::vector<float> ReferenceCentroidLogits(const std::vector<float>& x, const std::vector<float>& centroid_logits,
                                           const std::vector<int32_t>& ordering, const std::vector<float>& lm_head,
                                           int64_t rows, int64_t hidden, int64_t clusters, int64_t vocab, int top_k) {
  std::vector<float> out(rows * vocab, std::numeric_limits<float>::lowest());
  const int64_t per = vocab / clusters;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<std::pair<float, int64_t>> ranked;
    for (int64_t c = 0; c < clusters; ++c) {
      const float v = centroid_logits[r * clusters + c];
      ranked.push_back({std::isnan(v) ? -std::numeric_limits<float>::infinity() : v, c});
    }
    std::sort(ranked.begin(), ranked.end(),
              [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    for (int k = 0; k < top_k; ++k) {
      for (int64_t j = 0; j < per; ++j) {
        const int32_t token = ordering[ranked[k].second * per + j];
        double dot = 0;
        for (int64_t i = 0; i < hidden; ++i) dot += static_cast<double>(x[r * hidden + i]) * lm_head[token * hidden + i];
        out[r * vocab + token] = static_cast<float>(dot);
      }
    }
  }
  return out;
}

struct CentroidCase {
  int64_t rows, hidden, clusters, vocab;
  int top_k;
  std::vector<float> x, centroid_logits, lm_head;
  std::vector<int32_t> ordering;
};

// Random inputs (bf16-representable); the centroid scores include ties and NaNs, which
// the selection rule orders.
CentroidCase RandomCentroidCase(int64_t rows, int64_t hidden, int64_t clusters, int64_t vocab, int top_k,
                                uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto bf16 = [&] { return BF16ToF32(F32ToBF16(dist(rng))); };
  CentroidCase c{rows, hidden, clusters, vocab, top_k, {}, {}, {}, {}};
  for (int64_t i = 0; i < rows * hidden; ++i) c.x.push_back(bf16());
  for (int64_t i = 0; i < vocab * hidden; ++i) c.lm_head.push_back(bf16());
  for (int64_t i = 0; i < rows * clusters; ++i) c.centroid_logits.push_back(std::round(bf16() * 2.0f) / 2.0f);  // ties
  c.centroid_logits[0] = std::numeric_limits<float>::quiet_NaN();
  c.ordering.resize(vocab);
  std::iota(c.ordering.begin(), c.ordering.end(), 0);
  std::shuffle(c.ordering.begin(), c.ordering.end(), rng);
  return c;
}

Tensor HostF32(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::Host(DType::kF32, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}
Tensor HostBf16(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::Host(DType::kBF16, std::move(shape));
  ConvertFromF32(v.data(), DType::kBF16, t.raw(), v.size());
  return t;
}
Tensor HostI32(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::Host(DType::kI32, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

TEST(CentroidMaskedLogitsTest, CpuMatchesReferenceWithTiesAndNaN) {
  CpuBackend cpu;
  const CentroidCase c = RandomCentroidCase(5, 24, 16, 256, 3, 7);
  Tensor logits = Tensor::Host(DType::kF32, {c.rows, c.vocab});
  std::fill(logits.data<float>(), logits.data<float>() + logits.numel(), std::numeric_limits<float>::quiet_NaN());
  cpu.CentroidMaskedLogits(HostF32(c.x, {c.rows, c.hidden}), HostF32(c.centroid_logits, {c.rows, c.clusters}),
                           HostI32(c.ordering, {c.clusters, c.vocab / c.clusters}),
                           HostBf16(c.lm_head, {c.vocab, c.hidden}), c.top_k, logits);
  const std::vector<float> want =
      ReferenceCentroidLogits(c.x, c.centroid_logits, c.ordering, c.lm_head, c.rows, c.hidden, c.clusters, c.vocab, c.top_k);
  const std::vector<float> got = test::AsFloats(logits);
  int selected = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == std::numeric_limits<float>::lowest()) {
      EXPECT_EQ(got[i], want[i]) << "entry " << i << " should be masked";
    } else {
      ++selected;
      EXPECT_NEAR(got[i], want[i], 1e-4f * std::max(1.0f, std::abs(want[i]))) << "entry " << i;
    }
  }
  EXPECT_EQ(selected, c.rows * c.top_k * (c.vocab / c.clusters));
}


// ---- errors ----------------------------------------------------------------------------

nlohmann::json FixtureJson(const std::string& rel) {
  return nlohmann::json::parse(ReadTextFile(MtpPath(rel)).value());
}

std::string ConfigError(const nlohmann::json& assistant, const nlohmann::json& target = FixtureJson("gemma4_target/config.json")) {
  auto drafter = ParseMtpConfig(assistant.dump(), "assistant/config.json");
  if (!drafter.ok()) return drafter.status().message();
  auto tc = ParseModelConfig(target.dump(), "target/config.json");
  if (!tc.ok()) return "target: " + tc.status().message();
  auto layers = MtpTargetKvLayers(*drafter, *tc, "assistant/config.json");
  return layers.ok() ? "" : layers.status().message();
}

TEST(MtpConfigTest, FixtureAssistantsFitTheTarget) {
  EXPECT_EQ(ConfigError(FixtureJson("gemma4_assistant/config.json")), "");
  EXPECT_EQ(ConfigError(FixtureJson("gemma4_assistant_copy/config.json")), "");
  auto c = ParseMtpConfig(ReadTextFile(MtpPath("gemma4_assistant/config.json")).value(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->centroid_head);
  EXPECT_EQ(c->num_centroids, 16);
  EXPECT_EQ(c->centroid_top_k, 4);
  EXPECT_EQ(c->backbone_hidden_size, 64);
  EXPECT_EQ(c->text.hidden_size, 32);
  EXPECT_EQ(c->text.layers[1].head_dim, 32);
  EXPECT_EQ(c->text.attention_scale(0), 1.0f);
}

TEST(MtpConfigTest, ErrorsNameTheField) {
  const nlohmann::json base = FixtureJson("gemma4_assistant/config.json");
  struct Case {
    std::function<void(nlohmann::json&, nlohmann::json&)> edit;  // assistant, target
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](auto& a, auto&) { a.erase("text_config"); }, "assistant/config.json: field 'text_config': missing"},
      {[](auto& a, auto&) { a["num_centroids"] = "many"; }, "field 'num_centroids': is string, expected an integer"},
      {[](auto& a, auto&) { a["num_centroids"] = 15; }, "field 'num_centroids': 15 must divide text_config.vocab_size (512)"},
      {[](auto& a, auto&) { a["centroid_intermediate_top_k"] = 17; }, "field 'centroid_intermediate_top_k': 17 must be at most"},
      {[](auto& a, auto&) { a["architectures"] = {"Gemma4ForCausalLM"}; }, "field 'architectures': expected [\"Gemma4AssistantForCausalLM\"]"},
      {[](auto& a, auto&) { a["draft_vocab_size"] = 3; }, "field 'draft_vocab_size': not supported"},
      {[](auto& a, auto&) { a["text_config"]["hidden_size_per_layer_input"] = 8; },
       "text_config: field 'hidden_size_per_layer_input': must be 0"},
      {[](auto& a, auto&) { a["text_config"]["num_kv_shared_layers"] = 1; },
       "text_config: field 'num_kv_shared_layers': every assistant layer reads the target's KV"},
      {[](auto& a, auto&) { a["text_config"]["rms_norm_eps"] = 0; }, "assistant/config.json: text_config: field 'rms_norm_eps'"},
      {[](auto& a, auto&) { a["backbone_hidden_size"] = 32; },
       "field 'backbone_hidden_size': 32, but the target's hidden_size is 64"},
      {[](auto& a, auto&) { a.erase("backbone_hidden_size"); },  // transformers' default, 1536
       "field 'backbone_hidden_size': 1536, but the target's hidden_size is 64"},
      {[](auto& a, auto&) { a["text_config"]["vocab_size"] = 256; },
       "text_config: field 'vocab_size': 256, but the target's vocab_size is 512"},
      // No target layer of the drafter layer's type to read KV from: the source is out of range.
      {[](auto&, auto& t) { t["sliding_window"] = nullptr; },
       "text_config: field 'layer_types': drafter layer 0 is sliding_attention, but the target has no "
       "sliding_attention layer with its own KV cache to read"},
      {[](auto& a, auto&) { a["text_config"]["per_layer_config"]["1"]["head_dim"] = 16; },
       "text_config: field 'head_dim': drafter layer 1 (full_attention) has head_dim 16, but the target layer 5 whose KV "
       "it reads has 32"},
      {[](auto& a, auto&) { a["text_config"]["num_key_value_heads"] = 1; },
       "text_config: field 'num_key_value_heads': drafter layer 0 has 1 KV heads, but the target layer 4"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    nlohmann::json a = base, t = FixtureJson("gemma4_target/config.json");
    cases[i].edit(a, t);
    const std::string err = ConfigError(a, t);
    EXPECT_NE(err.find(cases[i].expected), std::string::npos) << "case " << i << ": got '" << err << "'";
  }
  // A Gemma 3 target (the gemma3 fixture).
  auto drafter = ParseMtpConfig(base.dump(), "assistant/config.json");
  ASSERT_TRUE(drafter.ok());
  auto gemma3 = LoadModelConfig(test::ModelDir("gemma3"));
  ASSERT_TRUE(gemma3.ok());
  auto layers = MtpTargetKvLayers(*drafter, *gemma3, "assistant/config.json");
  ASSERT_FALSE(layers.ok());
  EXPECT_NE(layers.status().message().find("drafts for Gemma 4 targets; the target is Gemma3ForCausalLM"), std::string::npos)
      << layers.status().message();
}

// A checkpoint directory in a temp folder: the fixture assistant's files with config.json
// edited, so weight errors can be provoked without writing tensors.
class MtpCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("hsx_mtp_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& assistant, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = FixtureJson(assistant + "/config.json");
    edit(c);
    std::ofstream(dir_ / "config.json") << c.dump();
    std::filesystem::copy_file(MtpPath(assistant + "/model.safetensors"), dir_ / "model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    return dir_.string();
  }
  std::filesystem::path dir_;
};

TEST_F(MtpCheckpointTest, MissingCentroidTensorsAreNamed) {
  CpuBackend backend;
  auto target = Model::Load(MtpPath("gemma4_target"), backend);
  ASSERT_TRUE(target.ok());
  // The dense copy assistant has no masked_embedding.* tensors.
  const std::string dir = Write("gemma4_assistant_copy", [](auto& c) {
    c["use_ordered_embeddings"] = true;
    c["num_centroids"] = 16;
    c["centroid_intermediate_top_k"] = 4;
  });
  auto drafter = MtpDrafter::Load(dir, **target, backend);
  ASSERT_FALSE(drafter.ok());
  EXPECT_NE(drafter.status().message().find("missing tensor 'masked_embedding.centroids.weight' (expected shape [16, 64])"),
            std::string::npos)
      << drafter.status().message();
}

TEST_F(MtpCheckpointTest, ShapesThatDisagreeWithTheConfigAreNamed) {
  CpuBackend backend;
  auto target = Model::Load(MtpPath("gemma4_target"), backend);
  ASSERT_TRUE(target.ok());
  // intermediate_size 96 in the file, 128 claimed.
  const std::string dir = Write("gemma4_assistant", [](auto& c) { c["text_config"]["intermediate_size"] = 128; });
  auto drafter = MtpDrafter::Load(dir, **target, backend);
  ASSERT_FALSE(drafter.ok());
  EXPECT_NE(drafter.status().message().find("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 32]"),
            std::string::npos)
      << drafter.status().message();
}

TEST_F(MtpCheckpointTest, TokenOrderingOutsideTheVocabularyIsRefused) {
  CpuBackend backend;
  auto target = Model::Load(MtpPath("gemma4_target"), backend);
  ASSERT_TRUE(target.ok());
  // The centroid assistant's tensors, its token ordering naming token 512 of a 512-token
  // vocabulary (an out-of-bounds read of the head, were it used).
  const std::string dir = Write("gemma4_assistant", [](auto&) {});
  SafetensorsFile original = test::Golden(MtpPath("gemma4_assistant/model.safetensors"));
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : original.tensors()) {
    Tensor copy = Tensor::Host(t.dtype(), t.shape());
    std::memcpy(copy.raw(), t.raw(), t.nbytes());
    if (name == "masked_embedding.token_ordering") copy.data<int64_t>()[7] = 512;
    tensors.push_back({name, copy});
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  auto drafter = MtpDrafter::Load(dir, **target, backend);
  ASSERT_FALSE(drafter.ok());
  EXPECT_NE(drafter.status().message().find("tensor 'masked_embedding.token_ordering' entry 7 is 512, not a token id in [0, 512)"),
            std::string::npos)
      << drafter.status().message();
}

}  // namespace
}  // namespace hsx
