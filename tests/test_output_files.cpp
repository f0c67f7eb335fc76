// What a crash or a full disk leaves in an output directory, and how the next run copes:
// a failed manifest append leaves no partial line, a torn last line is cut off, and only
// a dead writer's temp files are removed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "capture/manifest.h"
#include "util/atomic_file.h"

namespace hsx {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class OutputFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsx-output-files-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// The file size limit (RLIMIT_FSIZE) stands in for a full disk: a write past it fails
// with EFBIG once SIGXFSZ is ignored. Restored on scope exit, for the tests after this one.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit limit{bytes, saved_.rlim_max};
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_;
};

TEST_F(OutputFilesTest, AFailedAppendLeavesNoPartialLine) {
  const std::string path = dir_ + "/manifest.jsonl";
  ASSERT_TRUE(AppendLine(path, R"({"id":"a"})").ok());
  const std::string before = Slurp(path);
  Status s;
  {
    FileSizeLimit limit(before.size() + 10);  // room for part of the next line only
    s = AppendLine(path, R"({"id":"b","path":"/some/long/path/b.safetensors"})");
  }
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(IsOutOfSpace(s)) << s.message();
  EXPECT_EQ(Slurp(path), before);
  ASSERT_TRUE(AppendLine(path, R"({"id":"c"})").ok());
  EXPECT_EQ(Slurp(path), before + R"({"id":"c"})" + "\n");
}

TEST_F(OutputFilesTest, ATornLastManifestLineIsCutOffAndTheNextAppendStartsFresh) {
  const std::string path = dir_ + "/manifest.jsonl";
  std::ofstream(path) << R"({"id":"a","path":"a.safetensors","num_tokens":3})" << "\n"
                      << "{not json}\n"
                      << R"({"id":"b","path":"b.safetensors","num_tokens":3})" << "\n"
                      << R"({"id":"c","path":"c.saf)";
  auto m = Manifest::Open(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE(m->Contains("a"));
  EXPECT_TRUE(m->Contains("b"));
  EXPECT_FALSE(m->Contains("c"));  // its file is written again
  ASSERT_EQ(m->warnings().size(), 2u);
  EXPECT_NE(m->warnings()[0].find("manifest.jsonl:2: not a JSON object"), std::string::npos) << m->warnings()[0];
  EXPECT_NE(m->warnings()[1].find("manifest.jsonl:4: incomplete last line"), std::string::npos) << m->warnings()[1];
  ASSERT_TRUE(m->Append("c", "c.safetensors", 3).ok());
  // Every line but the one that was garbage all along parses, "c" on a line of its own.
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> ids;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) ids.push_back(j["id"]);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b", "c"}));
  auto reopened = Manifest::Open(path);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(reopened->size(), 3u);
  EXPECT_EQ(reopened->warnings().size(), 1u);  // only the garbage line
}

TEST_F(OutputFilesTest, OnlyADeadWritersTempFilesAreRemoved) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // now a pid that no process has
  const std::string host = TempFileHost();
  const std::string dead = host + "." + std::to_string(child), live = host + "." + std::to_string(getpid());
  const std::vector<std::string> stale = {"a.safetensors.tmp." + dead + ".0", "b.safetensors.tmp." + dead + ".17"};
  const std::vector<std::string> kept = {
      "c.safetensors.tmp." + live + ".0",  // a live writer's file in progress
      "d.safetensors.temp." + dead + ".0",  // not hsx's pattern
      "e.tmp.x" + dead + ".0", "f.tmp." + dead, "g.tmp." + dead + ".1x", ".tmp." + dead + ".0",
      "h.safetensors", "manifest.jsonl",
      "i.safetensors.tmp.other-host." + std::to_string(child) + ".0",  // another host's: its pids mean nothing here
      "j.safetensors.tmp." + std::to_string(child) + ".0"};             // no host: whose, nobody knows
  for (const auto& names : {stale, kept})
    for (const auto& n : names) std::ofstream(dir_ + "/" + n) << "x";
  fs::create_directory(dir_ + "/sub");
  std::ofstream(dir_ + "/sub/i.safetensors.tmp." + dead + ".0") << "x";  // not below the directory
  auto removed = RemoveStaleTempFiles(dir_);
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, 2);
  for (const auto& n : stale) EXPECT_FALSE(fs::exists(dir_ + "/" + n)) << n;
  for (const auto& n : kept) EXPECT_TRUE(fs::exists(dir_ + "/" + n)) << n;
  EXPECT_TRUE(fs::exists(dir_ + "/sub/i.safetensors.tmp." + dead + ".0"));
}

TEST_F(OutputFilesTest, AWriteThatFailsLeavesNoTempFile) {
  Status s;
  {
    FileSizeLimit limit(100);
    const std::string big(1000, 'x');
    s = WriteFileAtomic(dir_ + "/f.safetensors", {big});
  }
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(IsOutOfSpace(s)) << s.message();
  EXPECT_TRUE(fs::is_empty(dir_));
}

}  // namespace
}  // namespace hsx
