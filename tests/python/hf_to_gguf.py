"""A Hugging Face fixture directory written as GGUF the way llama.cpp's convert_hf_to_gguf.py
writes it (metadata keys, tensor names, Llama's q/k row permutation, experts stacked), with
the `gguf` package's GGUFWriter. Tensors keep their bits: BF16 stays BF16.

    python3 tests/python/hf_to_gguf.py MODEL_DIR OUT.gguf
"""
import json
import pathlib
import re
import sys

import numpy as np

from safetensors_numpy import read_safetensors

ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
         "Qwen3MoeForCausalLM": "qwen3moe"}
NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
         "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
         "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
         "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
         "mlp.gate.weight": "ffn_gate_inp.weight"}


def permute(w, n_head, n_kv_head):
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    if n_kv_head is not None and n_head != n_kv_head:
        n_head = n_kv_head
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(model_dir, out_path, tokenizer=None):
    import gguf
    model_dir = pathlib.Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    arch = ARCHS[config["architectures"][0]]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    w = gguf.GGUFWriter(str(out_path), arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(config["vocab_size"])
    if arch == "qwen3moe":
        w.add_expert_count(config.get("num_experts") or config["num_local_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
        w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    else:
        w.add_feed_forward_length(config["intermediate_size"])
    eos = config.get("eos_token_id")
    if isinstance(eos, int):
        w.add_eos_token_id(eos)
    if tokenizer:
        tokenizer(w)

    tensors = read_safetensors(model_dir / "model.safetensors")
    dtypes = {name: meta["dtype"] for name, meta in _header(model_dir / "model.safetensors").items()}
    experts = {}
    out = {}
    for name, t in tensors.items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            if config.get("tie_word_embeddings"):
                continue
            gname = "output.weight"
        else:
            m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", name)
            if e := re.fullmatch(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", m[2]):
                experts.setdefault((int(m[1]), e[2]), {})[int(e[1])] = (t, dtypes[name])
                continue
            gname = f"blk.{m[1]}.{NAMES[m[2]]}"
            if arch == "llama" and m[2].startswith("self_attn.q_proj"):
                t = permute(t, heads, heads)
            elif arch == "llama" and m[2].startswith("self_attn.k_proj"):
                t = permute(t, heads, kv_heads)
        out[gname] = (t, dtypes[name])
    for (layer, which), per_expert in experts.items():
        stacked = np.stack([per_expert[i][0] for i in range(len(per_expert))])
        out[f"blk.{layer}.ffn_{which}_exps.weight"] = (stacked, per_expert[0][1])
    for gname, (t, dtype) in out.items():
        t = np.ascontiguousarray(t)
        if dtype == "BF16":  # the widened f32's top 16 bits are the original bf16
            raw = (t.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(*t.shape[:-1], -1)
            w.add_tensor(gname, raw, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(gname, t.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _header(path):
    import struct
    raw = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return {k: v for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}


if __name__ == "__main__":
    convert(sys.argv[1], sys.argv[2])
