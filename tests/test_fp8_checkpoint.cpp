// FP8 checkpoints in compressed-tensors' dynamic scheme (model/quantization_config.h),
// made by llm-compressor from the qwen3 fixture (tests/data/generators/
// fp8_dynamic_checkpoint.py): hsx runs the checkpoint's own codes and scales, and refuses
// every other scheme and every broken tensor with an error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "tensor/float8.h"
#include "tensor/safetensors.h"
#include "checkpoint_copy.h"
#include "test_util.h"

namespace hsx {
namespace {

namespace fs = std::filesystem;

std::string CheckpointDir() { return test::DataPath("fp8/qwen3_fp8_dynamic"); }
std::string MoeCheckpointDir() { return test::DataPath("fp8/qwen3_moe_fp8_dynamic"); }

// The golden prefill's worst relative error over the fixture's three prompts.
double GoldenError(Model& model, const SafetensorsFile& golden, const std::string& prefix) {
  const test::GoldenPrefill out = test::RunGoldenPrefill(model, golden);
  double worst = 0;
  for (int k = 0; k < 3; ++k) {
    worst = std::max(worst, test::RelativeMaxError(out.hidden[k], test::AsFloats(golden.Get(prefix + std::to_string(k)).value())));
  }
  return worst;
}

// HF's own bf16 error against the same goldens (the fixture's bf16 GPU run), the worst of three.
double HfBf16Error(const SafetensorsFile& golden) {
  double worst = 0;
  for (int k = 0; k < 3; ++k) {
    worst = std::max(worst, test::RelativeMaxError(test::AsFloats(golden.Get("hidden_bf16gpu_" + std::to_string(k)).value()),
                                                   test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value())));
  }
  return worst;
}

// Layer 0's fused q/k/v holds the checkpoint's q, k and v codes and scales, row for row.
TEST(Fp8CheckpointTest, LoadsTheCheckpointsCodesAndScales) {
  CpuBackend backend;
  auto model = Model::Load(CheckpointDir(), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_TRUE((*model)->config().fp8_checkpoint);
  auto file = SafetensorsFile::Open(CheckpointDir() + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().message();
  const Tensor& qkv = (*model)->weights().layers[0].qkv_proj;
  ASSERT_EQ(qkv.dtype(), DType::kF8E4M3);
  ASSERT_NE(qkv.row_scales(), nullptr);
  int64_t row = 0;
  for (const char* part : {"q_proj", "k_proj", "v_proj"}) {
    const std::string name = std::string("model.layers.0.self_attn.") + part + ".weight";
    const Tensor codes = file->Get(name).value(), scale = file->Get(name + "_scale").value();
    ASSERT_EQ(std::memcmp(qkv.Rows(row, row + codes.size(0)).raw(), codes.raw(), codes.nbytes()), 0) << part;
    const std::vector<float> want = test::AsFloats(scale);
    for (int64_t r = 0; r < codes.size(0); ++r) {
      ASSERT_EQ(qkv.row_scales()->data<float>()[row + r], want[r]) << part << " row " << r;
    }
    row += codes.size(0);
  }
  EXPECT_EQ(row, qkv.size(0));
  // The LM head stays as the checkpoint keeps it (quantization_config's ignore list).
  EXPECT_NE((*model)->weights().lm_head.dtype(), DType::kF8E4M3);
}

// A checkpoint's states against the f32 goldens of the fixture it was made from: the error
// of FP8 (E4M3 weights and per-token activations) stays within 16x HF's own bf16 error and
// within 2x what --quantization fp8 gives the fixture's weights.
void ExpectGoldenErrorLikeQuantizingAtLoad(const std::string& checkpoint_dir, const std::string& fixture,
                                           const char* label) {
  CpuBackend backend;
  SafetensorsFile golden = test::Golden(test::ModelDir(fixture) + "/golden.safetensors");
  auto checkpoint = Model::Load(checkpoint_dir, backend);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().message();
  auto at_load = Model::Load(test::ModelDir(fixture), backend);
  ASSERT_TRUE(at_load.ok()) << at_load.status().message();
  ASSERT_TRUE((*at_load)->QuantizeWeightsFp8().ok());
  const double error = GoldenError(**checkpoint, golden, "hidden_");
  const double at_load_error = GoldenError(**at_load, golden, "hidden_");
  const double hf_bf16 = HfBf16Error(golden);
  std::printf("[%s] error %.3e, quantized at load %.3e, hf bf16 %.3e\n", label, error, at_load_error, hf_bf16);
  EXPECT_GT(error, 0.0);
  EXPECT_LE(error, 16 * hf_bf16);
  EXPECT_LE(error, 2 * at_load_error);
}

TEST(Fp8CheckpointTest, HiddenStatesStayNearTheF32GoldensLikeQuantizingAtLoad) {
  ExpectGoldenErrorLikeQuantizingAtLoad(CheckpointDir(), "qwen3", "fp8 checkpoint");
}

// A Qwen3-MoE checkpoint of the scheme (the qwen3_moe fixture through llm-compressor) holds
// its experts in E4M3 too. They run on bf16 grouped GEMMs, so they load dequantized: each
// element its code times its row's scale. The attention projections stay codes; the router
// and the LM head stay as the checkpoint keeps them.
TEST(Fp8CheckpointTest, MoeExpertsLoadDequantized) {
  SafetensorsFile file = test::Golden(MoeCheckpointDir() + "/model.safetensors");
  // Expert 2 of layer 1 on one rank, and on rank 1 of two: gate's rows and down's
  // columns (tensor parallelism splits experts inside), each its code times its row's scale.
  auto comms = MakeCpuCommunicators(2);
  for (const int ranks : {1, 2}) {
    CpuBackend backend;
    auto model = Model::Load(MoeCheckpointDir(), backend, ranks == 2 ? comms[1].get() : nullptr);
    ASSERT_TRUE(model.ok()) << model.status().message();
    const LayerWeights& l = (*model)->weights().layers[1];
    EXPECT_EQ(l.qkv_proj.dtype(), DType::kF8E4M3);
    EXPECT_NE(l.router.dtype(), DType::kF8E4M3);
    for (const bool down : {false, true}) {
      const std::string name = std::string("model.layers.1.mlp.experts.2.") + (down ? "down_proj" : "gate_proj") + ".weight";
      const Tensor codes = file.Get(name).value();
      ASSERT_EQ(codes.dtype(), DType::kF8E4M3) << name;
      const std::vector<float> scale = test::AsFloats(file.Get(name + "_scale").value());
      const Tensor& expert = down ? l.experts.down[2] : l.experts.gate[2];
      ASSERT_EQ(expert.dtype(), DType::kF32) << name;  // the CPU backend's weights
      const int64_t rows = codes.size(0), cols = codes.size(1);
      const int64_t my_rows = down ? rows : rows / ranks, my_cols = down ? cols / ranks : cols;
      ASSERT_EQ(expert.shape(), (Shape{my_rows, my_cols})) << name;
      const int64_t row0 = down ? 0 : rows - my_rows, col0 = down ? cols - my_cols : 0;  // the last rank's slice
      for (int64_t r = 0; r < my_rows; ++r) {
        for (int64_t c = 0; c < my_cols; ++c) {
          const int64_t i = (row0 + r) * cols + col0 + c;
          ASSERT_EQ(expert.data<float>()[r * my_cols + c], F8E4M3ToF32(codes.data<uint8_t>()[i]) * scale[row0 + r])
              << name << " ranks " << ranks << " row " << r << " column " << c;
        }
      }
    }
  }
}

// The MoE checkpoint within the same bounds (--quantization fp8 leaves the experts in the
// compute dtype; the checkpoint's experts were rounded to E4M3 once).
TEST(Fp8CheckpointTest, MoeHiddenStatesStayNearTheF32Goldens) {
  ExpectGoldenErrorLikeQuantizingAtLoad(MoeCheckpointDir(), "qwen3_moe", "fp8 moe checkpoint");
}

// A tensor-parallel rank takes its slices of the codes and the scales: a column-parallel
// weight (q/k/v, gate/up) its rows and their scales, a row-parallel one (o, down) its
// columns and every row's scale.
TEST(Fp8CheckpointTest, TensorParallelRanksTakeTheirSlicesOfCodesAndScales) {
  auto comms = MakeCpuCommunicators(2);
  CpuBackend backend;
  auto rank1 = Model::Load(CheckpointDir(), backend, comms[1].get());
  ASSERT_TRUE(rank1.ok()) << rank1.status().message();
  SafetensorsFile file = SafetensorsFile::Open(CheckpointDir() + "/model.safetensors").value();
  const LayerWeights& l = (*rank1)->weights().layers[1];
  const Tensor gate = file.Get("model.layers.1.mlp.gate_proj.weight").value();
  const std::vector<float> gate_scale = test::AsFloats(file.Get("model.layers.1.mlp.gate_proj.weight_scale").value());
  const int64_t half = gate.size(0) / 2, k = gate.size(1);
  ASSERT_EQ(l.gate_up_proj.dtype(), DType::kF8E4M3);
  ASSERT_EQ(l.gate_up_proj.size(0), 2 * half);  // this rank's gate rows, then its up rows
  EXPECT_EQ(std::memcmp(l.gate_up_proj.raw(), gate.data<uint8_t>() + half * k, half * k), 0);
  for (int64_t r = 0; r < half; ++r) ASSERT_EQ(l.gate_up_proj.row_scales()->data<float>()[r], gate_scale[half + r]) << r;
  const Tensor down = file.Get("model.layers.1.mlp.down_proj.weight").value();
  const std::vector<float> down_scale = test::AsFloats(file.Get("model.layers.1.mlp.down_proj.weight_scale").value());
  const int64_t cols = down.size(1) / 2;
  ASSERT_EQ(l.down_proj.size(1), cols);
  for (int64_t r = 0; r < down.size(0); ++r) {
    ASSERT_EQ(std::memcmp(l.down_proj.data<uint8_t>() + r * cols, down.data<uint8_t>() + r * down.size(1) + cols, cols), 0)
        << "down_proj row " << r;
    ASSERT_EQ(l.down_proj.row_scales()->data<float>()[r], down_scale[r]) << r;
  }
}

class Fp8CheckpointErrorTest : public test::CheckpointCopyTest {
 protected:
  Fp8CheckpointErrorTest() : CheckpointCopyTest(CheckpointDir()) {}
  void EditQuantization(const std::function<void(nlohmann::json&)>& edit) {
    EditConfig([&](nlohmann::json& j) { edit(j["quantization_config"]); });
  }
};

TEST_F(Fp8CheckpointErrorTest, OtherQuantizationSchemesAreRefusedNamingTheField) {
  const nlohmann::json original = [&] {
    std::ifstream in(dir_ + "/config.json");
    return nlohmann::json::parse(in)["quantization_config"];
  }();
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    EditQuantization([&](nlohmann::json& q) {
      q = original;
      edit(q);
    });
    EXPECT_CONTAINS(LoadError(), needle);
  };
  auto group = [](nlohmann::json& q) -> nlohmann::json& { return q["config_groups"].begin().value(); };
  refused([](auto& q) { q["quant_method"] = "fp8"; }, "quantization_config: field 'quant_method': \"fp8\"");
  refused([](auto& q) { q["format"] = "pack-quantized"; }, "field 'format'");
  refused([](auto& q) { q["kv_cache_scheme"] = {{"num_bits", 8}}; }, "field 'kv_cache_scheme'");
  refused([&](auto& q) { group(q)["weights"]["strategy"] = "tensor"; },
          ".weights: field 'strategy': \"tensor\"");
  refused([&](auto& q) { group(q)["weights"]["num_bits"] = 4; }, ".weights: field 'num_bits': 4");
  refused([&](auto& q) { group(q)["weights"]["strategy"] = "block"; }, "field 'strategy'");
  refused([&](auto& q) { group(q)["input_activations"]["dynamic"] = false; },
          ".input_activations: field 'dynamic': false");
  refused([&](auto& q) { group(q)["input_activations"] = nullptr; }, ".input_activations: expected an object");
  refused([&](auto& q) { group(q)["targets"] = {"Attention"}; }, "field 'targets'");
  refused([](auto& q) { q.erase("config_groups"); }, "field 'config_groups'");
}

TEST_F(Fp8CheckpointErrorTest, BrokenScalesAreRefusedNamingTheTensor) {
  const float negative = -1.0f;
  const std::string scale = "model.layers.1.mlp.down_proj.weight_scale";
  SafetensorsFile file = SafetensorsFile::Open(dir_ + "/model.safetensors").value();
  const DType dtype = file.Get(scale).value().dtype();
  if (dtype == DType::kF32) {
    PatchTensorBytes(scale, &negative, sizeof negative);
  } else {  // two bf16 scales
    const uint16_t pair[2] = {F32ToBF16(negative), F32ToBF16(negative)};
    PatchTensorBytes(scale, pair, sizeof pair);
  }
  const std::string error = LoadError();
  EXPECT_CONTAINS(error, "'" + scale + "' row 0 is -1");
}

// E4M3 has no infinities; S.1111.111 (0x7f, 0xff) is NaN, which would make every state
// the row touches NaN: refused as corrupt, naming the tensor, row and column.
TEST_F(Fp8CheckpointErrorTest, NanCodesAreRefusedNamingTheElement) {
  const std::string weight = "model.layers.1.mlp.down_proj.weight";
  for (const uint8_t nan : {uint8_t{0x7f}, uint8_t{0xff}}) {
    const uint8_t codes[4] = {0x01, 0xfe, nan, 0x7e};  // 0xfe, 0x7e: -448 and 448, not NaN
    PatchTensorBytes(weight, codes, sizeof codes);
    char expected[96];
    std::snprintf(expected, sizeof expected, "'%s' row 0 column 2 is 0x%02x, an E4M3 NaN", weight.c_str(), nan);
    EXPECT_CONTAINS(LoadError(), expected);
  }
}

// Only matrices may be E4M3: a norm weight stored as F8 is refused, naming it and the
// shape and types expected.
TEST_F(Fp8CheckpointErrorTest, AnF8TensorThatIsNotAMatrixIsRefused) {
  EditHeader([](nlohmann::json& h) {
    nlohmann::json& norm = h["model.norm.weight"];  // [64] bf16: 128 bytes, as [128] F8
    norm["dtype"] = "F8_E4M3";
    norm["shape"] = {128};
  });
  EXPECT_CONTAINS(LoadError(), "tensor 'model.norm.weight' is F8_E4M3, but only matrices may be (expected shape [64]");
}

TEST_F(Fp8CheckpointErrorTest, AMissingScaleIsRefusedNamingIt) {
  EditHeader([](nlohmann::json& h) {
    h["model.layers.0.self_attn.k_proj.weight_scale_"] = h["model.layers.0.self_attn.k_proj.weight_scale"];
    h.erase("model.layers.0.self_attn.k_proj.weight_scale");
  });
  EXPECT_CONTAINS(LoadError(), "missing tensor 'model.layers.0.self_attn.k_proj.weight_scale' (expected shape");
}

TEST_F(Fp8CheckpointErrorTest, AQuantizationConfigIsNeededToReadFp8Tensors) {
  EditConfig([](nlohmann::json& j) { j.erase("quantization_config"); });
  EXPECT_CONTAINS(LoadError(), "has dtype F8_E4M3, expected a float type");
}

}  // namespace
}  // namespace hsx
