"""hsx's CPU backend against PyTorch's CPU path on one workload, in one run: SmolLM2-135M
(the demo's Q4_1 GGUF, dequantized to f32 by both), the prompts `hsx bench` wrote, hidden
states of the same layers, one thread per core on both sides (hsx's pool has one). Prints JSON lines: torch's f32 GEMM
GFLOP/s at the model's shapes, HF forward tokens/s one prompt at a time (what batching
with padding would waste on a CPU), then hsx bench's own lines. Skips without torch.

usage: python3 bench/cpu_vs_torch.py MODEL.gguf [--hsx BINARY]... [--num-prompts 32] [--rounds 2]
(several --hsx binaries, e.g. builds with different HSX_CPU_GEMM, run in turn on the same prompts)
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

p = argparse.ArgumentParser()
p.add_argument("gguf")
p.add_argument("--hsx", action="append", help="hsx binaries (default: build/src/hsx)")
p.add_argument("--num-prompts", type=int, default=32)
p.add_argument("--median-len", type=int, default=400)
p.add_argument("--min-len", type=int, default=256)
p.add_argument("--max-len", type=int, default=700)
p.add_argument("--rounds", type=int, default=2, help="alternating hsx/torch rounds; the best of each is kept")
args = p.parse_args()
args.hsx = args.hsx or [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "src", "hsx")]

try:
    import accelerate  # noqa: F401  (transformers' GGUF loading asks for it)
    import gguf  # noqa: F401
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(json.dumps({"skipped": f"needs torch, transformers, gguf and accelerate: {e}"}))
    sys.exit(0)

torch.set_num_threads(os.cpu_count())


def emit(**kw):
    print(json.dumps(kw), flush=True)


def hsx_bench(binary, scratch):
    out = subprocess.run([binary, "bench", "--model", args.gguf, "--dir", scratch, "--num-prompts",
                          str(args.num_prompts), "--median-len", str(args.median_len), "--min-len",
                          str(args.min_len), "--max-len", str(args.max_len)],
                         check=True, capture_output=True, text=True).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print(f"{binary}: {lines[0]['value']:.1f} tok/s", file=sys.stderr, flush=True)
    return lines


def torch_gemm_gflops(m, n, k):
    a, w = torch.rand(m, k), torch.rand(n, k)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        a @ w.T
        best = min(best, time.perf_counter() - t0)
    return 2 * m * n * k / best / 1e9


model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                             gguf_file=os.path.basename(args.gguf), dtype=torch.float32)
body = model.model.eval()  # no LM head: extraction needs none
scratch = tempfile.mkdtemp(prefix="hsx-vs-torch-")
hsx_runs = {binary: [] for binary in args.hsx}  # each run: its JSON lines
hsx_runs[args.hsx[0]].append(hsx_bench(args.hsx[0], scratch))  # writes the prompts
prompts = [json.loads(line) for line in open(os.path.join(scratch, "prompts.jsonl"))]
tokens = sum(len(q["token_ids"]) for q in prompts)
layers = [int(x) for x in next(l for l in hsx_runs[args.hsx[0]][0] if l["metric"] == "extract_tokens_per_s")["layers"].split(",")]

c = model.config
for name, (n, k) in {"qkv": (c.hidden_size + 2 * c.num_key_value_heads * c.hidden_size // c.num_attention_heads,
                             c.hidden_size),
                     "gate_up": (2 * c.intermediate_size, c.hidden_size),
                     "down": (c.hidden_size, c.intermediate_size)}.items():
    emit(metric="torch_sgemm_gflops", shape=name, m=2048, n=n, k=k, value=torch_gemm_gflops(2048, n, k))


def torch_extract():
    t0 = time.perf_counter()
    for q in prompts:
        out = body(input_ids=torch.tensor([q["token_ids"]]), output_hidden_states=True)
        torch.stack([out.hidden_states[l][0] for l in layers], dim=1).contiguous()
    return tokens / (time.perf_counter() - t0)


def tok_s(run):
    return next(l["value"] for l in run if l["metric"] == "extract_tokens_per_s")


torch_tok_s = []
with torch.inference_mode():
    body(input_ids=torch.tensor([prompts[0]["token_ids"]]))  # warm-up
    for r in range(args.rounds):  # alternating, so load from elsewhere hits both sides alike
        torch_tok_s.append(torch_extract())
        for binary in args.hsx:
            if len(hsx_runs[binary]) <= r:
                hsx_runs[binary].append(hsx_bench(binary, scratch))
emit(metric="torch_extract_tokens_per_s", value=max(torch_tok_s), runs=torch_tok_s, prompts=len(prompts),
     tokens=tokens, layers=layers, threads=os.cpu_count(), torch=torch.__version__)
for binary, runs in hsx_runs.items():
    best = max(runs, key=tok_s)
    for line in best:
        emit(hsx=binary, **line)
    emit(metric="hsx_over_torch", hsx=binary, value=tok_s(best) / max(torch_tok_s), runs=[tok_s(r) for r in runs])
shutil.rmtree(scratch)
