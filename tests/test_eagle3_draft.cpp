// EAGLE-3 drafts in speculators' format (tests/data/eagle3, goldens from speculators'
// own forward): fc output, the first pass over every prompt position (whole and in two
// chunks), and K = 3 chained draft steps, on the CPU (f32) and CUDA (bf16) backends; a
// first pass padded as a graph runs it; then broken configs and checkpoints, each failing
// with an error that names the field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "model/eagle3_draft.h"
#include "test_util.h"
#ifdef HSX_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace hsx {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 3;  // the goldens' K
constexpr int kBlock = 16;

std::string DraftDir(const std::string& variant) { return test::DataPath("eagle3/" + variant); }

// A host f32 tensor as the backend's compute dtype, on its device.
Tensor ToDevice(Backend& backend, const Tensor& f32) {
  if (backend.compute_dtype() == DType::kF32) return backend.Upload(f32);
  Tensor t = Tensor::Host(backend.compute_dtype(), f32.shape());
  ConvertFromF32(f32.data<float>(), t.dtype(), t.raw(), static_cast<size_t>(f32.numel()));
  return backend.Upload(t);
}

// NaN bytes over a whole buffer, so a slot a kernel should have written and did not
// poisons whatever reads it.
void Poison(Backend& backend, Tensor& t) {
  Tensor host = Tensor::Host(t.dtype(), t.shape());
  std::memset(host.raw(), 0xff, host.nbytes());
  backend.Copy(backend.Upload(host), t);
}

double MaxAbsError(const std::vector<float>& a, const std::vector<float>& b) {
  double err = a.size() == b.size() ? 0.0 : std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    err = std::max(err, d);
  }
  return err;
}

std::vector<float> Slice(const std::vector<float>& v, int64_t begin, int64_t end) {
  return std::vector<float>(v.begin() + begin, v.begin() + end);
}

// What one run of the draft over a golden file produced, per prompt k.
struct DraftResults {
  std::vector<std::vector<float>> fc_out, prefill_logits, draft_logits, draft_prenorm;
  std::vector<std::vector<int32_t>> draft_tokens;
};

struct RunOptions {
  int chunks = 1;                     // the first pass in this many equal parts (chunked prefill)
  bool teacher_forced = false;        // steps take the golden's tokens (a bf16 run may flip a near tie)
  bool kv_only_early_chunks = false;  // parts before the last ask for no logits: they only fill the KV
  bool store_kv = false;              // ... through StoreKV (the engine's pass when no request drafts)
  std::string draft_dir;              // an edited checkpoint instead of the variant's (golden inputs kept)
};

// Drives the draft as vLLM's proposer does, over every golden prompt packed into one
// batch: the first pass at positions 0..T-1 (row j: token prompt[j+1], or the target's
// next token at j = T-1, and fc of aux state j), each part one forward over all prompts;
// then K-1 steps of one token per prompt at position T-2+s, fed the previous step's
// greedy token and next_hidden.
DraftResults RunDraft(Backend& backend, const std::string& variant, const RunOptions& options = {}) {
  const int chunks = options.chunks;
  const std::string& draft_dir = options.draft_dir;
  auto target = Model::Load(test::ModelDir(test::Eagle3Target(variant)), backend);
  EXPECT_TRUE(target.ok()) << target.status().message();
  auto loaded = Eagle3Draft::Load(draft_dir.empty() ? DraftDir(variant) : draft_dir, **target, backend);
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!target.ok() || !loaded.ok()) return {};
  Eagle3Draft& draft = **loaded;
  const SafetensorsFile golden = test::Golden(DraftDir(variant) + "/golden.safetensors");
  const int prompts = golden.tensors().count("prompt_3") ? 4 : 3;
  const int64_t h = draft.decoder().hidden_size, a = draft.config().num_aux();

  KVCache cache(draft.decoder(), backend, 64, kBlock);
  for (int i = 0; i < draft.decoder().num_layers; ++i) {
    Poison(backend, cache.k(i));
    Poison(backend, cache.v(i));
  }
  struct Seq {
    std::vector<int32_t> tokens, block_table;
    Tensor hidden;  // [T, H]: fc of the aux states
    int32_t length = 0;
  };
  std::vector<Seq> seqs(prompts);
  DraftResults out;
  int next_block = 0;
  for (int k = 0; k < prompts; ++k) {
    const std::string n = std::to_string(k);
    Seq& s = seqs[k];
    const std::vector<int32_t> prompt = test::AsIds(golden.Get("prompt_" + n).value());
    s.length = static_cast<int32_t>(prompt.size());
    s.tokens.assign(prompt.begin() + 1, prompt.end());
    s.tokens.push_back(test::AsIds(golden.Get("next_token_" + n).value())[0]);
    for (int32_t p = 0; p < s.length + kSteps; p += kBlock) s.block_table.push_back(next_block++);
    // aux [T, A, H]: the golden's layout is CombineHiddenStates'
    const std::vector<float> aux = test::AsFloats(golden.Get("aux_hidden_" + n).value());
    Tensor host = Tensor::Host(DType::kF32, {s.length, a, h});
    std::memcpy(host.data<float>(), aux.data(), aux.size() * sizeof(float));
    s.hidden = draft.CombineHiddenStates(ToDevice(backend, host));
    out.fc_out.push_back(test::AsFloats(backend.Download(s.hidden)));
  }
  auto slot = [&](const Seq& s, int32_t pos) { return s.block_table[pos / kBlock] * kBlock + pos % kBlock; };

  // First pass, chunk c of every prompt in one forward.
  out.prefill_logits.resize(prompts);
  std::vector<Tensor> fed(prompts);  // next_hidden of each prompt's last row
  for (int c = 0; c < chunks; ++c) {
    const bool wants_logits = !options.kv_only_early_chunks || c + 1 == chunks;
    ForwardBatch batch;
    std::vector<Tensor> parts;
    std::vector<std::pair<int, int32_t>> row_owner;  // (prompt, position) per logit row
    for (int k = 0; k < prompts; ++k) {
      const Seq& s = seqs[k];
      const int32_t begin = s.length * c / chunks, end = s.length * (c + 1) / chunks;
      SequenceSlice slice;
      slice.q_start = static_cast<int32_t>(batch.token_ids.size());
      slice.q_len = end - begin;
      slice.ctx_len = end;
      slice.block_table = s.block_table;
      batch.seqs.push_back(slice);
      for (int32_t p = begin; p < end; ++p) {
        if (wants_logits) {
          batch.logit_rows.push_back(static_cast<int32_t>(batch.token_ids.size()));
          row_owner.push_back({k, p});
        }
        batch.token_ids.push_back(s.tokens[p]);
        batch.positions.push_back(p);
        batch.slot_mapping.push_back(slot(s, p));
      }
      parts.push_back(s.hidden.Rows(begin, end));
    }
    // The chunk's hidden rows, packed like the batch.
    Tensor hidden = backend.Empty(backend.compute_dtype(), {static_cast<int64_t>(batch.token_ids.size()), h});
    int64_t at = 0;
    for (const Tensor& part : parts) {
      Tensor dst = hidden.Rows(at, at + part.size(0));
      backend.Copy(part, dst);
      at += part.size(0);
    }
    if (!wants_logits && options.store_kv) {
      draft.StoreKV(batch, hidden, cache);
      continue;
    }
    Eagle3Output result = draft.Forward(batch, hidden, cache);
    if (!wants_logits) {
      EXPECT_FALSE(result.logits.defined());
      continue;
    }
    const std::vector<float> logits = test::AsFloats(backend.Download(result.logits));
    const int64_t vd = result.logits.size(1);
    for (size_t r = 0; r < row_owner.size(); ++r) {
      auto& dst = out.prefill_logits[row_owner[r].first];
      dst.insert(dst.end(), logits.begin() + r * vd, logits.begin() + (r + 1) * vd);
      if (row_owner[r].second == seqs[row_owner[r].first].length - 1) {
        const int64_t row = static_cast<int64_t>(r);
        fed[row_owner[r].first] = result.next_hidden.Rows(row, row + 1);
        out.draft_logits.resize(prompts);
        out.draft_prenorm.resize(prompts);
        out.draft_tokens.resize(prompts);
        auto& k_logits = out.draft_logits[row_owner[r].first];
        k_logits.insert(k_logits.end(), logits.begin() + r * vd, logits.begin() + (r + 1) * vd);
        const std::vector<float> pre = test::AsFloats(backend.Download(result.prenorm.Rows(row, row + 1)));
        out.draft_prenorm[row_owner[r].first] = pre;
        Tensor row_logits = result.logits.Rows(row, row + 1);
        out.draft_tokens[row_owner[r].first].push_back(draft.GreedyTargetTokens(row_logits)[0]);
      }
    }
  }

  // Steps 2..K: one token per prompt, all prompts in one batch.
  for (int step = 2; step <= kSteps; ++step) {
    ForwardBatch batch;
    Tensor hidden = backend.Empty(backend.compute_dtype(), {prompts, h});
    for (int k = 0; k < prompts; ++k) {
      const Seq& s = seqs[k];
      const int32_t pos = s.length - 2 + step;
      SequenceSlice slice;
      slice.q_start = k;
      slice.q_len = 1;
      slice.ctx_len = pos + 1;
      slice.block_table = s.block_table;
      batch.seqs.push_back(slice);
      batch.logit_rows.push_back(k);
      const std::vector<int32_t> golden_tokens = test::AsIds(golden.Get("draft_tokens_" + std::to_string(k)).value());
      batch.token_ids.push_back(options.teacher_forced ? golden_tokens[step - 2] : out.draft_tokens[k].back());
      batch.positions.push_back(pos);
      batch.slot_mapping.push_back(slot(s, pos));
      Tensor dst = hidden.Rows(k, k + 1);
      backend.Copy(fed[k], dst);
    }
    Eagle3Output result = draft.Forward(batch, hidden, cache);
    const std::vector<float> logits = test::AsFloats(backend.Download(result.logits));
    const std::vector<float> pre = test::AsFloats(backend.Download(result.prenorm));
    const std::vector<int32_t> tokens = draft.GreedyTargetTokens(result.logits);
    const int64_t vd = result.logits.size(1);
    for (int k = 0; k < prompts; ++k) {
      out.draft_logits[k].insert(out.draft_logits[k].end(), logits.begin() + k * vd, logits.begin() + (k + 1) * vd);
      out.draft_prenorm[k].insert(out.draft_prenorm[k].end(), pre.begin() + k * h, pre.begin() + (k + 1) * h);
      out.draft_tokens[k].push_back(tokens[k]);
      fed[k] = result.next_hidden.Rows(k, k + 1);
    }
  }
  return out;
}

const std::vector<std::string>& Variants() {
  static const std::vector<std::string> kVariants = {"llama_legacy", "qwen3_default", "llama_copy"};
  return kVariants;
}

class Eagle3GoldenTest : public ::testing::TestWithParam<std::string> {};

// Bounds on the max abs difference from the golden, per tensor.
struct Tolerances {
  double fc_out, prefill_logits, draft_logits, draft_prenorm;
};

// Every golden tensor within its tolerance; tokens exactly, unless `token_margin` > 0:
// then a token may differ only where the golden's top two logits are closer than that.
void ExpectMatchesGolden(const DraftResults& out, const std::string& variant, const Tolerances& tolerance,
                         double token_margin) {
  const SafetensorsFile golden = test::Golden(DraftDir(variant) + "/golden.safetensors");
  ASSERT_FALSE(out.fc_out.empty());
  for (size_t k = 0; k < out.fc_out.size(); ++k) {
    const std::string n = std::to_string(k);
    auto check = [&](const std::vector<float>& mine, const char* key, double bound) {
      const double err = MaxAbsError(mine, test::AsFloats(golden.Get(key + n).value()));
      EXPECT_LE(err, bound) << variant << " " << key << n;
      std::printf("[eagle3] %-13s %-16s max abs error %.3e\n", variant.c_str(), (key + n).c_str(), err);
    };
    check(out.fc_out[k], "fc_out_", tolerance.fc_out);
    check(out.prefill_logits[k], "prefill_logits_", tolerance.prefill_logits);
    check(out.draft_logits[k], "draft_logits_", tolerance.draft_logits);
    check(out.draft_prenorm[k], "draft_prenorm_", tolerance.draft_prenorm);
    const std::vector<int32_t> tokens = test::AsIds(golden.Get("draft_tokens_" + n).value());
    const std::vector<float> logits = test::AsFloats(golden.Get("draft_logits_" + n).value());
    const size_t vd = logits.size() / kSteps;
    for (int s = 0; s < kSteps; ++s) {
      std::vector<float> row = Slice(logits, s * vd, (s + 1) * vd);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
      if (token_margin > 0 && row[0] - row[1] < token_margin) continue;
      EXPECT_EQ(out.draft_tokens[k][s], tokens[s]) << variant << " prompt " << k << " step " << s + 1;
      // Later steps ran on this token: after a flip they no longer follow the golden.
      if (out.draft_tokens[k][s] != tokens[s]) break;
    }
  }
}

// speculators reproduces itself to 1.5e-6 with an independent implementation (the
// fixture README); hsx's f32 CPU path, with other summation orders, stays within 1e-5
// (measured: at most 5.0e-6, on llama_copy's prefill logits).
constexpr double kF32Tolerance = 1e-5;
constexpr Tolerances kF32 = {kF32Tolerance, kF32Tolerance, kF32Tolerance, kF32Tolerance};

TEST_P(Eagle3GoldenTest, CpuMatchesSpeculators) {
  CpuBackend backend;
  ExpectMatchesGolden(RunDraft(backend, GetParam()), GetParam(), kF32, 0.0);
}

TEST_P(Eagle3GoldenTest, CpuChunkedFirstPassMatchesWhole) {
  CpuBackend backend;
  const DraftResults whole = RunDraft(backend, GetParam());
  // Teacher-forced, as the CUDA test runs: on an exact path the same tokens as self-fed.
  const DraftResults chunked = RunDraft(backend, GetParam(), {.chunks = 2, .teacher_forced = true});
  ExpectMatchesGolden(chunked, GetParam(), kF32, 0.0);
  ASSERT_EQ(whole.prefill_logits.size(), chunked.prefill_logits.size());
  for (size_t k = 0; k < whole.prefill_logits.size(); ++k) {
    EXPECT_LE(MaxAbsError(chunked.prefill_logits[k], whole.prefill_logits[k]), kF32Tolerance) << "prompt " << k;
    EXPECT_LE(MaxAbsError(chunked.draft_logits[k], whole.draft_logits[k]), kF32Tolerance) << "prompt " << k;
    EXPECT_EQ(chunked.draft_tokens[k], whole.draft_tokens[k]) << "prompt " << k;
  }
  // The engine asks a partial prefill's draft pass for no logits: it only fills the KV,
  // through Forward or (a step where no request drafts) StoreKV alone.
  for (const bool store_kv : {false, true}) {
    const DraftResults kv_only =
        RunDraft(backend, GetParam(), {.chunks = 3, .kv_only_early_chunks = true, .store_kv = store_kv});
    for (size_t k = 0; k < whole.draft_logits.size(); ++k) {
      EXPECT_LE(MaxAbsError(kv_only.draft_logits[k], whole.draft_logits[k]), kF32Tolerance) << "prompt " << k;
      EXPECT_LE(MaxAbsError(kv_only.draft_prenorm[k], whole.draft_prenorm[k]), kF32Tolerance) << "prompt " << k;
      EXPECT_EQ(kv_only.draft_tokens[k], whole.draft_tokens[k]) << "prompt " << k;
    }
  }
}

#ifdef HSX_HAS_CUDA
// The error a bf16 forward has on these drafts: tests/data/generators/eagle3_bf16_error.py
// rounds every op of the draft to bf16 as a PyTorch bf16 eager run does (the fixtures hold
// no bf16 run of speculators) and prints these max abs errors against the f32 goldens.
Tolerances Bf16Reference(const std::string& variant) {
  if (variant == "llama_legacy") return {1.826e-2, 2.665e-2, 2.763e-2, 4.801e-2};
  if (variant == "qwen3_default") return {1.456e-2, 3.373e-2, 4.993e-2, 6.925e-2};
  return {3.288e-4, 1.150e-1, 1.613e-2, 3.195e-2};  // llama_copy
}

// The CUDA bf16 draft within 2x that error, whole and chunked; the chained steps take
// the golden's tokens (as the reference does), and a draft token may differ from the
// golden's only where its top two logits are within twice the logits' bound. 2x, not the
// fixture test's 1.5x: the reference is an emulation that rounds after every op, and
// hsx's kernels round elsewhere (fused norms, f32 accumulation through attention); the
// H200 measured up to 1.6x of it (llama_legacy draft_prenorm_1, 7.7e-2 against 4.8e-2).
TEST_P(Eagle3GoldenTest, CudaBf16WithinTwiceTheBf16Reference) {
  auto gpu = CudaBackend::Create(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device";
  const Tolerances ref = Bf16Reference(GetParam());
  const Tolerances bound = {2 * ref.fc_out, 2 * ref.prefill_logits, 2 * ref.draft_logits, 2 * ref.draft_prenorm};
  for (int chunks : {1, 2}) {
    ExpectMatchesGolden(RunDraft(**gpu, GetParam(), {.chunks = chunks, .teacher_forced = true}), GetParam(), bound,
                        2 * bound.draft_logits);
  }
  // Early parts that only keep the KV (StoreKV's k/v projections alone) leave what Forward
  // does: the draft steps that read that KV (early parts give no prefill logits to compare).
  const DraftResults whole = RunDraft(**gpu, GetParam(), {.teacher_forced = true});
  const DraftResults kept =
      RunDraft(**gpu, GetParam(), {.chunks = 3, .teacher_forced = true, .kv_only_early_chunks = true, .store_kv = true});
  ASSERT_EQ(kept.draft_logits.size(), whole.draft_logits.size());
  for (size_t k = 0; k < whole.draft_logits.size(); ++k) {
    EXPECT_LE(MaxAbsError(kept.draft_logits[k], whole.draft_logits[k]), bound.draft_logits) << "prompt " << k;
    EXPECT_LE(MaxAbsError(kept.draft_prenorm[k], whole.draft_prenorm[k]), bound.draft_prenorm) << "prompt " << k;
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(Variants, Eagle3GoldenTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param; });

// A sliding window the prompts reach (qwen3_default's 2048 never is): rows within the
// window see what full attention sees; later rows see less, so their logits move.
TEST(Eagle3SlidingTest, WindowedLayersSeeOnlyTheWindow) {
  char tmpl[] = "/tmp/hsx-eagle3-window-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  fs::copy_file(DraftDir("qwen3_default") + "/model.safetensors", dir + "/model.safetensors");
  test::EditJsonFile(
      DraftDir("qwen3_default") + "/config.json",
      [](nlohmann::json& j) { j["transformer_layer_config"]["sliding_window"] = 8; }, dir + "/config.json");
  CpuBackend backend;
  auto target = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto full = Eagle3Draft::Load(DraftDir("qwen3_default"), **target, backend);
  auto windowed = Eagle3Draft::Load(dir, **target, backend);
  ASSERT_TRUE(full.ok() && windowed.ok());
  EXPECT_TRUE((*windowed)->decoder().layers[0].sliding);
  EXPECT_EQ((*windowed)->decoder().sliding_window, 8);
  EXPECT_EQ((*full)->decoder().sliding_window, 2048);

  const DraftResults a = RunDraft(backend, "qwen3_default");
  const DraftResults b = RunDraft(backend, "qwen3_default", {.draft_dir = dir});
  fs::remove_all(dir);
  ASSERT_EQ(a.prefill_logits.size(), b.prefill_logits.size());
  const int64_t vd = (*full)->config().draft_vocab_size;
  for (size_t k = 1; k < a.prefill_logits.size(); ++k) {  // T = 37, 130
    const int64_t t = static_cast<int64_t>(a.prefill_logits[k].size()) / vd;
    double inside = 0, beyond = 0;
    for (int64_t j = 0; j < t; ++j) {
      const double d = MaxAbsError(Slice(a.prefill_logits[k], j * vd, (j + 1) * vd), Slice(b.prefill_logits[k], j * vd, (j + 1) * vd));
      double& worst = j < 8 ? inside : beyond;
      worst = std::max(worst, d);
    }
    EXPECT_LE(inside, kF32Tolerance) << "prompt " << k;
    EXPECT_GT(beyond, 1e-2) << "prompt " << k;
  }
}

// A first pass padded at a sequence's front, as a draft round's graph runs it (every
// sequence q rows; padding rows at the positions before, with the first real row's token
// and hidden, storing no KV; each sequence's logit row its block's last, sliced): the real
// rows' logits and next hidden are the unpadded pass's, and so is the draft's KV, which a
// later step reads. Negative control: padding rows that store their KV change that step.
TEST(Eagle3PaddingTest, FrontPaddedFirstPassIsTheUnpaddedOne) {
  CpuBackend backend;
  auto target = Model::Load(test::ModelDir("llama"), backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto loaded = Eagle3Draft::Load(DraftDir("llama_legacy"), **target, backend);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Eagle3Draft& draft = **loaded;
  const int64_t h = draft.decoder().hidden_size;
  constexpr int kLen = 8;  // positions of each of two sequences; sequence s owns block s
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, draft.decoder().vocab_size - 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int32_t tokens[2][kLen];
  for (auto& seq : tokens)
    for (int32_t& t : seq) t = token(rng);
  std::vector<float> hidden_rows(2 * kLen * h);
  for (float& x : hidden_rows) x = normal(rng);

  struct Span {
    int seq, begin, end;  // positions [begin, end) whose KV stays
  };
  auto pass = [&](KVCache& cache, const std::vector<Span>& spans, int width, bool padding_stores) {
    ForwardBatch batch;
    std::vector<int> rows;  // each row's (sequence, position) as seq * kLen + position
    for (const Span& s : spans) {
      const int q = std::max(width, s.end - s.begin);
      SequenceSlice slice;
      slice.q_start = static_cast<int32_t>(batch.token_ids.size());
      slice.q_len = q;
      slice.ctx_len = s.end;
      slice.block_table = {s.seq};
      for (int p = s.end - q; p < s.end; ++p) {
        const bool padding = p < s.begin;
        const int from = padding ? s.begin : p;
        batch.token_ids.push_back(tokens[s.seq][from]);
        batch.positions.push_back(p);
        batch.slot_mapping.push_back(padding && !padding_stores ? -1 : s.seq * kBlock + p);
        rows.push_back(s.seq * kLen + from);
      }
      batch.logit_rows.push_back(static_cast<int32_t>(batch.token_ids.size()) - 1);
      batch.seqs.push_back(std::move(slice));
    }
    Tensor hidden = backend.Empty(DType::kF32, {static_cast<int64_t>(rows.size()), h});
    for (size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(hidden_rows.begin() + rows[r] * h, h, hidden.data<float>() + r * h);
    }
    const Eagle3Output out = draft.Forward(batch, hidden, cache);
    return std::make_pair(test::AsFloats(backend.Download(out.logits)), test::AsFloats(backend.Download(out.next_hidden)));
  };
  // Prefill, then a first pass of 2 rows for sequence 0 and 1 row for sequence 1 (padded
  // to 2), then one more step of each: its logits read the KV the first pass left.
  auto run = [&](int width, bool padding_stores) {
    KVCache cache(draft.decoder(), backend, 2, kBlock);
    pass(cache, {{0, 0, 5}, {1, 0, 3}}, 0, false);
    const auto first = pass(cache, {{0, 5, 7}, {1, 3, 4}}, width, padding_stores);
    const auto next = pass(cache, {{0, 7, 8}, {1, 4, 5}}, 0, false);
    return std::make_tuple(first.first, first.second, next.first);
  };
  const auto [logits, hidden, next] = run(0, false);
  const auto [padded_logits, padded_hidden, padded_next] = run(2, false);
  EXPECT_LE(MaxAbsError(padded_logits, logits), kF32Tolerance);
  EXPECT_LE(MaxAbsError(padded_hidden, hidden), kF32Tolerance);
  EXPECT_LE(MaxAbsError(padded_next, next), kF32Tolerance);
  const auto [stored_logits, stored_hidden, stored_next] = run(2, true);
  EXPECT_GT(MaxAbsError(stored_next, next), 1e-3);  // position 2 holds the padding row's KV
}

// ---- Broken drafts ------------------------------------------------------------------

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "expected '" << (needle) << "' in: " << (haystack)

class Eagle3ErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsx-eagle3-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    for (const char* name : {"config.json", "model.safetensors"}) {
      fs::copy_file(DraftDir("llama_legacy") + "/" + name, dir_ + "/" + name);
      fs::permissions(dir_ + "/" + name, fs::perms::owner_write, fs::perm_options::add);
    }
    auto target = Model::Load(test::ModelDir("llama"), backend_);
    ASSERT_TRUE(target.ok()) << target.status().message();
    target_ = std::move(target).value();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string LoadError() {
    auto draft = Eagle3Draft::Load(dir_, *target_, backend_);
    EXPECT_FALSE(draft.ok());
    return draft.ok() ? "" : draft.status().message();
  }
  void EditConfig(const std::function<void(nlohmann::json&)>& edit) { test::EditJsonFile(dir_ + "/config.json", edit); }
  // Rewrites model.safetensors with one tensor replaced (or removed, when undefined).
  void ReplaceTensor(const std::string& name, const Tensor& value) {
    const SafetensorsFile file = SafetensorsFile::Open(DraftDir("llama_legacy") + "/model.safetensors").value();
    std::vector<NamedTensor> tensors;
    for (const auto& [n, t] : file.tensors()) {
      if (n != name) tensors.push_back({n, t});
    }
    if (value.defined()) tensors.push_back({name, value});
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors).ok());
  }

  CpuBackend backend_;
  std::unique_ptr<Model> target_;
  std::string dir_;
};

TEST_F(Eagle3ErrorTest, TheUnbrokenCopyLoads) {
  auto draft = Eagle3Draft::Load(dir_, *target_, backend_);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  EXPECT_EQ((*draft)->config().aux_layer_ids, std::vector<int>({1, 2, 3}));
  EXPECT_EQ((*draft)->config().num_speculative_tokens, 3);
  // What other writers add: the layer config's own class name (or null).
  for (const nlohmann::json& names : {nlohmann::json({"LlamaForCausalLM"}), nlohmann::json()}) {
    EditConfig([&](auto& j) { j["transformer_layer_config"]["architectures"] = names; });
    auto again = Eagle3Draft::Load(dir_, *target_, backend_);
    EXPECT_TRUE(again.ok()) << again.status().message();
  }
}

TEST_F(Eagle3ErrorTest, MissingConfigFieldsAreNamed) {
  EditConfig([](auto& j) { j.erase("norm_before_residual"); });
  EXPECT_CONTAINS(LoadError(), "config.json: field 'norm_before_residual': missing");
  EditConfig([](auto& j) {
    j["norm_before_residual"] = false;
    j["transformer_layer_config"].erase("model_type");
  });
  EXPECT_CONTAINS(LoadError(), "config.json: transformer_layer_config: field 'model_type': missing");
  // The layer config is read as the target parser reads a Llama config: an omitted field
  // is transformers' default (num_attention_heads 32), which the weights then contradict.
  EditConfig([](auto& j) {
    j["transformer_layer_config"]["model_type"] = "llama";
    j["transformer_layer_config"].erase("num_attention_heads");
  });
  EXPECT_CONTAINS(LoadError(), "tensor 'layers.0.self_attn.q_proj.weight' has shape [64, 128], but config.json implies [512, 128]");
  EditConfig([](auto& j) {
    j["transformer_layer_config"]["num_attention_heads"] = 4;
    j["transformer_layer_config"]["rms_norm_eps"] = "small";
  });
  EXPECT_CONTAINS(LoadError(), "config.json: transformer_layer_config: field 'rms_norm_eps': is string, expected a number");
  EditConfig([](auto& j) { j.erase("transformer_layer_config"); });
  EXPECT_CONTAINS(LoadError(), "config.json: field 'transformer_layer_config': missing");
  EditConfig([](auto& j) { j["speculators_model_type"] = "dflash"; });
  EXPECT_CONTAINS(LoadError(), "field 'speculators_model_type': 'dflash' is not supported");
}

TEST_F(Eagle3ErrorTest, UnknownAndContradictoryFieldsAreRefused) {
  EditConfig([](auto& j) { j["mystery_flag"] = true; });
  EXPECT_CONTAINS(LoadError(), "config.json: field 'mystery_flag': not supported");
  EditConfig([](auto& j) {
    j.erase("mystery_flag");
    j["norm_before_fc"] = true;
    j["fc_norm"] = true;
  });
  EXPECT_CONTAINS(LoadError(), "field 'fc_norm': true together with norm_before_fc");
  EditConfig([](auto& j) {
    j["fc_norm"] = false;
    j["transformer_layer_config"]["model_type"] = "mistral";
  });
  EXPECT_CONTAINS(LoadError(), "transformer_layer_config: field 'model_type': 'mistral' is not supported");
  EditConfig([](auto& j) {
    j["transformer_layer_config"]["model_type"] = "llama";
    j["transformer_layer_config"]["architectures"] = {"Qwen3ForCausalLM"};
  });
  EXPECT_CONTAINS(LoadError(), "field 'architectures': [\"Qwen3ForCausalLM\"] disagrees with model_type 'llama'");
  // Sliding Llama draft layers (vLLM's reading): layer_types names them, sliding_window sizes them.
  EditConfig([](auto& j) {
    j["transformer_layer_config"].erase("architectures");
    j["transformer_layer_config"]["layer_types"] = {"sliding_attention"};
  });
  EXPECT_CONTAINS(LoadError(), "transformer_layer_config: field 'sliding_window': missing");
  EditConfig([](auto& j) {
    j["transformer_layer_config"]["sliding_window"] = 16;
    j["transformer_layer_config"]["use_sliding_window"] = false;
  });
  EXPECT_CONTAINS(LoadError(), "field 'use_sliding_window': false, but layer_types lists sliding_attention layers");
  EditConfig([](auto& j) {
    j["transformer_layer_config"].erase("layer_types");
    j["transformer_layer_config"]["use_sliding_window"] = true;
  });
  EXPECT_CONTAINS(LoadError(), "field 'use_sliding_window': true without layer_types");
  EditConfig([](auto& j) { j["transformer_layer_config"]["layer_types"] = {"sliding_attention", "full_attention"}; });
  EXPECT_CONTAINS(LoadError(), "field 'layer_types': expected a list of 1 layer types");
}

TEST_F(Eagle3ErrorTest, AuxLayerIdsOutOfRange) {
  EditConfig([](auto& j) { j["eagle_aux_hidden_state_layer_ids"] = {1, 2, 5}; });
  EXPECT_CONTAINS(LoadError(), "config.json: field 'eagle_aux_hidden_state_layer_ids': entry 5 is out of range [0, 4]");
  EditConfig([](auto& j) { j["eagle_aux_hidden_state_layer_ids"] = {-1, 2, 3}; });
  EXPECT_CONTAINS(LoadError(), "field 'eagle_aux_hidden_state_layer_ids': entry -1 is out of range [0, 4]");
  EditConfig([](auto& j) { j["eagle_aux_hidden_state_layer_ids"] = {2, 2, 3}; });
  EXPECT_CONTAINS(LoadError(), "field 'eagle_aux_hidden_state_layer_ids': lists a layer id twice");
  // Two ids where fc was trained on three: the weight's shape says so.
  EditConfig([](auto& j) { j["eagle_aux_hidden_state_layer_ids"] = {1, 3}; });
  EXPECT_CONTAINS(LoadError(), "tensor 'fc.weight' has shape [64, 192], but config.json implies [64, 128]");
}

TEST_F(Eagle3ErrorTest, DefaultAuxLayerIdsAreVllms) {
  // null: (2, N/2, N-3) = (2, 2, 1) for the 4-layer target, deduplicated as vLLM stores them.
  EditConfig([](auto& j) { j["eagle_aux_hidden_state_layer_ids"] = nullptr; });
  EXPECT_CONTAINS(LoadError(), "tensor 'fc.weight' has shape [64, 192], but config.json implies [64, 128]");
  ModelConfig deeper = target_->config();
  deeper.num_layers = 32;
  std::ifstream in(dir_ + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  auto config = ParseEagle3Config(text, "config.json", deeper);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->aux_layer_ids, std::vector<int>({2, 16, 29}));
}

TEST_F(Eagle3ErrorTest, HiddenSizeAndVocabularyMustFitTheTarget) {
  std::ifstream in(dir_ + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  ModelConfig wider = target_->config();
  wider.hidden_size = 128;
  auto e = ParseEagle3Config(text, "draft/config.json", wider);
  ASSERT_FALSE(e.ok());
  EXPECT_CONTAINS(e.status().message(),
                  "draft/config.json: transformer_layer_config: field 'hidden_size': 64, but the target's hidden size is 128");
  ModelConfig larger_vocab = target_->config();
  larger_vocab.vocab_size = 1024;
  e = ParseEagle3Config(text, "draft/config.json", larger_vocab);
  ASSERT_FALSE(e.ok());
  EXPECT_CONTAINS(e.status().message(), "field 'vocab_size': 512, but the target's vocabulary has 1024 tokens");
  EditConfig([](auto& j) { j["target_hidden_size"] = 4096; });
  EXPECT_CONTAINS(LoadError(), "field 'target_hidden_size': 4096, but the target's hidden size is 64");
  EditConfig([](auto& j) {
    j["target_hidden_size"] = nullptr;
    j["draft_vocab_size"] = 600;
  });
  EXPECT_CONTAINS(LoadError(), "field 'draft_vocab_size': 600 is out of range [1, 512]");
}

TEST_F(Eagle3ErrorTest, VocabularyMapOutOfRange) {
  const SafetensorsFile file = SafetensorsFile::Open(DraftDir("llama_legacy") + "/model.safetensors").value();
  Tensor d2t = Tensor::Host(DType::kI64, {256});
  std::memcpy(d2t.raw(), file.Get("d2t").value().raw(), d2t.nbytes());
  d2t.data<int64_t>()[255] = 400;  // draft id 255 -> target id 655 >= 512
  ReplaceTensor("d2t", d2t);
  EXPECT_CONTAINS(LoadError(), "tensor 'd2t': entry 255 is 400, which maps draft id 255 outside the target vocabulary [0, 512)");
  d2t.data<int64_t>()[255] = -300;
  ReplaceTensor("d2t", d2t);
  EXPECT_CONTAINS(LoadError(), "tensor 'd2t': entry 255 is -300");
  std::memcpy(d2t.raw(), file.Get("d2t").value().raw(), d2t.nbytes());
  const uint8_t* t2d = file.Get("t2d").value().data<uint8_t>();
  const int64_t unmarked = std::find(t2d, t2d + 512, 0) - t2d;
  d2t.data<int64_t>()[0] = unmarked;  // draft id 0 -> a target id outside the draft vocabulary
  ReplaceTensor("d2t", d2t);
  EXPECT_CONTAINS(LoadError(), "tensors 'd2t' and 't2d' disagree: d2t maps draft id 0 to target id " + std::to_string(unmarked));
  ReplaceTensor("d2t", Tensor());
  EXPECT_CONTAINS(LoadError(), "missing tensor 'd2t' (expected shape [256])");
}

TEST_F(Eagle3ErrorTest, TensorsAreCheckedByNameShapeAndDtype) {
  ReplaceTensor("lm_head.weight", Tensor());
  EXPECT_CONTAINS(LoadError(), "missing tensor 'lm_head.weight' (expected shape [256, 64]; the target's head cannot stand in");
  ReplaceTensor("input_norm.weight", Tensor::Host(DType::kBF16, {192}));
  EXPECT_CONTAINS(LoadError(), "tensor 'input_norm.weight' is not part of the EAGLE-3 draft config.json describes");
  ReplaceTensor("layers.0.self_attn.q_proj.weight", Tensor::Host(DType::kBF16, {64, 64}));
  EXPECT_CONTAINS(LoadError(), "tensor 'layers.0.self_attn.q_proj.weight' has shape [64, 64], but config.json implies [64, 128]");
}

// The original EAGLE repository's `midlayer.*` names read as layers.0.*; both at once are refused.
TEST_F(Eagle3ErrorTest, MidlayerNamesAreLayerZero) {
  const SafetensorsFile file = SafetensorsFile::Open(DraftDir("llama_legacy") + "/model.safetensors").value();
  std::vector<NamedTensor> renamed;
  for (const auto& [n, t] : file.tensors()) renamed.push_back({n.rfind("layers.0.", 0) == 0 ? "midlayer." + n.substr(9) : n, t});
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", renamed).ok());
  auto draft = Eagle3Draft::Load(dir_, *target_, backend_);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  const Tensor want = file.Get("layers.0.self_attn.q_proj.weight").value();
  const Tensor q = (*draft)->weights().layers[0].qkv_proj.Rows(0, want.size(0));  // q's rows come first
  EXPECT_EQ(std::memcmp(q.raw(), want.raw(), q.nbytes()), 0);
  renamed.push_back({"layers.0.self_attn.q_proj.weight", file.Get("layers.0.self_attn.q_proj.weight").value()});
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", renamed).ok());
  EXPECT_CONTAINS(LoadError(), "tensor 'midlayer.self_attn.q_proj.weight' is given twice (as midlayer.* and layers.0.*)");
}

// A draft over the full vocabulary without its own head uses the target's (vLLM shares it).
TEST(Eagle3HeadTest, AbsentFullVocabularyHeadIsTheTargets) {
  char tmpl[] = "/tmp/hsx-eagle3-head-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  fs::copy_file(DraftDir("qwen3_default") + "/config.json", dir + "/config.json");
  const SafetensorsFile file = SafetensorsFile::Open(DraftDir("qwen3_default") + "/model.safetensors").value();
  std::vector<NamedTensor> tensors;
  for (const auto& [n, t] : file.tensors()) {
    if (n != "lm_head.weight") tensors.push_back({n, t});
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  CpuBackend backend;
  auto target = Model::Load(test::ModelDir("qwen3"), backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto draft = Eagle3Draft::Load(dir, **target, backend);
  fs::remove_all(dir);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  EXPECT_EQ((*draft)->weights().lm_head.raw(), (*target)->weights().lm_head.raw());
  EXPECT_NE((*draft)->weights().embed_tokens.raw(), (*target)->weights().embed_tokens.raw());  // its own
}

TEST_F(Eagle3ErrorTest, AbsentEmbeddingIsTheTargets) {
  ReplaceTensor("embed_tokens.weight", Tensor());
  auto draft = Eagle3Draft::Load(dir_, *target_, backend_);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  EXPECT_EQ((*draft)->weights().embed_tokens.raw(), target_->weights().embed_tokens.raw());
}

}  // namespace
}  // namespace hsx
