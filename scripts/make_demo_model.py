"""Makes examples/tiny-qwen3: a Qwen3-architecture model with random bf16 weights and
the bundled byte-level BPE tokenizer, small enough to ship in the repo, so the README's
first command runs text prompts end to end on a fresh machine. Run once; its output is
committed (needs numpy and safetensors from PyPI)."""
import json
import pathlib
import shutil

import numpy as np
from safetensors.numpy import save_file

out = pathlib.Path(__file__).resolve().parent.parent / "examples" / "tiny-qwen3"
out.mkdir(parents=True, exist_ok=True)
H, L, NH, KV, HD, I, V = 64, 4, 4, 2, 16, 160, 3000
config = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "dtype": "bfloat16",
    "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": KV,
    "head_dim": HD, "intermediate_size": I, "vocab_size": V, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "max_position_embeddings": 4096,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
}
rng = np.random.default_rng(0)


def bf16(a):
    # numpy has no bfloat16: store the top 16 bits of f32 (round to nearest even) as uint16 bytes.
    bits = a.astype(np.float32).view(np.uint32)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).astype(np.uint16)


def mat(rows, cols):
    return bf16(rng.standard_normal((rows, cols)) / np.sqrt(cols))


def norm(n):
    return bf16(1.0 + 0.1 * rng.standard_normal(n))


w = {"model.embed_tokens.weight": mat(V, H), "model.norm.weight": norm(H)}
for i in range(L):
    p = f"model.layers.{i}."
    w.update({
        p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
        p + "self_attn.q_proj.weight": mat(NH * HD, H), p + "self_attn.k_proj.weight": mat(KV * HD, H),
        p + "self_attn.v_proj.weight": mat(KV * HD, H), p + "self_attn.o_proj.weight": mat(H, NH * HD),
        p + "self_attn.q_norm.weight": norm(HD), p + "self_attn.k_norm.weight": norm(HD),
        p + "mlp.gate_proj.weight": mat(I, H), p + "mlp.up_proj.weight": mat(I, H), p + "mlp.down_proj.weight": mat(H, I),
    })
save_file(w, str(out / "model.safetensors"))
# safetensors.numpy writes uint16 as U16: relabel those tensors BF16 in the header, same bytes.
raw = (out / "model.safetensors").read_bytes()
n = int.from_bytes(raw[:8], "little")
header = json.loads(raw[8:8 + n])
for k, v in header.items():
    if isinstance(v, dict) and v.get("dtype") == "U16":
        v["dtype"] = "BF16"
text = json.dumps(header).encode()
text += b" " * ((8 - (8 + len(text)) % 8) % 8)
(out / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
(out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
shutil.copy(out.parent.parent / "tests/data/tokenizers/bpe_qwen2/tokenizer.json", out / "tokenizer.json")
