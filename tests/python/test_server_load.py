"""hsx serve under load and faults: 64 concurrent clients whose every file and token is
checked against the same prompt run alone, a full disk (RLIMIT_FSIZE) that must fail one
request and nothing else, and a full queue that answers 503 with Retry-After."""
import fcntl
import functools
import http.client
import json
import os
import resource
import signal
import subprocess
import threading
import time
import urllib.request

import numpy as np
import openai
import pytest

import conftest
from conftest import LAYERS, Server, read_safetensors

TIMEOUT = 120  # seconds; generous, the tests assert no timings


def post(server, body, timeout=TIMEOUT):
    """One POST /v1/completions on its own connection: (status, json body, headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None, dict(resp.getheaders())
    finally:
        conn.close()


def read_when_complete(path):
    """vLLM's reader: a shared lock on <path>.lock waits until the writer is done."""
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            return read_safetensors(path) if os.path.exists(path) else None
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def metric(server, name):
    text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
    return float([l for l in text.splitlines() if l.startswith(name + " ")][0].split()[-1])


def assert_storage_is_clean(storage, expected_files):
    """Exactly the expected files, no temp files left, and no lock file still held."""
    names = os.listdir(storage)
    assert not [n for n in names if ".tmp." in n], names
    assert sorted(os.path.join(storage, n) for n in names if n.endswith(".safetensors")) == sorted(expected_files)
    for n in names:
        if n.endswith(".lock"):
            with open(os.path.join(storage, n)) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the server still holds it


def assert_bf16_close(got, want, what):
    """Equal up to bf16 rounding: within 2 bf16 ulps of each element (plus a floor near 0)."""
    assert got.shape == want.shape, what
    tol = 2.0 ** -7 * np.abs(want) + 1e-3 * np.abs(want).max()
    bad = np.abs(got - want) > tol
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} values differ beyond bf16 rounding, " \
                          f"max abs diff {np.abs(got - want).max()}"


# --- 64 concurrent clients ---------------------------------------------------------------

NUM_CLIENTS = 64
MAX_TOKENS = 6


def load_workload(golden):
    """64 client jobs with mixed prompt lengths (fixed seed): lognormal lengths, block-size
    edges, the three golden prompts, prompts sharing a 100-token prefix, an identical pair,
    and a few clients that send two prompts in one request. Half stream via openai."""
    rng = np.random.default_rng(20261130)
    vocab = 512

    def tokens(n):
        return rng.integers(0, vocab, n).tolist()

    prompts = [golden[f"prompt_{k}"].tolist() for k in range(3)]
    prompts += [tokens(n) for n in (1, 2, 15, 16, 17, 1500)]
    prefix = tokens(100)
    prompts += [prefix] + [prefix + tokens(int(n)) for n in rng.integers(1, 60, 5)]
    prompts.append(list(prompts[-1]))  # the same prompt twice, at the same time
    while len(prompts) < NUM_CLIENTS:
        prompts.append(tokens(int(np.clip(rng.lognormal(np.log(96), 0.9), 1, 1200))))
    order = rng.permutation(NUM_CLIENTS)  # mix the kinds over the clients
    jobs = []
    for i, p in enumerate(order):
        job = {"prompts": [prompts[p]], "max_tokens": int(rng.integers(1, MAX_TOKENS + 1)),
               "stream": i % 2 == 1}
        if i % 16 == 4:  # a list of two prompts in one request
            job["prompts"].append(tokens(int(rng.integers(1, 300))))
        jobs.append(job)
    return jobs


def run_client(server, job, openai_client):
    """One client: its request, then every file it names read the way vLLM reads it."""
    body = {"model": "qwen3-fixture", "max_tokens": job["max_tokens"], "ignore_eos": True, "return_token_ids": True,
            "temperature": 0}
    if job["stream"]:
        chunks = list(openai_client.completions.create(
            model="qwen3-fixture", prompt=job["prompts"][0], max_tokens=job["max_tokens"], stream=True, temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True}))
        tokens = [t for c in chunks for t in (getattr(c.choices[0], "token_ids", None) or [])]
        outs = [{"prompt_token_ids": chunks[0].choices[0].prompt_token_ids, "token_ids": tokens,  # the first chunk's
                 "path": chunks[-1].kv_transfer_params["hidden_states_path"]}]
    else:
        prompt = job["prompts"][0] if len(job["prompts"]) == 1 else job["prompts"]
        status, res, _ = post(server, {**body, "prompt": prompt})
        assert status == 200, res
        assert len(res["choices"]) == len(job["prompts"])
        outs = [{"prompt_token_ids": c["prompt_token_ids"], "token_ids": c["token_ids"],
                 "path": c["kv_transfer_params"]["hidden_states_path"]} for c in res["choices"]]
    for out in outs:
        out["file"] = read_when_complete(out["path"])
    return outs


@pytest.fixture(scope="module")
def alone(tmp_path_factory, golden):
    """The reference: every prompt of the workload run alone (one sequence at a time, no
    prefix cache) on its own server: greedy tokens and file contents."""
    tmp = tmp_path_factory.mktemp("alone")
    s = Server(tmp, "--max-num-seqs", "1", "--no-enable-prefix-caching")
    try:
        ref = {}
        for job in load_workload(golden):
            for p in job["prompts"]:
                if tuple(p) in ref:
                    continue
                status, res, _ = post(s, {"prompt": p, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                                          "temperature": 0, "return_token_ids": True})
                assert status == 200, res
                path = res["kv_transfer_params"]["hidden_states_path"]
                ref[tuple(p)] = (res["choices"][0]["token_ids"], read_when_complete(path)["hidden_states"])
        yield ref
    finally:
        s.stop()


def test_64_concurrent_clients_get_whole_correct_files(tmp_path, golden, alone):
    jobs = load_workload(golden)
    s = Server(tmp_path)
    try:
        client = openai.Client(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
        results, errors = [None] * len(jobs), []
        start = threading.Barrier(len(jobs))

        def worker(i):
            try:
                start.wait()
                results[i] = run_client(s, jobs[i], client)
            except BaseException as e:  # reported below, with the client's index
                errors.append(f"client {i}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=2 * TIMEOUT)
        assert not any(t.is_alive() for t in threads), "clients still waiting"
        assert not errors, errors

        paths = []
        golden_prompts = {tuple(golden[f"prompt_{k}"].tolist()): k for k in range(3)}
        for i, (job, outs) in enumerate(zip(jobs, results)):
            for prompt, out in zip(job["prompts"], outs):
                what = f"client {i}, {len(prompt)}-token prompt"
                ref_tokens, ref_states = alone[tuple(prompt)]
                assert out["prompt_token_ids"] == prompt, what
                assert out["token_ids"] == ref_tokens[:job["max_tokens"]], what
                assert out["file"] is not None, f"{what}: {out['path']} is missing"
                assert out["file"]["token_ids"].tolist() == prompt, what
                assert_bf16_close(out["file"]["hidden_states"], ref_states, what)
                if tuple(prompt) in golden_prompts:
                    k = golden_prompts[tuple(prompt)]
                    assert out["token_ids"] == golden[f"greedy_{k}"].tolist()[:job["max_tokens"]], what
                    want = golden[f"hidden_{k}"][:, LAYERS, :]
                    err = np.abs(out["file"]["hidden_states"] - want).max() / np.abs(want).max()
                    assert err < 8e-3, f"{what}: bf16 file vs f32 golden: {err}"
                paths.append(out["path"])
        assert len(set(paths)) == len(paths) == sum(len(j["prompts"]) for j in jobs)  # one file per prompt
        assert_storage_is_clean(s.storage, paths)
        assert metric(s, "hsx_hidden_state_files_total") == len(paths)
        assert metric(s, "hsx_hidden_state_file_errors_total") == 0
        assert metric(s, "hsx_running_requests") == 0 and metric(s, "hsx_queue_depth") == 0
    finally:
        s.stop()


def test_idle_keep_alive_connections_do_not_starve_other_clients(server):
    idle = []
    try:
        for _ in range(max(8, os.cpu_count() or 1)):  # as many as the pool has threads
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
            conn.request("GET", "/v1/models")
            conn.getresponse().read()  # the connection stays open, idle
            idle.append(conn)
        other = http.client.HTTPConnection("127.0.0.1", server.port, timeout=3)  # fixed: answers in milliseconds
        try:
            other.request("GET", "/health")
            assert other.getresponse().status == 200
        finally:
            other.close()
    finally:
        for conn in idle:
            conn.close()


# --- a full disk -------------------------------------------------------------------------

FSIZE_LIMIT = 64 << 10  # bytes; a file holds ~392 bytes per token here (3 bf16 layers of 64 + an int64 id)


def limit_file_size():
    """preexec_fn of the server: files past FSIZE_LIMIT fail with EFBIG (SIGXFSZ ignored,
    so the write returns the error instead of killing the process)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


@pytest.fixture
def full_disk_server(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(conftest.subprocess, "Popen", functools.partial(subprocess.Popen, preexec_fn=limit_file_size))
        s = Server(tmp_path)
    yield s
    s.stop()


def big_prompt():
    return np.random.default_rng(7).integers(0, 512, 1000).tolist()  # ~392 KB of states: over the limit


def test_a_full_disk_fails_the_one_request_and_nothing_else(full_disk_server):
    s = full_disk_server
    status, res, _ = post(s, {"prompt": big_prompt(), "max_tokens": 1})
    if status == 200:
        # The response came before the write; the file must never appear (see the next test).
        path = res["kv_transfer_params"]["hidden_states_path"]
        assert read_when_complete(path) is None, "a file past RLIMIT_FSIZE was written"
    else:
        assert status == 500, res
    for _ in range(100):  # the failed write is counted once its writer is done
        if metric(s, "hsx_hidden_state_file_errors_total") == 1:
            break
        time.sleep(0.1)
    assert metric(s, "hsx_hidden_state_file_errors_total") == 1
    assert_storage_is_clean(s.storage, [])  # no partial file, no temp file, no held lock

    # The server goes on: /health answers and a small request gets its whole file.
    assert urllib.request.urlopen(s.url + "/health", timeout=30).status == 200
    status, res, _ = post(s, {"prompt": [1, 2, 3, 4, 5], "max_tokens": 1})
    assert status == 200, res
    path = res["kv_transfer_params"]["hidden_states_path"]
    data = read_when_complete(path)
    assert data["token_ids"].tolist() == [1, 2, 3, 4, 5]
    assert data["hidden_states"].shape == (5, len(LAYERS), 64)
    assert_storage_is_clean(s.storage, [path])
    assert s.proc.poll() is None


def test_a_full_disk_answers_500_naming_the_file_and_the_os_error(full_disk_server):
    status, res, _ = post(full_disk_server, {"prompt": big_prompt(), "max_tokens": 1})
    assert status == 500, res
    assert res["error"]["type"] == "internal_error" and res["error"]["code"] == 500
    assert ".safetensors" in res["error"]["message"] and "File too large" in res["error"]["message"]


# --- a full queue ------------------------------------------------------------------------

def test_a_full_queue_answers_503_with_retry_after(tmp_path):
    s = Server(tmp_path, "--max-queued-requests", "1")
    try:
        # One long streaming request fills the queue...
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=TIMEOUT)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": [5] * 64, "max_tokens": 3700, "stream": True,
                                                            "ignore_eos": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.read(6) == b"data: "  # under way
        # ...so the next one is turned away at once, the way OpenAI's clients retry on.
        status, err, headers = post(s, {"prompt": [1, 2], "max_tokens": 1})
        assert status == 503, err
        assert int(headers["Retry-After"]) >= 1
        assert err["error"]["type"] == "server_overloaded" and err["error"]["code"] == 503 and err["error"]["message"]
        conn.sock.close()  # the long request's client goes away, which frees the slot
        conn.close()
        deadline = time.time() + TIMEOUT
        while True:
            status, res, headers = post(s, {"prompt": [1, 2], "max_tokens": 1})
            if status != 503 or time.time() > deadline:
                break
            time.sleep(float(headers.get("Retry-After", 1)) / 10)
        assert status == 200, res
        assert read_when_complete(res["kv_transfer_params"]["hidden_states_path"])["token_ids"].tolist() == [1, 2]
    finally:
        s.stop()
