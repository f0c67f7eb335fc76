// Which part of an extraction input one process does, when a launcher (mpirun, srun,
// torchrun) or --shard i/n runs several: shard i of n owns the lines whose request id
// hashes to i, and writes its own manifest, so shards never share a file.
//
// The hash is of the id, not of the line number: an id names its file, so two lines
// with one id must land in one shard (which reports the duplicate) or two shards would
// write the same file; and a resumed or merged run keys everything by id, so editing or
// reordering the input never moves a done id to another shard.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "util/status.h"

namespace hsx {

struct ShardSpec {
  int index = 0, count = 1;
  std::string source;  // where it came from, for messages: "--shard", "OMPI_COMM_WORLD_RANK/SIZE", ...

  bool sharded() const { return count > 1; }
  // Whether this shard owns a line: by its id's hash, or, for a line whose id could not
  // be read (it is reported as an error by exactly one shard), by its line number.
  bool Owns(int line, const std::string& id) const;
  // "manifest.jsonl" unsharded; "manifest.shard-00003-of-00016.jsonl" for shard 3 of 16.
  std::string ManifestName() const;
  // The settings the shard ran with, beside its manifest: "shard-00003-of-00016.json".
  std::string ConfigName() const;
  // Present once the shard has read its whole input: "shard-00003-of-00016.done".
  std::string DoneName() const;
};

// StableHash of the id: fixed, so every build and host agrees (part of the on-disk format).
uint64_t StableIdHash(const std::string& id);

// The environment, as getenv reads it (injectable for tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnv();

// An explicit "--shard i/n" (empty when not given) wins; otherwise the launcher's
// variables: OpenMPI's OMPI_COMM_WORLD_RANK/SIZE, Slurm's SLURM_PROCID/NTASKS, torchrun's
// RANK/WORLD_SIZE. A launcher with size 1 means no sharding; launchers that disagree, a
// rank without its size, or values out of range are errors naming the variables.
Result<ShardSpec> ResolveShard(const std::string& flag, const EnvLookup& env);

// The launcher's rank on this host (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID),
// 0 without one: "--device cuda" without an index means cuda:<local rank>.
Result<int> ResolveLocalRank(const EnvLookup& env);

}  // namespace hsx
