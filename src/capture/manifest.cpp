#include "capture/manifest.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "util/atomic_file.h"
#include "util/json.h"

namespace hsx {

Result<Manifest> Manifest::Open(const std::string& path) {
  Manifest m;
  m.path_ = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) return m;  // a first run
  std::string line;
  int64_t line_no = 0;
  uint64_t whole_bytes = 0;  // up to the end of the last line that has its '\n'
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = path + ":" + std::to_string(line_no);
    if (in.eof()) {  // no '\n' after it
      m.warnings_.push_back(where + ": incomplete last line (an append cut short) removed; its file is written again");
      if (::truncate(path.c_str(), static_cast<off_t>(whole_bytes)) != 0) {
        return Error(path + ": cannot remove the incomplete last line: " + std::strerror(errno));
      }
      break;
    }
    whole_bytes += line.size() + 1;
    auto j = ParseJson(line, where);
    if (j.ok() && j->is_object() && j->contains("id") && (*j)["id"].is_string()) {
      m.ids_.insert((*j)["id"].get<std::string>());
    } else {
      m.warnings_.push_back(where + ": not a JSON object with a string \"id\"; skipped (its file is written again)");
    }
  }
  if (in.bad()) return Error(path + ": read failed");
  return m;
}

Result<std::string> Manifest::Append(const std::string& id, const std::string& file, int64_t num_tokens,
                                     const nlohmann::json& transfer_params) const {
  nlohmann::json entry{{"id", id}, {"path", file}, {"num_tokens", num_tokens}};
  if (!transfer_params.is_null()) entry["kv_transfer_params"] = transfer_params;
  std::string line = entry.dump();
  HSX_RETURN_IF_ERROR(AppendLine(path_, line));
  return line;
}

}  // namespace hsx
