"""hsx extract under the faults an operator meets: kill -9 at random points, then resume;
a full disk (RLIMIT_FSIZE); writes that keep failing. Whatever happened, once a run
completes every prompt has exactly one manifest line and one whole file, equal to an
uninterrupted run's, and no temp file is left.

The CI runs a few kills; for the full check run e.g.
  HSX_FAULT_KILLS=16 HSX_BINARY=build/src/hsx python3 -m pytest tests/python/test_extract_faults.py
"""
import json
import os
import random
import resource
import signal
import subprocess
import time

import numpy as np

from conftest import HSX, MODEL, read_safetensors

LAYERS = "0,2,4"
KILLS = int(os.environ.get("HSX_FAULT_KILLS", "3"))
TIMEOUT = 300  # seconds; generous, nothing here asserts timings


def write_prompts(path, lengths, seed=0):
    rng = np.random.default_rng(seed)
    prompts = {f"q{i}": rng.integers(0, 512, n).tolist() for i, n in enumerate(lengths)}
    with open(path, "w") as f:
        for pid, ids in prompts.items():
            f.write(json.dumps({"id": pid, "token_ids": ids}) + "\n")
    return prompts


def extract_cmd(prompts_path, out, *extra):
    return [HSX, "extract", "--model", str(MODEL), "--layers", LAYERS, "--input", str(prompts_path),
            "--output", str(out), "--writer-threads", "1", *extra]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, **kw)


def check_complete(out, prompts, reference=None):
    """One manifest line and one whole file per prompt, nothing else in the directory."""
    lines = (out / "manifest.jsonl").read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines]  # every line parses
    assert sorted(ids) == sorted(prompts), "manifest ids differ (lost or duplicated)"
    names = {p.name for p in out.iterdir()}
    assert names == {f"{pid}.safetensors" for pid in prompts} | {"manifest.jsonl"}, \
        f"unexpected files: {sorted(names - {f'{pid}.safetensors' for pid in prompts})}"
    for pid, tokens in prompts.items():
        f = read_safetensors(out / f"{pid}.safetensors")  # a partial file would not parse
        assert f["token_ids"].tolist() == tokens
        assert f["hidden_states"].shape == (len(tokens), 3, 64)
        assert np.isfinite(f["hidden_states"]).all()
        if reference is not None:
            ref = read_safetensors(reference / f"{pid}.safetensors")["hidden_states"]
            # Runs batch prompts differently; bf16 results may differ by rounding.
            np.testing.assert_allclose(f["hidden_states"], ref, rtol=2e-2, atol=2e-2)


def test_kill_at_random_points_then_resume(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", [random.Random(1).randint(20, 400) for _ in range(64)])
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    r = run(extract_cmd(tmp_path / "p.jsonl", ref))
    full_run = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    rng = random.Random(int(os.environ.get("HSX_FAULT_SEED", "0")))
    for _ in range(KILLS):
        proc = subprocess.Popen(extract_cmd(tmp_path / "p.jsonl", out), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, full_run))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=TIMEOUT)
    r = run(extract_cmd(tmp_path / "p.jsonl", out))
    assert r.returncode == 0, r.stderr
    check_complete(out, prompts, reference=ref)


# A file of T tokens takes ~392 * T bytes (3 bf16 layers of 64 and an int64 id per token).
FSIZE_LIMIT = 64 << 10


def limit_file_size():
    """preexec_fn: writes past FSIZE_LIMIT fail with EFBIG, as on a full disk (SIGXFSZ
    ignored, so the write returns the error instead of killing the process)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


def test_a_full_disk_stops_extract_early_and_a_later_run_resumes(tmp_path):
    # Small prompts around one too big for the limit; small steps, so most of the input
    # is still to be computed when the big one's write fails.
    lengths = [40] * 4 + [400] + [40] * 40
    prompts = write_prompts(tmp_path / "p.jsonl", lengths)
    out = tmp_path / "out"
    cmd = extract_cmd(tmp_path / "p.jsonl", out, "--max-num-seqs", "2", "--max-num-batched-tokens", "128")
    r = run(cmd, preexec_fn=limit_file_size)
    assert r.returncode == 1
    assert "q4.safetensors: write failed: File too large" in r.stderr, r.stderr
    assert "stopped early: the disk is full" in r.stderr, r.stderr
    written = len((out / "manifest.jsonl").read_text().splitlines())
    assert written < len(prompts) - 10, "extract went on computing after the disk filled"
    assert not [p for p in out.iterdir() if ".tmp." in p.name]
    r = run(cmd)  # space is back
    assert r.returncode == 0, r.stderr
    assert f"skipped {written} already in the manifest" in r.stderr, r.stderr
    check_complete(out, prompts)


def test_writes_failing_in_a_row_stop_extract(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", [30] * 20)
    out = tmp_path / "out"
    for pid in prompts:  # a directory where each file should go: every rename fails
        (out / f"{pid}.safetensors").mkdir(parents=True)
    cmd = extract_cmd(tmp_path / "p.jsonl", out, "--max-num-seqs", "2", "--max-num-batched-tokens", "64")
    r = run([*cmd, "--max-write-failures", "3"])
    assert r.returncode == 1
    assert r.stderr.count("rename failed") == 3, r.stderr
    assert "stopped early: 3 writes failed in a row" in r.stderr, r.stderr
    for pid in prompts:
        (out / f"{pid}.safetensors").rmdir()
    r = run(cmd)
    assert r.returncode == 0, r.stderr
    check_complete(out, prompts)
