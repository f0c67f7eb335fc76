// A GGUF file's metadata as the Hugging Face config.json it stands for, read by the one
// config reader (ParseModelConfig), so GGUF models get the same defaults and checks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"
#include "model/gguf_file.h"

namespace hsx {

// Whether `path` names a GGUF file (ending in .gguf, not a directory) rather than a model directory.
bool IsGgufPath(const std::string& path);

// llama.cpp's architecture names hsx runs, and the transformers class each stands for.
// Keys of the architecture's namespace that hsx does not know, and tensors that change the
// computation (llama 3's rope_freqs), are refused by name.
Result<nlohmann::json> GgufHfConfig(const GgufFile& file);
Result<ModelConfig> GgufModelConfig(const GgufFile& file);

}  // namespace hsx
