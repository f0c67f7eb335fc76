// The capture sinks: hs-connectors' FP8 rule, the safetensors file sink (formats, lock,
// exclusive names, metadata), vLLM's --kv-transfer-config, and the record a finished
// sequence becomes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "capture/fp8_states.h"
#include "capture/kv_transfer_config.h"
#include "capture/memory_sink.h"
#include "capture/safetensors_sink.h"
#include "engine/capture_record.h"
#include "tensor/float8.h"

namespace hsx {
namespace {

namespace fs = std::filesystem;

Tensor F32States(int64_t t, int64_t l, int64_t h, const std::vector<float>& values) {
  Tensor x = Tensor::Host(DType::kF32, {t, l, h});
  std::memcpy(x.data<float>(), values.data(), values.size() * sizeof(float));
  return x;
}

TEST(Fp8StatesTest, OneScalePerTokenOverAllLayersAndTheReferenceCodes) {
  // Token 0 spans two layers with amax 4: codes are x / (4 / 448), all exact in E4M3.
  // Token 1 is all zeros: the scale is clamped to 1e-12 and the codes are zero.
  Tensor x = F32States(2, 2, 2, {1.0f, -2.0f, 0.5f, 4.0f, 0, 0, 0, 0});
  Fp8States q = QuantizeStatesFp8(x);
  ASSERT_EQ(q.values.dtype(), DType::kF8E4M3);
  ASSERT_EQ(q.values.shape(), (Shape{2, 2, 2}));
  ASSERT_EQ(q.scales.shape(), (Shape{2, 1, 1}));
  EXPECT_FLOAT_EQ(q.scales.data<float>()[0], 4.0f / 448.0f);
  EXPECT_EQ(q.scales.data<float>()[1], 1e-12f);
  const uint8_t expected[8] = {0x6E /*112*/, 0xF6 /*-224*/, 0x66 /*56*/, 0x7E /*448*/, 0, 0, 0, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.values.data<uint8_t>()[i], expected[i]) << "value " << i;
}

TEST(Fp8StatesTest, Bf16InputRoundTripsWithinE4M3Precision) {
  std::vector<float> values;
  for (int i = 0; i < 3 * 64; ++i) values.push_back(std::sin(0.37f * static_cast<float>(i)) * (1 + i % 7));
  Tensor f32 = F32States(3, 2, 32, values);
  Tensor bf16 = Tensor::Host(DType::kBF16, f32.shape());
  ConvertFromF32(f32.data<float>(), DType::kBF16, bf16.raw(), values.size());
  Fp8States q = QuantizeStatesFp8(bf16);
  std::vector<float> back(values.size());
  ConvertToF32(DType::kBF16, bf16.raw(), back.data(), back.size());
  for (int64_t t = 0; t < 3; ++t) {
    const float scale = q.scales.data<float>()[t];
    for (int64_t j = 0; j < 64; ++j) {
      const size_t i = static_cast<size_t>(t * 64 + j);
      const float restored = F8E4M3ToF32(q.values.data<uint8_t>()[i]) * scale;
      // E4M3 keeps 3 mantissa bits: a relative error of at most 2^-4, or a subnormal step.
      EXPECT_NEAR(restored, back[i], std::fabs(back[i]) / 16 + scale * std::ldexp(1.0f, -9)) << t << "," << j;
    }
  }
}

class SafetensorsSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsx-capture-sink-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  CaptureRecord Record(const std::string& id) const {
    CaptureRecord r;
    r.id = id;
    r.hidden_states = F32States(2, 1, 3, {1, 2, 3, -4, -5, -6});
    r.token_ids = {7, 9};
    r.metadata = {{"hsx_layer_ids", "[1]"}};
    return r;
  }
  std::string dir_;
};

TEST_F(SafetensorsSinkTest, WritesVllmsTensorsAndTheMetadata) {
  SafetensorsSink sink({.dir = dir_});
  auto receipt = sink.Put(Record("req-1"));
  ASSERT_TRUE(receipt.ok()) << receipt.status().message();
  const std::string path = dir_ + "/req-1.safetensors";
  EXPECT_EQ(receipt->location, path);
  EXPECT_EQ(receipt->transfer_params, nlohmann::json({{"hidden_states_path", path}}));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ(file->tensors().size(), 2u);
  Tensor hs = *file->Get("hidden_states");
  Tensor ids = *file->Get("token_ids");
  ASSERT_EQ(hs.shape(), (Shape{2, 1, 3}));
  ASSERT_EQ(ids.dtype(), DType::kI64);
  float v[6];
  std::memcpy(v, hs.raw(), sizeof(v));
  EXPECT_EQ(v[3], -4.0f);
  int64_t t[2];
  std::memcpy(t, ids.raw(), sizeof(t));
  EXPECT_EQ(t[0], 7);
  EXPECT_EQ(t[1], 9);
  EXPECT_EQ(file->metadata().at("hsx_layer_ids"), "[1]");
  EXPECT_FALSE(fs::exists(path + ".lock"));
}

TEST_F(SafetensorsSinkTest, Fp8FilesHoldCodesScalesAndTokenIds) {
  SafetensorsSink sink({.dir = dir_, .format = StatesFormat::kFp8});
  ASSERT_TRUE(sink.Put(Record("q")).ok());
  auto file = SafetensorsFile::Open(dir_ + "/q.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->Get("hidden_states")->dtype(), DType::kF8E4M3);
  EXPECT_EQ(file->Get("hidden_states_scales")->dtype(), DType::kF32);
  EXPECT_EQ(file->Get("hidden_states_scales")->shape(), (Shape{2, 1, 1}));
  float scales[2];
  std::memcpy(scales, file->Get("hidden_states_scales")->raw(), sizeof(scales));
  EXPECT_FLOAT_EQ(scales[0], 3.0f / 448.0f);
  EXPECT_FLOAT_EQ(scales[1], 6.0f / 448.0f);
  EXPECT_TRUE(file->Get("token_ids").ok());
}

TEST_F(SafetensorsSinkTest, ExclusiveNamesNeverReplaceAFileAndTheLockFileIsLeftForReaders) {
  SafetensorsSink sink({.dir = dir_, .lock = true, .exclusive = true});
  CaptureRecord first = Record("a");
  first.name = "custom.safetensors";
  ASSERT_TRUE(sink.Put(first).ok());
  EXPECT_TRUE(fs::exists(dir_ + "/custom.safetensors.lock"));  // speculators' reader removes it
  CaptureRecord second = Record("b");
  second.name = "custom.safetensors";
  second.token_ids = {1, 1};
  auto again = sink.Put(second);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("another writer created this file first"), std::string::npos);
  EXPECT_NE(again.status().message().find("request 'b'"), std::string::npos);
  int64_t t[2];
  std::memcpy(t, SafetensorsFile::Open(dir_ + "/custom.safetensors")->Get("token_ids")->raw(), sizeof(t));
  EXPECT_EQ(t[0], 7);  // still the first writer's
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

TEST_F(SafetensorsSinkTest, AnIdThatIsNoFileNameIsRefused) {
  SafetensorsSink sink({.dir = dir_});
  auto bad = sink.Put(Record("sub/escape"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'/'"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ + "/sub"));
}

TEST(KvTransferConfigTest, EachConnectorAsSpeculatorsAndHsConnectorsWriteIt) {
  auto files = ParseKvTransferConfig(
      R"({"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": "/tmp/hs/", "use_synchronization_lock": false}})");
  ASSERT_TRUE(files.ok()) << files.status().message();
  EXPECT_EQ(files->connector, KvTransferConfig::Connector::kFiles);
  EXPECT_EQ(files->storage_dir, "/tmp/hs");
  EXPECT_FALSE(files->use_lock);
  auto fp8 = ParseKvTransferConfig(
      R"({"kv_connector": "FP8HiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_module_path": "hs_connectors.fp8_hidden_states_connector",
          "kv_connector_extra_config": {"shared_storage_path": "/tmp/hs"}})");
  ASSERT_TRUE(fp8.ok()) << fp8.status().message();
  EXPECT_EQ(fp8->connector, KvTransferConfig::Connector::kFp8Files);
  EXPECT_TRUE(fp8->use_lock);
  auto mooncake = ParseKvTransferConfig(
      R"({"kv_connector": "MooncakeHiddenStatesConnector",
          "kv_connector_module_path": "hs_connectors.mooncake_hidden_states_connector",
          "kv_connector_extra_config": {"mooncake": {"master_server_address": "127.0.0.1:50051"}}})");
  ASSERT_TRUE(mooncake.ok()) << mooncake.status().message();
  EXPECT_FALSE(mooncake->writes_files());
  EXPECT_EQ(mooncake->mooncake.value("master_server_address", ""), "127.0.0.1:50051");
  // extract: the directory defaults to --output.
  auto defaulted = ParseKvTransferConfig(R"({"kv_connector": "FP8HiddenStatesConnector"})", "--kv-transfer-config", "/out");
  ASSERT_TRUE(defaulted.ok());
  EXPECT_EQ(defaulted->storage_dir, "/out");
}

TEST(KvTransferConfigTest, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([1])", "not a JSON object"},
      {R"({"kv_connector": "SharedStorageConnector"})", "kv_connector 'SharedStorageConnector'"},
      {R"({"kv_connector": "FP8HiddenStatesConnector", "kv_connector_module_path": "my.module",
           "kv_connector_extra_config": {"shared_storage_path": "/x"}})",
       "kv_connector_module_path 'my.module'"},
      {R"({"kv_connector": "ExampleHiddenStatesConnector"})", "shared_storage_path (a directory) is required"},
      {R"({"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_consumer",
           "kv_connector_extra_config": {"shared_storage_path": "/x"}})",
       "kv_role"},
      {R"({"kv_connector": "ExampleHiddenStatesConnector",
           "kv_connector_extra_config": {"shared_storage_path": "/x", "num_writer_threads": 0}})",
       "num_writer_threads"},
      {R"({"kv_connector": "MooncakeHiddenStatesConnector", "kv_connector_extra_config": {}})", "mooncake (an object)"},
  };
  for (const auto& [text, expected] : cases) {
    auto parsed = ParseKvTransferConfig(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.status().message().find(expected), std::string::npos) << parsed.status().message();
    EXPECT_EQ(parsed.status().message().rfind("--kv-transfer-config: ", 0), 0u) << parsed.status().message();
  }
}

TEST(CaptureRecordTest, AFinishedSequenceSharesItsRowsAndNamesTheirTokens) {
  Request request{"r", {5, 6, 7}, 2};
  request.include_output_tokens = true;
  Sequence seq(request);
  seq.Append(8);
  seq.Append(9);
  seq.hidden_states = F32States(4, 1, 2, {1, 2, 3, 4, 5, 6, 7, 8});  // the last token never ran
  MemorySink sink;
  CaptureRecord record = CaptureRecordOf(seq, "", {{"k", "v"}});
  EXPECT_EQ(record.hidden_states.raw(), seq.hidden_states.raw());  // no copy
  EXPECT_EQ(record.token_ids, (std::vector<int32_t>{5, 6, 7, 8}));
  ASSERT_TRUE(sink.Put(record).ok());
  EXPECT_FALSE(sink.Put(record).ok());  // one record per key
  EXPECT_EQ(sink.records().at("r").metadata.at("k"), "v");
}

}  // namespace
}  // namespace hsx
