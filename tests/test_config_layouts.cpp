// Every config.json layout transformers 5.x reads (4.x keys, 5.x rope_parameters,
// text_config nesting, omitted fields, transformers' own full serialization), for every
// supported architecture, resolved by hsx exactly as transformers resolves it. The
// expected values come from transformers itself: tests/data/generators/config_layouts.py
// writes tests/data/config_layouts.json.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/weights.h"
#include "test_util.h"

namespace hsx {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const json& Layouts() {
  static const json kLayouts = [] {
    std::ifstream in(test::DataPath("config_layouts.json"));
    return json::parse(in);
  }();
  return kLayouts;
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const json& c : Layouts()["cases"]) names.push_back(c["name"].get<std::string>());
  return names;
}

const json& Case(const std::string& name) {
  for (const json& c : Layouts()["cases"])
    if (c["name"] == name) return c;
  throw std::runtime_error("no case " + name);
}

std::string TestName(const std::string& name) {
  std::string s;
  for (char ch : name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

class ConfigLayoutTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConfigLayoutTest, ResolvesAsTransformersDoes) {
  const json& c = Case(GetParam());
  const json& e = c["expected"];
  auto parsed = ParseModelConfig(c["config"].dump(), GetParam());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const ModelConfig& m = *parsed;
  EXPECT_EQ(m.hidden_size, e["hidden_size"].get<int>());
  EXPECT_EQ(m.num_layers, e["num_layers"].get<int>());
  EXPECT_EQ(m.vocab_size, e["vocab_size"].get<int>());
  EXPECT_EQ(m.num_heads, e["num_heads"].get<int>());
  EXPECT_EQ(m.intermediate_size, e["intermediate_size"].get<int>());
  EXPECT_EQ(m.max_position_embeddings, e["max_position_embeddings"].get<int>());
  EXPECT_EQ(m.rms_norm_eps, e["rms_norm_eps"].get<float>());
  EXPECT_EQ(m.activation, e["activation"] == "silu" ? Activation::kSilu : Activation::kGeluTanh);
  EXPECT_EQ(m.tie_word_embeddings, e["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(m.eos_token_ids, e["eos_token_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(m.sliding_window, e["sliding_window"].get<int>());
  EXPECT_EQ(m.final_softcap, e["final_softcap"].get<float>());
  EXPECT_EQ(m.num_experts, e["num_experts"].get<int>());
  EXPECT_EQ(m.experts_per_token, e["experts_per_token"].get<int>());
  EXPECT_EQ(m.norm_topk_prob, e["norm_topk_prob"].get<bool>());
  EXPECT_EQ(m.max_model_len(), e["max_model_len"].get<int>());
  ASSERT_EQ(m.layers.size(), e["layers"].size());
  for (int i = 0; i < m.num_layers; ++i) {
    const json& el = e["layers"][i];
    const LayerSpec& l = m.layers[i];
    SCOPED_TRACE("layer " + std::to_string(i));
    EXPECT_EQ(l.sliding, el["sliding"].get<bool>());
    EXPECT_EQ(l.head_dim, el["head_dim"].get<int>());
    EXPECT_EQ(l.num_kv_heads, el["num_kv_heads"].get<int>());
    EXPECT_EQ(l.rope.theta, el["rope_theta"].get<double>());
    // transformers multiplies cos and sin by the RoPE attention factor a: q.k scales by a².
    const double a = el["attention_factor"].get<double>();
    EXPECT_DOUBLE_EQ(l.rope.attention_factor, a);
    const double scale = e["attn_scale"].get<double>() > 0 ? e["attn_scale"].get<double>() : 1.0 / std::sqrt(l.head_dim);
    EXPECT_FLOAT_EQ(m.attention_scale(i), static_cast<float>(scale * a * a));
    int rotary_dims = 0;
    const std::vector<float> mine = RopeInverseFrequencies(l.rope, l.head_dim, &rotary_dims);
    const std::vector<float> ref = e["inv_freq"][el["inv_freq"].get<std::string>()].get<std::vector<float>>();
    ASSERT_EQ(mine.size(), ref.size());
    for (size_t k = 0; k < ref.size(); ++k) {
      // transformers' torch pow and libm's powf may differ in the last bit.
      EXPECT_NEAR(mine[k], ref[k], 2e-7 * std::abs(ref[k])) << "inv_freq[" << k << "] (" << el["rope_type"] << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TransformersLayouts, ConfigLayoutTest, ::testing::ValuesIn(CaseNames()),
                         [](const auto& info) { return TestName(info.param); });

// The same fixture weights under a 4.x layout (or nested in text_config, with the
// multimodal weight names) give bit-identical hidden states and logits to the 5.x layout
// the goldens were made with, and those match the goldens.
class LayoutHiddenStatesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsx-layout-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// Renames the fixture's tensors as a multimodal checkpoint names them.
void WriteRenamed(const std::string& from, const std::string& to, const std::string& prefix, const std::string& lm_head) {
  SafetensorsFile f = test::Golden(from);
  std::vector<NamedTensor> renamed;
  for (const auto& [name, t] : f.tensors()) {
    if (name == "lm_head.weight") renamed.push_back({lm_head, t});
    else renamed.push_back({prefix + name.substr(std::string("model.").size()), t});
  }
  ASSERT_TRUE(WriteSafetensors(to, renamed).ok());
}

TEST_P(LayoutHiddenStatesTest, SameWeightsSameHiddenStates) {
  const json& c = Case(GetParam());
  const std::string fixture = c["hidden_states_of"].get<std::string>();
  const std::string src = test::ModelDir(fixture);
  std::ofstream(dir_ + "/config.json") << c["config"].dump(1);
  if (c["config"].contains("text_config")) {
    // 4.x multimodal checkpoints name weights language_model.model.*, 5.x model.language_model.*.
    const bool v4 = c["config"].contains("torch_dtype");
    WriteRenamed(src + "/model.safetensors", dir_ + "/model.safetensors",
                 v4 ? "language_model.model." : "model.language_model.", v4 ? "language_model.lm_head.weight" : "lm_head.weight");
  } else {
    fs::copy_file(src + "/model.safetensors", dir_ + "/model.safetensors");
  }
  CpuBackend backend;
  auto reference = Model::Load(src, backend);
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  auto layout = Model::Load(dir_, backend);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  SafetensorsFile golden = test::Golden(src + "/golden.safetensors");
  const test::GoldenPrefill want = test::RunGoldenPrefill(**reference, golden);
  const test::GoldenPrefill got = test::RunGoldenPrefill(**layout, golden);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(got.hidden[k], want.hidden[k]) << "prompt " << k;
    EXPECT_EQ(got.logits[k], want.logits[k]) << "prompt " << k;
    const std::vector<float> gold = test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value());
    EXPECT_LE(test::RelativeMaxError(got.hidden[k], gold), 1e-4) << "prompt " << k;
  }
}

std::vector<std::string> HiddenStateCases() {
  std::vector<std::string> names;
  for (const json& c : Layouts()["cases"])
    if (!c["hidden_states_of"].is_null() && c["name"].get<std::string>().rfind("fixture_5x/", 0) != 0)
      names.push_back(c["name"].get<std::string>());
  return names;
}

INSTANTIATE_TEST_SUITE_P(TransformersLayouts, LayoutHiddenStatesTest, ::testing::ValuesIn(HiddenStateCases()),
                         [](const auto& info) { return TestName(info.param); });

// The layouts reach different rope tables: a layout test that compared nothing would
// pass these too, so check that a wrong resolution is visible (linear scaling vs none).
TEST(ConfigLayouts, LinearScalingChangesTheFullAttentionTable) {
  auto scaled = ParseModelConfig(Case("4x_text_config_linear/gemma3")["config"].dump(), "scaled");
  auto plain = ParseModelConfig(Case("4x_text_config/gemma3")["config"].dump(), "plain");
  ASSERT_TRUE(scaled.ok() && plain.ok());
  int dims = 0;
  const LayerSpec& full = scaled->layers[5];
  ASSERT_FALSE(full.sliding);
  EXPECT_EQ(RopeInverseFrequencies(full.rope, 16, &dims)[1] * 8.0f, RopeInverseFrequencies(plain->layers[5].rope, 16, &dims)[1]);
  EXPECT_EQ(RopeInverseFrequencies(scaled->layers[0].rope, 16, &dims), RopeInverseFrequencies(plain->layers[0].rope, 16, &dims));
}

// Mistral-7B-Instruct-v0.3's config.json: transformers' parameter count for it (untied
// 32768-row embedding and head, GQA 32/8, MLP 14336), as `hsx inspect` prints it.
TEST(ConfigLayouts, Mistral7BInstructV03HasTransformersParameterCount) {
  auto c = ParseModelConfig(Case("Mistral-7B-Instruct-v0.3")["config"].dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(CountParameters(*c), int64_t{7248023552});
}

// longrope switches to long_factor, in transformers, once a forward call reaches past
// original_max_position_embeddings: the engine runs no longer sequences, even when asked to.
TEST(ConfigLayouts, LongropeBoundsTheEngineAtTheOriginalLength) {
  char tmpl[] = "/tmp/hsx-longrope-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  json config = json::parse(std::ifstream(test::ModelDir("llama") + "/config.json"));
  config["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 10000.0}, {"original_max_position_embeddings", 16},
                               {"short_factor", std::vector<double>(8, 1.5)}, {"long_factor", std::vector<double>(8, 4.0)}};
  std::ofstream(dir + "/config.json") << config.dump();
  fs::copy_file(test::ModelDir("llama") + "/model.safetensors", dir + "/model.safetensors");
  CpuBackend backend;
  auto model = Model::Load(dir, backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ((*model)->config().max_position_embeddings, 4096);
  EXPECT_EQ((*model)->config().max_model_len(), 16);
  for (int asked : {0, 4096}) {
    EngineConfig ec;
    ec.num_blocks = 8;
    ec.capture_layers = {1};
    ec.max_model_len = asked;
    Engine engine(**model, ec);
    EXPECT_TRUE(engine.Validate(Request{"fits", std::vector<int32_t>(10, 1), 6}).ok());
    Status s = engine.Validate(Request{"long", std::vector<int32_t>(10, 1), 7});
    EXPECT_NE(s.message().find("exceed max_model_len 16"), std::string::npos) << s.message();
  }
  fs::remove_all(dir);
}

// generation_config.json's eos_token_id (an integer or a list) joins the stop tokens.
TEST(ConfigLayouts, GenerationConfigEosJoinsTheStopTokens) {
  char tmpl[] = "/tmp/hsx-genconfig-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  fs::copy_file(test::ModelDir("llama") + "/config.json", dir + "/config.json");
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": [2, 7, 9], "temperature": 0.6})";
  auto c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2, 7, 9}));
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": 11})";
  EXPECT_EQ(LoadModelConfig(dir)->eos_token_ids, (std::vector<int32_t>{2, 11}));
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": "x"})";
  auto bad = LoadModelConfig(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("generation_config.json: field 'eos_token_id'"), std::string::npos);
  fs::remove_all(dir);
}

// Values transformers would accept but that hsx cannot run, or that can only give NaN or
// inf, are refused with an error naming config.json and the field.
struct Refusal {
  const char* fixture;
  const char* edit;  // a JSON merge patch on the fixture's config
  const char* error;
};

const Refusal kRefusals[] = {
    {"llama", R"({"rope_parameters": {"rope_theta": 0}})", "field 'rope_theta': must be a finite number > 0"},
    {"llama", R"({"rope_parameters": {"rope_theta": -1}})", "field 'rope_theta': must be a finite number > 0"},
    {"llama", R"({"rope_parameters": null, "rope_theta": -1})", "config.json: field 'rope_theta': must be a finite number > 0"},
    {"llama", R"({"rope_parameters": {"rope_theta": "1e4"}})", "field 'rope_theta': is string, expected a number"},
    {"llama", R"({"rope_parameters": {"rope_type": "mrope", "factor": 4}})", "field 'rope_type': RoPE type 'mrope' is not supported"},
    {"llama", R"({"rope_parameters": null, "rope_scaling": {"type": "su", "factor": 4}})", "rope_scaling: field 'type': RoPE type 'su' is not supported"},
    {"llama", R"({"rope_parameters": {"rope_type": "yarn"}})", "rope_parameters: field 'factor': missing"},
    {"llama", R"({"rope_parameters": {"rope_type": "yarn", "factor": 4, "low_freq_factor": 1}})", "field 'low_freq_factor': not supported"},
    {"llama", R"({"rope_parameters": {"rope_type": "yarn", "factor": 4, "truncate": "no"}})", "field 'truncate': is string"},
    {"llama", R"({"rope_parameters": {"rope_type": "yarn", "factor": 4, "attention_factor": -1}})",
     "field 'attention_factor': must be null or a finite number > 0"},
    {"llama", R"({"rope_parameters": {"rope_type": "yarn", "factor": 4, "mscale": "1"}})", "field 'mscale': is string"},
    {"llama", R"({"rope_parameters": {"rope_type": "yarn", "factor": 4, "beta_fast": -2}})", "field 'beta_fast': beta_fast and beta_slow must be > 0"},
    {"llama", R"({"rope_parameters": {"rope_type": "yarn", "factor": 4}, "partial_rotary_factor": 0.5})",
     "field 'partial_rotary_factor': layer 0: yarn, dynamic and longrope RoPE rotate the whole head"},
    {"llama", R"({"rope_parameters": {"rope_type": "dynamic"}})", "rope_parameters: field 'factor': missing"},
    {"llama", R"({"rope_parameters": {"rope_type": "dynamic", "factor": 2, "original_max_position_embeddings": 64}})",
     "field 'original_max_position_embeddings': not supported"},
    {"llama", R"({"head_dim": 2, "rope_parameters": {"rope_type": "dynamic", "factor": 2}})", "dynamic RoPE needs more than 2 rotary dimensions"},
    {"llama", R"({"rope_parameters": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1]}})",
     "rope_parameters: field 'long_factor': missing"},
    {"llama", R"({"rope_parameters": {"rope_type": "longrope", "short_factor": [1, 1], "long_factor": [1, 1]}})",
     "field 'rope_parameters': layer 0: longrope short_factor has 2 entries, expected one per frequency (8)"},
    {"llama", R"({"rope_parameters": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 0], "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]}})",
     "field 'short_factor': entries must be finite numbers > 0"},
    {"llama", R"({"rope_parameters": {"rope_type": "longrope", "short_factor": 1, "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]}})",
     "field 'short_factor': is number, expected a list of numbers"},
    {"llama", R"({"rope_parameters": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1], "long_factor": [1, 1, 1, 1, 1, 1, 1, 1], "original_max_position_embeddings": 1}})",
     "field 'original_max_position_embeddings': the attention factor it gives is not a finite number > 0"},
    {"gemma3", R"({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 8, "rope_theta": 1000000}}})",
     "field 'rope_parameters': layer type 'full_attention': yarn, dynamic and longrope RoPE are supported only in one dict"},
    {"qwen3", R"({"rope_parameters": null, "rope_scaling": {"full_attention": {"rope_type": "dynamic", "factor": 2}}})",
     "yarn, dynamic and longrope RoPE are supported only in one dict"},
    {"llama", R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "pretraining_tp": null, "attention_bias": true})",
     "field 'attention_bias': projection biases are not supported"},
    {"llama", R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "pretraining_tp": null, "mlp_bias": true})",
     "field 'mlp_bias': MLP biases are not supported"},
    {"llama", R"({"architectures": ["MistralForCausalLM"], "model_type": "llama"})", "field 'model_type': is \"llama\", expected \"mistral\""},
    {"llama", R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]})",
     "field 'layer_types': transformers ignores it for this architecture (every layer is sliding_attention)"},
    {"llama", R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 0})", "field 'sliding_window': 0 is out of range"},
    {"llama", R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "use_sliding_window": true})", "field 'use_sliding_window': not supported"},
    {"llama", R"({"rope_parameters": {"rope_type": "linear", "factor": 0}})", "field 'factor': must be a finite number > 0"},
    {"llama", R"({"rope_parameters": {"attention_factor": 2}})", "field 'attention_factor': not supported"},
    {"llama31", R"({"rope_parameters": {"high_freq_factor": 1.0}})", "field 'high_freq_factor': must differ from low_freq_factor"},
    {"llama", R"({"rms_norm_eps": -1e-6})", "config.json: field 'rms_norm_eps': must be a finite number > 0"},
    {"llama", R"({"rms_norm_eps": 0})", "config.json: field 'rms_norm_eps': must be a finite number > 0"},
    {"llama", R"({"rms_norm_eps": 1e-60})", "field 'rms_norm_eps': must be a finite number > 0 within single precision"},
    {"llama", R"({"rms_norm_eps": 1e300})", "field 'rms_norm_eps': must be a finite number > 0 within single precision"},
    {"llama", R"({"hidden_size": 0})", "config.json: field 'hidden_size': 0 is out of range [1, 16777216]"},
    {"llama", R"({"vocab_size": 4294967296})", "field 'vocab_size': 4294967296 is out of range"},
    {"llama", R"({"num_hidden_layers": 18446744073709551615})", "field 'num_hidden_layers': 18446744073709551615 is out of range [1, 4096]"},
    {"llama", R"({"num_key_value_heads": 3})", "num_attention_heads (4) is not divisible by num_key_value_heads (3)"},
    {"llama", R"({"head_dim": 15})", "field 'head_dim': layer 0: head dimension 15 must be positive and even"},
    {"llama", R"({"attention_bias": true})", "field 'attention_bias': projection biases are not supported"},
    {"llama", R"({"mlp_bias": true})", "field 'mlp_bias': MLP biases are not supported"},
    {"llama", R"({"quantization_config": {"quant_method": "awq"}})", "quantization_config: field 'quant_method': \"awq\""},
    {"llama", R"({"model_type": "mistral"})", "field 'model_type': is \"mistral\", expected \"llama\""},
    {"llama", R"({"eos_token_id": -1})", "field 'eos_token_id': expected an integer or a list of integers in [0, 512)"},
    {"llama", R"({"eos_token_id": [2, 512]})", "field 'eos_token_id'"},
    {"llama", R"({"tie_word_embeddings": "yes"})", "field 'tie_word_embeddings': is string, expected true or false"},
    {"llama", R"({"max_position_embeddings": -5})", "field 'max_position_embeddings': -5 is out of range"},
    {"llama", R"({"layer_types": ["sliding_attention", "full_attention", "full_attention", "full_attention"]})",
     "field 'layer_types': transformers ignores it for this architecture"},
    {"qwen3_moe", R"({"decoder_sparse_step": 0})", "field 'decoder_sparse_step': 0 is out of range"},
    {"qwen3_moe", R"({"mlp_only_layers": "all"})", "field 'mlp_only_layers': is string, expected a list of integers"},
    {"qwen3_moe", R"({"mlp_only_layers": [7]})", "field 'mlp_only_layers': entry 7 is out of range [0, 3]"},
    {"qwen3_moe", R"({"num_experts_per_tok": 9})", "field 'num_experts_per_tok': must not exceed num_experts"},
    {"qwen3_moe", R"({"num_experts": 4})", "field 'num_experts': disagrees with num_local_experts"},
    {"qwen2", R"({"use_sliding_window": "no"})", "field 'use_sliding_window': is string, expected true or false"},
    {"gemma3", R"({"layer_types": null, "sliding_window_pattern": 0})", "field 'sliding_window_pattern': 0 is out of range"},
    {"gemma3", R"({"query_pre_attn_scalar": 0})", "field 'query_pre_attn_scalar': must be a finite number > 0"},
    {"gemma3", R"({"final_logit_softcapping": 0})", "field 'final_logit_softcapping': must be null or a finite number > 0"},
    {"gemma3", R"({"use_bidirectional_attention": true})", "field 'use_bidirectional_attention'"},
    {"gemma3", R"({"rope_parameters": {"rope_type": "default", "rope_theta": 10000}})",
     "Gemma 3 needs rope_parameters keyed by layer type"},
    {"gemma3", R"({"rope_local_base_freq": -10000})", "field 'rope_local_base_freq': must be a finite number > 0"},
    {"gemma3", R"({"hidden_activation": "relu"})", "field 'hidden_activation': unsupported activation 'relu'"},
    {"gemma3", R"({"hidden_act": "silu"})", "field 'hidden_act': disagrees with hidden_activation"},
    {"gemma4", R"({"rope_theta": 10000})", "field 'rope_theta': transformers ignores it for Gemma 4"},
    {"gemma4", R"({"rope_parameters": {"full_attention": null}})", "no entry for layer type 'full_attention'"},
    {"gemma4", R"({"rope_parameters": {"full_attention": {"partial_rotary_factor": 1.5}}})",
     "field 'partial_rotary_factor': must be in (0, 1]"},
    {"gemma4", R"({"per_layer_config": {"9": {"head_dim": 32}}})", "field 'per_layer_config': key '9' is not a layer index"},
    {"gemma4", R"({"per_layer_config": {"5": {"sliding_window": 3}}})", "per_layer_config.5: field 'sliding_window': not supported"},
    {"gemma4", R"({"use_bidirectional_attention": "all"})", "field 'use_bidirectional_attention'"},
    {"gemma4", R"({"num_kv_shared_layers": 6})", "field 'num_kv_shared_layers': 6 is out of range [0, 5]"},
};

TEST(ConfigRefusals, EachNamesConfigJsonAndTheField) {
  for (const Refusal& r : kRefusals) {
    std::ifstream in(test::ModelDir(r.fixture) + "/config.json");
    json config = json::parse(in);
    config.merge_patch(json::parse(r.edit));
    auto parsed = ParseModelConfig(config.dump(), "/m/config.json");
    ASSERT_FALSE(parsed.ok()) << r.fixture << " " << r.edit;
    EXPECT_NE(parsed.status().message().find(r.error), std::string::npos)
        << r.fixture << " " << r.edit << "\n  expected: " << r.error << "\n  got: " << parsed.status().message();
    EXPECT_EQ(parsed.status().message().rfind("/m/config.json", 0), 0u) << parsed.status().message();
  }
}

TEST(ConfigRefusals, MultimodalWithoutTextConfigOrWithTowerlessUnknowns) {
  json mm = Case("4x_text_config/gemma3")["config"];
  mm.erase("text_config");
  auto parsed = ParseModelConfig(mm.dump(), "config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("field 'text_config': missing"), std::string::npos);
  mm = Case("4x_text_config/gemma3")["config"];
  mm["quantization_config"] = {{"quant_method", "gptq"}};
  parsed = ParseModelConfig(mm.dump(), "config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("quantization_config: field 'quant_method': \"gptq\""), std::string::npos);
}

}  // namespace
}  // namespace hsx
