// A GGUF file's tokenizer (tokenizer.ggml.*) as a Hugging Face tokenizer.json document, built
// into the project's one Tokenizer: gpt2-style byte-level BPE with its merges and the
// pre-tokenizer regexes llama.cpp uses for tokenizer.ggml.pre, or llama-style SentencePiece
// BPE as transformers converts it (Llama's, or Gemma's own); unknown, control and user-defined tokens as added tokens,
// BOS/EOS as llama.cpp adds them.
#pragma once

#include <nlohmann/json.hpp>

#include "model/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace hsx {

// Refuses, by name, other tokenizer models, pre-tokenizer types whose regexes hsx does not
// know, and SentencePiece vocabularies of Gemma 4 and Phi-3 (built differently by transformers).
Result<nlohmann::json> GgufTokenizerJson(const GgufFile& file);
Result<Tokenizer> GgufTokenizer(const GgufFile& file);
// The tokenizer of a .gguf path.
Result<Tokenizer> LoadGgufTokenizer(const std::string& path);

}  // namespace hsx
