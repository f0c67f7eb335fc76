// FP8 E4M3 and --quantization fp8 on the CPU reference: the conversions against ml_dtypes'
// bytes (tests/data/fp8/make_e4m3_golden.py), the per-row quantization rule, the FP8
// Linear against the products of the codes, and every fixture model's hidden states.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "tensor/float8.h"
#include "test_util.h"

namespace hsx {
namespace {

template <class T>
std::vector<T> ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

TEST(Float8, EncodesLikeMlDtypes) {
  const auto values = ReadRaw<float>(test::DataPath("fp8/e4m3_values.f32"));
  const auto encoded = ReadRaw<uint8_t>(test::DataPath("fp8/e4m3_encoded.u8"));
  ASSERT_EQ(values.size(), encoded.size());
  ASSERT_GT(values.size(), 5000u);
  int wrong = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (F32ToF8E4M3(values[i]) != encoded[i] && ++wrong <= 5)
      ADD_FAILURE() << values[i] << ": 0x" << std::hex << int(F32ToF8E4M3(values[i])) << ", ml_dtypes 0x"
                    << int(encoded[i]);
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Float8, DecodesEveryCodeAndRoundTrips) {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    const float f = F8E4M3ToF32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    ++finite;
    EXPECT_EQ(F32ToF8E4M3(f), c) << f;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
}

TEST(Float8, SaturatesLikeSatfinite) {
  EXPECT_EQ(F32ToF8E4M3(449.0f), 0x7e);
  EXPECT_EQ(F32ToF8E4M3(1e9f), 0x7e);
  EXPECT_EQ(F32ToF8E4M3(-1e9f), 0xfe);
  EXPECT_EQ(F32ToF8E4M3(INFINITY), 0x7e);
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(F32ToF8E4M3(NAN))));
}

TEST(Float8, RowQuantizationMapsTheLargestMagnitudeTo448) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(300);
  for (float& v : x) v = dist(rng);
  x[17] = -20.0f;  // the largest magnitude
  std::vector<uint8_t> q(x.size(), 0xaa);
  const float scale = QuantizeRowF8E4M3(x.data(), static_cast<int64_t>(x.size()), q.data());
  EXPECT_FLOAT_EQ(scale, 20.0f / 448.0f);
  EXPECT_EQ(q[17], 0xfe);  // -448
  for (size_t i = 0; i < x.size(); ++i) {
    // Within half a step of 3 mantissa bits (relative 2^-4), or of the subnormal spacing.
    const float back = F8E4M3ToF32(q[i]) * scale;
    EXPECT_LE(std::fabs(back - x[i]), std::max(std::fabs(x[i]) / 16.0f, std::ldexp(1.0f, -10) * scale)) << i;
  }
  std::vector<float> zeros(8, 0.0f);
  EXPECT_EQ(QuantizeRowF8E4M3(zeros.data(), 8, q.data()), 1.0f);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q[i], 0);
}

Tensor RandomF32(Shape shape, std::mt19937& rng) {
  Tensor t = Tensor::Host(DType::kF32, std::move(shape));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

TEST(Float8, CpuLinearMultipliesTheCodesAndScalesBack) {
  CpuBackend cpu;
  std::mt19937 rng(2);
  const int64_t m = 5, n = 48, k = 80;
  const Tensor x = RandomF32({m, k}, rng), w = RandomF32({n, k}, rng), bias = RandomF32({n}, rng);
  const Tensor wq = cpu.QuantizeRowsFp8(w);
  ASSERT_EQ(wq.dtype(), DType::kF8E4M3);
  ASSERT_NE(wq.row_scales(), nullptr);
  Tensor y = Tensor::Host(DType::kF32, {m, n}), exact = Tensor::Host(DType::kF32, {m, n});
  std::fill(y.data<float>(), y.data<float>() + y.numel(), NAN);
  cpu.Linear(x, wq, &bias, y);
  cpu.Linear(x, w, &bias, exact);
  std::vector<uint8_t> xq(static_cast<size_t>(k));
  double worst = 0, range = 0;
  for (int64_t i = 0; i < m; ++i) {
    const float sx = QuantizeRowF8E4M3(x.data<float>() + i * k, k, xq.data());
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < k; ++c) dot += double(F8E4M3ToF32(xq[c])) * F8E4M3ToF32(wq.data<uint8_t>()[j * k + c]);
      const double want = dot * sx * wq.row_scales()->data<float>()[j] + bias.data<float>()[j];
      EXPECT_NEAR(y.data<float>()[i * n + j], want, 1e-5 * std::max(1.0, std::fabs(want))) << i << "," << j;
      worst = std::max(worst, std::fabs(want - exact.data<float>()[i * n + j]));
      range = std::max(range, std::fabs(double(exact.data<float>()[i * n + j])));
    }
  }
  // FP8's rounding, not a wrong scale: within a few percent of the f32 product's range.
  EXPECT_LT(worst, 0.1 * range);
  // x quantized beforehand (one quantization for several projections) gives the same bits.
  Tensor y2 = Tensor::Host(DType::kF32, {m, n});
  std::fill(y2.data<float>(), y2.data<float>() + y2.numel(), NAN);
  cpu.Linear(cpu.QuantizeRowsFp8(x), wq, &bias, y2);
  EXPECT_EQ(std::memcmp(y.raw(), y2.raw(), y.nbytes()), 0);
}

class Fp8FixtureTest : public ::testing::TestWithParam<std::string> {};

// The FP8 model's states against Hugging Face's f32 goldens: the error --quantization fp8
// costs, printed beside Hugging Face's own bf16 error on the same goldens.
TEST_P(Fp8FixtureTest, HiddenStatesStayNearTheF32Goldens) {
  CpuBackend backend;
  auto model = Model::Load(test::ModelDir(GetParam()), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  ASSERT_TRUE((*model)->QuantizeWeightsFp8().ok());
  SafetensorsFile golden = test::Golden(test::ModelDir(GetParam()) + "/golden.safetensors");
  const test::GoldenPrefill out = test::RunGoldenPrefill(**model, golden);
  double fp8 = 0, hf_bf16 = 0;
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> gold = test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value());
    fp8 = std::max(fp8, test::RelativeMaxError(out.hidden[k], gold));
    hf_bf16 = std::max(hf_bf16, test::RelativeMaxError(
                                    test::AsFloats(golden.Get("hidden_bf16gpu_" + std::to_string(k)).value()), gold));
  }
  std::printf("[fp8 cpu] %-15s fp8 %.3e  hf bf16 %.3e  ratio %.2f\n", GetParam().c_str(), fp8, hf_bf16, fp8 / hf_bf16);
  EXPECT_GT(fp8, 0.0);  // the weights did change
  // E4M3 keeps 3 mantissa bits to bf16's 7: its rounding step is 2^4 times bf16's, and so,
  // at most, is the error it adds (measured: 10-12x on the dense fixtures, less where MoE
  // experts and Gemma 4's per-layer projections stay unquantized).
  EXPECT_LE(fp8, 16 * hf_bf16);
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, Fp8FixtureTest, ::testing::ValuesIn(test::FixtureModels()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace hsx
