"""Hugging Face transformers `generate` on the decode workload of `hsx bench --decode`, in
the same device run: a Qwen3-8B-shaped model with random bf16 weights, random prompts of
PROMPT_LEN tokens, NEW_TOKENS generated past end-of-sequence, per batch size. Decode
throughput is the difference of a NEW_TOKENS run and an 8-token run, so prefill cancels.
Usage: hf_decode.py PROMPT_LEN NEW_TOKENS BATCH[,BATCH...]. Prints JSON lines."""
import json
import sys
import time

import torch

from hf_qwen3_8b import CONFIG, random_model

prompt_len, new_tokens = int(sys.argv[1]), int(sys.argv[2])
batches = [int(b) for b in sys.argv[3].split(",")]

model = random_model()


def timed(ids, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                   pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


with torch.inference_mode():
    for batch in batches:
        ids = torch.randint(0, CONFIG.vocab_size, (batch, prompt_len), device="cuda")
        timed(ids, 4)  # warm-up
        short, full = timed(ids, 8), timed(ids, new_tokens)
        tok_s = batch * (new_tokens - 8) / (full - short)
        print(json.dumps({"metric": "hf_decode_tokens_per_s", "value": tok_s, "batch": batch, "prompt_len": prompt_len,
                          "new_tokens": new_tokens, "step_ms": 1e3 * (full - short) / (new_tokens - 8)}), flush=True)
