// Shared helpers for tests: fixture paths, golden loading, error metrics.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "tensor/safetensors.h"

namespace hsx::test {

// HSX_TEST_DATA in the environment overrides the build-time path (binaries run elsewhere).
inline std::string DataPath(const std::string& rel) {
  const char* env = std::getenv("HSX_TEST_DATA");
  return std::string(env != nullptr ? env : HSX_TEST_DATA) + "/" + rel;
}
inline std::string ModelDir(const std::string& name) { return DataPath("models/" + name); }
// The fixture target an EAGLE-3 fixture draft (tests/data/eagle3/<variant>) was made for.
inline std::string Eagle3Target(const std::string& variant) { return variant == "qwen3_default" ? "qwen3" : "llama"; }

// Writes the JSON file at `from`, edited, to `to` (the same file by default).
inline void EditJsonFile(const std::string& from, const std::function<void(nlohmann::json&)>& edit,
                         std::string to = "") {
  std::ifstream in(from);
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  edit(j);
  std::ofstream(to.empty() ? from : to) << j.dump();
}

inline const std::vector<std::string>& FixtureModels() {
  static const std::vector<std::string> kModels = {
      "llama",  "llama31", "qwen2",          "qwen3",      "qwen3_tied",  "qwen3_moe",    "gemma3",
      "gemma4", "gemma4_kvshare", "mistral_sw", "llama_yarn", "llama_dynamic", "llama_longrope"};
  return kModels;
}

// gpt-oss (attention sinks, biased MoE with the clamped SwiGLU; bf16 and MXFP4 experts): the
// golden, engine, speculative and CUDA fixture suites, not the tensor-parallel and FP8 ones
// (hsx refuses gpt-oss under tensor parallelism and --quantization fp8 for now).
inline const std::vector<std::string>& GptOssFixtureModels() {
  static const std::vector<std::string> kModels = {"gpt_oss", "gpt_oss_mxfp4"};
  return kModels;
}

// Loads a golden file or fails the test.
inline SafetensorsFile Golden(const std::string& path) {
  auto f = SafetensorsFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return std::move(f).value();
}

inline std::vector<float> AsFloats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ConvertToF32(t.dtype(), t.raw(), v.data(), v.size());
  return v;
}

inline std::vector<int32_t> AsIds(const Tensor& t) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<int32_t>(t.data<int64_t>()[i]));
  return v;
}

// max |a - b| / max |b|: the error measure the fixtures' tolerances use. A NaN anywhere
// is an infinite error (std::max would skip it, and a NaN-poisoned output would pass).
inline double RelativeMaxError(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    err = std::max(err, d);
    ref = std::max(ref, static_cast<double>(std::abs(b[i])));
  }
  return ref > 0 ? err / ref : err;
}

// `prompts` packed into one forward with every layer captured; returns, per prompt, the
// hidden states as [T, N+1, H] (the goldens' layout) and logits [T, V].
struct GoldenPrefill {
  std::vector<std::vector<float>> hidden, logits;
};

inline GoldenPrefill RunPrefill(Model& model, const std::vector<std::vector<int32_t>>& prompts) {
  const ModelConfig& config = model.config();
  constexpr int kBlock = 16;
  int64_t blocks = 0;
  for (const auto& p : prompts) blocks += (static_cast<int64_t>(p.size()) + kBlock - 1) / kBlock;
  KVCache cache(config, model.backend(), static_cast<int>(blocks), kBlock);
  ForwardBatch batch;
  int next_block = 0;
  for (const std::vector<int32_t>& p : prompts) {
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
  ForwardOutput out = model.Forward(batch, cache, all_layers);
  const std::vector<float> captured = AsFloats(model.backend().Download(out.captured));  // [L, T, H]
  const std::vector<float> logits = AsFloats(model.backend().Download(out.logits));      // [T, V]
  const int64_t h = config.hidden_size, layers = config.num_layers + 1, v = config.vocab_size;
  const int64_t total = static_cast<int64_t>(batch.token_ids.size());
  GoldenPrefill result;
  for (const SequenceSlice& seq : batch.seqs) {
    std::vector<float> hidden;
    for (int64_t t = seq.q_start; t < seq.q_start + seq.q_len; ++t)
      for (int64_t l = 0; l < layers; ++l)
        hidden.insert(hidden.end(), captured.begin() + (l * total + t) * h, captured.begin() + (l * total + t + 1) * h);
    result.hidden.push_back(std::move(hidden));
    result.logits.emplace_back(logits.begin() + seq.q_start * v, logits.begin() + (seq.q_start + seq.q_len) * v);
  }
  return result;
}

// The golden file's three prompts; with `with_loop`, a fourth that repeats seven of prompt
// 1's tokens (so prompt lookup and copy drafts find matches from the start).
inline std::vector<std::vector<int32_t>> GoldenPrompts(const SafetensorsFile& golden, bool with_loop = false) {
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < 3; ++k) prompts.push_back(AsIds(golden.Get("prompt_" + std::to_string(k)).value()));
  if (with_loop) {
    std::vector<int32_t> loop;
    for (int i = 0; i < 40; ++i) loop.push_back(prompts[1][i % 7]);
    prompts.push_back(std::move(loop));
  }
  return prompts;
}

// The three golden prompts through RunPrefill.
inline GoldenPrefill RunGoldenPrefill(Model& model, const SafetensorsFile& golden) {
  return RunPrefill(model, GoldenPrompts(golden));
}

// The qwen3 fixture on the CPU backend, with its golden file, for engine-level tests.
class Qwen3FixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::Load(ModelDir("qwen3"), backend_);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(m).value();
    golden_ = std::make_unique<SafetensorsFile>(Golden(ModelDir("qwen3") + "/golden.safetensors"));
  }
  std::vector<int32_t> Prompt(int k) const { return AsIds(golden_->Get("prompt_" + std::to_string(k)).value()); }

  CpuBackend backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<SafetensorsFile> golden_;
};

}  // namespace hsx::test
