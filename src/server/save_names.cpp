#include "server/save_names.h"

#include <filesystem>

namespace hsx {

std::variant<SaveNames::Claim, std::string> SaveNames::ClaimName(const std::string& dir, const std::string& name) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->names.count(name)) return "'" + name + "' is the file of a request still in flight; choose another name";
  // Under the mutex, so no claim of this process can slip in between the check and the insert.
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(dir + "/" + name, ec))) {
    return "'" + name + "' names an existing file; choose another name";
  }
  state_->names.insert(name);
  return Claim(new std::string(name), [state = state_](const std::string* held) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->names.erase(*held);
    }
    delete held;
  });
}

}  // namespace hsx
