// Token strings back to text, as tokenizer.json's "decoder" configures it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "util/status.h"

namespace hsx {

// HF's decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence. Each step
// maps the list of token strings to a new list; the text is their concatenation at the end.
class TokenDecoder {
 public:
  // `where` is the field path used in errors, e.g. "decoder".
  static Result<TokenDecoder> FromJson(const nlohmann::json& config, const std::string& where);
  std::string Decode(std::vector<std::string> tokens) const;

 private:
  struct ByteLevel {};
  struct Replace {
    std::string pattern;
    std::string content;
  };
  struct ByteFallback {};
  struct Fuse {};
  struct Strip {
    std::string content;  // one character
    size_t start;
    size_t stop;
  };
  struct Metaspace {
    std::string replacement;
    bool drop_from_first_token;  // the pre-tokenizer prepended it (prepend_scheme is not "never")
  };
  using Step = std::variant<ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace>;
  static Status AddSteps(const nlohmann::json& config, const std::string& where,
                         std::vector<Step>* steps);

  // Without a decoder HF joins the tokens with spaces.
  bool configured_ = false;
  std::vector<Step> steps_;
};

}  // namespace hsx
