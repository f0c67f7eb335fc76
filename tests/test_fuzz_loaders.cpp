// A bounded, deterministic fuzz run over the checkpoint loaders: the fixture's
// model.safetensors, config.json and model.safetensors.index.json mutated (bit flips,
// truncations, header length +/- small and huge, numbers replaced by extreme values, values
// of the wrong type, deep nesting). Every load must either succeed or return a Status;
// CI runs this under ASan+UBSan, where any out-of-bounds read, overflow or misaligned
// load fails it. A config that loads must also never give non-finite RoPE frequencies,
// attention scales or norm epsilons (values that could only produce NaN are refused).
// EAGLE-3 drafts (config.json and model.safetensors) get the same treatment.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/eagle3_draft.h"
#include "model/model.h"
#include "test_util.h"

namespace hsx {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

class LoaderFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsx-fuzz-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary | std::ios::trunc) << bytes;
  }

  // Loads the directory; a failure must be a Status naming a file of the checkpoint.
  bool LoadOk() {
    CpuBackend backend;
    auto model = Model::Load(dir_, backend);
    if (!model.ok()) {
      const std::string& m = model.status().message();
      EXPECT_NE(m.find(dir_), std::string::npos) << "error does not name the file: " << m;
      return false;
    }
    CheckFinite((*model)->config());
    return true;
  }

  static void CheckFinite(const ModelConfig& c) {
    EXPECT_TRUE(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0);
    for (int i = 0; i < c.num_layers; ++i) {
      EXPECT_TRUE(std::isfinite(c.attention_scale(i)) && c.attention_scale(i) > 0);
      int dims = 0;
      for (float f : RopeInverseFrequencies(c.layers[i].rope, c.layers[i].head_dim, &dims)) {
        ASSERT_TRUE(std::isfinite(f)) << "layer " << i << " theta " << c.layers[i].rope.theta;
      }
    }
  }

  std::string dir_;
};

// Values a hostile or broken file might hold where a well-formed one has a number.
json ExtremeValue(std::mt19937_64& rng) {
  static const std::vector<json> kValues = {
      nullptr, true, "str", json::array(), json::object(), 0, -1, 1, 3, -2147483648LL, 2147483647, 4294967296LL,
      9223372036854775807LL, json(18446744073709551615ULL), 1e308, -1e308, 1e-308, 0.5, -0.0, json::array({1, 2}),
      json::array({json::array({json::array()})}), json::object({{"rope_type", "yarn"}})};
  return kValues[rng() % kValues.size()];
}

// Replaces one value anywhere in the tree (objects and arrays alike) by an extreme one.
void MutateValue(json& j, std::mt19937_64& rng, int depth = 0) {
  if ((j.is_object() || j.is_array()) && !j.empty() && depth < 4 && rng() % 4 != 0) {
    auto it = j.begin();
    std::advance(it, rng() % j.size());
    MutateValue(*it, rng, depth + 1);
    return;
  }
  j = ExtremeValue(rng);
}

std::string FlipBits(std::string s, std::mt19937_64& rng, size_t lo, size_t hi, int flips) {
  if (hi <= lo) return s;
  for (int i = 0; i < flips; ++i) s[lo + rng() % (hi - lo)] ^= static_cast<char>(1u << (rng() % 8));
  return s;
}

TEST_F(LoaderFuzzTest, SafetensorsMutationsLoadOrFail) {
  const std::string fixture = test::ModelDir("qwen3");
  const std::string original = ReadAll(fixture + "/model.safetensors");
  Write("config.json", ReadAll(fixture + "/config.json"));
  uint64_t header_len;
  std::memcpy(&header_len, original.data(), 8);
  const json header = json::parse(original.substr(8, header_len));
  std::mt19937_64 rng(1234);
  int loaded = 0, cases = 0;
  for (; cases < 1000; ++cases) {
    std::string bytes = original;
    switch (cases % 6) {
      case 0:  // bit flips in the header
        bytes = FlipBits(bytes, rng, 0, 8 + header_len, 1 + rng() % 3);
        break;
      case 1: {  // header length off by a little or by a lot
        static const int64_t kDeltas[] = {-1, 1, -2, 2, -8, 8, -64, 1 << 20};
        uint64_t len = header_len + kDeltas[rng() % 8];
        if (rng() % 5 == 0) len = rng();
        std::memcpy(bytes.data(), &len, 8);
        break;
      }
      case 2:  // truncation anywhere
        bytes.resize(rng() % bytes.size());
        break;
      case 3: {  // one header value replaced by an extreme one
        json h = header;
        MutateValue(h, rng);
        const std::string text = h.dump();
        const uint64_t len = text.size();
        bytes = std::string(reinterpret_cast<const char*>(&len), 8) + text + original.substr(8 + header_len);
        break;
      }
      case 4:  // bit flips in the data (weights may become inf/NaN: loading must not crash)
        bytes = FlipBits(bytes, rng, 8 + header_len, bytes.size(), 2);
        break;
      case 5: {  // a deeply nested header
        const std::string text = "{\"a\":" + std::string(1000 + rng() % 100000, '[');
        const uint64_t len = text.size();
        bytes = std::string(reinterpret_cast<const char*>(&len), 8) + text;
        break;
      }
    }
    Write("model.safetensors", bytes);
    loaded += LoadOk();
    if (HasFatalFailure()) return;
  }
  // Data bit flips and no-op header changes load; everything else must have failed.
  EXPECT_GT(loaded, 0);
  EXPECT_LT(loaded, cases / 2);
}

TEST_F(LoaderFuzzTest, ConfigMutationsLoadOrFail) {
  const std::string weights = test::ModelDir("gemma3") + "/model.safetensors";
  std::mt19937_64 rng(5678);
  int loaded = 0, cases = 0;
  // Configs of every architecture, mutated; the gemma3 weights only fit the gemma3
  // config, so the others exercise the config parser and the weight-shape checks.
  std::vector<std::string> configs;
  for (const std::string& m : test::FixtureModels()) configs.push_back(ReadAll(test::ModelDir(m) + "/config.json"));
  fs::create_symlink(weights, dir_ + "/model.safetensors");
  for (; cases < 2000; ++cases) {
    const std::string& base = configs[rng() % configs.size()];
    std::string text;
    switch (cases % 5) {
      case 0:
      case 1: {  // one value replaced (possibly inside rope_parameters or layer_types)
        json j = json::parse(base);
        MutateValue(j, rng);
        if (rng() % 2) MutateValue(j, rng);
        text = j.dump();
        break;
      }
      case 2:  // bit flips in the text
        text = FlipBits(base, rng, 0, base.size(), 1 + rng() % 4);
        break;
      case 3:  // truncation
        text = base.substr(0, rng() % base.size());
        break;
      case 4: {  // deep nesting in a field
        const size_t depth = 10 + rng() % 5000;
        text = base.substr(0, base.size() - 2) + ", \"deep\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
        break;
      }
    }
    Write("config.json", text);
    loaded += LoadOk();
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(loaded, 0);
}

TEST_F(LoaderFuzzTest, IndexMutationsLoadOrFail) {
  const std::string fixture = test::ModelDir("qwen3");
  Write("config.json", ReadAll(fixture + "/config.json"));
  fs::create_symlink(fixture + "/model.safetensors", dir_ + "/model-00001-of-00001.safetensors");
  SafetensorsFile whole = test::Golden(fixture + "/model.safetensors");
  json index = {{"metadata", {{"total_size", 1}}}, {"weight_map", json::object()}};
  for (const auto& [name, t] : whole.tensors()) index["weight_map"][name] = "model-00001-of-00001.safetensors";
  Write("model.safetensors.index.json", index.dump());
  ASSERT_TRUE(LoadOk());
  std::mt19937_64 rng(91011);
  for (int cases = 0; cases < 300; ++cases) {
    std::string text;
    if (cases % 2 == 0) {
      json j = index;
      MutateValue(j, rng);
      text = j.dump();
    } else {
      const std::string base = index.dump();
      text = FlipBits(base, rng, 0, base.size(), 1 + rng() % 3);
    }
    Write("model.safetensors.index.json", text);
    LoadOk();
    if (HasFatalFailure()) return;
  }
}

// EAGLE-3 drafts of all three fixture variants: config values replaced, config bit flips
// and truncations, safetensors header values replaced (d2t's dtype or shape, a tensor's
// offsets), bit flips in the tensor data (d2t's offsets, t2d's bytes). A draft that loads
// must fit its target: aux ids within its layers, a d2t that maps into its vocabulary.
TEST_F(LoaderFuzzTest, Eagle3DraftMutationsLoadOrFail) {
  CpuBackend backend;
  std::map<std::string, std::unique_ptr<Model>> targets;
  for (const char* t : {"llama", "qwen3"}) targets[t] = std::move(Model::Load(test::ModelDir(t), backend)).value();
  std::mt19937_64 rng(91011);
  int loaded = 0;
  for (int cases = 0; cases < 1200; ++cases) {
    static const char* kVariants[] = {"llama_legacy", "qwen3_default", "llama_copy"};
    const std::string variant = kVariants[rng() % 3];
    const std::string src = test::DataPath("eagle3/" + variant);
    const Model& target = *targets[test::Eagle3Target(variant)];
    std::string config = ReadAll(src + "/config.json"), weights = ReadAll(src + "/model.safetensors");
    switch (cases % 5) {
      case 0: {
        json j = json::parse(config);
        MutateValue(j, rng);
        config = j.dump();
        break;
      }
      case 1:
        config = FlipBits(config, rng, 0, config.size(), 1 + rng() % 3);
        break;
      case 2:
        config = config.substr(0, rng() % config.size());
        break;
      case 3: {
        uint64_t len;
        std::memcpy(&len, weights.data(), 8);
        json h = json::parse(weights.substr(8, len));
        MutateValue(h, rng);
        const std::string text = h.dump();
        const uint64_t new_len = text.size();
        weights = std::string(reinterpret_cast<const char*>(&new_len), 8) + text + weights.substr(8 + len);
        break;
      }
      case 4: {  // data bit flips: d2t offsets and t2d bytes included
        uint64_t len;
        std::memcpy(&len, weights.data(), 8);
        weights = FlipBits(weights, rng, 8 + len, weights.size(), 1 + rng() % 8);
        break;
      }
    }
    Write("config.json", config);
    Write("model.safetensors", weights);
    auto draft = Eagle3Draft::Load(dir_, target, backend);
    if (!draft.ok()) {
      EXPECT_NE(draft.status().message().find(dir_), std::string::npos) << "error does not name the file: " << draft.status().message();
      continue;
    }
    ++loaded;
    const Eagle3Config& c = (*draft)->config();
    CheckFinite(c.decoder);
    for (int id : c.aux_layer_ids) EXPECT_TRUE(id >= 0 && id <= target.config().num_layers) << id;
    const std::vector<int32_t>& d2t = (*draft)->weights().d2t;
    for (int32_t i = 0; i < static_cast<int32_t>(d2t.size()); ++i) {
      const int64_t t = int64_t{i} + d2t[i];  // a draft id's target id
      ASSERT_TRUE(t >= 0 && t < target.config().vocab_size) << "draft id " << i << " -> " << t;
    }
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace hsx
