#include "capture/shard_manifests.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <unordered_map>
#include <vector>

#include "util/atomic_file.h"
#include "util/json.h"
#include "util/text_file.h"

namespace hsx {
namespace {

// "manifest.shard-00003-of-00016.jsonl" -> {3, 16}; nullopt for any other name.
std::optional<std::pair<int, int>> ParseShardManifestName(const std::string& name) {
  const std::string prefix = "manifest.shard-", suffix = ".jsonl";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string middle = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  const size_t of = middle.find("-of-");
  if (of == std::string::npos) return std::nullopt;
  auto ok = ResolveShard(middle.substr(0, of) + "/" + middle.substr(of + 4), {});
  if (!ok.ok()) return std::nullopt;
  ShardSpec spec = *ok;
  if (spec.ManifestName() != name) return std::nullopt;  // the one spelling extract writes
  return std::make_pair(spec.index, spec.count);
}

std::string ShardList(const std::vector<int>& shards) {
  std::string s;
  for (size_t i = 0; i < shards.size() && i < 10; ++i) s += (i ? ", " : "") + std::to_string(shards[i]);
  if (shards.size() > 10) s += " and " + std::to_string(shards.size() - 10) + " more";
  return s;
}

}  // namespace

Status WriteOrCheckShardConfig(const std::string& dir, const ShardSpec& spec, const nlohmann::json& settings) {
  const std::string path = dir + "/" + spec.ConfigName();
  nlohmann::json want = settings;
  want["shard"] = spec.index;
  want["num_shards"] = spec.count;
  if (!std::filesystem::exists(path)) return WriteFileAtomic(path, {want.dump(2) + "\n"});
  HSX_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, 1 << 20));
  HSX_ASSIGN_OR_RETURN(nlohmann::json have, ParseJson(text, path));
  for (const auto& [key, value] : want.items()) {
    if (!have.is_object() || !have.contains(key) || have[key] != value) {
      return Error(path + ": this shard ran before with " + key + " = " +
                   (have.is_object() && have.contains(key) ? have[key].dump() : std::string("(none)")) + ", now " +
                   value.dump() + ": its files would mix two settings (use the same settings, or another --output)");
    }
  }
  return {};
}

Status SetShardDone(const std::string& dir, const ShardSpec& spec, bool done) {
  const std::string path = dir + "/" + spec.DoneName();
  if (done) return WriteFileAtomic(path, {"done\n"});
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) return Error(path + ": cannot remove: " + ec.message());
  return {};
}

Result<MergeSummary> MergeShardManifests(const std::string& dir) {
  std::set<int> shards, counts;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (auto parsed = ParseShardManifestName(entry.path().filename().string())) {
      shards.insert(parsed->first);
      counts.insert(parsed->second);
    }
  }
  if (ec) return Error(dir + ": cannot list: " + ec.message());
  if (shards.empty()) {
    return Error(dir + ": no shard manifests (manifest.shard-I-of-N.jsonl): run hsx extract with --shard i/n, or "
                       "under mpirun, srun or torchrun, into this directory first");
  }
  if (counts.size() > 1) {
    return Error(dir + ": shard manifests of different shard counts (" + std::to_string(*counts.begin()) + " and " +
                 std::to_string(*counts.rbegin()) + "): runs with different shard counts cannot be merged; remove one run's");
  }
  const int count = *counts.begin();
  std::vector<int> missing;
  for (int i = 0; i < count; ++i) {
    if (!shards.count(i)) missing.push_back(i);
  }
  if (!missing.empty()) {
    return Error(dir + ": shard(s) " + ShardList(missing) + " of " + std::to_string(count) + " have no manifest (e.g. " +
                 ShardSpec{missing[0], count, ""}.ManifestName() + "): run them (or resume them), then merge");
  }

  std::vector<int> unfinished;
  for (int i = 0; i < count; ++i) {
    if (!std::filesystem::exists(dir + "/" + ShardSpec{i, count, ""}.DoneName(), ec)) unfinished.push_back(i);
  }
  if (!unfinished.empty()) {
    return Error(dir + ": shard(s) " + ShardList(unfinished) + " of " + std::to_string(count) +
                 " did not finish (no " + ShardSpec{unfinished[0], count, ""}.DoneName() +
                 "; a killed or failed run): run them again (they resume), then merge");
  }

  std::optional<nlohmann::json> settings;  // shard 0's, without its shard number
  std::vector<std::string> lines;
  std::unordered_map<std::string, std::pair<std::string, std::string>> seen;  // id -> (line, where)
  for (int i = 0; i < count; ++i) {
    const ShardSpec spec{i, count, ""};
    const std::string config_path = dir + "/" + spec.ConfigName();
    auto config_text = ReadTextFile(config_path, 1 << 20);
    if (!config_text.ok()) return Error(config_path + ": the shard's settings are missing or unreadable: " + config_text.status().message());
    HSX_ASSIGN_OR_RETURN(nlohmann::json config, ParseJson(*config_text, config_path));
    if (!config.is_object()) return Error(config_path + ": expected a JSON object");
    config.erase("shard");
    if (!settings) {
      settings = config;
    } else if (config != *settings) {
      for (const auto& [key, value] : settings->items()) {
        if (!config.contains(key) || config[key] != value) {
          return Error(config_path + ": shard " + std::to_string(i) + " ran with " + key + " = " +
                       (config.contains(key) ? config[key].dump() : std::string("(none)")) + " but shard 0 with " +
                       value.dump() + ": its files do not belong to the same dataset");
        }
      }
      return Error(config_path + ": shard " + std::to_string(i) + " ran with settings shard 0 does not have");
    }

    const std::string path = dir + "/" + spec.ManifestName();
    std::ifstream in(path, std::ios::binary);
    if (!in) return Error(path + ": cannot open");
    std::string text;
    int64_t line_no = 0;
    while (std::getline(in, text)) {
      ++line_no;
      const std::string where = path + ":" + std::to_string(line_no);
      if (in.eof()) {
        return Error(where + ": incomplete last line (the shard was killed mid-append): run shard " + std::to_string(i) +
                     " again (it resumes and repairs its manifest), then merge");
      }
      HSX_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, where));
      if (!j.is_object() || !j.contains("id") || !j["id"].is_string() || !j.contains("path") || !j["path"].is_string() ||
          !j.contains("num_tokens") || !j["num_tokens"].is_number_integer()) {
        return Error(where + ": expected {\"id\": string, \"path\": string, \"num_tokens\": integer}");
      }
      const std::string id = j["id"].get<std::string>();
      if (!spec.Owns(0, id)) {
        return Error(where + ": id '" + id + "' belongs to shard " +
                     std::to_string(StableIdHash(id) % static_cast<uint64_t>(count)) + " of " + std::to_string(count) +
                     ", not " + std::to_string(i) + ": this manifest was not written by that shard");
      }
      const std::string file = j["path"].get<std::string>();
      if (!std::filesystem::exists(file, ec)) return Error(where + ": the listed file " + file + " does not exist");
      auto [it, fresh] = seen.emplace(id, std::make_pair(text, where));
      if (fresh) {
        lines.push_back(text + "\n");
      } else if (it->second.first != text) {
        return Error(where + ": id '" + id + "' is listed differently at " + it->second.second);
      }
    }
    if (in.bad()) return Error(path + ": read failed");
  }
  std::vector<std::string_view> parts(lines.begin(), lines.end());
  HSX_RETURN_IF_ERROR(WriteFileAtomic(dir + "/manifest.jsonl", parts));
  return MergeSummary{count, static_cast<int64_t>(lines.size())};
}

}  // namespace hsx
