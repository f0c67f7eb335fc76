#include "capture/shard_spec.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "util/stable_hash.h"

namespace hsx {
namespace {

constexpr int kMaxShards = 1 << 20;

// A whole decimal number in [0, max], or nullopt.
std::optional<int> ParseCount(const std::string& text, int max) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  int v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v > max) return std::nullopt;
  return v;
}

std::string Padded(int v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%05d", v);
  return buf;
}

struct Launcher {
  const char* rank;
  const char* size;
};
constexpr Launcher kLaunchers[] = {
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
    {"RANK", "WORLD_SIZE"},
};

}  // namespace

uint64_t StableIdHash(const std::string& id) { return StableHash(id); }

bool ShardSpec::Owns(int line, const std::string& id) const {
  if (count <= 1) return true;
  if (id.empty()) return line >= 0 && line % count == index;
  return static_cast<int>(StableIdHash(id) % static_cast<uint64_t>(count)) == index;
}

std::string ShardSpec::ManifestName() const {
  if (!sharded()) return "manifest.jsonl";
  return "manifest.shard-" + Padded(index) + "-of-" + Padded(count) + ".jsonl";
}

std::string ShardSpec::ConfigName() const { return "shard-" + Padded(index) + "-of-" + Padded(count) + ".json"; }

std::string ShardSpec::DoneName() const { return "shard-" + Padded(index) + "-of-" + Padded(count) + ".done"; }

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<ShardSpec> ResolveShard(const std::string& flag, const EnvLookup& env) {
  if (!flag.empty()) {
    const size_t slash = flag.find('/');
    const std::string expected = "expected i/n with 0 <= i < n, e.g. --shard 3/16";
    if (slash == std::string::npos) return Error("--shard '" + flag + "': " + expected);
    const auto index = ParseCount(flag.substr(0, slash), kMaxShards);
    const auto count = ParseCount(flag.substr(slash + 1), kMaxShards);
    if (!index || !count) return Error("--shard '" + flag + "': " + expected + " (n at most " + std::to_string(kMaxShards) + ")");
    if (*count == 0) return Error("--shard '" + flag + "': the shard count must be at least 1");
    if (*index >= *count) {
      return Error("--shard '" + flag + "': shard index " + std::to_string(*index) + " is not below the shard count " +
                   std::to_string(*count) + " (shards are numbered from 0)");
    }
    return ShardSpec{*index, *count, "--shard"};
  }
  std::optional<ShardSpec> found;
  for (const Launcher& l : kLaunchers) {
    const auto rank_text = env(l.rank), size_text = env(l.size);
    if (!rank_text && !size_text) continue;
    const std::string names = std::string(l.rank) + "/" + l.size;
    if (!rank_text || !size_text) {
      return Error(std::string(rank_text ? l.rank : l.size) + " is set but " + (rank_text ? l.size : l.rank) +
                   " is not: cannot tell this process's shard (give --shard i/n)");
    }
    const auto rank = ParseCount(*rank_text, kMaxShards), size = ParseCount(*size_text, kMaxShards);
    if (!rank || !size || *size == 0 || *rank >= *size) {
      return Error(names + " = " + *rank_text + "/" + *size_text + " is not a rank below a size of at least 1");
    }
    if (*size == 1) continue;  // one process: nothing to split
    ShardSpec spec{*rank, *size, names};
    if (found && (found->index != spec.index || found->count != spec.count)) {
      return Error("the launchers disagree: " + found->source + " = " + std::to_string(found->index) + "/" +
                   std::to_string(found->count) + " but " + names + " = " + std::to_string(spec.index) + "/" +
                   std::to_string(spec.count) + " (give --shard i/n)");
    }
    if (!found) found = spec;
  }
  return found ? *found : ShardSpec{};
}

Result<int> ResolveLocalRank(const EnvLookup& env) {
  std::optional<int> found;
  std::string found_name;
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    const auto text = env(name);
    if (!text) continue;
    const auto v = ParseCount(*text, kMaxShards);
    if (!v) return Error(std::string(name) + " = '" + *text + "' is not a non-negative integer");
    if (found && *found != *v) {
      return Error("the launchers disagree on the local rank: " + found_name + " = " + std::to_string(*found) + " but " +
                   name + " = " + *text + " (give --device cuda:N)");
    }
    found = v;
    found_name = name;
  }
  return found.value_or(0);
}

}  // namespace hsx
