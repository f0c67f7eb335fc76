#include "tokenizer/tokenizer_fingerprint.h"

#include "util/stable_hash.h"

namespace hsx {

std::string TokenizerFingerprint(const Tokenizer& tokenizer) {
  std::string bytes;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    bytes += tokenizer.IdToToken(id);
    bytes += tokenizer.IsSpecial(id) ? '\1' : '\0';
  }
  bytes += '\2';
  static constexpr const char* kProbe = "Hello, World!  It's 2026: naïve café ÅNGSTRÖM 東京 \t\n 12345 <|im_start|>x";
  auto ids = tokenizer.Encode(kProbe, /*add_special_tokens=*/true);
  if (ids.ok()) {
    for (int32_t id : *ids) bytes += std::to_string(id) + ',';
  }
  return StableHashHex(bytes);
}

}  // namespace hsx
