// A short fingerprint of a tokenizer, whatever file it came from (tokenizer.json or a
// GGUF's tokenizer.ggml.*): its vocabulary in id order with each token's special flag,
// and the ids of a fixed probe text (which catch normalizer and pre-tokenizer changes).
// Two tokenizers that give different ids to real text almost surely differ here.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace hsx {

std::string TokenizerFingerprint(const Tokenizer& tokenizer);  // 16 hex digits

}  // namespace hsx
