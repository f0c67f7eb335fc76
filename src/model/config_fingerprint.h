// A short fingerprint of a model's configuration, so a hidden-state file can say which
// model made it and `hsx verify-states` can check it against --model: a directory's
// config.json (parsed, with transformers' bookkeeping keys left out, so a re-save or
// reformatting keeps it), a .gguf file's header (metadata and tensor infos), or a named
// config's name. 16 hex digits (StableHashHex).
#pragma once

#include <string>

#include "util/status.h"

namespace hsx {

Result<std::string> ModelConfigFingerprint(const std::string& model);

}  // namespace hsx
