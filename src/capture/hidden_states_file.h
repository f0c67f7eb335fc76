// The per-request output file, in vLLM's hidden-state extraction format:
// hidden_states [T, L, H] (layers in ascending id order) and token_ids [T] int64, the
// tokens of those rows: the prompt, plus the fed-back outputs with include_output_tokens.
#pragma once

#include <string>

#include "engine/sequence.h"
#include "util/status.h"

namespace hsx {

// Request ids name files, so they must stay a plain file name inside the output dir.
Status ValidateRequestId(const std::string& id);

// Writes <dir>/<id>.safetensors atomically; returns its path.
Result<std::string> WriteHiddenStatesFile(const std::string& dir, const Sequence& seq);
// Writes the same content to an exact path.
Status WriteHiddenStatesTo(const std::string& path, const Sequence& seq);
// The same, but never replaces a file already at `path` (one another process made after
// the name was checked): an error instead.
Status WriteNewHiddenStatesTo(const std::string& path, const Sequence& seq);

}  // namespace hsx
