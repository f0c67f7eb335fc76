// EAGLE-3 drafts over a gpt-oss target, in the format `speculators train` writes for one
// (eagle3/gpt_oss_default: a llama draft layer with the verifier's yarn RoPE, norm_before_fc,
// a 256-token draft vocabulary; eagle3/gpt_oss_lookup: the same config with weights that
// propose the token HF's greedy decode put after the current one, so drafts are accepted).
// Held to: the config resolves as speculators and vLLM read it, what hsx does not run is refused by
// name, the aux states the draft reads are the target's layers that extraction captures
// (and HF's hidden states there), and greedy output with drafts is the plain decode's.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "engine/draft_length.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/eagle3_draft.h"
#include "engine_runs.h"
#include "test_util.h"

namespace hsx {
namespace {

using json = nlohmann::json;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "expected '" << (needle) << "' in: " << (haystack)

std::string DraftDir(const std::string& variant) { return test::DataPath("eagle3/" + variant); }

json DraftConfigJson(const std::string& variant) {
  return json::parse(std::ifstream(DraftDir(variant) + "/config.json"));
}

TEST(GptOssEagle3Config, ResolvesAsSpeculatorsWritesIt) {
  CpuBackend backend;
  auto target = Model::Load(test::ModelDir("gpt_oss"), backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto draft = Eagle3Draft::Load(DraftDir("gpt_oss_default"), **target, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  const Eagle3Config& c = (*draft)->config();
  const ModelConfig& t = (*target)->config();
  EXPECT_EQ(c.aux_layer_ids, std::vector<int>({1, 2, 3}));
  EXPECT_TRUE(c.norm_before_fc && c.norm_before_residual && c.norm_output && !c.fc_norm);
  EXPECT_EQ(c.draft_vocab_size, 256);
  EXPECT_EQ((*draft)->weights().d2t.size(), 256u);
  EXPECT_EQ(c.num_speculative_tokens, 3);
  // The draft decoder: one llama layer, sliding (2048, speculators' default, not the
  // target's window), no biases or sinks, and the target's yarn RoPE: the same inverse
  // frequencies and attention factor (so the same softmax scale as a target layer).
  const ModelConfig& d = c.decoder;
  ASSERT_EQ(d.num_layers, 1);
  EXPECT_EQ(d.arch, Arch::kLlama);
  EXPECT_TRUE(d.layers[0].sliding);
  EXPECT_EQ(d.sliding_window, 2048);
  EXPECT_FALSE(d.qkv_bias || d.o_bias || d.attention_sinks);
  const RopeSpec& dr = d.layers[0].rope;
  const RopeSpec& tr = t.layers[1].rope;  // a full-attention layer of the target
  EXPECT_EQ(dr.type, RopeSpec::Type::kYarn);
  EXPECT_EQ(dr.factor, tr.factor);
  EXPECT_EQ(dr.truncate, tr.truncate);
  EXPECT_FALSE(dr.truncate);  // gpt-oss's "truncate": false
  EXPECT_NE(dr.attention_factor, 1.0);
  EXPECT_EQ(dr.attention_factor, tr.attention_factor);
  int dims_d = 0, dims_t = 0;
  EXPECT_EQ(RopeInverseFrequencies(dr, d.layers[0].head_dim, &dims_d),
            RopeInverseFrequencies(tr, t.layers[1].head_dim, &dims_t));
  EXPECT_EQ(dims_d, dims_t);
  EXPECT_EQ(d.attention_scale(0), t.attention_scale(1));
}

// A gpt-oss draft config with what hsx does not run: each refused, the field named.
TEST(GptOssEagle3Config, RefusesWhatItDoesNotRunByName) {
  CpuBackend backend;
  auto target = Model::Load(test::ModelDir("gpt_oss"), backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  const ModelConfig& t = (*target)->config();
  const json base = DraftConfigJson("gpt_oss_default");
  auto error = [&](const std::function<void(json&)>& edit) {
    json j = base;
    edit(j);
    auto c = ParseEagle3Config(j.dump(), "draft/config.json", t);
    EXPECT_FALSE(c.ok());
    return c.ok() ? std::string() : c.status().message();
  };
  auto layer = [&](const std::function<void(json&)>& edit) {
    return error([&](json& j) { edit(j["transformer_layer_config"]); });
  };
  // The verifier's own config as the draft decoder (--draft-config of a gpt_oss config):
  // vLLM builds llama and qwen3 EAGLE-3 drafts only.
  json verifier = json::parse(std::ifstream(test::ModelDir("gpt_oss") + "/config.json"));
  verifier["num_hidden_layers"] = 1;
  EXPECT_CONTAINS(error([&](json& j) { j["transformer_layer_config"] = verifier; }),
                  "draft/config.json: transformer_layer_config: field 'model_type': 'gpt_oss' is not supported for "
                  "EAGLE-3 drafts");
  // gpt-oss's attention biases and sinks copied into the llama layer.
  EXPECT_CONTAINS(layer([](json& l) { l["attention_bias"] = true; }),
                  "transformer_layer_config: field 'attention_bias': projection biases are not supported");
  EXPECT_CONTAINS(layer([](json& l) { l["mlp_bias"] = true; }), "transformer_layer_config: field 'mlp_bias'");
  for (const char* field : {"swiglu_limit", "num_local_experts", "sinks"}) {
    EXPECT_CONTAINS(layer([&](json& l) { l[field] = 1; }), std::string("'") + field + "'") << field;
  }
  // RoPE fields of the yarn dict that the draft does not read are refused, not dropped.
  EXPECT_CONTAINS(layer([](json& l) { l["rope_parameters"]["mrope_section"] = {4, 2, 2}; }), "mrope_section");
  EXPECT_CONTAINS(layer([](json& l) { l["rope_parameters"]["rope_type"] = "su"; }), "rope_type");
  // Speculators' per-layer-type RoPE (Laguna-style nesting) is not what a llama layer reads.
  EXPECT_CONTAINS(layer([](json& l) {
                    const json flat = l["rope_parameters"];
                    l["rope_parameters"] = {{"sliding_attention", flat}, {"full_attention", flat}};
                  }),
                  "rope_parameters");
  // Top-level options of other speculators models.
  EXPECT_CONTAINS(error([](json& j) { j["fc_norm"] = true; }), "field 'fc_norm': true together with norm_before_fc");
  EXPECT_CONTAINS(error([](json& j) { j["speculators_model_type"] = "peagle"; }), "field 'speculators_model_type'");
  EXPECT_CONTAINS(error([](json& j) { j["mask_token_id"] = 200017; }), "mask_token_id");
  // The defaults (2, N/2, N-3) fit gpt-oss-20b's 24 layers: (2, 12, 21), vLLM's for GptOss.
  ModelConfig twenty = t;
  twenty.num_layers = 24;
  json null_ids = base;
  null_ids["eagle_aux_hidden_state_layer_ids"] = nullptr;
  auto c = ParseEagle3Config(null_ids.dump(), "draft/config.json", twenty);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->aux_layer_ids, std::vector<int>({2, 12, 21}));
}

// The aux states a draft reads are the target's layers that extraction captures, bit for
// bit, and HF's hidden states at those layer ids (the fixture's golden), not their neighbours'.
TEST(GptOssEagle3, AuxStatesAreTheCapturedLayers) {
  CpuBackend backend(/*batch_invariant=*/true);
  auto target = Model::Load(test::ModelDir("gpt_oss"), backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto draft = Eagle3Draft::Load(DraftDir("gpt_oss_default"), **target, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  const std::vector<int>& ids = (*draft)->config().aux_layer_ids;
  SafetensorsFile golden = test::Golden(test::ModelDir("gpt_oss") + "/golden.safetensors");
  const std::vector<int32_t> prompt = test::AsIds(golden.Get("prompt_1").value());  // 37 tokens: past the window of 16
  const int64_t t = static_cast<int64_t>(prompt.size()), h = (*target)->config().hidden_size;
  const int64_t layers = (*target)->config().num_layers + 1;
  constexpr int kBlock = 16;
  ForwardBatch batch;
  SequenceSlice s;
  s.q_start = 0;
  s.q_len = s.ctx_len = static_cast<int32_t>(t);
  for (int64_t i = 0; i <= t; i += kBlock) s.block_table.push_back(static_cast<int32_t>(i / kBlock));
  for (int64_t i = 0; i < t; ++i) {
    batch.token_ids.push_back(prompt[i]);
    batch.positions.push_back(static_cast<int32_t>(i));
    batch.slot_mapping.push_back(static_cast<int32_t>(i));
  }
  batch.seqs.push_back(s);
  batch.logit_rows.push_back(static_cast<int32_t>(t - 1));
  SamplingBatch sampling;
  sampling.rows.resize(1);

  RunnerConfig drafting;
  drafting.num_blocks = 8;
  drafting.block_size = kBlock;
  drafting.graphs = false;
  drafting.eagle3 = draft->get();
  ModelRunner draft_runner(**target, drafting);
  const StepResult drafted = draft_runner.Run(batch, sampling);
  const Tensor aux = backend.Download(draft_runner.step_aux());
  ASSERT_EQ(aux.shape(), (Shape{static_cast<int64_t>(ids.size()), t, h}));

  CaptureStaging staging(64);
  RunnerConfig extracting = drafting;
  extracting.eagle3 = nullptr;
  extracting.capture_layers = ids;
  extracting.capture_staging = &staging;
  ModelRunner capture_runner(**target, extracting);
  StepResult captured = capture_runner.Run(batch, sampling);
  ASSERT_NE(captured.captured, nullptr);
  captured.captured->Wait();
  EXPECT_EQ(drafted.sampled.tokens, captured.sampled.tokens);
  const std::vector<float> read = test::AsFloats(aux), stored = test::AsFloats(captured.captured->rows());
  EXPECT_EQ(read, stored) << "the draft reads other rows than extraction stores";

  const std::vector<float> gold = test::AsFloats(golden.Get("hidden_1").value());  // [T, N + 1, H]
  auto golden_layer = [&](int id) {
    std::vector<float> rows;
    for (int64_t i = 0; i < t; ++i) rows.insert(rows.end(), gold.begin() + (i * layers + id) * h, gold.begin() + (i * layers + id + 1) * h);
    return rows;
  };
  for (size_t a = 0; a < ids.size(); ++a) {
    const std::vector<float> mine(read.begin() + a * t * h, read.begin() + (a + 1) * t * h);
    EXPECT_LE(test::RelativeMaxError(mine, golden_layer(ids[a])), 1e-4) << "aux layer id " << ids[a];
    EXPECT_GT(test::RelativeMaxError(mine, golden_layer(ids[a] - 1)), 1e-2) << "aux layer id " << ids[a] << " vs one below";
  }
}

using test::Generation;

// The golden prompts and one that repeats itself, batched, under chunked prefill.
Generation Generate(Model& model, const EngineConfig& config, int max_new_tokens) {
  SafetensorsFile golden = test::Golden(test::ModelDir("gpt_oss") + "/golden.safetensors");
  return test::Generate(model, test::GoldenPrompts(golden, /*with_loop=*/true), config, max_new_tokens);
}

// (target, draft): the bf16 and the MXFP4 gpt-oss fixtures under both drafts.
class GptOssEagle3Engine : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GptOssEagle3Engine, GreedyOutputIsThePlainDecodes) {
  const auto& [target_name, variant] = GetParam();
  CpuBackend backend(/*batch_invariant=*/true);
  auto model = Model::Load(test::ModelDir(target_name), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto draft = Eagle3Draft::Load(DraftDir(variant), **model, backend);
  ASSERT_TRUE(draft.ok()) << draft.status().message();
  EngineConfig plain;
  plain.scheduler.max_num_batched_tokens = 48;  // chunked prefill beside decodes and verifications
  const Generation reference = Generate(**model, plain, 32);
  const DraftCostModel cost;  // unmeasured: a step costs 1, a draft step 0.1 (deterministic choices)
  for (int k : {1, 3, 5}) {
    for (bool adaptive : {false, true}) {
      if (adaptive && k == 1) continue;
      EngineConfig speculative = plain;
      speculative.eagle3 = {draft->get(), k};
      speculative.draft_length.adaptive = adaptive;
      if (adaptive) speculative.draft_length.cost_model = &cost;
      const Generation run = Generate(**model, speculative, 32);
      const std::string what = target_name + " " + variant + " K=" + std::to_string(k) + (adaptive ? " adaptive" : "");
      EXPECT_EQ(run.tokens, reference.tokens) << what;
      EXPECT_GT(run.stats.num_draft_tokens, 0u) << what;
      if (variant == "gpt_oss_lookup" && !adaptive) {
        EXPECT_GT(run.stats.num_accepted_tokens, 0u) << what;
      }
      std::printf("[eagle3] %-26s accepted %lu of %lu drafts, %lu steps (plain %lu)\n", what.c_str(),
                  static_cast<unsigned long>(run.stats.num_accepted_tokens),
                  static_cast<unsigned long>(run.stats.num_draft_tokens), static_cast<unsigned long>(run.stats.steps),
                  static_cast<unsigned long>(reference.stats.steps));
    }
  }
}

// Prompt lookup over gpt-oss with adaptive draft lengths (fixed K: test_speculative's
// NgramDraftsLeaveGreedyOutputUnchanged/gpt_oss*): greedy output is the plain decode's.
TEST(GptOssNgram, AdaptiveDraftsLeaveGreedyOutputUnchanged) {
  for (const std::string& name : test::GptOssFixtureModels()) {
    CpuBackend backend(/*batch_invariant=*/true);
    auto model = Model::Load(test::ModelDir(name), backend);
    ASSERT_TRUE(model.ok()) << model.status().message();
    EngineConfig plain;
    plain.scheduler.max_num_batched_tokens = 48;
    const Generation reference = Generate(**model, plain, 32);
    const DraftCostModel cost;
    EngineConfig ngram = plain;
    ngram.ngram = {3, 1, 3};
    ngram.draft_length.adaptive = true;
    ngram.draft_length.cost_model = &cost;
    const Generation run = Generate(**model, ngram, 32);
    EXPECT_EQ(run.tokens, reference.tokens) << name;
    EXPECT_GT(run.stats.num_draft_tokens, 0u) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Drafts, GptOssEagle3Engine,
                         ::testing::Combine(::testing::ValuesIn(test::GptOssFixtureModels()),
                                            ::testing::Values("gpt_oss_default", "gpt_oss_lookup")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
}  // namespace hsx
