// Picks a backend by name: "cpu" (the f32 reference) or "cuda" / "cuda:N".
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "util/status.h"

namespace hsx {

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& device);

}  // namespace hsx
