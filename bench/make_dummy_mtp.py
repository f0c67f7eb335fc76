"""Writes a random Gemma 4 MTP assistant ("gemma4_assistant", Gemma4AssistantForCausalLM) for a
target shape: config.json and model.safetensors exactly as tests/data/mtp/gemma4_assistant has them
(../shared/SPECULATIVE.md section 2), with the dense tied head (use_ordered_embeddings false, no
masked_embedding tensors). For benchmarks of the speculation machinery: a random draft is never accepted.

Defaults: an assistant for the gemma-4-31b named target (hidden 5376, vocab 262144, sliding layers
head_dim 256 with 16 KV heads, full layers head_dim 512 with 4 KV heads and k = v, window 1024, the
named config's rope parameters). Google publishes no config for the 31B assistant here, so its own
shape is an ESTIMATE:
  - 4 decoder layers, sliding, sliding, sliding, full: llama.cpp and eliza call Google's assistants
    "4-block" drafters (the E2B one: 4 layers, pre_projection 2 * backbone -> 256); Gemma 4 ends on a
    full-attention layer, and hsx maps each layer to the target's last KV-owning layer of its type;
  - hidden 1024, intermediate 8192, 32 query heads (head_dim per layer type as the target's, which
    the KV sharing requires);
  - the dense tied head the 26B-A4B / 31B assistants use (the centroid head is E2B / E4B's).
That comes to about 470M parameters, the count the google/gemma-4-31B-it assistant's model card
lists; the script prints the count it wrote.

Weights: N(0, 0.02) matrices, norms of ones, layer_scalar 1, written as bf16 (default: numpy only,
f32 truncated to bf16 by hand, since numpy has no bf16) or f32 (hsx converts either).
Usage: python3 bench/make_dummy_mtp.py OUT_DIR [--hidden 1024 ...] (see --help; the target-side
flags must match the target, the assistant-side ones are free)."""
import argparse
import json
import pathlib

import numpy as np

ROPE = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}


CHUNK = 1 << 24


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    t = p.add_argument_group("target (must match it; defaults: gemma-4-31b)")
    t.add_argument("--backbone-hidden", type=int, default=5376, help="the target's hidden_size")
    t.add_argument("--vocab", type=int, default=262144)
    t.add_argument("--head-dim", type=int, default=256, help="the target's sliding layers' head_dim")
    t.add_argument("--kv-heads", type=int, default=16, help="the target's sliding layers' KV heads")
    t.add_argument("--global-head-dim", type=int, default=512, help="the target's full layers' head_dim")
    t.add_argument("--global-kv-heads", type=int, default=4,
                   help="the target's full layers' KV heads with attention_k_eq_v; 0: no k = v (as --kv-heads)")
    t.add_argument("--sliding-window", type=int, default=1024)
    t.add_argument("--max-position", type=int, default=262144)
    a = p.add_argument_group("assistant (an estimate for gemma-4-31b's)")
    a.add_argument("--hidden", type=int, default=1024)
    a.add_argument("--intermediate", type=int, default=8192)
    a.add_argument("--heads", type=int, default=32)
    a.add_argument("--layer-types", default="sliding,sliding,sliding,full")
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def tensor_shapes(args, types):
    """The checkpoint's tensors (names as Gemma4AssistantForCausalLM saves them) -> (shape, init)."""
    h, ht = args.hidden, args.backbone_hidden
    out = {"model.embed_tokens.weight": ((args.vocab, h), "w")}  # also the tied head
    for i, kind in enumerate(types):
        hd = args.head_dim if kind == "sliding" else args.global_head_dim
        pre = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            out[pre + norm + ".weight"] = ((h,), "ones")
        out[pre + "layer_scalar"] = ((1,), "ones")
        out[pre + "self_attn.q_proj.weight"] = ((args.heads * hd, h), "w")  # Q only: K/V are the target's
        out[pre + "self_attn.q_norm.weight"] = ((hd,), "ones")
        out[pre + "self_attn.o_proj.weight"] = ((h, args.heads * hd), "w")
        out[pre + "mlp.gate_proj.weight"] = ((args.intermediate, h), "w")
        out[pre + "mlp.up_proj.weight"] = ((args.intermediate, h), "w")
        out[pre + "mlp.down_proj.weight"] = ((h, args.intermediate), "w")
    out["model.norm.weight"] = ((h,), "ones")
    out["pre_projection.weight"] = ((h, 2 * ht), "w")  # columns: the target's embedding, then its hidden
    out["post_projection.weight"] = ((ht, h), "w")
    return dict(sorted(out.items()))  # safetensors' own writers sort by name


def to_bf16(x):
    """f32 -> bf16 bits (uint16), truncated (random weights need no rounding)."""
    return (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def write_safetensors(path, shapes, dtype, rng):
    esize, tag = (2, "BF16") if dtype == "bf16" else (4, "F32")
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, _) in shapes.items():
        n = int(np.prod(shape)) * esize
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, (shape, init) in shapes.items():
            n = int(np.prod(shape))
            for begin in range(0, n, CHUNK):  # in chunks: the embedding is 1 GiB of f32 at the default shape
                m = min(CHUNK, n - begin)
                if init == "ones":
                    x = np.ones(m, np.float32)
                else:
                    x = rng.standard_normal(m, dtype=np.float32)
                    x *= np.float32(0.02)
                f.write((to_bf16(x) if dtype == "bf16" else x).tobytes())


def config(args, types):
    n = len(types)
    text = {
        "_name_or_path": "", "architectures": None, "attention_bias": False, "attention_dropout": 0.0,
        "attention_k_eq_v": args.global_kv_heads > 0, "bos_token_id": 2, "chunk_size_feed_forward": 0,
        "dtype": None, "enable_moe_block": False, "eos_token_id": 1, "final_logit_softcapping": None,
        "global_head_dim": args.global_head_dim, "head_dim": args.head_dim,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": args.hidden, "hidden_size_per_layer_input": 0,
        "initializer_range": 0.02, "intermediate_size": args.intermediate, "is_encoder_decoder": False,
        "layer_types": [k + "_attention" for k in types], "max_position_embeddings": args.max_position,
        "model_type": "gemma4_text", "moe_intermediate_size": None, "num_attention_heads": args.heads,
        "num_experts": None, "num_global_key_value_heads": args.global_kv_heads or None, "num_hidden_layers": n,
        "num_key_value_heads": args.kv_heads, "num_kv_shared_layers": n, "pad_token_id": 0,
        "rms_norm_eps": 1e-06, "rope_parameters": ROPE, "sliding_window": args.sliding_window,
        "tie_word_embeddings": True, "top_k_experts": None, "use_bidirectional_attention": None,
        "use_cache": True, "use_double_wide_mlp": False, "vocab_size": args.vocab, "vocab_size_per_layer_input": 0}
    return {"architectures": ["Gemma4AssistantForCausalLM"], "backbone_hidden_size": args.backbone_hidden,
            "centroid_intermediate_top_k": 32, "dtype": "bfloat16" if args.dtype == "bf16" else "float32",
            "model_type": "gemma4_assistant", "num_centroids": 2048, "text_config": text,
            "tie_word_embeddings": True, "transformers_version": "5.17.0", "use_ordered_embeddings": False}


def main():
    args = parse_args()
    types = args.layer_types.split(",")
    if not types or any(k not in ("sliding", "full") for k in types) or types[-1] != "full":
        raise SystemExit("--layer-types: sliding/full entries, the last full (Gemma 4 ends on a full layer)")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = tensor_shapes(args, types)
    write_safetensors(out / "model.safetensors", shapes, args.dtype, np.random.default_rng(args.seed))
    (out / "config.json").write_text(json.dumps(config(args, types), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
         "transformers_version": "5.17.0"}, indent=2))
    params = sum(int(np.prod(s)) for s, _ in shapes.values())
    print(json.dumps({"assistant": str(out), "params": params, "params_millions": round(params / 1e6, 1),
                      "dtype": args.dtype, "layer_types": types}))


if __name__ == "__main__":
    main()
