// Shared helpers for tests: fixture paths, golden loading, error metrics.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tensor/safetensors.h"

namespace hsx::test {

inline std::string DataPath(const std::string& rel) { return std::string(HSX_TEST_DATA) + "/" + rel; }
inline std::string ModelDir(const std::string& name) { return DataPath("models/" + name); }

inline const std::vector<std::string>& FixtureModels() {
  static const std::vector<std::string> kModels = {"llama",   "llama31", "qwen2",  "qwen3",          "qwen3_tied",
                                                   "qwen3_moe", "gemma3", "gemma4", "gemma4_kvshare"};
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

// max |a - b| / max |b|: the error measure the fixtures' tolerances use.
inline double RelativeMaxError(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, static_cast<double>(std::abs(a[i] - b[i])));
    ref = std::max(ref, static_cast<double>(std::abs(b[i])));
  }
  return ref > 0 ? err / ref : err;
}

}  // namespace hsx::test
