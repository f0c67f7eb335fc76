// The config.json of an EAGLE-3 draft in speculators' checkpoint format (speculators 0.9,
// as vLLM 0.33 reads it; /work/shared/SPECULATIVE.md §1.1), resolved and checked against
// the target it drafts for.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "util/status.h"

namespace hsx {

struct Eagle3Config {
  // transformer_layer_config as hsx resolves an HF config (a llama or qwen3 decoder):
  // the draft's layers, heads, RoPE, norms' eps, sliding window. Its first layer takes
  // [embedding | hidden] (2H) inputs; later layers are plain decoder layers.
  ModelConfig decoder;
  int draft_vocab_size = 0;           // rows of lm_head; < the target's vocabulary: d2t maps ids
  bool norm_before_residual = false;  // the residual is the normed hidden, not the raw one
  bool norm_before_fc = false;        // one RMSNorm (input_norm) over the A*H concat before fc
  bool fc_norm = false;               // one RMSNorm per aux chunk (fc_norm.{i}) before fc
  bool norm_output = false;           // feed rms(out, norm) to the next step instead of out
  std::vector<int> aux_layer_ids;     // ascending target layer ids (vLLM's convention)
  int num_speculative_tokens = 0;     // speculators_config's default proposal length; 0: none given

  int num_aux() const { return static_cast<int>(aux_layer_ids.size()); }
};

// Reads DIR/config.json. Every field that can change the draft's computation is read
// strictly (errors name the file and field); unknown ones are refused. Checked against
// the target: hidden size, vocabulary, aux layer ids in [0, num_layers].
Result<Eagle3Config> LoadEagle3Config(const std::string& draft_dir, const ModelConfig& target);
Result<Eagle3Config> ParseEagle3Config(const std::string& json_text, const std::string& source_name,
                                       const ModelConfig& target);

}  // namespace hsx
