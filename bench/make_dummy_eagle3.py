"""Writes a random EAGLE-3 draft in speculators' checkpoint format for a target shape: one
Llama decoder layer, fc over the aux layers of vLLM's default ids (2, N/2, N-3), a 32k draft vocabulary,
today's `speculators train` flags; f32 weights (numpy has no bf16; hsx converts on upload).
For benchmarks of the speculation machinery: a random draft is never accepted.
Usage: python3 bench/make_dummy_eagle3.py OUT_DIR [hidden heads kv_heads head_dim intermediate vocab layers]
(defaults: the Qwen3-8B shape)."""
import json
import pathlib
import sys

import numpy as np
from safetensors.numpy import save_file


def main():
    out = pathlib.Path(sys.argv[1])
    h, nh, nkv, hd, inter, vocab, layers = (int(x) for x in (sys.argv[2:9] or
                                                               [4096, 32, 8, 128, 12288, 151936, 36]))
    draft_vocab = min(32000, vocab)
    aux = sorted({2, layers // 2, layers - 3})
    rng = np.random.default_rng(0)
    w = lambda *shape: (rng.standard_normal(shape, dtype=np.float32) * 0.02)
    ones = lambda n: np.ones(n, np.float32)
    tensors = {
        "fc.weight": w(h, len(aux) * h), "input_norm.weight": ones(len(aux) * h),
        "layers.0.hidden_norm.weight": ones(h), "layers.0.input_layernorm.weight": ones(h),
        "layers.0.self_attn.q_proj.weight": w(nh * hd, 2 * h), "layers.0.self_attn.k_proj.weight": w(nkv * hd, 2 * h),
        "layers.0.self_attn.v_proj.weight": w(nkv * hd, 2 * h), "layers.0.self_attn.o_proj.weight": w(h, nh * hd),
        "layers.0.post_attention_layernorm.weight": ones(h),
        "layers.0.mlp.gate_proj.weight": w(inter, h), "layers.0.mlp.up_proj.weight": w(inter, h),
        "layers.0.mlp.down_proj.weight": w(h, inter), "norm.weight": ones(h), "lm_head.weight": w(draft_vocab, h),
    }
    if draft_vocab < vocab:
        tensors["d2t"] = np.zeros(draft_vocab, np.int64)  # draft id i is target id i
        t2d = np.zeros(vocab, np.bool_)
        t2d[:draft_vocab] = True
        tensors["t2d"] = t2d
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    layer = {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
             "head_dim": hd, "hidden_act": "silu", "hidden_size": h, "initializer_range": 0.02,
             "intermediate_size": inter, "layer_types": ["full_attention"], "max_position_embeddings": 40960,
             "mlp_bias": False, "model_type": "llama", "num_attention_heads": nh, "num_hidden_layers": 1,
             "num_key_value_heads": nkv, "pad_token_id": None, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
             "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "tie_word_embeddings": False,
             "use_cache": True, "vocab_size": vocab}
    config = {"architectures": ["Eagle3DraftModel"], "draft_vocab_size": draft_vocab, "dtype": "float32",
              "eagle_aux_hidden_state_layer_ids": aux, "embed_requires_grad": False, "fc_norm": False,
              "norm_before_fc": True, "norm_before_residual": True, "norm_output": True,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                                           "speculative_tokens": 3, "verifier_accept_k": 1}],
                                     "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": "dummy"}},
              "speculators_model_type": "eagle3", "speculators_version": "0.9.0", "target_hidden_size": None,
              "tie_word_embeddings": False, "transformer_layer_config": layer, "transformers_version": "5.17.0"}
    (out / "config.json").write_text(json.dumps(config, indent=2))


if __name__ == "__main__":
    main()
