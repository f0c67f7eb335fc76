// A checkpoint's `quantization_config` (config.json): the one form hsx runs is
// compressed-tensors' FP8 "dynamic" scheme (what llm-compressor's FP8_DYNAMIC preset
// writes, as in the RedHatAI *-FP8-dynamic checkpoints): float-quantized E4M3 weights
// with one scale per output channel, activations quantized per token at run time. That is
// `--quantization fp8`'s scheme, so such a checkpoint runs on the same FP8 path with its
// own codes and scales. gpt-oss's MXFP4 experts ("quant_method": "mxfp4") are read as
// well, dequantized at load (model/mxfp4.h). Any other scheme is refused, naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "util/status.h"

namespace hsx {

// Checks `quantization_config` (read from `source`, for the errors) against the FP8
// dynamic scheme; OK when it is that scheme.
Status CheckFp8DynamicQuantizationConfig(const nlohmann::json& config, const std::string& source);

// Checks an MXFP4 `quantization_config` (transformers' Mxfp4Config: quant_method "mxfp4",
// modules_to_not_convert, dequantize): transformers quantizes only the experts, so every
// layer's `model.layers.<i>.mlp.experts` must be left to it; a pattern that keeps them bf16
// is refused (hsx expects them as blocks and scales).
Status CheckMxfp4QuantizationConfig(const nlohmann::json& config, int num_layers, const std::string& source);

}  // namespace hsx
