// vLLM's --speculative-config, one JSON object for serve, generate and bench:
//   {"method": "extract_hidden_states", "num_speculative_tokens": 1,
//    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [..]}}}
//      (no drafts: the hidden states of those layers are captured, vLLM's extraction)
//   {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": a, "prompt_lookup_max": b}
//   {"method": "eagle3", "model": DIR, "num_speculative_tokens": K}  (a speculators checkpoint;
//      K defaults to the checkpoint's proposal length)
//   {"method": "mtp", "model": DIR, "num_speculative_tokens": K}  (a Gemma 4 assistant)
// ngram, eagle3 and mtp also take "draft_length": "adaptive" | "fixed" (engine/draft_length.h).
// eagle3 also takes vLLM's "speculative_token_tree": "[(0,), (1,), (0, 0)]" (engine/token_tree.h):
//   tree drafts; num_speculative_tokens is then the tree's node count (vLLM's), derived when absent.
// eagle3 also takes SGLang's "speculative_eagle_topk": k, "speculative_num_steps": depth
//   (engine/dynamic_tree.h): EAGLE-2's dynamic trees, num_speculative_tokens (required)
//   candidates verified a step.
// Fields a method does not take are refused by name, as are methods hsx does not run yet.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/dynamic_tree.h"
#include "engine/ngram_proposer.h"
#include "engine/token_tree.h"
#include "util/status.h"

namespace hsx {

struct SpeculativeConfig {
  enum class Method { kNone, kExtractHiddenStates, kNgram, kEagle3, kMtp };
  Method method = Method::kNone;
  std::vector<int> capture_layers;  // extract_hidden_states: ascending, unique, in [0, num_layers]
  NgramConfig ngram;                // ngram: its K and lookup lengths
  std::string model;                // eagle3, mtp: the draft's directory
  int num_speculative_tokens = 0;   // eagle3, mtp: K; 0 (eagle3 only): the checkpoint's own
  // ngram, eagle3, mtp: "draft_length": "adaptive" (K in 0..num_speculative_tokens per
  // request per step) or "fixed" (the default: K every step).
  bool adaptive_draft_length = false;
  // eagle3: "speculative_token_tree", a tree that is not the chain (a chain tree drafts as
  // the chain does, so it is dropped here and num_speculative_tokens keeps its length).
  std::optional<TokenTree> token_tree;
  // eagle3: "speculative_eagle_topk" and "speculative_num_steps" (both or neither).
  std::optional<DynamicTreeConfig> dynamic_tree;
};

// text: the flag's JSON; num_layers: the target's (layer ids range over [0, num_layers]).
Result<SpeculativeConfig> ParseSpeculativeConfig(const std::string& text, int num_layers);

}  // namespace hsx
