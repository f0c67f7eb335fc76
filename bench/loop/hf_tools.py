"""The loop's Hugging Face side (device, torch + transformers + gguf):

  convert GGUF OUTDIR       the GGUF through transformers' own GGUF loader (dequantized),
                            saved as a Hugging Face directory: speculators' verifier
  states HF_DIR DATASET OUT the control: transformers' hidden states of the prepared
                            dataset's tokens, written as hsx extract / vLLM write them
                            (OUT/hs_<row>.safetensors: hidden_states [T, L, H] bf16,
                            token_ids [T] int64), layer ids in vLLM's convention
  compare A B N             relative error between two state folders on N files
"""
import json
import pathlib
import sys
import time

import torch


def convert(gguf, out):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = pathlib.Path(gguf)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.bfloat16)
    # Dequantized at load: save plain bf16 weights, without the GGUF "quantization" marker
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(json.dumps({"converted": out, "params": sum(p.numel() for p in model.parameters()),
                      "layers": model.config.num_hidden_layers}))


def states(hf_dir, dataset_dir, out, layers="2,15,27,30", batch_tokens=65536):
    """Rows sorted by length, packed into padded batches (right padding: causal attention
    keeps every real token's states independent of the pad). Layer id i < N is the input of
    decoder layer i (HF's hidden_states[i]); id N is the last layer's output before the final
    norm (hooks on the decoder layers: HF's hidden_states[N] is after the norm)."""
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    ids = [int(x) for x in layers.split(",")]
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    n_layers = model.config.num_hidden_layers
    captured = {}
    for i in ids:  # id i < N: the input of decoder layer i; id N: the last layer's output
        if i < n_layers:
            def pre_hook(_module, args, kwargs, i=i):
                captured[i] = args[0] if args else kwargs["hidden_states"]
            model.model.layers[i].register_forward_pre_hook(pre_hook, with_kwargs=True)
        else:
            def hook(_module, _args, output, i=i):
                captured[i] = output[0] if isinstance(output, tuple) else output
            model.model.layers[n_layers - 1].register_forward_hook(hook)
    data = load_from_disk(dataset_dir).with_format(None)
    rows = [(i, r) for i, r in enumerate(data["input_ids"])]
    rows.sort(key=lambda x: len(x[1]))
    outdir = pathlib.Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tokens = 0
    k = 0
    with torch.inference_mode():
        while k < len(rows):
            longest = len(rows[k][1])
            j = k
            while j < len(rows) and (j - k + 1) * len(rows[j][1]) <= batch_tokens:
                j += 1
            j = max(j, k + 1)
            batch = rows[k:j]
            longest = max(len(r) for _, r in batch)
            input_ids = torch.zeros(len(batch), longest, dtype=torch.long)
            mask = torch.zeros(len(batch), longest, dtype=torch.long)
            for b, (_, r) in enumerate(batch):
                input_ids[b, :len(r)] = torch.tensor(r)
                mask[b, :len(r)] = 1
            model.model(input_ids=input_ids.cuda(), attention_mask=mask.cuda())
            stacked = torch.stack([captured[i] for i in ids], dim=2).to(torch.bfloat16).cpu()
            for b, (row, r) in enumerate(batch):
                save_file({"hidden_states": stacked[b, :len(r)].contiguous(),
                           "token_ids": torch.tensor(r, dtype=torch.int64)}, str(outdir / f"hs_{row}.safetensors"))
                tokens += len(r)
            k = j
    print(json.dumps({"hf_states": out, "files": len(rows), "tokens": tokens, "seconds": round(time.time() - t0, 1)}))


def compare(a, b, n):
    from safetensors.torch import load_file
    files = sorted(pathlib.Path(a).glob("hs_*.safetensors"))[: int(n)]
    per_layer = None
    for f in files:
        x = load_file(str(f))
        y = load_file(str(pathlib.Path(b) / f.name))
        assert torch.equal(x["token_ids"], y["token_ids"]), f
        hx, hy = x["hidden_states"].float(), y["hidden_states"].float()
        err = ((hx - hy).norm(dim=(0, 2)) / hy.norm(dim=(0, 2))).tolist()
        per_layer = err if per_layer is None else [p + e for p, e in zip(per_layer, err)]
    print(json.dumps({"metric": "hsx_vs_hf_states_rel_error_per_layer", "files": len(files),
                      "value": [round(p / len(files), 5) for p in per_layer]}))


if __name__ == "__main__":
    {"convert": convert, "states": states, "compare": compare}[sys.argv[1]](*sys.argv[2:])
