// The broken-checkpoint tests' base fixture: a writable copy of a fixture checkpoint in a
// temporary folder, the edits they make to it (a config field, the safetensors header, a
// tensor's first bytes), and the one error loading it gives.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "test_util.h"

namespace hsx::test {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "expected '" << (needle) << "' in: " << (haystack)

class CheckpointCopyTest : public ::testing::Test {
 protected:
  explicit CheckpointCopyTest(std::string source) : source_(std::move(source)) {}

  void SetUp() override {
    char tmpl[] = "/tmp/hsx-ckpt-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Reset();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A fresh copy of config.json and model.safetensors.
  void Reset() {
    namespace fs = std::filesystem;
    for (const char* name : {"config.json", "model.safetensors"}) {
      fs::copy_file(source_ + "/" + name, dir_ + "/" + name, fs::copy_options::overwrite_existing);
      fs::permissions(dir_ + "/" + name, fs::perms::owner_write, fs::perm_options::add);
    }
  }

  // Loading fails; its message.
  std::string LoadError() {
    CpuBackend backend;
    auto model = Model::Load(dir_, backend);
    EXPECT_FALSE(model.ok());
    return model.ok() ? "" : model.status().message();
  }

  void EditConfig(const std::function<void(nlohmann::json&)>& edit) { EditJsonFile(dir_ + "/config.json", edit); }

  // Rewrites model.safetensors with an edited header and the original data.
  void EditHeader(const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(dir_ + "/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    uint64_t len;
    std::memcpy(&len, bytes.data(), 8);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len));
    edit(header);
    std::string text = header.dump();
    const uint64_t new_len = text.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &new_len, 8);
    std::ofstream(dir_ + "/model.safetensors", std::ios::binary) << out << text << bytes.substr(8 + len);
  }

  // Overwrites the first n bytes of a tensor's data in model.safetensors.
  void PatchTensorBytes(const std::string& tensor, const void* bytes, size_t n) {
    std::fstream f(dir_ + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t len = 0;
    f.read(reinterpret_cast<char*>(&len), 8);
    std::string header(len, '\0');
    f.read(header.data(), static_cast<std::streamsize>(len));
    const auto begin = nlohmann::json::parse(header)[tensor]["data_offsets"][0].get<uint64_t>();
    f.seekp(static_cast<std::streamoff>(8 + len + begin));
    f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  }

  std::string dir_;

 private:
  std::string source_;
};

}  // namespace hsx::test
