#!/usr/bin/env python3
"""hsx serve under load against hsx extract offline, on the same synthetic prompts.

Starts `hsx serve` with extraction on, sends every prompt (lognormal lengths, fixed seed,
random token ids, max_tokens=1) from C concurrent clients, each reading its file the way
vLLM does (a shared lock on <file>.lock), verifies every file, then runs `hsx extract`
on the same prompts with the same engine flags. Prints one JSON line per figure:

  server_idle_ttfb_ms       median time to first byte of a short request on an idle server
  server_prompt_tokens_per_s  prompt tokens / (first request sent .. last file complete)
  server_latency_ms         p50 / p99 / max request latency (sent .. response read)
  server_files_verified     files whole and matching their prompt, of all requests
  offline_prompt_tokens_per_s  hsx extract on the same prompts (its own timer: no model load)
  server_vs_offline         the ratio of the two throughputs (issue 4's goal: >= 0.9)

Standard library and numpy only. Examples:
  python3 bench/server_load.py --hsx build/src/hsx --model tests/data/models/qwen3 --layers 0,2,4
  python3 bench/server_load.py --hsx .devbin/hsx --device cuda --load-format dummy --model qwen3-8b \
      --layers 2,18,33,36 --num-prompts 768 --median-len 700 --min-len 32 --max-len 4096 \
      --max-num-batched-tokens 16384 --kv-cache-gib 40 --storage /dev/shm/hsx-serve-bench
"""
import argparse
import fcntl
import http.client
import json
import os
import pathlib
import queue
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np


def line(**fields):
    print(json.dumps(fields), flush=True)


def model_shape(args):
    """(num_layers, vocab_size) from `hsx inspect`, which reads directories and named configs alike."""
    cmd = [args.hsx, "inspect", "--model", args.model, "--load-format", args.load_format]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    layers = int(re.search(r"^layers\s+(\d+)", out, re.M).group(1))
    vocab = int(re.search(r"^vocab_size\s+(\d+)", out, re.M).group(1))
    return layers, vocab


def make_prompts(args, vocab):
    """hsx bench's distribution: lognormal lengths around --median-len (sigma 0.6), clipped to
    [--min-len, --max-len], uniform random token ids; fixed --seed (numpy's generator, so the
    draws are not hsx bench's own)."""
    rng = np.random.default_rng(args.seed)
    lengths = np.clip(rng.lognormal(np.log(args.median_len), 0.6, args.num_prompts).astype(int), args.min_len, args.max_len)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def percentile(values, p):
    return float(np.percentile(np.asarray(values, dtype=float), p)) if values else None


class Serve:
    """`hsx serve` with extraction on, the engine flags passed through."""

    def __init__(self, args, storage, log_path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": args.layer_ids}}}
        kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
              "kv_connector_extra_config": {"shared_storage_path": str(storage),
                                            "num_writer_threads": args.writer_threads,
                                            "use_synchronization_lock": True}}
        cmd = [args.hsx, "serve", args.model, "--port", str(self.port), "--served-model-name", "bench",
               "--load-format", args.load_format, "--device", args.device,
               "--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv),
               *engine_flags(args), "--max-queued-requests", str(args.max_queued_requests), *args.serve_arg]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + args.startup_timeout
        while True:
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                sys.exit("hsx serve did not come up:\n" + pathlib.Path(log_path).read_text()[-4000:])
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
            except OSError:
                time.sleep(0.2)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def engine_flags(args):
    flags = ["--max-num-batched-tokens", str(args.max_num_batched_tokens), "--max-num-seqs", str(args.max_num_seqs),
             "--kv-cache-gib", str(args.kv_cache_gib)]
    return flags + (["--no-enable-prefix-caching"] if args.no_enable_prefix_caching else [])


class Client:
    """One client on one keep-alive connection (reopened when the server closes it), as the
    openai package keeps one per pooled connection."""

    def __init__(self, port, timeout):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def close(self):
        self.conn.close()

    def complete(self, prompt):
        """(status, body, seconds to the status line, seconds to the whole response)."""
        body = json.dumps({"model": "bench", "prompt": prompt, "max_tokens": 1})
        for attempt in range(2):  # a keep-alive connection the server just closed: reopen once
            try:
                t0 = time.perf_counter()
                self.conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                t_first = time.perf_counter()
                raw = resp.read()
                t_done = time.perf_counter()
                return resp.status, json.loads(raw), t_first - t0, t_done - t0
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()
                if attempt == 1:
                    raise


def wait_for_file(path):
    """vLLM's reader: a shared lock on <path>.lock returns once the writer is done."""
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        fcntl.flock(lock, fcntl.LOCK_UN)


def verify(path, prompt, num_layers_captured):
    """The file is whole: a safetensors header whose offsets end exactly at the end of the
    file, token_ids equal to the prompt, hidden_states [T, L, H] (only the header and the
    ids are read)."""
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            end = max(meta["data_offsets"][1] for name, meta in header.items() if name != "__metadata__")
            if 8 + n + end != os.fstat(f.fileno()).st_size:
                return False
            begin, stop = header["token_ids"]["data_offsets"]
            f.seek(8 + n + begin)
            ids = np.frombuffer(f.read(stop - begin), np.int64)
        shape = header["hidden_states"]["shape"]
        return ids.tolist() == prompt and shape[:2] == [len(prompt), num_layers_captured]
    except (OSError, ValueError, KeyError, struct.error):
        return False


def idle_ttfb(args, server, vocab):
    """Median time to the first byte of a short request on the idle server (each prompt
    different, so none hits the prefix cache)."""
    rng = np.random.default_rng(args.seed + 1)
    client = Client(server.port, args.request_timeout)
    times = []
    for i in range(args.ttfb_requests + 1):
        status, body, first, _ = client.complete(rng.integers(0, vocab, args.ttfb_len).tolist())
        if status != 200:
            sys.exit(f"idle request failed: {status} {body}")
        wait_for_file(body["kv_transfer_params"]["hidden_states_path"])
        if i > 0:  # the first one warms up
            times.append(first)
    client.close()
    return statistics.median(times)


def run_load(args, server, prompts, concurrency):
    """Every prompt once, from `concurrency` closed-loop clients."""
    work = queue.Queue()
    for i, p in enumerate(prompts):
        work.put(i)
    latency, paths, errors = [None] * len(prompts), [None] * len(prompts), []
    file_done = [0.0] * len(prompts)
    start = threading.Barrier(concurrency + 1)

    def client_loop():
        client = Client(server.port, args.request_timeout)
        start.wait()
        while True:
            try:
                i = work.get_nowait()
            except queue.Empty:
                client.close()  # an idle keep-alive connection would hold a server thread
                return
            try:
                status, body, _, seconds = client.complete(prompts[i])
                if status != 200:
                    errors.append(f"prompt {i}: HTTP {status}: {body}")
                    continue
                latency[i] = seconds
                paths[i] = body["kv_transfer_params"]["hidden_states_path"]
                wait_for_file(paths[i])
                file_done[i] = time.perf_counter()
            except Exception as e:  # counted, and the run goes on
                errors.append(f"prompt {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    done = [t for t in file_done if t > 0]
    seconds = (max(done) - t0) if done else float("nan")
    return latency, paths, errors, seconds


def run_offline(args, prompts, work_dir):
    """hsx extract on the same prompts with the same engine flags; its tok/s from its own
    final progress line (timed from the first request queued to the last file written)."""
    prompts_path = work_dir / "prompts.jsonl"
    with open(prompts_path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": f"b{i}", "token_ids": p}) + "\n")
    out_dir = work_dir / "offline"
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [args.hsx, "extract", "--model", args.model, "--load-format", args.load_format, "--device", args.device,
           "--layers", ",".join(map(str, args.layer_ids)), "--input", str(prompts_path), "--output", str(out_dir),
           "--writer-threads", str(args.writer_threads), *engine_flags(args)]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        sys.exit("hsx extract failed:\n" + run.stderr[-4000:])
    rates = re.findall(r"\[hsx extract\] (\d+)/(\d+) requests, ([0-9.]+) tok/s", run.stderr)
    files = sum(1 for _ in open(out_dir / "manifest.jsonl"))
    shutil.rmtree(out_dir, ignore_errors=True)
    return float(rates[-1][2]), wall, files


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hsx", default=str(pathlib.Path(__file__).resolve().parents[1] / "build" / "src" / "hsx"))
    p.add_argument("--model", required=True, help="model directory, or a named config with --load-format dummy")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", help="capture layer ids (default: 2, N/2, N-3, N, as hsx bench)")
    # The workload: hsx bench's flags.
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--median-len", type=float, default=256)
    p.add_argument("--min-len", type=int, default=32)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 64], help="clients; one fresh server per value")
    p.add_argument("--ttfb-requests", type=int, default=10)
    p.add_argument("--ttfb-len", type=int, default=16, help="prompt tokens of the idle time-to-first-byte requests")
    # Engine flags, passed to hsx serve and hsx extract alike (their defaults).
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--kv-cache-gib", type=float, default=2.0)
    p.add_argument("--no-enable-prefix-caching", action="store_true")
    p.add_argument("--writer-threads", type=int, default=8, help="num_writer_threads of serve, --writer-threads of extract")
    p.add_argument("--max-queued-requests", type=int, default=1024)
    p.add_argument("--serve-arg", action="append", default=[], help="one more argument for hsx serve (repeatable)")
    p.add_argument("--storage", help="shared_storage_path (default: a fresh directory under /dev/shm or /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the files and prompts.jsonl afterwards")
    p.add_argument("--skip-offline", action="store_true")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--request-timeout", type=float, default=600)
    args = p.parse_args()

    num_layers, vocab = model_shape(args)
    if args.layers:
        args.layer_ids = sorted(int(x) for x in args.layers.split(","))
    else:
        args.layer_ids = sorted({min(2, num_layers), num_layers // 2, max(0, num_layers - 3), num_layers})
    base = pathlib.Path(args.storage) if args.storage else pathlib.Path(
        tempfile.mkdtemp(prefix="hsx-serve-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    prompts = make_prompts(args, vocab)
    tokens = sum(map(len, prompts))
    common = {"model": args.model, "device": args.device, "layers": args.layer_ids, "prompts": len(prompts),
              "tokens": tokens}

    server_rates = {}
    for concurrency in args.concurrency:
        storage = base / f"serve-c{concurrency}"
        server = Serve(args, storage, base / f"serve-c{concurrency}.log")  # fresh: an empty prefix cache
        try:
            ttfb = idle_ttfb(args, server, vocab)
            line(metric="server_idle_ttfb_ms", value=1e3 * ttfb, prompt_tokens=args.ttfb_len, max_tokens=1,
                 requests=args.ttfb_requests, **common)
            for f in storage.iterdir():  # leave only the load's files
                f.unlink()
            latency, paths, errors, seconds = run_load(args, server, prompts, concurrency)
        finally:
            server.stop()
        ok = [x for x in latency if x is not None]
        rate = tokens / seconds if not errors else float("nan")
        server_rates[concurrency] = rate
        line(metric="server_prompt_tokens_per_s", value=rate, concurrency=concurrency, seconds=seconds,
             errors=len(errors), **common)
        line(metric="server_latency_ms", concurrency=concurrency, p50=1e3 * percentile(ok, 50),
             p99=1e3 * percentile(ok, 99), max=1e3 * max(ok) if ok else None, **common)
        verified = sum(verify(path, prompt, len(args.layer_ids)) for path, prompt in zip(paths, prompts) if path)
        leftovers = [f.name for f in storage.iterdir() if ".tmp." in f.name]
        line(metric="server_files_verified", value=verified, of=len(prompts), temp_files_left=len(leftovers),
             concurrency=concurrency, **common)
        for e in errors[:5]:
            print("error: " + e, file=sys.stderr)
        if not args.keep:
            shutil.rmtree(storage, ignore_errors=True)

    if not args.skip_offline:
        offline, wall, files = run_offline(args, prompts, base)
        line(metric="offline_prompt_tokens_per_s", value=offline, files=files, wall_seconds_with_model_load=wall,
             **common)
        for concurrency, rate in server_rates.items():
            line(metric="server_vs_offline", value=rate / offline, concurrency=concurrency, goal=0.9, **common)
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
