// The special tokens HF adds around an encoded text (add_special_tokens=True), as
// tokenizer.json's "post_processor" says.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/status.h"

namespace hsx {

// Only single sequences are encoded, so a post-processor reduces to the ids put before and
// after the text's ids.
class PostProcessor {
 public:
  // TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence or null.
  // `vocab_size` bounds the ids; `where` is the field path used in errors.
  static Result<PostProcessor> FromJson(const nlohmann::json& config, int vocab_size,
                                        const std::string& where);
  std::vector<int32_t> Apply(std::vector<int32_t> ids) const;
  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  static Status AddSteps(const nlohmann::json& config, int vocab_size, const std::string& where,
                         PostProcessor* processor);
  std::vector<int32_t> prefix_;
  std::vector<int32_t> suffix_;
};

}  // namespace hsx
