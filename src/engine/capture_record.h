// A finished sequence's captured rows as a capture sink takes them.
#pragma once

#include <map>
#include <string>

#include "capture/capture_sink.h"
#include "engine/sequence.h"

namespace hsx {

// Shares the rows' storage (no copy); token_ids are the tokens of those rows. `name`: the
// record's place in the sink (empty: the sink's rule for the id).
CaptureRecord CaptureRecordOf(const Sequence& seq, std::string name = {},
                              std::map<std::string, std::string> metadata = {});

}  // namespace hsx
