// The layer contract every hidden-state file carries in its safetensors __metadata__
// (string values; the tensors vLLM and speculators read are untouched): which layers the
// rows hold, which model and tokenizer made them, in what dtype, by which hsx. A trainer
// that mixes files of two models, two tap choices or two tokenizers can then be caught
// (`hsx verify-states`) instead of training on them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "util/status.h"

namespace hsx {

inline constexpr const char* kHsxVersion = "0.9.0";

struct LayerContract {
  std::vector<int> layer_ids;     // ascending, vLLM's numbering (0: embeddings)
  std::string model_config_hash;  // model/config_fingerprint.h
  std::string tokenizer_hash;     // tokenizer/tokenizer_fingerprint.h; empty: no tokenizer
  std::string dtype;              // the states as captured: "BF16", "F32", "F16"
  std::string hsx_version = kHsxVersion;

  std::map<std::string, std::string> ToMetadata() const;
  // nullopt-like: an error naming `where` and the missing or malformed key.
  static Result<LayerContract> FromMetadata(const std::map<std::string, std::string>& metadata, const std::string& where);
};

}  // namespace hsx
