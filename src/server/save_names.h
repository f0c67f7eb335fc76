// The file names of the storage directory that requests are writing: a client-chosen
// hidden_states_path must name a file that neither exists nor belongs to a request in
// flight, or two requests would each be told one file holds their prompt, or a later one
// would replace an earlier one's file. Every request claims its file's name before it is
// submitted and holds the claim until its write is done (the file then exists) or it ends
// without one.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <variant>

namespace hsx {

class SaveNames {
 public:
  // Held while the name is in use; the name is free again once every copy is gone.
  using Claim = std::shared_ptr<const std::string>;

  // A claim on `dir`/`name`, or why it cannot be had (a message naming it, not `dir`).
  std::variant<Claim, std::string> ClaimName(const std::string& dir, const std::string& name);

 private:
  struct State {
    std::mutex mu;
    std::set<std::string> names;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();  // claims may outlive this object
};

}  // namespace hsx
