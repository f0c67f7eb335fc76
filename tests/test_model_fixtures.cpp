// Every fixture model against Hugging Face's f32 goldens: all N+1 hidden states and
// logits of three prompts packed into one forward (no padding), within 1e-4 relative.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "test_util.h"

namespace hsx {
namespace {

class FixtureModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureModelTest, PackedPrefillMatchesGoldenHiddenStatesAndLogits) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir(GetParam()), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const ModelConfig& config = (*model)->config();
  SafetensorsFile golden = test::Golden(test::ModelDir(GetParam()) + "/golden.safetensors");

  constexpr int kBlock = 16;
  KVCache cache(config, backend, 32, kBlock);
  ForwardBatch batch;
  std::vector<std::vector<int32_t>> prompts;
  int next_block = 0;
  for (int k = 0; k < 3; ++k) {
    prompts.push_back(test::AsIds(golden.Get("prompt_" + std::to_string(k)).value()));
    const auto& p = prompts.back();
    SequenceSlice seq;
    seq.q_start = static_cast<int32_t>(batch.token_ids.size());
    seq.q_len = seq.ctx_len = static_cast<int32_t>(p.size());
    for (size_t i = 0; i < p.size(); i += kBlock) seq.block_table.push_back(next_block++);
    for (size_t i = 0; i < p.size(); ++i) {
      batch.logit_rows.push_back(static_cast<int32_t>(batch.token_ids.size()));
      batch.token_ids.push_back(p[i]);
      batch.positions.push_back(static_cast<int32_t>(i));
      batch.slot_mapping.push_back(seq.block_table[i / kBlock] * kBlock + static_cast<int32_t>(i % kBlock));
    }
    batch.seqs.push_back(seq);
  }
  std::vector<int> all_layers;
  for (int i = 0; i <= config.num_layers; ++i) all_layers.push_back(i);
  ForwardOutput out = (*model)->Forward(batch, cache, all_layers);

  const int64_t h = config.hidden_size, layers = config.num_layers + 1;
  std::vector<float> captured = test::AsFloats(out.captured);  // [L, T, H]
  std::vector<float> logits = test::AsFloats(out.logits);      // [T, V]
  const int64_t total = static_cast<int64_t>(batch.token_ids.size());
  for (int k = 0; k < 3; ++k) {
    const int64_t start = batch.seqs[k].q_start, len = batch.seqs[k].q_len;
    std::vector<float> gold_hidden = test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value());  // [T, L, H]
    for (int64_t l = 0; l < layers; ++l) {
      std::vector<float> mine, ref;
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t c = 0; c < h; ++c) {
          mine.push_back(captured[(l * total + start + t) * h + c]);
          ref.push_back(gold_hidden[(t * layers + l) * h + c]);
        }
      }
      EXPECT_LE(test::RelativeMaxError(mine, ref), 1e-4) << "prompt " << k << " layer id " << l;
    }
    std::vector<float> gold_logits = test::AsFloats(golden.Get("logits_" + std::to_string(k)).value());
    std::vector<float> mine(logits.begin() + start * config.vocab_size, logits.begin() + (start + len) * config.vocab_size);
    EXPECT_LE(test::RelativeMaxError(mine, gold_logits), 1e-4) << "prompt " << k << " logits";
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, FixtureModelTest, ::testing::ValuesIn(test::FixtureModels()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace hsx
