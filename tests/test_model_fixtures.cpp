// Every fixture model against Hugging Face's f32 goldens: all N+1 hidden states and
// logits of three prompts packed into one forward (no padding), within 1e-4 relative.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "test_util.h"

namespace hsx {
namespace {

class FixtureModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureModelTest, PackedPrefillMatchesGoldenHiddenStatesAndLogits) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir(GetParam()), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir(GetParam()) + "/golden.safetensors");
  const test::GoldenPrefill out = test::RunGoldenPrefill(**model, golden);
  const int64_t h = (*model)->config().hidden_size, layers = (*model)->config().num_layers + 1;
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> gold = test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value());
    const int64_t t = static_cast<int64_t>(gold.size()) / (layers * h);
    for (int64_t l = 0; l < layers; ++l) {
      std::vector<float> mine, ref;
      for (int64_t i = 0; i < t; ++i) {
        const int64_t at = (i * layers + l) * h;
        mine.insert(mine.end(), out.hidden[k].begin() + at, out.hidden[k].begin() + at + h);
        ref.insert(ref.end(), gold.begin() + at, gold.begin() + at + h);
      }
      EXPECT_LE(test::RelativeMaxError(mine, ref), 1e-4) << "prompt " << k << " layer id " << l;
    }
    EXPECT_LE(test::RelativeMaxError(out.logits[k], test::AsFloats(golden.Get("logits_" + std::to_string(k)).value())), 1e-4)
        << "prompt " << k << " logits";
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, FixtureModelTest, ::testing::ValuesIn(test::FixtureModels()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(GptOss, FixtureModelTest, ::testing::ValuesIn(test::GptOssFixtureModels()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace hsx
