// A GGUF file's tensors as the model's weights: llama.cpp's names (token_embd, blk.N.attn_q,
// output_norm, output, ...) mapped to the Hugging Face names the weight schema expects,
// dequantized to f32 (the backend converts to its compute dtype on upload), and llama's
// Q/K row permutation undone.
#pragma once

#include "model/config.h"
#include "model/gguf_file.h"
#include "model/weights.h"

namespace hsx {

// Every tensor of the file must be used (an unknown one would change the computation).
Result<ModelWeights> LoadGgufWeights(const GgufFile& file, const ModelConfig& config, Backend& backend,
                                     Shard shard = {});

// llama.cpp's converter reorders each head's rows of Llama's q and k projections from
// rotate-half order (first halves, then second halves) to interleaved pairs; this puts them
// back: row 2i + h of each `head_dim`-row head becomes row h * head_dim / 2 + i.
void UnpermuteLlamaRows(Tensor& weight, int64_t head_dim);

}  // namespace hsx
