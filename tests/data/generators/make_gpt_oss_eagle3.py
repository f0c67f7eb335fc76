"""EAGLE-3 drafts for the gpt_oss fixture target (models/gpt_oss), in speculators 0.9's checkpoint
format as `speculators train` writes it for a gpt-oss verifier, in numpy (this machine has no
torch, so speculators' classes cannot run here; its source was read instead).

What speculators 0.9 does for a gpt-oss verifier (speculators/train/cli.py
create_transformer_layer_config, models/eagle3/core.py from_training_args, train/vocab_mapping.py):
- transformer_layer_config is a LlamaConfig (draft_arch "llama"), not the verifier's gpt_oss
  config: the verifier's vocab, hidden size, heads, KV heads, head_dim, hidden_act, rms_norm_eps,
  max_position_embeddings and initializer_range; intermediate_size the verifier's (gpt-oss has a
  dense one, so not the 3 x hidden MoE fallback); attention_bias / mlp_bias LlamaConfig's False
  (the verifier's attention biases and sinks are not copied); layer_types all
  "sliding_attention" with sliding_window 2048 (--sliding-window, not the verifier's 128);
  rope_parameters the verifier's own dict verbatim: yarn (factor, beta_fast, beta_slow,
  original_max_position_embeddings, truncate), so the draft's RoPE is yarn too.
- eagle3 defaults: norm_before_fc (one RMSNorm over the 3H concat: "gpt-oss style"),
  norm_output and norm_before_residual all true; fc_norm false.
- aux layer ids: (2, N/2, N-3) when not given (20b: 2, 12, 21; 120b: 2, 18, 33), as vLLM's
  GptOssForCausalLM.get_eagle3_aux_hidden_state_layers; the 4-layer fixture's defaults
  (2, 2, 1) repeat an id, which speculators refuses, so the ids are given: [1, 2, 3].
- draft vocabulary: d2t (int64, target id = i + d2t[i]) and t2d (bool) from the token
  frequencies of the target's own responses (here its golden greedy tokens), most frequent
  first, ties to the lower id, filled up from id 0, then sorted.
- embed_tokens: the verifier's (load_verifier_weights; frozen: embed_requires_grad false).

Variants:
  gpt_oss_default  the defaults above; every trainable tensor random (seeded), lm_head too.
  gpt_oss_lookup   the same config with norm_before_residual and norm_output false and hand-set
                   weights that propose, after token x, the token HF's greedy decode of the
                   target put after x in its goldens (prompt_k's last token -> greedy_k[0],
                   greedy_k[i] -> greedy_k[i+1]; the first successor where x has several):
                   attention reads the token embedding and returns it, and lm_head's row of
                   draft id d is the sum of the embeddings of the tokens whose successor is d.
                   The target never repeats a token at once, so llama_copy's "the same token
                   again" would never be accepted; this draft's chains are, for the goldens'
                   8 tokens, so the accept path (whole and partial rounds) runs.

Run: python3 make_gpt_oss_eagle3.py [tests/data]   (writes eagle3/gpt_oss_{default,copy}/)
"""
import json
import os
import struct
import sys
from collections import Counter

import numpy as np

SEED = 20261204
AUX = [1, 2, 3]
DRAFT_VOCAB = 256
K = 3


def read_safetensors(path):
    """{name: (dtype string, shape, raw bytes)}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[b:end])
    return out


def bf16_bits(x):
    """f32 array -> bf16 bits (round to nearest even), as torch's .to(torch.bfloat16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_f32(raw, shape):
    return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


def write_safetensors(path, tensors):
    """tensors: {name: (dtype string, shape, bytes)}, written sorted by name as safetensors does."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_golden_ints(path):
    out = {}
    for name, (dtype, shape, raw) in read_safetensors(path).items():
        if dtype == "I64":
            out[name] = np.frombuffer(raw, dtype=np.int64).reshape(shape)
    return out


def vocab_mapping(freq, draft_vocab, vocab):
    ids = sorted(freq, key=lambda t: (-freq[t], t))[:draft_vocab]
    chosen = set(ids)
    for t in range(vocab):
        if len(ids) >= draft_vocab:
            break
        if t not in chosen:
            ids.append(t)
    ids.sort()
    d2t = np.array(ids, dtype=np.int64) - np.arange(draft_vocab, dtype=np.int64)
    t2d = np.zeros(vocab, dtype=np.bool_)
    t2d[ids] = True
    return ids, d2t, t2d


def layer_config(t):
    """The LlamaConfig speculators builds from a gpt-oss verifier, as its to_diff_dict writes it."""
    return {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "head_dim": t["head_dim"], "hidden_act": t["hidden_act"], "hidden_size": t["hidden_size"],
        "initializer_range": t["initializer_range"], "intermediate_size": t["intermediate_size"],
        "layer_types": ["sliding_attention"], "max_position_embeddings": t["max_position_embeddings"],
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": t["num_attention_heads"],
        "num_hidden_layers": 1, "num_key_value_heads": t["num_key_value_heads"], "pad_token_id": None,
        "pretraining_tp": 1, "rms_norm_eps": t["rms_norm_eps"], "rope_parameters": dict(t["rope_parameters"]),
        "sliding_window": 2048, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": True,
        "vocab_size": t["vocab_size"],
    }


def draft_config(t, copy):
    return {
        "architectures": ["Eagle3DraftModel"],
        "auto_map": {"": "config.Eagle3SpeculatorConfig"},
        "draft_vocab_size": DRAFT_VOCAB,
        "dtype": "bfloat16",
        "eagle_aux_hidden_state_layer_ids": AUX,
        "embed_requires_grad": False,
        "fc_norm": False,
        "norm_before_fc": True,
        "norm_before_residual": not copy,
        "norm_output": not copy,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": K,
                                  "verifier_accept_k": 1}],
            "verifier": {"architectures": ["GptOssForCausalLM"], "name_or_path": "../models/gpt_oss"},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer_config(t),
        "transformers_version": "5.17.0",
    }


def draft_weights(t, embed, ids, copy, rng, successor=None):
    """f32 weights of the draft (layer 0 reads [embedding | hidden], 2H wide)."""
    h, nh, nkv, hd, inter = (t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"],
                             t["intermediate_size"])
    a = len(AUX)

    def mat(rows, cols, scale=1.0):
        return rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(scale / np.sqrt(cols))

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {
        "fc.weight": mat(h, a * h), "input_norm.weight": norm(a * h),
        "layers.0.hidden_norm.weight": norm(h), "layers.0.input_layernorm.weight": norm(h),
        "layers.0.self_attn.q_proj.weight": mat(nh * hd, 2 * h), "layers.0.self_attn.k_proj.weight": mat(nkv * hd, 2 * h),
        "layers.0.self_attn.v_proj.weight": mat(nkv * hd, 2 * h), "layers.0.self_attn.o_proj.weight": mat(h, nh * hd),
        "layers.0.post_attention_layernorm.weight": norm(h),
        "layers.0.mlp.gate_proj.weight": mat(inter, h), "layers.0.mlp.up_proj.weight": mat(inter, h),
        "layers.0.mlp.down_proj.weight": mat(h, inter), "norm.weight": norm(h),
        "lm_head.weight": mat(DRAFT_VOCAB, h),
    }
    if copy:
        # Small everywhere but attention, which reads the normed token embedding (the first H
        # inputs) and returns it: out ~ embedding, so lm_head = embedding rows picks the token.
        for name in w:
            w[name] = np.ones_like(w[name]) if w[name].ndim == 1 else w[name] * np.float32(0.02)
        grp = nh // nkv
        q, k, v, o = (np.zeros_like(w["layers.0.self_attn." + p + "_proj.weight"]) for p in "qkvo")
        eye = np.eye(hd, dtype=np.float32)
        for g in range(nkv):
            cols = slice(g * hd, (g + 1) * hd)
            k[g * hd:(g + 1) * hd, cols] = eye
            v[g * hd:(g + 1) * hd, cols] = eye
            for head in range(g * grp, (g + 1) * grp):
                q[head * hd:(head + 1) * hd, cols] = 8.0 * eye
                o[g * hd:(g + 1) * hd, head * hd:(head + 1) * hd] = eye / grp
        for p, m in zip("qkvo", (q, k, v, o)):
            w["layers.0.self_attn." + p + "_proj.weight"] = m
        head = np.zeros((DRAFT_VOCAB, h), dtype=np.float32)
        index = {tid: i for i, tid in enumerate(ids)}
        for x, nxt in successor.items():
            head[index[nxt]] += embed[x]
        w["lm_head.weight"] = head
    return w


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    target_dir = os.path.join(data, "models", "gpt_oss")
    t = json.load(open(os.path.join(target_dir, "config.json")))
    target = read_safetensors(os.path.join(target_dir, "model.safetensors"))
    embed_dtype, embed_shape, embed_raw = target["model.embed_tokens.weight"]
    assert embed_dtype == "BF16"
    embed = bf16_to_f32(embed_raw, embed_shape)
    golden = read_golden_ints(os.path.join(target_dir, "golden.safetensors"))
    freq = Counter()
    successor = {}  # token -> the token HF's greedy decode put after it first
    for k in range(3):
        greedy = [int(x) for x in golden["greedy_%d" % k]]
        freq.update(greedy)
        chain = [int(golden["prompt_%d" % k][-1])] + greedy
        for x, nxt in zip(chain, chain[1:]):
            successor.setdefault(x, nxt)
    ids, d2t, t2d = vocab_mapping(freq, DRAFT_VOCAB, t["vocab_size"])
    for name, copy in (("gpt_oss_default", False), ("gpt_oss_lookup", True)):
        rng = np.random.default_rng(SEED + copy)
        out = os.path.join(data, "eagle3", name)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(draft_config(t, copy), f, indent=2, sort_keys=True)
            f.write("\n")
        tensors = {"embed_tokens.weight": ("BF16", embed_shape, embed_raw),
                   "d2t": ("I64", [DRAFT_VOCAB], d2t.tobytes()), "t2d": ("BOOL", [t["vocab_size"]], t2d.tobytes())}
        for n, x in draft_weights(t, embed, ids, copy, rng, successor).items():
            tensors[n] = ("BF16", list(x.shape), bf16_bits(x).tobytes())
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        print("wrote", out)


if __name__ == "__main__":
    main()
