// The checks `hsx verify-states` runs on one hidden-state file: its tensors' names, dtypes
// and shapes as vLLM and speculators read them, every value finite, token ids inside the
// vocabulary and (where the prompt is known) the prompt's own, and its layer contract
// against the model the directory is said to come from.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "capture/layer_contract.h"

namespace hsx {

struct StatesExpectation {
  int hidden_size = 0;
  int num_layers = 0;  // layer ids run 0..num_layers
  int vocab_size = 0;
  std::string model_config_hash;
  std::string tokenizer_hash;  // empty: not checked (no tokenizer)
  std::vector<int> layer_ids;  // empty: not checked
  std::optional<std::vector<int32_t>> prompt_ids;  // the file's tokens must begin with these
};

struct StatesCheck {
  std::vector<std::string> problems;  // each names the file and what is wrong; empty: the file is sound
  std::optional<LayerContract> contract;
  int64_t num_tokens = 0;
};

StatesCheck CheckStatesFile(const std::string& path, const StatesExpectation& expected);

}  // namespace hsx
