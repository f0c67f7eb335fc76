"""Hugging Face transformers on the same extraction workload as `hsx bench`, in the same
device run: a Qwen3-8B-shaped model with random bf16 weights, the prompts hsx bench wrote
(prompts.jsonl), hidden states of the same layers saved one safetensors file per prompt.
Two ways of driving it: one prompt at a time, and length-sorted padded batches of about
32k tokens. Also the bf16 matmul peak (matmul_peak.py). Prints JSON lines."""
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file

from hf_qwen3_8b import random_model
from matmul_peak import peak_line

prompts_path, out_dir = sys.argv[1], sys.argv[2]
layers = [int(x) for x in sys.argv[3].split(",")]
prompts = [json.loads(line) for line in open(prompts_path)]
total_tokens = sum(len(p["token_ids"]) for p in prompts)


def emit(**kw):
    print(json.dumps(kw), flush=True)


print(peak_line(), flush=True)

model = random_model()
body = model.model  # no LM head: extraction needs none


def save(pid, hidden, ids):
    # hidden: tuple of N+1 [T, H]; files hold [T, L, H] like hsx and vLLM.
    states = torch.stack([hidden[l] for l in layers], dim=1).to("cpu")
    save_file({"hidden_states": states.contiguous(), "token_ids": torch.tensor(ids, dtype=torch.int64)},
              os.path.join(out_dir, f"{pid}.safetensors"))


def one_at_a_time():
    for p in prompts:
        ids = torch.tensor([p["token_ids"]], device="cuda")
        out = body(input_ids=ids, output_hidden_states=True)
        save(p["id"], [h[0] for h in out.hidden_states], p["token_ids"])


def sorted_batches(budget=32768):
    order = sorted(prompts, key=lambda p: len(p["token_ids"]))
    batch = []
    def run(batch):
        width = max(len(p["token_ids"]) for p in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long, device="cuda")
        mask = torch.zeros(len(batch), width, dtype=torch.long, device="cuda")
        for i, p in enumerate(batch):
            ids[i, : len(p["token_ids"])] = torch.tensor(p["token_ids"])
            mask[i, : len(p["token_ids"])] = 1
        out = body(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        for i, p in enumerate(batch):
            n = len(p["token_ids"])
            save(p["id"], [h[i, :n] for h in out.hidden_states], p["token_ids"])
    for p in order:
        if batch and len(p["token_ids"]) * (len(batch) + 1) > budget:
            run(batch)
            batch = []
        batch.append(p)
    if batch:
        run(batch)


os.makedirs(out_dir, exist_ok=True)
with torch.inference_mode():
    body(input_ids=torch.tensor([prompts[0]["token_ids"]], device="cuda"))  # warm-up
    for name, fn in [("hf_one_at_a_time", one_at_a_time), ("hf_sorted_batches_32k", sorted_batches)]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        emit(metric=name + "_tokens_per_s", value=total_tokens / seconds, seconds=seconds, tokens=total_tokens,
             peak_device_gib=torch.cuda.max_memory_allocated() / 2**30)
