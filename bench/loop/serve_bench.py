"""hsx serve on the held-out conversations: output tokens per second at a fixed number of
clients (batch 1: one client; batch 32: 32), greedy, and vLLM's speculative-decoding
counters from /metrics (mean acceptance length = 1 + accepted / verifications, and the
acceptance rate of each draft position). Stdlib only.

Usage: python3 serve_bench.py --hsx BIN --model GGUF --prompts heldout.prompts.jsonl --label NAME
         [--spec JSON] [--runs 32:500,1:64] [--max-tokens 256] [--outputs DIR] [-- extra serve args]
Prints one JSON line per run; with --outputs, writes DIR/<label>_c<clients>.jsonl
({"id", "token_ids"}) to compare against plain decode."""
import argparse
import json
import os
import queue
import re
import socket
import subprocess
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {"per_pos": {}}
    for line in text.splitlines():
        m = re.match(r'vllm:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\} ([0-9.e+]+)', line)
        if m:
            out["per_pos"][int(m.group(1))] = float(m.group(2))
            continue
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            m = re.match(rf"vllm:spec_decode_{key}_total ([0-9.e+]+)", line)
            if m:
                out[key] = float(m.group(1))
    return out


def run(url, prompts, clients, max_tokens):
    work = queue.Queue()
    for p in prompts:
        work.put(p)
    results, errors = {}, []

    def client():
        while True:
            try:
                p = work.get_nowait()
            except queue.Empty:
                return
            try:
                r = post(url + "/v1/completions", {"model": "target", "prompt": p["token_ids"], "max_tokens": max_tokens,
                                                   "temperature": 0, "return_token_ids": True})
                results[p["id"]] = r["choices"][0]["token_ids"]
            except Exception as e:  # noqa: BLE001
                errors.append(f"{p['id']}: {e}")

    before = metrics(url)
    t0 = time.time()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.time() - t0
    after = metrics(url)
    tokens = sum(len(v) for v in results.values())
    line = {"clients": clients, "prompts": len(prompts), "completed": len(results), "errors": errors[:3],
            "output_tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    if drafts > 0:
        accepted = after["num_accepted_tokens"] - before.get("num_accepted_tokens", 0)
        line["mean_acceptance_length"] = round(1 + accepted / drafts, 4)
        line["acceptance_rate_per_position"] = [
            round((after["per_pos"][k] - before["per_pos"].get(k, 0)) / drafts, 4) for k in sorted(after["per_pos"])]
        line["verifications"] = int(drafts)
    return line, results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hsx", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--spec", default="")
    ap.add_argument("--runs", default="32:500,1:64", help="clients:prompts, ...")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--outputs", default="")
    ap.add_argument("--log", default="/tmp/serve_bench.log")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    prompts = [json.loads(line) for line in open(a.prompts)]
    port = free_port()
    cmd = [a.hsx, "serve", a.model, "--device", a.device, "--port", str(port), "--served-model-name", "target",
           "--max-num-seqs", "64", *a.serve_args]
    if a.spec:
        cmd += ["--speculative-config", a.spec]
    log = open(a.log, "a")
    log.write(f"== {a.label}: {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"hsx serve ({a.label}) did not come up; see {a.log}")
                time.sleep(0.2)
        run(url, prompts[:8], 8, 16)  # warm-up: graphs, allocator
        for spec in a.runs.split(","):
            clients, n = (int(x) for x in spec.split(":"))
            line, results = run(url, prompts[:n], clients, a.max_tokens)
            line = {"label": a.label, "spec": a.spec or None, **line}
            print(json.dumps(line), flush=True)
            if a.outputs:
                os.makedirs(a.outputs, exist_ok=True)
                with open(os.path.join(a.outputs, f"{a.label}_c{clients}.jsonl"), "w") as f:
                    for k in sorted(results):
                        f.write(json.dumps({"id": k, "token_ids": results[k]}) + "\n")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
