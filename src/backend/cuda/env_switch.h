// The CUDA backend's comparison switches: HSX_* variables that turn a kernel choice off.
#pragma once

#include <cstdlib>
#include <string_view>

namespace hsx {

// A switch that is on unless its variable is "0".
inline bool EnvOn(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::string_view(e) != "0";
}

}  // namespace hsx
