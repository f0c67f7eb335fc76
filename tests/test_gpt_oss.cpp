// gpt-oss (GptOssForCausalLM): its config files' parse and transformers' parameter counts,
// the refusals of what hsx does not run, MXFP4 dequantization against hand-computed values,
// and attention sinks and the clamped SwiGLU on the CPU reference. The fixtures' goldens
// (hidden states, logits, greedy tokens) run in test_model_fixtures / test_engine.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/mxfp4.h"
#include "model/weights.h"
#include "test_util.h"

namespace hsx {
namespace {

using json = nlohmann::json;

json HubConfig(const std::string& name) {
  return json::parse(std::ifstream(test::DataPath("configs/" + name + "/config.json")));
}

// transformers' count for GptOssForCausalLM (bf16 experts: MXFP4 checkpoints count as
// their dequantized tensors): 20,914,757,184 and 116,829,156,672.
TEST(GptOssConfig, HubConfigsHaveTransformersParameterCounts) {
  for (const auto& [name, params, layers, experts] :
       {std::tuple{"gpt-oss-20b", int64_t{20914757184}, 24, 32}, std::tuple{"gpt-oss-120b", int64_t{116829156672}, 36, 128}}) {
    auto c = LoadModelConfig(test::DataPath(std::string("configs/") + name));
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(CountParameters(*c), params) << name;
    EXPECT_EQ(c->num_layers, layers);
    EXPECT_EQ(c->num_experts, experts);
    EXPECT_EQ(c->experts_per_token, 4);
    EXPECT_TRUE(c->mxfp4_experts && c->qkv_bias && c->o_bias && c->attention_sinks && c->moe_biases);
    EXPECT_FLOAT_EQ(c->swiglu_limit, 7.0f);
    EXPECT_FLOAT_EQ(c->swiglu_alpha, 1.702f);
    EXPECT_EQ(c->sliding_window, 128);
    for (int i = 0; i < layers; ++i) {
      EXPECT_EQ(c->layers[i].sliding, i % 2 == 0) << i;
      EXPECT_TRUE(c->layers[i].moe);
      EXPECT_EQ(c->layers[i].head_dim, 64);
      EXPECT_EQ(c->layers[i].rope.type, RopeSpec::Type::kYarn);
      EXPECT_EQ(c->layers[i].rope.theta, 150000.0);
      EXPECT_EQ(c->layers[i].rope.factor, 32.0);
      EXPECT_FALSE(c->layers[i].rope.truncate);
    }
    // yarn's attention factor 0.1 ln(32) + 1 scales q.k by its square.
    const double mscale = 0.1 * std::log(32.0) + 1.0;
    EXPECT_NEAR(c->attention_scale(0), mscale * mscale / 8.0, 1e-6);
  }
}

TEST(GptOssConfig, NamedConfigIsTheTwentyBillionShape) {
  auto named = NamedModelConfig("gpt-oss-20b");
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_EQ(CountParameters(*named), int64_t{20914757184});
  EXPECT_FALSE(named->mxfp4_experts);
}

// GptOssConfig's defaults (36 layers, 128 experts, yarn) when config.json gives nothing else.
TEST(GptOssConfig, DefaultsAreGptOssConfigs) {
  auto c = ParseModelConfig(R"({"architectures": ["GptOssForCausalLM"]})", "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(CountParameters(*c), int64_t{116829156672});
  EXPECT_EQ(c->layers[0].rope.type, RopeSpec::Type::kYarn);
  EXPECT_EQ(c->layers[0].rope.theta, 150000.0);
  EXPECT_TRUE(c->layers[0].sliding);
  EXPECT_FALSE(c->layers[1].sliding);
}

TEST(GptOssConfig, RefusesWhatItDoesNotRunByName) {
  const json base = HubConfig("gpt-oss-20b");
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"some_new_field", 1}}, "field 'some_new_field'"},
      {{{"experts_per_token", 2}}, "field 'experts_per_token': is 2, but num_experts_per_tok"},
      {{{"num_experts_per_tok", 64}}, "field 'num_experts_per_tok': must not exceed num_local_experts"},
      {{{"swiglu_limit", 0}}, "field 'swiglu_limit'"},
      {{{"quantization_config", {{"quant_method", "mxfp4"}, {"group_size", 16}}}}, "quantization_config: field 'group_size'"},
      {{{"quantization_config", {{"quant_method", "mxfp4"}, {"modules_to_not_convert", {"model.layers.*.mlp"}}}}},
       "keeps 'model.layers.0.mlp.experts' unquantized"},
      {{{"quantization_config", {{"quant_method", "gptq"}}}}, "quantization_config: field 'quant_method'"},
      {{{"model_type", "gpt_oss_v2"}}, "field 'model_type'"},
      {{{"layer_types", {"sliding_attention"}}}, "field 'layer_types': expected a list of 24 layer types"},
  };
  for (const auto& [edit, want] : cases) {
    json j = base;
    j.update(edit);
    auto c = ParseModelConfig(j.dump(), "config.json");
    ASSERT_FALSE(c.ok()) << edit.dump();
    EXPECT_NE(c.status().message().find(want), std::string::npos) << c.status().message();
  }
}

// Hand-computed: byte 0x21 holds codes 1 (0.5, low nibble first) and 2 (1.0); 0xF8 holds
// 8 (-0.0) and 15 (-6.0); 0x7B holds 11 (-1.5) and 7 (6.0). Scales are 2^(s - 127).
TEST(Mxfp4, DequantizesLowNibbleFirstWithPowerOfTwoScales) {
  std::vector<uint8_t> blocks(32, 0);  // 2 rows of one 32-value group
  blocks[0] = 0x21;
  blocks[1] = 0xF8;
  blocks[15] = 0x7B;
  blocks[16] = 0x21;
  const uint8_t scales[2] = {128, 125};  // x2, x1/4
  std::vector<float> out(64);
  DequantizeMxfp4(blocks.data(), scales, 2, 32, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_TRUE(std::signbit(out[2]));
  EXPECT_EQ(out[3], -12.0f);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[30], -3.0f);
  EXPECT_EQ(out[31], 12.0f);
  EXPECT_EQ(out[32], 0.125f);
  EXPECT_EQ(out[33], 0.25f);
  EXPECT_EQ(out[63], 0.0f);
}

// One query, one key: softmax over [s, sink] leaves exp(s) / (exp(s) + exp(sink)) of v, on
// every CPU attention path (sgemm prefill, few-query decode, batch-invariant rows).
TEST(AttentionSinks, TakeTheirShareOfTheSoftmaxOnEveryCpuPath) {
  for (const bool invariant : {false, true}) {
    for (const int q_len : {1, 40}) {
      CpuBackend cpu(invariant);
      const int64_t heads = 2, d = 8, block = 16;
      Tensor q = cpu.Empty(DType::kF32, {q_len, heads, d}), out = cpu.Empty(DType::kF32, {q_len, heads, d});
      Tensor kc = cpu.Empty(DType::kF32, {64, 1, d}), vc = cpu.Empty(DType::kF32, {64, 1, d});
      for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = 0.25f;
      for (int64_t i = 0; i < kc.numel(); ++i) kc.data<float>()[i] = 0.5f;
      for (int64_t i = 0; i < vc.numel(); ++i) vc.data<float>()[i] = 1.0f + static_cast<float>(i % d);
      Tensor sinks = cpu.Empty(DType::kF32, {heads});
      sinks.data<float>()[0] = 0.0f;
      sinks.data<float>()[1] = 2.0f;
      SequenceSlice s;
      s.q_len = q_len;
      s.ctx_len = q_len;
      s.block_table = {0, 1, 2, 3};
      AttentionParams params;
      params.scale = 1.0f;
      params.block_size = block;
      params.sinks = &sinks;
      cpu.Attention(q, kc, vc, MakeAttentionBatch(cpu, {s}), params, out);
      // Row i sees i + 1 equal keys of score 0.25 * 0.5 * 8 = 1.
      for (int i = 0; i < q_len; ++i) {
        for (int64_t h = 0; h < heads; ++h) {
          const double keys = (i + 1) * std::exp(1.0);
          const double share = keys / (keys + std::exp(sinks.data<float>()[h]));
          for (int64_t c = 0; c < d; ++c) {
            EXPECT_NEAR(out.data<float>()[(i * heads + h) * d + c], share * (1.0 + c), 1e-5)
                << "invariant " << invariant << " q_len " << q_len << " row " << i << " head " << h;
          }
        }
      }
    }
  }
}

TEST(ClampedSwiglu, ClampsGateAboveAndUpBothSides) {
  const float limit = 7.0f, alpha = 1.702f;
  auto ref = [&](double g, double u) { return (u + 1) * g / (1 + std::exp(-alpha * g)); };
  EXPECT_NEAR(ClampedSwiglu(1.0f, 0.5f, limit, alpha), ref(1.0, 0.5), 1e-6);
  EXPECT_NEAR(ClampedSwiglu(9.0f, 0.5f, limit, alpha), ref(7.0, 0.5), 1e-5);
  EXPECT_NEAR(ClampedSwiglu(-9.0f, 0.5f, limit, alpha), ref(-9.0, 0.5), 1e-6);  // no lower clamp on the gate
  EXPECT_NEAR(ClampedSwiglu(2.0f, 8.0f, limit, alpha), ref(2.0, 7.0), 1e-5);
  EXPECT_NEAR(ClampedSwiglu(2.0f, -8.0f, limit, alpha), ref(2.0, -7.0), 1e-5);
}

}  // namespace
}  // namespace hsx
