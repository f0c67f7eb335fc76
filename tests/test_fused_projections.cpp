// Projections that run as one GEMM: gate/up concatenated at load, and the op
// that reads the fused output with a row stride, against the unfused arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/weights.h"
#include "test_util.h"

namespace hsx {
namespace {

Tensor Random(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::Host(DType::kF32, std::move(shape));
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

Tensor Poisoned(CpuBackend& cpu, Shape shape) {
  Tensor t = cpu.Empty(DType::kF32, std::move(shape));
  std::fill(t.data<float>(), t.data<float>() + t.numel(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

float Gated(Activation act, float g, float u) {
  const float a = act == Activation::kSilu ? g / (1.0f + std::exp(-g))
                                           : 0.5f * g * (1.0f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g)));
  return a * u;
}

// GatedActivation reads gate's columns then up's from each row of [T, 2I].
TEST(FusedProjectionsTest, GatedActivationReadsBothHalvesOfEachRow) {
  CpuBackend cpu;
  std::mt19937 rng(1);
  const int64_t t = 5, inter = 37;
  const Tensor gate_up = Random({t, 2 * inter}, rng);
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    Tensor out = Poisoned(cpu, {t, inter});
    cpu.GatedActivation(gate_up, act, out);
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t c = 0; c < inter; ++c) {
        const float* row = gate_up.data<float>() + r * 2 * inter;
        EXPECT_FLOAT_EQ(out.data<float>()[r * inter + c], Gated(act, row[c], row[inter + c])) << r << "," << c;
      }
    }
  }
}

// GatedLinear on the fused [2I, K] weight gives the separate gate and up products' values.
TEST(FusedProjectionsTest, GatedLinearOnTheFusedWeightIsTheUnfusedMlp) {
  CpuBackend cpu;
  std::mt19937 rng(2);
  const int64_t k = 48, inter = 72;
  const Tensor gate = Random({inter, k}, rng, 0.2f), up = Random({inter, k}, rng, 0.2f);
  Tensor gate_up;
  ASSERT_TRUE(PlaceRows(cpu, gate, 0, 2 * inter, "gate", gate_up).ok());
  ASSERT_TRUE(PlaceRows(cpu, up, inter, 2 * inter, "up", gate_up).ok());
  for (int64_t t : {1, 3, 8, 9, 130}) {
    const Tensor x = Random({t, k}, rng);
    Tensor g = cpu.Empty(DType::kF32, {t, inter}), u = cpu.Empty(DType::kF32, {t, inter});
    cpu.Linear(x, gate, nullptr, g);
    cpu.Linear(x, up, nullptr, u);
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
      Tensor out = Poisoned(cpu, {t, inter});
      cpu.GatedLinear(x, gate_up, act, out);
      for (int64_t i = 0; i < t * inter; ++i) {
        const float want = Gated(act, g.data<float>()[i], u.data<float>()[i]);
        EXPECT_NEAR(out.data<float>()[i], want, 1e-5f * (1.0f + std::abs(want))) << "t=" << t << " i=" << i;
      }
    }
  }
}

// PlaceRows refuses parts of different dtypes rather than mixing them in one weight.
TEST(FusedProjectionsTest, PlaceRowsRefusesAPartOfAnotherDtype) {
  CpuBackend cpu;
  Tensor fused;
  ASSERT_TRUE(PlaceRows(cpu, Tensor::Host(DType::kF32, {2, 4}), 0, 4, "a", fused).ok());
  const Status s = PlaceRows(cpu, Tensor::Host(DType::kBF16, {2, 4}), 2, 4, "model.layers.0.mlp.up_proj.weight", fused);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor 'model.layers.0.mlp.up_proj.weight' has dtype"), std::string::npos) << s.message();
}

// The checkpoint's gate_proj and up_proj, bit for bit, as the rows of one weight.
TEST(FusedProjectionsTest, LoadingConcatenatesGateAndUp) {
  const std::string dir = test::ModelDir("qwen3");
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().message();
  CpuBackend cpu;
  auto weights = LoadWeights(dir, *config, cpu);
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  auto tensors = OpenCheckpoint(dir);
  ASSERT_TRUE(tensors.ok());
  const int64_t inter = config->intermediate_size;
  for (size_t l = 0; l < weights->layers.size(); ++l) {
    const Tensor& fused = weights->layers[l].gate_up_proj;
    ASSERT_EQ(fused.size(0), 2 * inter);
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    for (auto [name, begin] : {std::pair<const char*, int64_t>{"gate_proj.weight", 0}, {"up_proj.weight", inter}}) {
      const Tensor& want = tensors->at(p + name).first;
      const Tensor got = fused.Rows(begin, begin + inter);
      ASSERT_EQ(got.nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << p << name;
    }
  }
}

}  // namespace
}  // namespace hsx
