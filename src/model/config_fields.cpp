#include "model/config_fields.h"

namespace hsx {

const std::set<std::string>& HfIgnoredFields() {
  static const std::set<std::string> kIgnored = {
      // Bookkeeping and training-only settings (PreTrainedConfig and the hub's files).
      "_name_or_path", "transformers_version", "_commit_hash", "model_type", "use_cache", "initializer_range",
      "attention_dropout", "bos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      "output_hidden_states", "output_attentions", "return_dict", "use_return_dict", "torchscript", "id2label",
      "label2id", "num_labels", "problem_type", "finetuning_task", "chunk_size_feed_forward", "is_encoder_decoder",
      "is_decoder", "add_cross_attention", "cross_attention_hidden_size", "tie_encoder_decoder", "pruned_heads",
      "tf_legacy_loss", "use_bfloat16", "tokenizer_class", "prefix", "task_specific_params",
      "_attn_implementation_autoset", "attn_implementation", "output_router_logits", "router_aux_loss_coef",
      // Generation defaults: transformers pops them from the model config; hsx's sampling
      // comes from the request, stop tokens from eos_token_id and generation_config.json.
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
      "encoder_repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
      "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
      "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
      "begin_suppress_tokens", "epsilon_cutoff", "eta_cutoff", "cache_implementation",
      // Llama: transformers 5 never reads it; 4.x split the same matmuls tp ways (same result).
      "pretraining_tp",
      // Gemma 3: a copy transformers 5 writes next to an explicit layer_types.
      "_sliding_window_pattern",
  };
  return kIgnored;
}

}  // namespace hsx
