#include "engine/capture_record.h"

namespace hsx {

CaptureRecord CaptureRecordOf(const Sequence& seq, std::string name, std::map<std::string, std::string> metadata) {
  CaptureRecord record;
  record.id = seq.id();
  record.name = std::move(name);
  record.hidden_states = seq.hidden_states;
  const size_t rows = seq.hidden_states.defined() ? static_cast<size_t>(seq.hidden_states.size(0)) : 0;
  record.token_ids.assign(seq.tokens().begin(), seq.tokens().begin() + static_cast<std::ptrdiff_t>(std::min(rows, seq.tokens().size())));
  record.metadata = std::move(metadata);
  // hs-connectors' name for which rows a record holds (its Mooncake manifest carries it).
  record.metadata["extract_mode"] = seq.request().include_output_tokens ? "all" : "prompt_only";
  return record;
}

}  // namespace hsx
