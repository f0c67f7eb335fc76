"""Generates tests/data/config_layouts.json: config.json layouts of every supported
architecture (transformers 4.x keys, 5.x rope_parameters, text_config nesting, omitted
fields, transformers' own full serialization) with the values transformers 5.x resolves
from each. test_config_layouts.cpp asserts hsx resolves the same.

Needs only `pip install transformers` (no torch: configs load without it). The inverse
frequencies and attention factors transcribe transformers' modeling_rope_utils (default,
linear, llama3, proportional, yarn, dynamic, longrope) in float32 (the attention factor
and yarn's correction range in Python doubles, as there), on the rope parameters
transformers resolved. With torch installed, every single-dict table is also checked
against transformers' own ROPE_INIT_FUNCTIONS.

  python3 tests/data/generators/config_layouts.py   # rewrites tests/data/config_layouts.json
"""
import copy
import json
import math
import os
import tempfile

import numpy as np
import transformers
from transformers import AutoConfig

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)


def fixture(name):
    with open(os.path.join(DATA, "models", name, "config.json")) as f:
        return json.load(f)


def load(config_dict):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config_dict, f)
        return AutoConfig.from_pretrained(d)


def inv_freq(rope, head_dim, max_pos=None):
    """transformers' _compute_*_rope_parameters in float32 (numpy): (inv_freq, attention factor)."""
    f32 = np.float32
    base, kind = rope["rope_theta"], rope.get("rope_type", "default")
    if kind in ("yarn", "dynamic", "longrope"):
        return scaled_inv_freq(rope, head_dim, max_pos)
    if kind == "proportional":
        angles = int(rope.get("partial_rotary_factor", 1.0) * head_dim // 2)
        rotated = f32(1.0) / (f32(base) ** (np.arange(0, 2 * angles, 2).astype(f32) / f32(head_dim)))
        rotated = rotated / f32(rope.get("factor", 1.0))
        return np.concatenate([rotated, np.zeros(head_dim // 2 - angles, dtype=f32)]), 1.0
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    inv = f32(1.0) / (f32(base) ** (np.arange(0, dim, 2).astype(f32) / f32(dim)))
    if kind == "linear":
        inv = inv / f32(rope["factor"])
    elif kind == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        wavelen = f32(2 * math.pi) / inv
        llama = np.where(wavelen > f32(old / low), inv / f32(factor), inv)
        smooth = (f32(old) / wavelen - f32(low)) / f32(high - low)
        smoothed = (f32(1) - smooth) * llama / f32(factor) + smooth * llama
        medium = ~(wavelen < f32(old / high)) & ~(wavelen > f32(old / low))
        inv = np.where(medium, smoothed, llama)
    elif kind != "default":
        raise ValueError(kind)
    return inv.astype(f32), 1.0


def scaled_inv_freq(rope, head_dim, max_pos):
    """_compute_yarn_parameters, _compute_dynamic_ntk_parameters and
    _compute_longrope_parameters at init (seq_len None), as transformers builds the table."""
    f32 = np.float32
    base, kind = rope["rope_theta"], rope["rope_type"]
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    shape = np.arange(0, dim, 2).astype(f32) / f32(dim)
    if kind == "dynamic":
        seq_len = max_pos  # seq_len None: max_position_embeddings
        base = base * ((rope["factor"] * seq_len / max_pos) - (rope["factor"] - 1)) ** (dim / (dim - 2))
        return (f32(1.0) / (f32(base) ** shape)).astype(f32), 1.0
    orig = rope["original_max_position_embeddings"]
    factor = rope.get("factor")
    attention_factor = rope.get("attention_factor")
    if factor is None:
        factor = max_pos / orig
    if kind == "longrope":
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = np.array(rope["short_factor"], dtype=f32)
        return (f32(1.0) / (ext * f32(base) ** shape)).astype(f32), attention_factor

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):  # single dict: config.rope_parameters is this dict
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = f32(base) ** shape
    extrapolation = f32(1.0) / pos_freqs
    interpolation = f32(1.0) / (f32(factor) * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), f32(0), f32(1))
    extrapolation_factor = f32(1) - ramp
    inv = interpolation * (f32(1) - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv.astype(f32), attention_factor


def torch_check(config, inv, attention_factor):
    """With torch installed: transformers' own table for a single-dict config."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    kind = config.rope_parameters["rope_type"]
    if kind not in ROPE_INIT_FUNCTIONS:
        return
    ref, ref_factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    assert np.allclose(ref.numpy(), inv, rtol=2e-7, atol=0), (kind, ref.numpy(), inv)
    assert abs(ref_factor - attention_factor) <= 1e-15 * abs(ref_factor), (kind, ref_factor, attention_factor)


def eos_list(v):
    return [] if v is None else list(v) if isinstance(v, (list, tuple)) else [v]


def resolve(config_dict):
    """What transformers makes of config_dict, in the terms ModelConfig uses."""
    top = load(config_dict)
    c = top.get_text_config(decoder=True)
    model_type = c.model_type
    n = c.num_hidden_layers
    if model_type in ("qwen3_moe", "mistral"):
        layer_types = ["sliding_attention" if c.sliding_window is not None else "full_attention"] * n
    elif hasattr(c, "layer_types") and c.layer_types is not None:
        layer_types = list(c.layer_types)
    else:
        layer_types = ["full_attention"] * n
    gemma4 = model_type.startswith("gemma4")
    default_head_dim = None if gemma4 else getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rp = c.rope_parameters
    nested = isinstance(rp, dict) and any(k in ("full_attention", "sliding_attention") for k in rp)
    layers, freqs = [], {}
    for i in range(n):
        head_dim, kv = (None, None) if gemma4 else (default_head_dim, c.num_key_value_heads)
        if gemma4:
            head_dim = c.per_layer_config[i].head_dim
            kv = c.per_layer_config[i].num_key_value_heads
        t = layer_types[i]
        rope = dict(rp[t] if nested else rp)
        sliding = t == "sliding_attention" and c.sliding_window is not None
        key = "%s/%d" % (t, head_dim)
        table, attention_factor = inv_freq(rope, head_dim, c.max_position_embeddings)
        if not nested and i == 0:
            torch_check(c, table, attention_factor)
        freqs.setdefault(key, [float(x) for x in table])
        layers.append({"sliding": sliding, "head_dim": head_dim, "num_kv_heads": kv, "inv_freq": key,
                       "rope_type": rope.get("rope_type", "default"), "rope_theta": rope["rope_theta"],
                       "attention_factor": attention_factor})
    if model_type.startswith("gemma3"):
        scale = c.query_pre_attn_scalar ** -0.5
    elif model_type.startswith("gemma4"):
        scale = 1.0
    else:
        scale = 0.0  # hsx: 1 / sqrt(head_dim) per layer
    eos = eos_list(c.eos_token_id)
    if top is not c:
        eos += [e for e in eos_list(getattr(top, "eos_token_id", None)) if e not in eos]
    any_sliding = any(l["sliding"] for l in layers)
    # The longest sequence whose table is the one above: dynamic recomputes it past
    # max_position_embeddings, longrope switches to long_factor past the original length.
    max_model_len = c.max_position_embeddings
    for t in set(layer_types):
        rope = rp[t] if nested else rp
        if rope.get("rope_type") == "longrope":
            max_model_len = min(max_model_len, rope["original_max_position_embeddings"])
    return {
        "max_model_len": max_model_len,
        "hidden_size": c.hidden_size,
        "num_layers": n,
        "vocab_size": c.vocab_size,
        "num_heads": c.num_attention_heads,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "activation": getattr(c, "hidden_activation", None) or c.hidden_act,
        "tie_word_embeddings": bool(getattr(top, "tie_word_embeddings", c.tie_word_embeddings)),
        "eos_token_ids": eos,
        "sliding_window": c.sliding_window if any_sliding else 0,
        "attn_scale": scale,
        "final_softcap": getattr(c, "final_logit_softcapping", None) or 0.0,
        "num_experts": getattr(c, "num_experts", 0) if model_type == "qwen3_moe" else 0,
        "experts_per_token": getattr(c, "num_experts_per_tok", 0) if model_type == "qwen3_moe" else 0,
        "norm_topk_prob": bool(getattr(c, "norm_topk_prob", True)) if model_type == "qwen3_moe" else True,
        "layers": layers,
        "inv_freq": freqs,
    }


def strip(d, *keys):
    d = copy.deepcopy(d)
    for k in keys:
        d.pop(k, None)
    return d


# Published config.json files (as on the Hugging Face Hub).
MISTRAL_7B_INSTRUCT_V03 = {
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
    "use_cache": True, "vocab_size": 32768}
MISTRAL_7B_V01 = dict(MISTRAL_7B_INSTRUCT_V03, rope_theta=10000.0, sliding_window=4096, vocab_size=32000,
                      transformers_version="4.34.0.dev0")
MISTRAL_NEMO = dict(MISTRAL_7B_INSTRUCT_V03, head_dim=128, hidden_size=5120, num_hidden_layers=40,
                    max_position_embeddings=1024000, vocab_size=131072, transformers_version="4.43.0.dev0")
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936}


def cases():
    out = []

    def add(name, config, hidden_states_of=None):
        out.append({"name": name, "config": config, "hidden_states_of": hidden_states_of})

    for name in ["llama", "llama31", "qwen2", "qwen3", "qwen3_tied", "qwen3_moe", "gemma3", "gemma4", "gemma4_kvshare"]:
        f = fixture(name)
        add("fixture_5x/" + name, f, name)
        add("transformers_to_dict/" + name, json.loads(load(f).to_json_string()))

    # transformers 4.x keys on the single-rope architectures.
    for name in ["llama", "llama31", "qwen2", "qwen3", "qwen3_moe"]:
        f = fixture(name)
        rp = f["rope_parameters"]
        d = strip(f, "dtype", "rope_parameters")
        d["torch_dtype"] = "bfloat16"
        d["rope_theta"] = rp["rope_theta"]
        if rp["rope_type"] != "default":
            d["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
        add("4x_keys/" + name, d, name)

    f = fixture("llama31")
    d = strip(f, "rope_parameters")
    d["rope_theta"] = 500000.0
    d["rope_scaling"] = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    add("4x_legacy_type_key_no_original_max/llama31", d)
    d = strip(fixture("llama"), "rope_parameters")
    d["rope_scaling"] = {"type": "linear", "factor": 4.0}
    add("4x_linear_scaling/llama", d)
    d = strip(fixture("qwen2"), "rope_parameters", "layer_types")
    d.update(use_sliding_window=True, sliding_window=8, max_window_layers=2, rope_theta=1e6)
    add("4x_sliding_window/qwen2", d)
    d = strip(fixture("qwen3_moe"), "rope_parameters", "head_dim")
    d.update(use_sliding_window=True, sliding_window=8, rope_theta=1e6, max_window_layers=48)
    add("4x_sliding_window_no_head_dim/qwen3_moe", d)

    # Gemma 3, 4.x text-only (1B style): rope_theta, rope_local_base_freq, pattern.
    g = fixture("gemma3")
    g4x = strip(g, "dtype", "rope_parameters", "layer_types", "_sliding_window_pattern")
    g4x.update(torch_dtype="bfloat16", rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=6)
    add("4x_keys/gemma3", g4x, "gemma3")
    # Gemma 3 4B+ style: multimodal, text_config nesting, linear scaling on full attention.
    text = strip(g4x, "architectures", "torch_dtype", "eos_token_id", "bos_token_id", "pad_token_id")
    text["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    mm = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
          "eos_token_id": [1, 106], "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
          "mm_tokens_per_image": 256, "initializer_range": 0.02, "text_config": text,
          "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                            "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 32, "patch_size": 16}}
    add("4x_text_config_linear/gemma3", mm)
    mm_same = copy.deepcopy(mm)
    del mm_same["text_config"]["rope_scaling"]
    add("4x_text_config/gemma3", mm_same, "gemma3")
    mm5 = copy.deepcopy(mm)
    t5 = strip(g, "architectures", "dtype")
    t5["rope_parameters"]["full_attention"] = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    mm5.update(text_config=t5, dtype="bfloat16")
    del mm5["torch_dtype"]
    add("5x_text_config_linear/gemma3", mm5)
    # Omitted fields: only what the 4B text_config gives; the rest are Gemma 3's defaults.
    sparse = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 2560,
              "intermediate_size": 10240, "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
              "sliding_window": 1024}
    add("omitted_fields_4b_style/gemma3", sparse)

    # Gemma 4 nested in text_config.
    for name in ["gemma4", "gemma4_kvshare"]:
        t = strip(fixture(name), "architectures", "dtype")
        add("5x_text_config/" + name, {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                                       "dtype": "bfloat16", "text_config": t}, name)

    # Mistral: Llama's computation; the llama fixture's weights under MistralForCausalLM
    # (no window) give the llama goldens.
    m = strip(fixture("llama"), "mlp_bias", "pretraining_tp")
    m.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)
    add("5x_keys/mistral_from_llama", m, "llama")
    m4 = strip(m, "rope_parameters", "dtype")
    m4.update(rope_theta=10000.0, torch_dtype="bfloat16")
    add("4x_keys/mistral_from_llama", m4, "llama")
    add("transformers_to_dict/mistral_from_llama", json.loads(load(m).to_json_string()))
    add("sliding_window/mistral", dict(m, sliding_window=8))
    add("sliding_window_omitted/mistral", strip(m, "sliding_window"))
    add("Mistral-7B-Instruct-v0.3", MISTRAL_7B_INSTRUCT_V03)
    add("Mistral-7B-v0.1", MISTRAL_7B_V01)
    add("explicit_head_dim/Mistral-Nemo", MISTRAL_NEMO)

    # RoPE variants with an attention factor or a length-dependent table (single dict).
    qwen3 = fixture("qwen3")
    d = strip(qwen3, "rope_parameters")
    d.update(rope_theta=1000000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    add("yarn_qwen_model_card_4x/qwen3", d)
    d = copy.deepcopy(qwen3)
    d["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                            "rope_theta": 1000000.0}
    add("yarn_qwen_model_card_5x/qwen3", d)
    add("yarn_qwen_model_card/Qwen3-8B", dict(QWEN3_8B, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                       "original_max_position_embeddings": 32768}))
    llama = fixture("llama")
    ds = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
          "mscale": 0.707, "mscale_all_dim": 1.0, "rope_theta": 10000.0}
    add("yarn_deepseek_mscale/llama", dict(llama, rope_parameters=ds))
    add("yarn_mscale_equal/llama", dict(llama, rope_parameters=dict(ds, mscale=0.707, mscale_all_dim=0.707)))
    add("yarn_mscale_all_dim_zero/llama", dict(llama, rope_parameters=dict(ds, mscale=1.0, mscale_all_dim=0)))
    add("yarn_no_truncate/mistral", dict(m, rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                            "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                            "original_max_position_embeddings": 128}))
    add("yarn_attention_factor/llama", dict(llama, rope_parameters={"rope_type": "yarn", "factor": 8.0,
                                                                   "attention_factor": 0.75, "beta_fast": 16.0,
                                                                   "original_max_position_embeddings": 256,
                                                                   "rope_theta": 10000.0}))
    add("yarn_original_from_max_pos/llama", dict(llama, rope_parameters={"rope_type": "yarn", "factor": 2.0,
                                                                        "rope_theta": 10000.0}))
    short = [1.0, 1.05, 1.1, 1.3, 1.8, 2.5, 3.9, 6.0]
    long_ = [1.1, 1.4, 2.0, 3.5, 7.0, 12.0, 20.0, 31.5]
    phi3 = strip(llama, "rope_parameters")
    phi3.update(max_position_embeddings=131072, rope_theta=10000.0,
                rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long_,
                              "original_max_position_embeddings": 4096})
    add("longrope_phi3_style/llama", phi3)
    add("longrope_factor_attention_factor/mistral", dict(m, rope_parameters={
        "rope_type": "longrope", "short_factor": short, "long_factor": long_, "factor": 16.0, "attention_factor": 1.25,
        "original_max_position_embeddings": 256, "rope_theta": 10000.0}))
    add("longrope_original_from_max_pos/qwen3", dict(qwen3, rope_parameters={
        "rope_type": "longrope", "short_factor": short, "long_factor": long_, "rope_theta": 10000.0}))
    d = strip(llama, "rope_parameters")
    d.update(rope_theta=10000.0, rope_scaling={"type": "dynamic", "factor": 2.0})
    add("dynamic_4x/llama", d)
    add("dynamic_5x_odd_factor/qwen3", dict(qwen3, rope_parameters={"rope_type": "dynamic", "factor": 3.3,
                                                                     "rope_theta": 1000000.0}))

    # Every field omitted: transformers' defaults for the architecture.
    for arch, model_type in [("LlamaForCausalLM", "llama"), ("MistralForCausalLM", "mistral"), ("Qwen2ForCausalLM", "qwen2"),
                             ("Qwen3ForCausalLM", "qwen3"), ("Qwen3MoeForCausalLM", "qwen3_moe"),
                             ("Gemma3ForCausalLM", "gemma3_text"), ("Gemma4ForCausalLM", "gemma4_text")]:
        add("omitted_fields/" + model_type, {"architectures": [arch], "model_type": model_type})
    return out


def main():
    result = []
    for case in cases():
        case["expected"] = resolve(case["config"])
        result.append(case)
    path = os.path.join(DATA, "config_layouts.json")
    with open(path, "w") as f:
        json.dump({"generator": "tests/data/generators/config_layouts.py",
                   "transformers_version": transformers.__version__, "cases": result}, f, indent=1)
        f.write("\n")
    print("wrote %d cases to %s" % (len(result), path))


if __name__ == "__main__":
    main()
