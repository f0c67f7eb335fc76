// Sharded extraction's pieces: the shard spec from --shard or a launcher's environment,
// the id partition, and the merge of shard manifests (what it refuses, and that it
// refuses without writing).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "capture/shard_manifests.h"
#include "capture/shard_spec.h"

namespace hsx {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string ErrorOf(const std::string& flag, std::map<std::string, std::string> vars = {}) {
  auto r = ResolveShard(flag, Env(std::move(vars)));
  return r.ok() ? "(no error)" : r.status().message();
}

TEST(ShardSpecTest, FlagParses) {
  auto s = ResolveShard("3/16", Env({}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->index, 3);
  EXPECT_EQ(s->count, 16);
  EXPECT_EQ(s->ManifestName(), "manifest.shard-00003-of-00016.jsonl");
  EXPECT_EQ(s->ConfigName(), "shard-00003-of-00016.json");
  auto whole = ResolveShard("0/1", Env({}));
  ASSERT_TRUE(whole.ok());
  EXPECT_FALSE(whole->sharded());
  EXPECT_EQ(whole->ManifestName(), "manifest.jsonl");
}

TEST(ShardSpecTest, BadFlagsNameTheProblem) {
  for (const char* bad : {"3", "3/", "/4", "a/4", "1/b", "-1/4", "1/-4", "1.0/4", "1/4/5", " 1/4", "99999999999/4"}) {
    EXPECT_NE(ErrorOf(bad).find("--shard '" + std::string(bad) + "': expected i/n"), std::string::npos) << bad << ": "
                                                                                                         << ErrorOf(bad);
  }
  EXPECT_NE(ErrorOf("4/4").find("shard index 4 is not below the shard count 4"), std::string::npos) << ErrorOf("4/4");
  EXPECT_NE(ErrorOf("0/0").find("at least 1"), std::string::npos) << ErrorOf("0/0");
}

TEST(ShardSpecTest, LaunchersAndPrecedence) {
  auto mpi = ResolveShard("", Env({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "16"}}));
  ASSERT_TRUE(mpi.ok()) << mpi.status().message();
  EXPECT_EQ(mpi->index, 5);
  EXPECT_EQ(mpi->count, 16);
  auto slurm = ResolveShard("", Env({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}}));
  ASSERT_TRUE(slurm.ok());
  EXPECT_EQ(slurm->index, 2);
  auto torch = ResolveShard("", Env({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(torch.ok());
  EXPECT_EQ(torch->count, 2);
  // The flag wins over the environment, even a contradictory one.
  auto flag = ResolveShard("0/3", Env({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(flag.ok());
  EXPECT_EQ(flag->count, 3);
  // torchrun inside a one-task Slurm allocation: the size-1 launcher says nothing.
  auto nested = ResolveShard("", Env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(nested.ok()) << nested.status().message();
  EXPECT_EQ(nested->index, 1);
  // mpirun under srun agreeing is fine.
  EXPECT_TRUE(ResolveShard("", Env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
                                    {"OMPI_COMM_WORLD_SIZE", "2"}}))
                  .ok());
  auto none = ResolveShard("", Env({}));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->sharded());
}

TEST(ShardSpecTest, BadEnvironmentsNameTheVariables) {
  EXPECT_NE(ErrorOf("", {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}})
                .find("the launchers disagree: SLURM_PROCID/SLURM_NTASKS = 1/2 but RANK/WORLD_SIZE = 0/2"),
            std::string::npos);
  EXPECT_NE(ErrorOf("", {{"RANK", "0"}}).find("RANK is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(ErrorOf("", {{"WORLD_SIZE", "2"}}).find("WORLD_SIZE is set but RANK is not"), std::string::npos);
  EXPECT_NE(ErrorOf("", {{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK/WORLD_SIZE = 2/2"), std::string::npos);
  EXPECT_NE(ErrorOf("", {{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK/WORLD_SIZE = x/2"), std::string::npos);
}

TEST(ShardSpecTest, LocalRank) {
  EXPECT_EQ(*ResolveLocalRank(Env({})), 0);
  EXPECT_EQ(*ResolveLocalRank(Env({{"SLURM_LOCALID", "3"}})), 3);
  EXPECT_EQ(*ResolveLocalRank(Env({{"LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}})), 1);
  EXPECT_FALSE(ResolveLocalRank(Env({{"LOCAL_RANK", "1"}, {"SLURM_LOCALID", "2"}})).ok());
  EXPECT_FALSE(ResolveLocalRank(Env({{"LOCAL_RANK", "one"}})).ok());
}

TEST(ShardSpecTest, EveryIdAndLineHasExactlyOneShard) {
  // The hash is fixed (FNV-1a 64 of the id's bytes, then MurmurHash3's finalizer): its
  // values are part of the on-disk format.
  EXPECT_EQ(StableIdHash(""), 17280346270528514342ull);
  EXPECT_EQ(StableIdHash("a"), 0x82a2a958a9bece5bull);
  std::vector<int> per_shard(4);
  for (int i = 0; i < 1000; ++i) {
    int owners = 0;
    for (int s = 0; s < 4; ++s) {
      const bool owns = ShardSpec{s, 4, ""}.Owns(i, "req-" + std::to_string(i));
      owners += owns;
      per_shard[static_cast<size_t>(s)] += owns;
      owners += ShardSpec{s, 4, ""}.Owns(i, "") ? 10 : 0;
    }
    EXPECT_EQ(owners, 11) << i;
  }
  for (int n : per_shard) EXPECT_GT(n, 180);  // roughly even (250 each)
  // Ids differing only in higher bits of their bytes spread too ('a', 'e', 'i', ... share their low bits).
  std::set<int> shards;
  for (int c = 'A'; c <= '}'; c += 4) shards.insert(static_cast<int>(StableIdHash("id-" + std::string(1, static_cast<char>(c))) % 4));
  EXPECT_EQ(shards.size(), 4u);
}

class MergeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("hsx-merge-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A shard's config and manifest listing `ids` (each id's file created).
  void WriteShard(int index, int count, const std::vector<std::string>& ids, const std::string& layers = "[2,4]") {
    const ShardSpec spec{index, count, ""};
    std::ofstream(dir_ / spec.ConfigName()) << R"({"model": "m", "layers": )" << layers
                                              << R"(, "shard": )" << index << R"(, "num_shards": )" << count << "}\n";
    ASSERT_TRUE(SetShardDone(dir_.string(), spec, true).ok());
    std::ofstream m(dir_ / spec.ManifestName());
    for (const std::string& id : ids) m << Line(id) << "\n";
  }
  std::string Line(const std::string& id, int tokens = 7) {
    const std::string path = (dir_ / (id + ".safetensors")).string();
    std::ofstream(path) << "x";
    return nlohmann::json{{"id", id}, {"path", path}, {"num_tokens", tokens}}.dump();
  }
  // Ids owned by shard `index` of `count`.
  std::vector<std::string> IdsOf(int index, int count, int n) {
    std::vector<std::string> ids;
    for (int i = 0; ids.size() < static_cast<size_t>(n); ++i) {
      if (ShardSpec{index, count, ""}.Owns(0, "id" + std::to_string(i))) ids.push_back("id" + std::to_string(i));
    }
    return ids;
  }
  std::string MergeError() {
    auto r = MergeShardManifests(dir_.string());
    EXPECT_FALSE(std::filesystem::exists(dir_ / "manifest.jsonl")) << "a refused merge wrote its output";
    return r.ok() ? "(merged)" : r.status().message();
  }

  std::filesystem::path dir_;
};

TEST_F(MergeTest, JoinsEveryShardInOrder) {
  const auto a = IdsOf(0, 2, 3), b = IdsOf(1, 2, 2);
  WriteShard(0, 2, a);
  WriteShard(1, 2, b);
  auto r = MergeShardManifests(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->shards, 2);
  EXPECT_EQ(r->lines, 5);
  std::ifstream in(dir_ / "manifest.jsonl");
  std::vector<std::string> ids;
  for (std::string line; std::getline(in, line);) ids.push_back(nlohmann::json::parse(line)["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{a[0], a[1], a[2], b[0], b[1]}));
}

TEST_F(MergeTest, RefusesAMissingShard) {
  WriteShard(0, 3, IdsOf(0, 3, 1));
  WriteShard(2, 3, IdsOf(2, 3, 1));
  EXPECT_NE(MergeError().find("shard(s) 1 of 3 have no manifest (e.g. manifest.shard-00001-of-00003.jsonl)"),
            std::string::npos)
      << MergeError();
}

TEST_F(MergeTest, RefusesAnUnfinishedShard) {
  WriteShard(0, 2, IdsOf(0, 2, 1));
  WriteShard(1, 2, IdsOf(1, 2, 1));
  ASSERT_TRUE(SetShardDone(dir_.string(), ShardSpec{1, 2, ""}, false).ok());
  EXPECT_NE(MergeError().find("shard(s) 1 of 2 did not finish (no shard-00001-of-00002.done"), std::string::npos)
      << MergeError();
}

TEST_F(MergeTest, RefusesNoShardsAndMixedCounts) {
  EXPECT_NE(MergeError().find("no shard manifests"), std::string::npos);
  WriteShard(0, 2, {});
  WriteShard(1, 2, {});
  WriteShard(0, 3, {});
  EXPECT_NE(MergeError().find("different shard counts"), std::string::npos) << MergeError();
}

TEST_F(MergeTest, RefusesShardsOfOtherSettings) {
  WriteShard(0, 2, IdsOf(0, 2, 1));
  WriteShard(1, 2, IdsOf(1, 2, 1), "[2,5]");
  EXPECT_NE(MergeError().find("shard 1 ran with layers = [2,5] but shard 0 with [2,4]"), std::string::npos)
      << MergeError();
}

TEST_F(MergeTest, RefusesAnIdInTheWrongShard) {
  WriteShard(0, 2, IdsOf(1, 2, 1));  // shard 1's id in shard 0's manifest
  WriteShard(1, 2, {});
  EXPECT_NE(MergeError().find("belongs to shard 1 of 2, not 0"), std::string::npos) << MergeError();
}

TEST_F(MergeTest, RefusesOneIdListedTwoWays) {
  const auto a = IdsOf(0, 2, 1);
  WriteShard(0, 2, a);
  WriteShard(1, 2, {});
  std::ofstream(dir_ / ShardSpec{0, 2, ""}.ManifestName(), std::ios::app) << Line(a[0], 8) << "\n";
  EXPECT_NE(MergeError().find("id '" + a[0] + "' is listed differently at"), std::string::npos) << MergeError();
}

TEST_F(MergeTest, RefusesATornLineAMissingFileAndGarbage) {
  const auto a = IdsOf(0, 2, 2);
  WriteShard(0, 2, {a[0]});
  WriteShard(1, 2, {});
  std::ofstream(dir_ / ShardSpec{0, 2, ""}.ManifestName(), std::ios::app) << R"({"id": ")" << a[1];
  EXPECT_NE(MergeError().find("incomplete last line"), std::string::npos) << MergeError();
  WriteShard(0, 2, {a[0]});
  std::filesystem::remove(dir_ / (a[0] + ".safetensors"));
  EXPECT_NE(MergeError().find("does not exist"), std::string::npos) << MergeError();
  WriteShard(0, 2, {});
  std::ofstream(dir_ / ShardSpec{0, 2, ""}.ManifestName()) << "[1]\n";
  EXPECT_NE(MergeError().find(":1: expected {\"id\""), std::string::npos) << MergeError();
  std::filesystem::remove(dir_ / ShardSpec{1, 2, ""}.ConfigName());
  WriteShard(0, 2, {});
  EXPECT_NE(MergeError().find("shard-00001-of-00002.json: the shard's settings are missing"), std::string::npos)
      << MergeError();
}

TEST_F(MergeTest, ShardConfigIsCheckedOnResume) {
  const ShardSpec spec{1, 4, ""};
  const nlohmann::json settings{{"model", "m"}, {"layers", {2, 4}}};
  ASSERT_TRUE(WriteOrCheckShardConfig(dir_.string(), spec, settings).ok());
  EXPECT_TRUE(WriteOrCheckShardConfig(dir_.string(), spec, settings).ok());
  Status other = WriteOrCheckShardConfig(dir_.string(), spec, {{"model", "m"}, {"layers", {2, 5}}});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.message().find("this shard ran before with layers = [2,4], now [2,5]"), std::string::npos)
      << other.message();
}

}  // namespace
}  // namespace hsx
