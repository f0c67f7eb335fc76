// hsx manifest merge: one manifest.jsonl from the shard manifests of a sharded extract.
#include <memory>

#include "capture/shard_manifests.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace hsx::cli {

void RegisterManifest(CLI::App& root) {
  CLI::App* app = root.add_subcommand("manifest", "Work on extract's manifests");
  app->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  CLI::App* merge = app->add_subcommand(
      "merge", "Join the manifest.shard-I-of-N.jsonl of every shard in DIR into DIR/manifest.jsonl (checked, atomic)");
  merge->add_option("dir", *dir, "The output directory the shards wrote into")->required();
  merge->callback([dir] {
    auto merged = MergeShardManifests(*dir);
    if (!merged.ok()) {
      ExitCode() = Fail("manifest merge", merged.status());
      return;
    }
    std::fprintf(stderr, "hsx manifest merge: %ld files of %d shards in %s/manifest.jsonl\n",
                 static_cast<long>(merged->lines), merged->shards, dir->c_str());
  });
}

}  // namespace hsx::cli
