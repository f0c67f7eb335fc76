// extract's manifest.jsonl: one {"id", "path", "num_tokens"} line per file, appended only
// after the file is complete, so a resumed run skips exactly the ids it lists.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "util/status.h"

namespace hsx {

class Manifest {
 public:
  // Reads the ids an earlier run wrote (none if the file does not exist). A last line
  // without its '\n' is an append that failed or was cut short by a crash: it is cut
  // off, so the next append starts on a fresh line, and its file is written again. An
  // unparsable line elsewhere is skipped. Both give a warning naming the line.
  static Result<Manifest> Open(const std::string& path);

  // Whether the manifest listed `id` when opened (appends since are not looked up).
  bool Contains(const std::string& id) const { return ids_.count(id) > 0; }
  size_t size() const { return ids_.size(); }
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Appends the line for a complete file and returns it; a failed append leaves the
  // manifest as it was. Callers serialize appends.
  // `transfer_params`: a store sink's kv_transfer_params (what a reader needs to fetch the
  // object at `file`, then its key), listed when not null.
  Result<std::string> Append(const std::string& id, const std::string& file, int64_t num_tokens,
                             const nlohmann::json& transfer_params = nullptr) const;

 private:
  std::string path_;
  std::unordered_set<std::string> ids_;
  std::vector<std::string> warnings_;
};

}  // namespace hsx
