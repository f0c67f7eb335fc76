// Broken checkpoints: each gives one error naming the file and the field or tensor,
// and what was expected.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "checkpoint_copy.h"
#include "test_util.h"

namespace hsx {
namespace {

namespace fs = std::filesystem;

class CheckpointErrorTest : public test::CheckpointCopyTest {
 protected:
  CheckpointErrorTest() : CheckpointCopyTest(test::ModelDir("qwen3")) {}
};

TEST_F(CheckpointErrorTest, UnsupportedArchitecture) {
  EditConfig([](auto& j) { j["architectures"] = {"MambaForCausalLM"}; });
  const std::string e = LoadError();
  EXPECT_CONTAINS(e, "config.json: field 'architectures': unsupported architecture 'MambaForCausalLM'");
}

TEST_F(CheckpointErrorTest, MissingAndIllTypedConfigFields) {
  // An omitted field takes transformers' default for the architecture (Qwen3: 4096).
  EditConfig([](auto& j) { j.erase("hidden_size"); });
  EXPECT_CONTAINS(LoadError(), "tensor 'model.embed_tokens.weight' has shape [512, 64], but config.json implies [512, 4096]");
  EditConfig([](auto& j) { j["hidden_size"] = "64"; });
  EXPECT_CONTAINS(LoadError(), "config.json: field 'hidden_size': is string, expected an integer");
  EditConfig([](auto& j) {
    j["hidden_size"] = 64;
    j["num_key_value_heads"] = 3;
  });
  EXPECT_CONTAINS(LoadError(), "divisible by num_key_value_heads (3)");
  EditConfig([](auto& j) {
    j["num_key_value_heads"] = 2;
    j["rope_parameters"]["rope_type"] = "ntk_by_parts";
  });
  EXPECT_CONTAINS(LoadError(), "rope_parameters: field 'rope_type': RoPE type 'ntk_by_parts' is not supported");
  EditConfig([](auto& j) { j["rope_parameters"]["rope_type"] = "yarn"; });  // yarn needs its factor
  EXPECT_CONTAINS(LoadError(), "rope_parameters: field 'factor': missing (expected a number)");
  std::ofstream(dir_ + "/config.json") << "{not json";
  EXPECT_CONTAINS(LoadError(), "config.json: invalid JSON");
}

TEST_F(CheckpointErrorTest, TruncatedFile) {
  fs::resize_file(dir_ + "/model.safetensors", 100000);
  EXPECT_CONTAINS(LoadError(), "out of range: the data section after the");
  fs::resize_file(dir_ + "/model.safetensors", 4);
  EXPECT_CONTAINS(LoadError(), "too small to be a safetensors file");
}

TEST_F(CheckpointErrorTest, HeaderLengthPastEndOfFile) {
  std::fstream f(dir_ + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t past_end = 90'000'000;
  f.write(reinterpret_cast<const char*>(&past_end), 8);
  f.close();
  EXPECT_CONTAINS(LoadError(), "model.safetensors: header length 90000000 runs past the end of the file");
  std::fstream g(dir_ + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t huge = 1ull << 40;
  g.write(reinterpret_cast<const char*>(&huge), 8);
  g.close();
  EXPECT_CONTAINS(LoadError(), "model.safetensors: header length 1099511627776 exceeds the format's limit");
}

TEST_F(CheckpointErrorTest, OffsetsOutOfRangeOrOverlapping) {
  EditHeader([](auto& h) { h["model.norm.weight"]["data_offsets"] = {0, 128}; });
  EXPECT_CONTAINS(LoadError(), "(tensors must tile the data section without gaps or overlaps)");
  Reset();
  EditHeader([](auto& h) { h["model.norm.weight"]["data_offsets"] = {1ull << 30, (1ull << 30) + 128}; });
  EXPECT_CONTAINS(LoadError(), "tensor 'model.norm.weight': data_offsets begin at 1073741824, expected");
}

// The reference reader's rule: the tensors end exactly where the file ends. A header
// length one byte short used to shift every tensor by a byte and load garbage.
TEST_F(CheckpointErrorTest, HeaderLengthOffByOneOrTrailingBytes) {
  for (int64_t delta : {-1, 1, -8, 8}) {
    Reset();
    std::fstream f(dir_ + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t len;
    f.read(reinterpret_cast<char*>(&len), 8);
    len += delta;
    f.seekp(0);
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.close();
    const std::string e = LoadError();
    EXPECT_TRUE(e.find("model.safetensors") != std::string::npos && e.find("header") != std::string::npos) << delta << ": " << e;
  }
  Reset();
  std::ofstream(dir_ + "/model.safetensors", std::ios::binary | std::ios::app) << "x";
  EXPECT_CONTAINS(LoadError(), "-byte data section (header length");
}

TEST_F(CheckpointErrorTest, OverflowingShapeOrOffsets) {
  EditHeader([](auto& h) { h["model.norm.weight"]["shape"] = {1ull << 62, 1ull << 62}; });
  EXPECT_CONTAINS(LoadError(), "tensor 'model.norm.weight': shape [4611686018427387904, 4611686018427387904] overflows");
  Reset();
  EditHeader([](auto& h) { h["model.norm.weight"]["shape"] = {~0ull}; });
  EXPECT_CONTAINS(LoadError(), "tensor 'model.norm.weight': shape entries must be non-negative 64-bit integers");
  Reset();
  EditHeader([](auto& h) { h["model.norm.weight"]["data_offsets"] = {~0ull - 1, 126}; });
  EXPECT_CONTAINS(LoadError(), "end before they begin");
}

TEST_F(CheckpointErrorTest, IndexNamesAFileOutsideTheDirectory) {
  fs::rename(dir_ + "/model.safetensors", dir_ + "/shard.safetensors");
  std::ofstream(dir_ + "/model.safetensors.index.json") << R"({"weight_map": {"model.norm.weight": "../shard.safetensors"}})";
  EXPECT_CONTAINS(LoadError(), "model.safetensors.index.json: weight_map['model.norm.weight'] = '../shard.safetensors' is not a file name");
  std::ofstream(dir_ + "/model.safetensors.index.json") << R"({"weight_map": [)" + std::string(100, '[');
  EXPECT_CONTAINS(LoadError(), "model.safetensors.index.json: JSON nested deeper than");
  std::ofstream(dir_ + "/model.safetensors.index.json") << R"({"weight_map": {}})";
  EXPECT_CONTAINS(LoadError(), "'weight_map' names no files");
}

TEST_F(CheckpointErrorTest, DtypeOrShapeDisagreeing) {
  EditHeader([](auto& h) { h["model.norm.weight"]["shape"] = {32, 2}; });
  EXPECT_CONTAINS(LoadError(), "tensor 'model.norm.weight' has shape [32, 2], but config.json implies [64]");
  Reset();
  EditHeader([](auto& h) { h["model.norm.weight"]["dtype"] = "F32"; });
  EXPECT_CONTAINS(LoadError(), "tensor 'model.norm.weight': 128 bytes for shape [64] F32 (expected 256)");
  Reset();
  EditHeader([](auto& h) { h["model.norm.weight"]["dtype"] = "Q4_K"; });
  EXPECT_CONTAINS(LoadError(), "unsupported dtype 'Q4_K'");
  Reset();
  EditHeader([](auto& h) {
    h["model.norm.weight"]["dtype"] = "I32";
    h["model.norm.weight"]["shape"] = {32};
  });
  EXPECT_CONTAINS(LoadError(), "'model.norm.weight' has shape [32], but config.json implies [64]");
}

TEST_F(CheckpointErrorTest, MissingTensorAndMissingFile) {
  {
    SafetensorsFile whole = test::Golden(dir_ + "/model.safetensors");
    std::vector<NamedTensor> kept;
    for (const auto& [name, t] : whole.tensors())
      if (name != "model.layers.3.mlp.up_proj.weight") kept.push_back({name, t});
    ASSERT_TRUE(WriteSafetensors(dir_ + "/without.safetensors", kept).ok());
  }
  fs::rename(dir_ + "/without.safetensors", dir_ + "/model.safetensors");
  EXPECT_CONTAINS(LoadError(), "missing tensor 'model.layers.3.mlp.up_proj.weight' (expected shape [160, 64])");
  fs::remove(dir_ + "/model.safetensors");
  EXPECT_CONTAINS(LoadError(), "no model.safetensors or model.safetensors.index.json");
}

TEST_F(CheckpointErrorTest, ShardedCheckpointLoadsAndChecksItsIndex) {
  // A two-shard copy of the fixture loads and gives the same hidden states and logits,
  // bit for bit, as the single file (a tensor read from the wrong shard or offset would not).
  SafetensorsFile golden = test::Golden(test::ModelDir("qwen3") + "/golden.safetensors");
  CpuBackend backend;
  test::GoldenPrefill single;
  {
    auto model = Model::Load(dir_, backend);
    ASSERT_TRUE(model.ok()) << model.status().message();
    single = test::RunGoldenPrefill(**model, golden);
  }
  SafetensorsFile whole = test::Golden(dir_ + "/model.safetensors");
  std::vector<NamedTensor> a, b;
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : whole.tensors()) {
    const bool first = name.find("layers.0.") != std::string::npos || name.find("layers.1.") != std::string::npos;
    (first ? a : b).push_back({name, t});
    index["weight_map"][name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model-00001-of-00002.safetensors", a).ok());
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model-00002-of-00002.safetensors", b).ok());
  fs::remove(dir_ + "/model.safetensors");
  std::ofstream(dir_ + "/model.safetensors.index.json") << index.dump();
  auto model = Model::Load(dir_, backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const test::GoldenPrefill sharded = test::RunGoldenPrefill(**model, golden);
  for (size_t k = 0; k < single.hidden.size(); ++k) {
    EXPECT_EQ(sharded.hidden[k], single.hidden[k]) << "prompt " << k;
    EXPECT_EQ(sharded.logits[k], single.logits[k]) << "prompt " << k;
  }
  fs::remove(dir_ + "/model-00002-of-00002.safetensors");
  EXPECT_CONTAINS(LoadError(), "model-00002-of-00002.safetensors: cannot open");
}

}  // namespace
}  // namespace hsx
