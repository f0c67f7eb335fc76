// A sharded extraction's own files in the shared output directory: each shard's
// settings (so shards run with other settings are caught) and its manifest, and the
// merge of all shards' manifests into one manifest.jsonl (`hsx manifest merge`).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "capture/shard_spec.h"
#include "util/status.h"

namespace hsx {

// Writes <dir>/<spec.ConfigName()> holding `settings` (what decides the files' content:
// model, layers, dtype) on a shard's first run; on a resumed run, checks that they are
// the same, naming the first setting that differs.
Status WriteOrCheckShardConfig(const std::string& dir, const ShardSpec& spec, const nlohmann::json& settings);

// Marks the shard as having gone through its whole input (every line written or reported
// as failed), or, when a run starts, as not (yet): merge refuses unfinished shards.
Status SetShardDone(const std::string& dir, const ShardSpec& spec, bool done);

struct MergeSummary {
  int shards = 0;
  int64_t lines = 0;
};

// Joins every manifest.shard-I-of-N.jsonl in `dir` into <dir>/manifest.jsonl, written
// atomically (shard order, each shard's lines in its order). Refuses, naming what is
// wrong: a missing or unfinished shard, shard counts that differ, shards run with other settings, an
// incomplete or unparsable line, an id in the wrong shard, one id with two different
// lines, a listed file that does not exist. Shard manifests are only read.
Result<MergeSummary> MergeShardManifests(const std::string& dir);

}  // namespace hsx
