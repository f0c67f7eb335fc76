"""--data-parallel-size M: M engine replicas in one process (CPU replicas here; one per
GPU on CUDA). Extraction gives one replica's files byte for byte (--batch-invariant makes
a prompt's bits independent of its batch), the server gives the openai client the same
greedy tokens as one replica, both replicas take work, and bad sizes fail naming the flag."""
import json
import re
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from conftest import HSX, MODEL, Server

TIMEOUT = 300


def write_prompts(path, n, seed=0):
    rng = np.random.default_rng(seed)
    prompts = {f"q{i}": rng.integers(0, 512, int(rng.integers(16, 60))).tolist() for i in range(n)}
    # Two sharing their first blocks: one replica's prefix cache serves the second.
    prompts["shared_a"] = list(range(40)) + [1, 2]
    prompts["shared_b"] = list(range(40)) + [3, 4, 5]
    with open(path, "w") as f:
        for pid, ids in prompts.items():
            f.write(json.dumps({"id": pid, "token_ids": ids}) + "\n")
    return prompts


def extract(prompts, out, *extra):
    return subprocess.run([HSX, "extract", "--model", str(MODEL), "--layers", "0,2,4", "--input", str(prompts),
                           "--output", str(out), "--batch-invariant", *extra],
                          capture_output=True, text=True, timeout=TIMEOUT)


def files(out):
    return {p.name: p.read_bytes() for p in out.iterdir() if p.name.endswith(".safetensors")}


def manifest(out):
    return sorted(line for line in (out / "manifest.jsonl").read_text().splitlines())


def test_extract_with_two_replicas_equals_one(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    one, two = tmp_path / "one", tmp_path / "two"
    r = extract(tmp_path / "p.jsonl", one)
    assert r.returncode == 0, r.stderr
    r = extract(tmp_path / "p.jsonl", two, "--data-parallel-size", "2")
    assert r.returncode == 0, r.stderr
    per_replica = [int(n) for n in re.search(r"requests per replica: (\d+), (\d+)", r.stderr).groups()]
    assert sum(per_replica) == len(prompts) and min(per_replica) > 0, r.stderr
    assert len(files(one)) == len(prompts)
    assert files(two) == files(one)
    assert [line.replace(str(two), "D") for line in manifest(two)] == \
           [line.replace(str(one), "D") for line in manifest(one)]
    # Resume with a different M: nothing left to do.
    r = extract(tmp_path / "p.jsonl", two, "--data-parallel-size", "3")
    assert r.returncode == 0, r.stderr
    assert f"skipped {len(prompts)} already in the manifest" in r.stderr


@pytest.mark.parametrize("flags, message", [
    (["--data-parallel-size", "0"], "--data-parallel-size"),
    (["--data-parallel-size", "65"], "--data-parallel-size"),
    (["--data-parallel-size", "2", "--device", "cuda:1000"], "--data-parallel-size 2: replica 0 on cuda:1000"),
])
def test_bad_data_parallel_sizes_fail_naming_the_flag(tmp_path, flags, message):
    write_prompts(tmp_path / "p.jsonl", 1)
    r = extract(tmp_path / "p.jsonl", tmp_path / "out", *flags)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def replica_requests(server):
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    return [float(v) for v in re.findall(r'^hsx_replica_requests_total\{replica="\d+"\} (\S+)$', text, re.M)]


def greedy_tokens(server, prompts):
    client = openai.Client(base_url=server.url + "/v1", api_key="unused")

    def one(prompt):
        res = client.completions.create(model="qwen3-fixture", prompt=prompt, max_tokens=6, temperature=0,
                                        extra_body={"return_token_ids": True})
        return res.choices[0].token_ids

    with ThreadPoolExecutor(8) as pool:  # at once, so both replicas hold work
        return list(pool.map(one, prompts))


def test_server_with_two_replicas_serves_one_replicas_greedy_tokens(tmp_path, golden):
    rng = np.random.default_rng(3)
    prompts = [golden[f"prompt_{k}"].tolist() for k in range(3)]
    prompts += [rng.integers(0, 512, int(rng.integers(16, 48))).tolist() for _ in range(13)]
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    single = Server(tmp_path / "one", "--batch-invariant")
    try:
        expected = greedy_tokens(single, prompts)
        assert replica_requests(single) == [len(prompts)]
    finally:
        single.stop()
    for k in range(3):
        assert expected[k] == golden[f"greedy_{k}"].tolist()[:6]
    double = Server(tmp_path / "two", "--batch-invariant", "--data-parallel-size", "2")
    try:
        assert greedy_tokens(double, prompts) == expected
        counts = replica_requests(double)
        assert len(counts) == 2 and sum(counts) == len(prompts) and min(counts) > 0, counts
        text = urllib.request.urlopen(double.url + "/metrics").read().decode()
        assert f'hsx_requests_total{{status="finished"}} {len(prompts)}' in text  # summed over replicas
    finally:
        double.stop()


def test_generate_with_two_replicas_equals_one(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 12)

    def generate(*extra):
        r = subprocess.run([HSX, "generate", "--model", str(MODEL), "--input", str(tmp_path / "p.jsonl"),
                            "--max-tokens", "5", "--batch-invariant", *extra],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        return sorted(r.stdout.splitlines())

    one = generate()
    assert len(one) == len(prompts)
    assert generate("--data-parallel-size", "2") == one
