// The per-request file, in vLLM's hidden-state extraction format: hidden_states [T, L, H]
// (layers in ascending id order) and token_ids [T] int64, the tokens of those rows (the
// prompt, plus the fed-back outputs with include_output_tokens). In hs-connectors' FP8
// form, hidden_states is F8_E4M3 with hidden_states_scales f32 [T, 1, 1] beside it.
#pragma once

#include <string>
#include <vector>

#include "capture/capture_sink.h"
#include "util/status.h"

namespace hsx {

enum class StatesFormat { kAsCaptured, kFp8 };

// Request ids name files, so they must stay a plain file name inside the output dir.
Status ValidateRequestId(const std::string& id);

// The file's tensors in the order they are written: the states, their scales (FP8),
// token_ids, then the record's extras.
std::vector<NamedTensor> HiddenStatesFileTensors(const CaptureRecord& record, StatesFormat format);

}  // namespace hsx
