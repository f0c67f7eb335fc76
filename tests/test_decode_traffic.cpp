// The bytes a decode step reads (model/decode_traffic.h), the basis of bench --decode's
// bound: against the config's parameter count, and against FP8 weights' codes and scales.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/decode_traffic.h"
#include "model/fp8_quantization.h"
#include "model/weights.h"
#include "test_util.h"

namespace hsx {
namespace {

// Unquantized: every parameter in the checkpoint dtype, bar the embedding tables a step only
// gathers rows of (a tied LM head reads the embedding, so it counts then).
TEST(DecodeTrafficTest, UnquantizedWeightsAreTheParametersBarTheGatheredEmbeddings) {
  for (const std::string model : {"llama", "qwen3_tied", "qwen3_moe", "gemma4"}) {
    auto config = LoadModelConfig(test::ModelDir(model));
    ASSERT_TRUE(config.ok()) << model << ": " << config.status().message();
    CpuBackend cpu;
    const ModelWeights w = DummyWeights(*config, cpu);  // in config.dtype on the CPU
    int64_t gathered = config->tie_word_embeddings ? 0 : static_cast<int64_t>(config->vocab_size) * config->hidden_size;
    gathered += static_cast<int64_t>(config->per_layer_vocab_size) * config->num_layers * config->per_layer_input_size;
    EXPECT_EQ(DecodeWeightBytes(w), (CountParameters(*config) - gathered) * static_cast<int64_t>(DTypeSize(config->dtype)))
        << model;
  }
}

// --quantization fp8: each projection's elements drop to one byte and gain an f32 scale
// per row; nothing else changes.
TEST(DecodeTrafficTest, Fp8WeightsCountTheirCodesAndRowScales) {
  for (const std::string model : {"llama", "gemma4"}) {
    auto config = LoadModelConfig(test::ModelDir(model));
    ASSERT_TRUE(config.ok()) << model << ": " << config.status().message();
    CpuBackend cpu;
    ModelWeights w = DummyWeights(*config, cpu);
    const int64_t unquantized = DecodeWeightBytes(w);
    int64_t saved = 0;
    for (const LayerWeights& l : w.layers) {
      for (const Tensor* p : {&l.qkv_proj, &l.o_proj, &l.gate_up_proj, &l.down_proj}) {
        if (!p->defined()) continue;
        saved += p->numel() * (static_cast<int64_t>(DTypeSize(p->dtype())) - 1) - p->size(0) * 4;
      }
    }
    ASSERT_GT(saved, 0) << model;
    ASSERT_TRUE(QuantizeLinearWeightsFp8(w, cpu).ok()) << model;
    ASSERT_EQ(w.layers[0].qkv_proj.dtype(), DType::kF8E4M3) << model;
    EXPECT_EQ(DecodeWeightBytes(w), unquantized - saved) << model;
  }
}

// A decode step of a MoE reads the experts its tokens chose: at batch 1 top_k of E per
// layer, towards all of them as the batch grows; dense models are unaffected.
TEST(DecodeTrafficTest, MoeStepsCountTheExpertsTheyAreExpectedToUse) {
  CpuBackend cpu;
  auto dense = LoadModelConfig(test::ModelDir("llama"));
  ASSERT_TRUE(dense.ok());
  const ModelWeights dw = DummyWeights(*dense, cpu);
  EXPECT_DOUBLE_EQ(ExpectedDecodeWeightBytes(dw, 1, 0), static_cast<double>(DecodeWeightBytes(dw)));
  auto config = LoadModelConfig(test::ModelDir("qwen3_moe"));
  ASSERT_TRUE(config.ok()) << config.status().message();
  const ModelWeights w = DummyWeights(*config, cpu);
  int64_t experts_bytes = 0;
  for (const LayerWeights& l : w.layers) {
    for (const auto* m : {&l.experts.gate, &l.experts.up, &l.experts.down})
      for (const Tensor& e : *m) experts_bytes += static_cast<int64_t>(e.nbytes());
  }
  ASSERT_GT(experts_bytes, 0);
  const double all = static_cast<double>(DecodeWeightBytes(w)), rest = all - static_cast<double>(experts_bytes);
  const int e = config->num_experts, k = config->experts_per_token;
  EXPECT_NEAR(ExpectedDecodeWeightBytes(w, 1, k), rest + experts_bytes * static_cast<double>(k) / e, 1.0);
  EXPECT_NEAR(ExpectedDecodeWeightBytes(w, 2, k),
              rest + experts_bytes * (1.0 - std::pow(1.0 - static_cast<double>(k) / e, 2)), 1.0);
  EXPECT_NEAR(ExpectedDecodeWeightBytes(w, 100000, k), all, 1.0);
}

}  // namespace
}  // namespace hsx
