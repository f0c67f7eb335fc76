// Batch-invariant mode (--batch-invariant): a prompt's hidden states and greedy tokens are
// the same bits whatever it runs with: alone, batched with prompts of other lengths,
// after a prefix-cache hit, or chunked by a small token budget. Compared byte for byte on
// the CPU and, where there is one, on the GPU (skipped elsewhere), op by op (Linear rows
// against m, attention rows against their batch and chunking) and end to end. Each check
// has a negative control: the same comparison, with one input value changed in the runs
// compared against the reference, must see every case differ.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "backend/backend_factory.h"
#include "engine/engine.h"
#include "test_util.h"

namespace hsx {
namespace {

// The backend for a device in batch-invariant mode (or not); null without that device.
std::unique_ptr<Backend> MakeOrNull(const std::string& device, bool batch_invariant) {
  auto b = MakeBackend(device, batch_invariant);
  return b.ok() ? std::move(b).value() : nullptr;
}

// Each check below names the cases whose bits differ; nullopt without the device.
using Differences = std::optional<std::vector<std::string>>;

// The mode's tests: no case may differ.
void ExpectNone(const Differences& differing, const std::string& device) {
  if (!differing) GTEST_SKIP() << "no " << device << " device";
  for (const std::string& name : *differing) ADD_FAILURE() << name << ": differs";
}

// The negative controls: with one input value changed, all `compared` cases must differ.
void ExpectAll(const Differences& differing, size_t compared, const std::string& device) {
  if (!differing) GTEST_SKIP() << "no " << device << " device";
  EXPECT_GT(compared, 0u);
  EXPECT_EQ(differing->size(), compared) << "a changed input went unseen in some cases";
}

// Random values that bf16 holds exactly, on the backend in its compute dtype.
Tensor Random(Backend& b, Shape shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::Host(DType::kF32, std::move(shape));
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = BF16ToF32(F32ToBF16(dist(rng)));
  if (b.compute_dtype() == DType::kF32) return b.Upload(t);
  Tensor h = Tensor::Host(b.compute_dtype(), t.shape());
  ConvertFromF32(t.data<float>(), h.dtype(), h.raw(), static_cast<size_t>(t.numel()));
  return b.Upload(h);
}

// `t` with the value at flat `offset` increased by 1, as a new tensor on the backend (a copy:
// the CPU backend's Download shares t's storage).
Tensor WithOneValueChanged(Backend& b, const Tensor& t, int64_t offset) {
  const Tensor downloaded = b.Download(t);
  Tensor host = Tensor::Host(downloaded.dtype(), downloaded.shape());
  std::memcpy(host.raw(), downloaded.raw(), downloaded.nbytes());
  const size_t bytes = DTypeSize(host.dtype());
  float v = 0.0f;
  ConvertToF32(host.dtype(), host.data<char>() + offset * bytes, &v, 1);
  v += 1.0f;
  ConvertFromF32(&v, host.dtype(), host.data<char>() + offset * bytes, 1);
  return b.Upload(host);
}

// Bytes of rows [row, row + count) of a tensor on the host.
std::vector<char> RowBytes(const Tensor& host, int64_t row, int64_t count) {
  const size_t row_bytes = host.nbytes() / static_cast<size_t>(host.size(0));
  const char* p = host.data<char>() + row * row_bytes;
  return {p, p + count * row_bytes};
}

// Linear's rows computed in calls of different m against the same rows of the largest call;
// *compared counts the comparisons. With change_one_value, the calls of m rows use a weight
// with one value changed, so every comparison must differ.
Differences LinearDifferences(const std::string& device, bool batch_invariant, bool change_one_value = false,
                              size_t* compared = nullptr) {
  auto b = MakeOrNull(device, batch_invariant);
  if (!b) return std::nullopt;
  std::mt19937 rng(1);
  // Fixture widths, and on the GPU Qwen3-8B's projections (whose GEMMs cuBLASLt tunes per m).
  std::vector<std::pair<int64_t, int64_t>> shapes = {{64, 64}, {96, 200}, {1000, 136}, {512, 64}};
  std::vector<int64_t> ms = {1, 3, 17, 64, 65, 300, 1000};
  if (b->device() == Device::kCUDA) {
    shapes.insert(shapes.end(), {{4096, 4096}, {24576, 4096}, {4096, 12288}, {6144, 4096}});
    ms.insert(ms.end(), {4097, 16384});
  }
  std::vector<std::string> differing;
  for (auto [n, k] : shapes) {
    const int64_t max_m = ms.back();
    const Tensor x = Random(*b, {max_m, k}, rng), w = Random(*b, {n, k}, rng, 0.05f);
    // The reference: every row in the largest call; then calls of m rows starting at row
    // `first` (so rows also move within the blocks and tiles a GEMM splits m into).
    Tensor y_all = b->Empty(b->compute_dtype(), {max_m, n});
    b->Linear(x, w, nullptr, y_all);
    const Tensor all = b->Download(y_all);
    const Tensor w_calls = change_one_value ? WithOneValueChanged(*b, w, 0) : w;
    for (int64_t m : ms) {
      for (int64_t first : {int64_t{0}, int64_t{13}}) {
        if (first + m > max_m) continue;
        Tensor xm = b->Empty(b->compute_dtype(), {m, k}), ym = b->Empty(b->compute_dtype(), {m, n});
        std::vector<int32_t> rows(static_cast<size_t>(m));
        std::iota(rows.begin(), rows.end(), static_cast<int32_t>(first));
        b->GatherRows(x, rows, xm);
        b->Linear(xm, w_calls, nullptr, ym);
        if (compared != nullptr) ++*compared;
        if (RowBytes(b->Download(ym), 0, m) != RowBytes(all, first, m))
          differing.push_back("n=" + std::to_string(n) + " k=" + std::to_string(k) + " m=" + std::to_string(m) +
                              " from row " + std::to_string(first));
      }
    }
  }
  return differing;
}

// One sequence's queries (positions 400..699 of a 700-token context) computed alone, in
// chunks (one of a single token) and among other sequences, against the rows alone;
// *compared counts the comparisons. With change_one_value, the runs compared use a value
// cache with the last position's first value changed, so every comparison must differ.
Differences AttentionDifferences(const std::string& device, bool batch_invariant, bool change_one_value = false,
                                 size_t* compared = nullptr) {
  auto b = MakeOrNull(device, batch_invariant);
  if (!b) return std::nullopt;
  std::mt19937 rng(2);
  constexpr int kBlock = 16;
  std::vector<std::string> differing;
  struct Case { int64_t d; int window; float softcap; int64_t heads, kv_heads; };
  for (const Case& c : std::vector<Case>{{16, 0, 0, 4, 2}, {64, 16, 0, 8, 2}, {128, 0, 0, 8, 2}, {128, 100, 0, 4, 4},
                                         {128, 0, 30, 16, 4}, {128, 300, 0, 2, 1}, {256, 0, 0, 4, 2}}) {
    // Sequence 0 is the one compared; 1 and 2 are company of other lengths.
    const std::vector<std::pair<int, int>> seqs_q_ctx = {{300, 700}, {37, 500}, {1, 1000}};
    std::vector<int32_t> blocks(2200 / kBlock * 3);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    const int64_t slots = static_cast<int64_t>(blocks.size()) * kBlock;
    const Tensor kc = Random(*b, {slots, c.kv_heads, c.d}, rng), vc = Random(*b, {slots, c.kv_heads, c.d}, rng);
    std::vector<std::vector<int32_t>> tables;
    for (size_t s = 0, next = 0; s < seqs_q_ctx.size(); ++s) {
      tables.emplace_back(blocks.begin() + next, blocks.begin() + next + (seqs_q_ctx[s].second + kBlock - 1) / kBlock);
      next += tables.back().size();
    }
    const auto [q_len, ctx] = seqs_q_ctx[0];
    const int64_t last_slot = int64_t{tables[0][(ctx - 1) / kBlock]} * kBlock + (ctx - 1) % kBlock;
    const Tensor vc_changed = change_one_value ? WithOneValueChanged(*b, vc, last_slot * c.kv_heads * c.d) : vc;
    const Tensor q_target = Random(*b, {q_len, c.heads, c.d}, rng);
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    params.sliding_window = c.window;
    params.softcap = c.softcap;
    params.block_size = kBlock;

    // Runs target rows [r0, r0 + rows), with company around them or alone; returns the
    // target rows' output bytes.
    auto run = [&](int64_t r0, int64_t rows, bool with_company, const Tensor& v) {
      std::vector<SequenceSlice> seqs;
      std::vector<int32_t> gather;  // the q_target row of each batch row (company: any)
      auto add = [&](int s, int64_t first_row, int64_t n, int64_t ctx_len) {
        SequenceSlice slice;
        slice.q_start = static_cast<int32_t>(gather.size());
        slice.q_len = static_cast<int32_t>(n);
        slice.ctx_len = static_cast<int32_t>(ctx_len);
        slice.block_table = tables[s];
        seqs.push_back(slice);
        for (int64_t i = 0; i < n; ++i) gather.push_back(s == 0 ? static_cast<int32_t>(first_row + i) : 0);
      };
      if (with_company) add(1, 0, seqs_q_ctx[1].first, seqs_q_ctx[1].second);
      const int64_t target_start = static_cast<int64_t>(gather.size());
      add(0, r0, rows, ctx - q_len + r0 + rows);
      if (with_company) add(2, 0, seqs_q_ctx[2].first, seqs_q_ctx[2].second);
      Tensor q = b->Empty(b->compute_dtype(), {static_cast<int64_t>(gather.size()), c.heads, c.d});
      b->GatherRows(q_target, gather, q);
      Tensor out = b->Empty(b->compute_dtype(), q.shape());
      b->Attention(q, kc, v, MakeAttentionBatch(*b, seqs), params, out);
      return RowBytes(b->Download(out), target_start, rows);
    };
    const std::vector<char> alone = run(0, q_len, false, vc);
    std::vector<char> pieces;
    for (auto [r0, rows] : std::vector<std::pair<int, int>>{{0, 37}, {37, 1}, {38, 100}, {138, 162}}) {
      const std::vector<char> part = run(r0, rows, true, vc_changed);
      pieces.insert(pieces.end(), part.begin(), part.end());
    }
    const std::string label = "d=" + std::to_string(c.d) + " window=" + std::to_string(c.window) +
                              " softcap=" + std::to_string(static_cast<int>(c.softcap)) +
                              " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads);
    if (compared != nullptr) *compared += 2;
    if (run(0, q_len, true, vc_changed) != alone) differing.push_back("among other sequences, " + label);
    if (pieces != alone) differing.push_back("in chunks, " + label);
  }
  return differing;
}

class BatchInvariantOps : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariantOps, LinearRowsDoNotDependOnM) { ExpectNone(LinearDifferences(GetParam(), true), GetParam()); }
TEST_P(BatchInvariantOps, LinearComparisonSeesOneChangedWeight) {
  size_t compared = 0;
  const Differences differing = LinearDifferences(GetParam(), true, true, &compared);
  ExpectAll(differing, compared, GetParam());
}

TEST_P(BatchInvariantOps, AttentionRowsDoNotDependOnBatchOrChunking) {
  ExpectNone(AttentionDifferences(GetParam(), true), GetParam());
}
TEST_P(BatchInvariantOps, AttentionComparisonSeesOneChangedValue) {
  size_t compared = 0;
  const Differences differing = AttentionDifferences(GetParam(), true, true, &compared);
  ExpectAll(differing, compared, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Devices, BatchInvariantOps, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

// End to end: the engine on a fixture model, one prompt in several schedules.
struct PromptRun {
  std::vector<char> hidden;  // the captured [T, L, H] in the compute dtype
  std::vector<int32_t> tokens;
};

struct Scenario {
  std::string name;
  int budget = 8192;                              // max_num_batched_tokens
  std::vector<std::vector<int32_t>> before;       // run to completion first (prefix cache on)
  std::vector<std::vector<int32_t>> company;      // added with the prompt (the first one ahead of it)
};

PromptRun RunPrompt(Model& model, const std::vector<int32_t>& prompt, const Scenario& scenario) {
  EngineConfig c;
  c.num_blocks = 256;
  c.capture_dtype = model.backend().compute_dtype();
  for (int l = 0; l <= model.config().num_layers; ++l) c.capture_layers.push_back(l);
  c.scheduler.max_num_batched_tokens = scenario.budget;
  Engine engine(model, c);
  auto drain = [&] {
    std::vector<std::unique_ptr<Sequence>> done;
    while (engine.has_work())
      for (auto& s : engine.Step()) done.push_back(std::move(s));
    return done;
  };
  int id = 0;
  for (const auto& p : scenario.before) {
    EXPECT_TRUE(engine.Add({"before" + std::to_string(id++), p, 2}).ok());
  }
  drain();
  for (size_t i = 0; i < scenario.company.size(); ++i) {
    EXPECT_TRUE(engine.Add({"company" + std::to_string(i), scenario.company[i], 3}).ok());
    if (i == 0) {
      EXPECT_TRUE(engine.Add({"target", prompt, 4}).ok());
    }
  }
  if (scenario.company.empty()) {
    EXPECT_TRUE(engine.Add({"target", prompt, 4}).ok());
  }
  PromptRun run;
  for (auto& s : drain()) {
    if (s->request().id != "target") continue;
    const Tensor& h = s->hidden_states;
    run.hidden.assign(h.data<char>(), h.data<char>() + h.nbytes());
    run.tokens = s->generated();
  }
  // The hit must be real (the company's random prompts share nothing).
  if (!scenario.before.empty()) {
    EXPECT_GT(engine.prefix_cache_hit_rate(), 0.0) << scenario.name << ": no cache hit";
  }
  EXPECT_FALSE(run.hidden.empty()) << scenario.name;
  return run;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> dist(3, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& v : t) v = dist(rng);
  return t;
}

// The schedules every prompt is compared across; the first is the reference (alone).
std::vector<Scenario> Scenarios(const std::vector<int32_t>& prompt, int vocab) {
  std::mt19937 rng(7);
  const auto other = [&](int n) { return RandomTokens(rng, n, vocab); };
  std::vector<int32_t> shares_prefix(prompt.begin(), prompt.begin() + 100);  // 6 full blocks
  const std::vector<int32_t> tail = other(30);
  shares_prefix.insert(shares_prefix.end(), tail.begin(), tail.end());
  return {
      {"alone", 8192, {}, {}},
      {"batched with 5, 37 and 300 tokens", 8192, {}, {other(5), other(37), other(300)}},
      {"batched behind 300 tokens", 8192, {}, {other(300), other(1)}},
      {"after a prefix-cache hit on 96 tokens", 8192, {shares_prefix}, {other(45)}},
      {"after a prefix-cache hit on the whole prompt", 8192, {prompt}, {}},
      {"chunked by 16 tokens", 16, {}, {other(20), other(7)}},
      {"chunked by 37 tokens", 37, {}, {other(50), other(3)}},
      {"chunked by 100 tokens after a cache hit", 100, {shares_prefix}, {other(200)}},
  };
}

// The scenarios in which the prompt's bits differ from the prompt alone, for one model on
// one device; the reference run goes to *reference_out.
Differences EngineDifferences(const std::string& device, const std::string& model_name, bool batch_invariant,
                              PromptRun* reference_out = nullptr) {
  auto b = MakeOrNull(device, batch_invariant);
  if (!b) return std::nullopt;
  auto model = Model::Load(test::ModelDir(model_name), *b);
  if (!model.ok()) return std::vector<std::string>{"loading the model: " + model.status().message()};
  const int vocab = (*model)->config().vocab_size;
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt = RandomTokens(rng, 213, vocab);
  const std::vector<Scenario> scenarios = Scenarios(prompt, vocab);
  const PromptRun reference = RunPrompt(**model, prompt, scenarios[0]);
  std::vector<std::string> differing;
  for (size_t i = 1; i < scenarios.size(); ++i) {
    const PromptRun run = RunPrompt(**model, prompt, scenarios[i]);
    if (run.hidden != reference.hidden || run.tokens != reference.tokens) differing.push_back(scenarios[i].name);
  }
  if (reference_out != nullptr) *reference_out = reference;
  return differing;
}

class BatchInvariantEngine : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(BatchInvariantEngine, SamePromptSameBitsWhateverTheSchedule) {
  const auto& [device, model] = GetParam();
  PromptRun reference;
  const Differences differing = EngineDifferences(device, model, true, &reference);
  ExpectNone(differing, device);
  if (!differing) return;
  ASSERT_FALSE(reference.hidden.empty());
  EXPECT_TRUE(std::any_of(reference.hidden.begin(), reference.hidden.end(), [](char c) { return c != 0; }));
  EXPECT_EQ(reference.tokens.size(), 4u);
}

// The negative control: the prompt with its last token changed, run alone, gives the same
// bits at every earlier position (attention is causal) and other bits at the last, so the
// byte comparison above sees a change of one token.
TEST_P(BatchInvariantEngine, ComparisonSeesAChangedLastToken) {
  const auto& [device, model_name] = GetParam();
  auto b = MakeOrNull(device, true);
  if (!b) GTEST_SKIP() << "no " << device << " device";
  auto model = Model::Load(test::ModelDir(model_name), *b);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const int vocab = (*model)->config().vocab_size;
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt = RandomTokens(rng, 213, vocab);
  std::vector<int32_t> changed = prompt;
  changed.back() = prompt.back() + 1 < vocab ? prompt.back() + 1 : 3;
  const Scenario alone = Scenarios(prompt, vocab)[0];
  const PromptRun a = RunPrompt(**model, prompt, alone), c = RunPrompt(**model, changed, alone);
  ASSERT_EQ(a.hidden.size(), c.hidden.size());
  ASSERT_EQ(a.hidden.size() % prompt.size(), 0u);
  const size_t last_row = a.hidden.size() - a.hidden.size() / prompt.size();
  EXPECT_TRUE(std::equal(a.hidden.begin(), a.hidden.begin() + last_row, c.hidden.begin())) << "earlier positions changed";
  EXPECT_FALSE(std::equal(a.hidden.begin() + last_row, a.hidden.end(), c.hidden.begin() + last_row))
      << "the changed last token went unseen";
}

// Through the binary: extract's files (bytes, header included) under three schedules, and
// the flag on every command that runs the model.
TEST(BatchInvariantCli, ExtractFilesAreIdenticalAcrossBudgetsAndBatches) {
  char tmpl[] = "/tmp/hsx-batch-invariant-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::mt19937 rng(5);
  {
    std::ofstream prompts(dir + "/prompts.jsonl");
    for (int n : {213, 5, 90, 300, 17}) {
      prompts << nlohmann::json{{"id", "p" + std::to_string(n)}, {"token_ids", RandomTokens(rng, n, 512)}}.dump()
              << "\n";
    }
  }
  auto extract = [&](const std::string& out, const std::string& flags) {
    const std::string cmd = std::string(HSX_BINARY) + " extract --model " + test::ModelDir("gemma3") +
                            " --layers 0,3,6 --dtype float32 --batch-invariant --input " + dir +
                            "/prompts.jsonl --output " + dir + "/" + out + " " + flags + " 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  };
  extract("big", "");
  extract("chunked", "--max-num-batched-tokens 16 --max-num-seqs 3");
  extract("single", "--max-num-seqs 1");
  auto slurp = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (int n : {213, 5, 90, 300, 17}) {
    const std::string name = "/p" + std::to_string(n) + ".safetensors";
    const std::string big = slurp(dir + "/big" + name);
    EXPECT_GT(big.size(), static_cast<size_t>(n) * 3 * 64 * 4) << name;
    EXPECT_TRUE(slurp(dir + "/chunked" + name) == big) << name << " chunked";
    EXPECT_TRUE(slurp(dir + "/single" + name) == big) << name << " alone";
  }
  for (const char* command : {"extract", "generate", "serve", "bench"}) {
    const std::string cmd = std::string(HSX_BINARY) + " " + command + " --help | grep -q -- --batch-invariant";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << command << " lacks --batch-invariant";
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchInvariantEngine,
                         ::testing::Combine(::testing::Values("cpu", "cuda"),
                                            ::testing::Values("qwen3", "gemma3", "qwen3_moe", "gemma4")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
}  // namespace hsx

namespace hsx {
namespace {

// A conversation regenerated in one sequence (Request::next_turn) whose known tokens outrun
// the capture buffer's headroom, so it grows twice: every row is the row a plain prefill of
// the final tokens gives, bit for bit (batch-invariant CPU), and the buffer holds all of them.
TEST(EngineTurns, CaptureBufferGrowsAcrossTurnsKeepingEveryRow) {
  auto b = MakeOrNull("cpu", true);
  ASSERT_TRUE(b);
  auto model = Model::Load(test::ModelDir("qwen3"), *b);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const int vocab = (*model)->config().vocab_size;
  EngineConfig c;
  c.num_blocks = 256;
  c.capture_dtype = DType::kF32;
  c.capture_layers = {0, 1, (*model)->config().num_layers};
  std::mt19937 rng(3);
  const int64_t known = Engine::kTurnHeadroomRows + 40;  // past the headroom: each turn grows the buffer
  std::vector<int32_t> final_tokens;
  Tensor regenerated;
  {
    Engine engine(**model, c);
    Request r{"conversation", RandomTokens(rng, 20, vocab), 3};
    r.include_output_tokens = true;
    int turns = 0;
    r.next_turn = [&](const Sequence&) -> std::optional<Request::Turn> {
      if (++turns > 3) return std::nullopt;
      return Request::Turn{RandomTokens(rng, static_cast<int>(known), vocab), turns < 3 ? 3 : 0};
    };
    ASSERT_TRUE(engine.Add(std::move(r)).ok());
    while (engine.has_work()) {
      for (auto& s : engine.Step()) {
        ASSERT_TRUE(s->error.ok()) << s->error.message();
        final_tokens = s->tokens();
        regenerated = s->hidden_states;
      }
    }
  }
  ASSERT_EQ(final_tokens.size(), 20u + 3 + known + 3 + known + 3 + known);
  ASSERT_EQ(regenerated.size(0), static_cast<int64_t>(final_tokens.size()));  // the last known token runs too
  Engine engine(**model, c);
  ASSERT_TRUE(engine.Add({"plain", final_tokens, 1}).ok());
  Tensor plain;
  while (engine.has_work()) {
    for (auto& s : engine.Step()) plain = s->hidden_states;
  }
  ASSERT_EQ(plain.shape(), regenerated.shape());
  EXPECT_EQ(std::memcmp(plain.raw(), regenerated.raw(), plain.nbytes()), 0);
}

}  // namespace
}  // namespace hsx
