"""Golden fixtures from HF transformers (the reference implementation).

For each tiny random model: config.json + model.safetensors (bf16 weights, as real
checkpoints ship) and golden.safetensors computed in fp32 on CPU from exactly those
bf16 weights:
  prompt_<k>            int64 [T]            input token ids
  hidden_<k>            f32 [T, N+1, H]      index i<N: input of decoder layer i
                                              (index 0 = embedding output, after any
                                              embedding scale); index N: output of the
                                              last decoder layer, BEFORE the final norm
  final_norm_<k>        f32 [T, H]           after the final norm
  logits_<k>            f32 [T, V]           (after final softcapping, if the model has it)
  greedy_<k>            int64 [G]            greedy continuation (G new tokens) from HF generate
  hidden_bf16gpu_<k>    f32 [T, N+1, H]      same hidden states from HF in bf16 on GPU (tolerance scale)
Usage: python3 make_fixtures.py OUTDIR [--only NAME,...]

This copy extends ../shared/fixtures/generators/make_fixtures.py (whose configs it keeps
unchanged) with gpt_oss, gpt_oss_mxfp4, mistral_sw and the llama_yarn / llama_dynamic /
llama_longrope RoPE variants (issue 33). gpt_oss_mxfp4 is gpt_oss with its experts
quantized to MXFP4 blocks + scales by this script; its golden is what HF computes from
that checkpoint, dequantized at load (transformers' own MXFP4 path).
"""
import json, os, sys, traceback

import torch
from safetensors.torch import save_file

GEN = 8

def perturb(model, seed, zero_centered_norm=False):
    """Replace HF's tiny default init with larger random weights so that every part
    of the network (norm weights, biases, attention pattern) visibly matters."""
    g = torch.Generator().manual_seed(seed + 1)
    H = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 1.0 / H ** 0.5 if "embed" in name else 1.0 / p.shape[-1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:  # norm weights (ones or zeros at init), biases, scalars: jitter around init
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        # make fp32 compute use exactly the bf16-stored values
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))

def capture(model, ids):
    """Run fp32 forward; return [T, N+1, H] hidden states (pre-final-norm last), final normed, logits."""
    inner = model.model if hasattr(model, "model") else model
    layers = inner.layers
    N = len(layers)
    ins = [None] * N
    out_last = {}
    hooks = []
    for i, layer in enumerate(layers):
        def pre_hook(mod, args, kwargs, i=i):
            hs = args[0] if args else kwargs["hidden_states"]
            ins[i] = hs.detach().clone()
        hooks.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))
    def norm_pre(mod, args):
        out_last["x"] = args[0].detach().clone()
    def norm_post(mod, args, out):
        out_last["y"] = out.detach().clone()
    hooks.append(inner.norm.register_forward_pre_hook(norm_pre))
    hooks.append(inner.norm.register_forward_hook(norm_post))
    with torch.no_grad():
        out = model(input_ids=ids[None], use_cache=False)
    for h in hooks:
        h.remove()
    hidden = torch.stack([x[0] for x in ins] + [out_last["x"][0]], dim=1)
    return hidden.float(), out_last["y"][0].float(), out.logits[0].float()

def configs(variant):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    cfgs = {}
    V, H, I, L, NH, KV, HD = 512, 64, 160, 4, 4, 2, 16
    lens = [5, 37, 130]
    sw = 16
    common = dict(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                  num_attention_heads=NH, num_key_value_heads=KV, head_dim=HD,
                  max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    cfgs["llama"] = (lambda: __import__("transformers").LlamaForCausalLM,
                     lambda: LlamaConfig(rms_norm_eps=1e-5, rope_theta=10000.0, **common), False)
    def llama31():
        c = LlamaConfig(rms_norm_eps=1e-5, **common)
        c.rope_parameters = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64, "rope_theta": 500000.0}
        return c
    cfgs["llama31"] = (lambda: __import__("transformers").LlamaForCausalLM, llama31, False)
    cfgs["qwen2"] = (lambda: __import__("transformers").Qwen2ForCausalLM,
                     lambda: Qwen2Config(rms_norm_eps=1e-6, rope_theta=1000000.0,
                                         **{k: v for k, v in common.items() if k != "head_dim"}), False)
    cfgs["qwen3"] = (lambda: __import__("transformers").Qwen3ForCausalLM,
                     lambda: Qwen3Config(rms_norm_eps=1e-6, rope_theta=1000000.0, **common), False)
    def qwen3_tied():
        c = Qwen3Config(rms_norm_eps=1e-6, rope_theta=1000000.0, **{**common, "tie_word_embeddings": True})
        return c
    cfgs["qwen3_tied"] = (lambda: __import__("transformers").Qwen3ForCausalLM, qwen3_tied, False)
    def qwen3_moe():
        from transformers import Qwen3MoeConfig
        c = Qwen3MoeConfig(rms_norm_eps=1e-6, rope_theta=1000000.0, num_experts=8, num_experts_per_tok=2,
                           moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                           mlp_only_layers=[], **common)
        return c
    cfgs["qwen3_moe"] = (lambda: __import__("transformers").Qwen3MoeForCausalLM, qwen3_moe, False)
    def gemma3():
        from transformers import Gemma3TextConfig
        return Gemma3TextConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=6,
                                num_attention_heads=NH, num_key_value_heads=KV, head_dim=HD,
                                sliding_window=sw, query_pre_attn_scalar=HD, rms_norm_eps=1e-6,
                                max_position_embeddings=4096, bos_token_id=2, eos_token_id=1, pad_token_id=0,
                                final_logit_softcapping=30.0, attn_logit_softcapping=None)
    cfgs["gemma3"] = (lambda: __import__("transformers").Gemma3ForCausalLM, gemma3, True)
    def gemma4():
        from transformers import Gemma4TextConfig
        return Gemma4TextConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=6,
                                num_attention_heads=NH, num_key_value_heads=KV, head_dim=HD,
                                global_head_dim=2 * HD, sliding_window=sw, rms_norm_eps=1e-6,
                                max_position_embeddings=4096, vocab_size_per_layer_input=V,
                                hidden_size_per_layer_input=8, final_logit_softcapping=30.0,
                                bos_token_id=2, eos_token_id=1, pad_token_id=0)
    def gemma4_cls():
        import transformers
        for n in ("Gemma4ForCausalLM", "Gemma4TextForCausalLM"):
            if hasattr(transformers, n):
                return getattr(transformers, n)
        raise RuntimeError("no Gemma4 causal LM class")
    cfgs["gemma4"] = (gemma4_cls, gemma4, True)
    def gemma4_kvshare():
        from transformers import Gemma4TextConfig
        return Gemma4TextConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=8,
                                num_attention_heads=NH, num_key_value_heads=KV, head_dim=HD,
                                global_head_dim=2 * HD, num_global_key_value_heads=1, attention_k_eq_v=True,
                                num_kv_shared_layers=2, sliding_window=sw, rms_norm_eps=1e-6,
                                max_position_embeddings=4096, vocab_size_per_layer_input=V,
                                hidden_size_per_layer_input=0, final_logit_softcapping=30.0,
                                bos_token_id=2, eos_token_id=1, pad_token_id=0)
    cfgs["gemma4_kvshare"] = (gemma4_cls, gemma4_kvshare, True)
    # ---- issue 33 ----
    def mistral_sw():
        from transformers import MistralConfig
        return MistralConfig(rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=sw, **common)
    cfgs["mistral_sw"] = (lambda: __import__("transformers").MistralForCausalLM, mistral_sw, False)
    def llama_rope(params):
        def make():
            c = LlamaConfig(rms_norm_eps=1e-5, **common)
            c.rope_parameters = dict(params)
            return c
        return make
    cfgs["llama_yarn"] = (lambda: __import__("transformers").LlamaForCausalLM,
                          llama_rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 10000.0}), False)
    cfgs["llama_dynamic"] = (lambda: __import__("transformers").LlamaForCausalLM,
                             llama_rope({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), False)
    cfgs["llama_longrope"] = (lambda: __import__("transformers").LlamaForCausalLM,
                              llama_rope({"rope_type": "longrope", "original_max_position_embeddings": 256,
                                          "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                                          "long_factor": [1.0, 1.5, 2.2, 3.0, 4.0, 5.2, 6.6, 8.0],
                                          "rope_theta": 10000.0}), False)
    def gpt_oss():
        from transformers import GptOssConfig
        return GptOssConfig(vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=L,
                            num_attention_heads=NH, num_key_value_heads=KV, head_dim=HD, num_local_experts=8,
                            num_experts_per_tok=4, sliding_window=sw, max_position_embeddings=4096,
                            rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                            layer_types=["sliding_attention", "full_attention"] * (L // 2),
                            rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                             "truncate": False, "original_max_position_embeddings": 64,
                                             "rope_theta": 150000.0})
    cfgs["gpt_oss"] = (lambda: __import__("transformers").GptOssForCausalLM, gpt_oss, False)
    return cfgs, lens

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

def gpt_oss_extra_perturb(model, seed):
    """Sinks large enough to matter (HF inits them near 0), and gate/up projections large
    enough that the clamp at swiglu_limit (7) cuts some values."""
    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for layer in model.model.layers:
            s = layer.self_attn.sinks
            s.copy_((torch.randn(s.shape, generator=g) * 1.5).to(torch.bfloat16).float())
            w = layer.mlp.experts.gate_up_proj
            w.mul_(3.0)
            w.copy_(w.to(torch.bfloat16).float())

def mxfp4_quantize(w):
    """w [..., rows, k] (k % 32 == 0) -> blocks uint8 [..., rows, k/32, 16] (two e2m1 codes a
    byte, low nibble first), scales uint8 [..., rows, k/32] (E8M0, bias 127); round to nearest."""
    *pre, rows, k = w.shape
    g = w.float().reshape(*pre, rows, k // 32, 32)
    amax = g.abs().amax(-1).clamp_min(2.0 ** -100)
    exp = torch.floor(torch.log2(amax)) - 2  # amax / 2^exp in [4, 8): at most 6 after saturation
    x = g / torch.pow(2.0, exp)[..., None]
    mags = torch.tensor(FP4_VALUES[:8])
    idx = (x.abs()[..., None] - mags).abs().argmin(-1)  # nearest magnitude
    code = idx | ((x < 0).to(torch.long) << 3)
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    scales = (exp + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()

def mxfp4_dequantize(blocks, scales):
    """The inverse, in the blocks' [..., rows, k] layout."""
    lut = torch.tensor(FP4_VALUES)
    lo, hi = (blocks & 0x0F).long(), (blocks >> 4).long()
    vals = torch.stack([lut[lo], lut[hi]], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.pow(2.0, scales.float() - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)

def write_mxfp4_variant(src_dir, dst_dir):
    """gpt_oss's checkpoint with every expert projection as MXFP4 blocks + scales (the
    on-disk form of openai/gpt-oss-*): gate_up_proj [E, H, 2I] is stored transposed as
    [E, 2I, H/32, 16] blocks, down_proj [E, I, H] as [E, H, I/32, 16]."""
    import shutil
    from safetensors.torch import load_file
    os.makedirs(dst_dir, exist_ok=True)
    sd = load_file(os.path.join(src_dir, "model.safetensors"))
    out = {}
    for name, t in sd.items():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            b, sc = mxfp4_quantize(t.float().transpose(1, 2))
            out[name + "_blocks"], out[name + "_scales"] = b, sc
        else:
            out[name] = t
    save_file(out, os.path.join(dst_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    json.dump(cfg, open(os.path.join(dst_dir, "config.json"), "w"), indent=2, sort_keys=True)
    shutil.copy(os.path.join(src_dir, "generation_config.json"), dst_dir)
    return out

def main():
    outdir = sys.argv[1]
    only = None
    variant = "public"
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1].split(",")
    seed = 1234
    cfgs, lens = configs(variant)
    summary = {}
    for name, (cls_fn, cfg_fn, zc) in cfgs.items():
        if only and name not in only:
            continue
        try:
            torch.manual_seed(seed)
            cls = cls_fn()
            cfg = cfg_fn()
            cfg._attn_implementation = "eager"
            model = cls(cfg).float().eval()
            perturb(model, seed, zero_centered_norm=zc)
            if name == "gpt_oss":
                gpt_oss_extra_perturb(model, seed)
            d = os.path.join(outdir, name)
            os.makedirs(d, exist_ok=True)
            model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
            model.float()
            # reload from disk to be sure the golden matches what is stored
            model = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
            from safetensors import safe_open
            with safe_open(os.path.join(d, "model.safetensors"), "pt") as sf:
                print(json.dumps({"fixture": name, "tensors": {k: list(sf.get_slice(k).get_shape()) for k in sf.keys()
                                                               if ".layers.0." in k or "layers" not in k}}), flush=True)
            variants = [(name, d, model, {})]
            if name == "gpt_oss":
              try:
                from transformers import Mxfp4Config
                dm = os.path.join(outdir, "gpt_oss_mxfp4")
                qsd = write_mxfp4_variant(d, dm)
                qkw = dict(quantization_config=Mxfp4Config(dequantize=True))
                mq = cls.from_pretrained(dm, torch_dtype=torch.float32, attn_implementation="eager", **qkw).eval()
                # transformers dequantizes MXFP4 experts to bf16 whatever torch_dtype says, and
                # runs them in bf16; the golden is f32 like every other (the values are exact
                # in both: an FP4 code times a power of two)
                # (parameter by parameter: transformers may refuse .float() on a quantized model)
                with torch.no_grad():
                    for prm in mq.parameters():
                        prm.data = prm.data.float()
                # HF's dequantized weights against this script's own dequantization.
                try:
                  ex = mq.model.layers[0].mlp.experts
                  mine = mxfp4_dequantize(qsd["model.layers.0.mlp.experts.gate_up_proj_blocks"],
                                        qsd["model.layers.0.mlp.experts.gate_up_proj_scales"]).transpose(1, 2)
                  print(json.dumps({"fixture": "gpt_oss_mxfp4", "hf_gate_up_shape": list(ex.gate_up_proj.shape),
                                  "hf_vs_own_dequant_maxabs": float((ex.gate_up_proj.float() - mine).abs().max())
                                  if ex.gate_up_proj.shape == mine.shape else "shape differs",
                                  "limit": getattr(ex, "limit", None), "alpha": getattr(ex, "alpha", None),
                                  "q_vs_bf16_maxabs": float((ex.gate_up_proj.float() - model.model.layers[0].mlp.experts.gate_up_proj.float()).abs().max())}), flush=True)
                except Exception:
                  traceback.print_exc()
                variants.append(("gpt_oss_mxfp4", dm, mq, qkw))
              except Exception as e:  # keep the bf16 fixture; report why the variant failed
                traceback.print_exc()
                summary["gpt_oss_mxfp4"] = dict(ok=False, error=repr(e)[:500])
            for vname, d, model, qkw in variants:
              name = vname
              gpu_attn = "eager" if name.startswith("gpt_oss") else "sdpa"
              g = torch.Generator().manual_seed(seed + 7)
              tensors = {}
              V = cfg.vocab_size
              for k, T in enumerate(lens):
                  ids = torch.randint(3, V, (T,), generator=g)
                  hidden, fnorm, logits = capture(model, ids)
                  with torch.no_grad():
                      gen = model.generate(ids[None], attention_mask=torch.ones(1, T, dtype=torch.long),
                                           max_new_tokens=GEN, do_sample=False, min_new_tokens=GEN,
                                           eos_token_id=None, pad_token_id=0)[0, T:]
                  tensors[f"prompt_{k}"] = ids.long()
                  tensors[f"hidden_{k}"] = hidden.contiguous()
                  tensors[f"final_norm_{k}"] = fnorm.contiguous()
                  tensors[f"logits_{k}"] = logits.contiguous()
                  tensors[f"greedy_{k}"] = gen.long().contiguous()
              if torch.cuda.is_available():
                  mg = cls.from_pretrained(d, torch_dtype=torch.bfloat16, attn_implementation=gpu_attn, **qkw).cuda().eval()
                  for k, T in enumerate(lens):
                      ids = tensors[f"prompt_{k}"].cuda()
                      h, _, _ = capture(mg, ids)
                      tensors[f"hidden_bf16gpu_{k}"] = h.float().cpu().contiguous()
                  del mg
              save_file(tensors, os.path.join(d, "golden.safetensors"),
                        metadata={"source": f"transformers {__import__('transformers').__version__}",
                                  "layout": "hidden[i<N]=input of layer i; hidden[N]=last layer output before final norm",
                                  "greedy_new_tokens": str(GEN)})
              err = float((tensors["hidden_bf16gpu_2"] - tensors["hidden_2"]).abs().max()) if "hidden_bf16gpu_2" in tensors else None
              scale = float(tensors["hidden_2"].abs().max())
              summary[name] = dict(ok=True, arch=cfg.architectures if hasattr(cfg, "architectures") else None,
                                   bf16_vs_fp32_maxabs=err, hidden_maxabs=scale,
                                   greedy=[tensors[f"greedy_{k}"].tolist() for k in range(len(lens))])
              print(json.dumps({"fixture": name, **summary[name]}), flush=True)
        except Exception as e:
            traceback.print_exc()
            summary[name] = dict(ok=False, error=repr(e)[:500])
            print(json.dumps({"fixture": name, **summary[name]}), flush=True)
    with open(os.path.join(outdir, f"summary_{variant}.json"), "w") as f:
        json.dump(summary, f, indent=1)

if __name__ == "__main__":
    main()
