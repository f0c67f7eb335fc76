"""The error a bf16 run of the EAGLE-3 fixture drafts has against their f32 goldens, in
numpy, by rounding every op's output to bf16 the way a PyTorch bf16 eager forward does
(f32 accumulation inside each matmul and norm, bf16 tensors between ops; HF's eager
attention takes the softmax in f32). The fixtures record no bf16 run of speculators (the
generator ran on a CPU without one), so tests/test_eagle3_draft.cpp bounds the CUDA bf16
draft by 1.5x what this prints.

Run: python3 eagle3_bf16_error.py [tests/data/eagle3]
"""
import json
import os
import struct
import sys

import numpy as np

K = 3


def load(path):
    """safetensors -> {name: f32 or int array} (bf16 widened exactly)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        dt = e["dtype"]
        if dt == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F32":
            a = np.frombuffer(raw, np.float32)
        elif dt == "I64":
            a = np.frombuffer(raw, np.int64)
        elif dt == "BOOL":
            a = np.frombuffer(raw, np.uint8)
        else:
            raise ValueError(dt)
        out[name] = a.reshape(e["shape"]).copy()
    return out


def bf16(x):
    """Round to nearest even bf16, returned as f32."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def draft_bf16(w, cfg, aux, tokens, step_tokens):
    tl = cfg["transformer_layer_config"]
    H, nh, nkv, hd, eps = tl["hidden_size"], tl["num_attention_heads"], tl["num_key_value_heads"], tl["head_dim"], tl["rms_norm_eps"]
    theta = tl["rope_parameters"]["rope_theta"]
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, hd, 2, dtype=np.float32) / hd))).astype(np.float32)
    win = tl.get("sliding_window") if "sliding_attention" in (tl.get("layer_types") or []) else None
    embed = w.get("embed_tokens.weight")
    p = "layers.0."

    def lin(x, name):
        return bf16(x @ w[name].T)

    def rms(x, name):
        x32 = x.astype(np.float32)
        n = bf16(x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + np.float32(eps)))
        return bf16(w[name] * n)

    def rope(x, pos):
        f = pos[:, None].astype(np.float32) * inv[None]
        emb = np.concatenate([f, f], -1)
        cos, sin = bf16(np.cos(emb))[:, None], bf16(np.sin(emb))[:, None]
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return bf16(bf16(x * cos) + bf16(rot * sin))

    kc, vc, pc = [], [], []

    def layer(tok, hid, pos):
        en, hn = rms(embed[tok], p + "input_layernorm.weight"), rms(hid, p + "hidden_norm.weight")
        res = hn if cfg["norm_before_residual"] else hid
        x = np.concatenate([en, hn], -1)
        q = lin(x, p + "self_attn.q_proj.weight").reshape(-1, nh, hd)
        k = lin(x, p + "self_attn.k_proj.weight").reshape(-1, nkv, hd)
        v = lin(x, p + "self_attn.v_proj.weight").reshape(-1, nkv, hd)
        q, k = rope(q, pos), rope(k, pos)
        kc.append(k); vc.append(v); pc.append(pos)
        K_, V_, P_ = np.concatenate(kc), np.concatenate(vc), np.concatenate(pc)
        g = nh // nkv
        s = bf16(np.einsum("qhd,khd->hqk", q, np.repeat(K_, g, 1)) * np.float32(hd ** -0.5))
        ok = P_[None, :] <= pos[:, None]
        if win is not None:
            ok &= P_[None, :] > pos[:, None] - win
        s = np.where(ok[None], s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        prob = bf16(e / e.sum(-1, keepdims=True))
        o = bf16(np.einsum("hqk,khd->qhd", prob, np.repeat(V_, g, 1))).reshape(-1, nh * hd)
        h = bf16(res + lin(o, p + "self_attn.o_proj.weight"))
        u = rms(h, p + "post_attention_layernorm.weight")
        gate, up = lin(u, p + "mlp.gate_proj.weight"), lin(u, p + "mlp.up_proj.weight")
        act = bf16(bf16(gate / (1 + np.exp(-gate))) * up)
        return bf16(h + lin(act, p + "mlp.down_proj.weight"))

    g = bf16(aux.reshape(aux.shape[0], -1))
    if cfg["norm_before_fc"]:
        g = rms(g, "input_norm.weight")
    fc = lin(g, "fc.weight")
    T = len(tokens)
    out = layer(np.array(tokens), fc, np.arange(T))
    prefill, logits, prenorm = None, [], []
    for s in range(K):
        fn = rms(out, "norm.weight")
        lg = lin(fn, "lm_head.weight")
        if s == 0:
            prefill = lg
        logits.append(lg[-1]); prenorm.append(out[-1])
        fed = fn[-1:] if cfg["norm_output"] else out[-1:]
        if s + 1 < K:
            out = layer(np.array([step_tokens[s]]), fed, np.array([T - 1 + s + 1]))
    return fc, prefill, np.stack(logits), np.stack(prenorm)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eagle3")
    for variant in ("llama_legacy", "qwen3_default", "llama_copy"):
        d = os.path.join(root, variant)
        cfg = json.load(open(os.path.join(d, "config.json")))
        w = load(os.path.join(d, "model.safetensors"))
        gold = load(os.path.join(d, "golden.safetensors"))
        if "embed_tokens.weight" not in w:
            raise SystemExit(f"{variant}: the fixtures all carry embed_tokens")
        err = {"fc_out": 0.0, "prefill_logits": 0.0, "draft_logits": 0.0, "draft_prenorm": 0.0}
        k = 0
        while f"prompt_{k}" in gold:
            prompt = gold[f"prompt_{k}"].tolist()
            tokens = prompt[1:] + gold[f"next_token_{k}"].tolist()
            fc, pre, lg, pn = draft_bf16(w, cfg, gold[f"aux_hidden_{k}"], tokens, gold[f"draft_tokens_{k}"].tolist())
            for key, mine in (("fc_out", fc), ("prefill_logits", pre), ("draft_logits", lg), ("draft_prenorm", pn)):
                err[key] = max(err[key], float(np.abs(mine - gold[f"{key}_{k}"]).max()))
            k += 1
        print(variant, " ".join(f"{key} {v:.3e}" for key, v in err.items()))


if __name__ == "__main__":
    main()
