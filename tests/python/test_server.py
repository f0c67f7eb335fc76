"""hsx serve against real clients: speculators' data-generation client and the openai
package, checked against the golden hidden states of the fixture model."""
import fcntl
import importlib.util
import json
import os
import signal
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from conftest import LAYERS, Server, read_safetensors


def load_vllm_client():
    """speculators' own client module, loaded from the installed package file (the
    package itself imports torch; this module needs only openai)."""
    package_dir = importlib.util.find_spec("speculators").submodule_search_locations[0]
    path = os.path.join(package_dir, "data_generation", "vllm_client.py")
    spec = importlib.util.spec_from_file_location("speculators_vllm_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def post(url, body, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null"), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


def expected_states(golden, k):
    return golden[f"hidden_{k}"][:, LAYERS, :]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_speculators_client_gets_the_golden_hidden_states(server, golden, k):
    vllm_client = load_vllm_client()
    client = openai.Client(base_url=server.url + "/v1", api_key="unused")
    prompt = [int(t) for t in golden[f"prompt_{k}"]]
    path, params = vllm_client.generate_hidden_states(client, "qwen3-fixture", {"input_ids": prompt})
    assert params["hidden_states_path"] == path
    vllm_client.wait_for_lock(path + ".lock")  # non-blocking exclusive lock, then removes the lock file
    assert not os.path.exists(path + ".lock")
    data = read_safetensors(path)
    assert data["token_ids"].tolist() == prompt
    want = expected_states(golden, k)
    assert data["hidden_states"].shape == want.shape
    err = np.abs(data["hidden_states"] - want).max() / np.abs(want).max()
    assert err < 8e-3, f"bf16 file vs f32 golden: {err}"


def test_vllm_style_reader_takes_a_shared_lock(server, golden):
    status, body, _ = post(server.url + "/v1/completions",
                           {"model": "qwen3-fixture", "prompt": golden["prompt_1"].tolist(), "max_tokens": 1})
    assert status == 200
    path = body["kv_transfer_params"]["hidden_states_path"]
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # blocks until the writer is done, as vLLM's load_hidden_states
        data = read_safetensors(path)
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert data["hidden_states"].shape == (37, len(LAYERS), 64)


def test_openai_client_generates_the_golden_greedy_tokens(server, golden):
    client = openai.Client(base_url=server.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["qwen3-fixture"]
    prompts = [golden[f"prompt_{k}"].tolist() for k in range(3)]
    res = client.completions.create(model="qwen3-fixture", prompt=prompts, max_tokens=8, temperature=0,
                                    extra_body={"return_token_ids": True})
    assert len(res.choices) == 3
    for k, choice in enumerate(res.choices):
        assert choice.prompt_token_ids == prompts[k]
        assert choice.token_ids == golden[f"greedy_{k}"].tolist()
        assert choice.finish_reason == "length"
    assert res.usage.completion_tokens == 24


def metric(server, name):
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    return float([l for l in text.splitlines() if l.startswith(name + " ")][0].split()[-1])


def assert_idle_soon(server):
    """Within 10 s nothing runs and every KV block is free (cancelled requests let go)."""
    for _ in range(100):
        if metric(server, "hsx_running_requests") == 0 and metric(server, "hsx_kv_cache_usage_ratio") == 0:
            break
        time.sleep(0.1)
    assert metric(server, "hsx_running_requests") == 0
    assert metric(server, "hsx_kv_cache_usage_ratio") == 0


def test_streaming_with_the_openai_client(server, golden):
    client = openai.Client(base_url=server.url + "/v1", api_key="unused")
    chunks = list(client.completions.create(model="qwen3-fixture", prompt=golden["prompt_2"].tolist(), max_tokens=8,
                                            stream=True, temperature=0, extra_body={"return_token_ids": True}))
    tokens = [t for c in chunks for t in (getattr(c.choices[0], "token_ids", None) or [])]
    assert tokens == golden["greedy_2"].tolist()
    assert chunks[-1].choices[0].finish_reason == "length"
    path = chunks[-1].kv_transfer_params["hidden_states_path"]
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        assert read_safetensors(path)["hidden_states"].shape == (130, len(LAYERS), 64)


def test_a_client_that_disconnects_frees_its_blocks(server):
    import http.client
    failed = 'hsx_requests_total{status="failed"}'
    finished = 'hsx_requests_total{status="finished"}'
    failed_before, finished_before = metric(server, failed), metric(server, finished)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": [5] * 300, "max_tokens": 3700, "stream": True,
                                                        "ignore_eos": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(6) == b"data: "  # generation is under way
    conn.sock.close()  # the client goes away mid-request
    conn.close()
    assert_idle_soon(server)
    # It was cancelled, not run to the end.
    assert metric(server, failed) == failed_before + 1
    assert metric(server, finished) == finished_before


def test_a_streaming_client_that_leaves_before_any_chunk_is_cancelled(server):
    # With logprobs a stream holds its tokens until their logprobs are in, so no write
    # can fail: the server must notice the closed socket itself.
    import http.client
    failed = 'hsx_requests_total{status="failed"}'
    finished = 'hsx_requests_total{status="finished"}'
    failed_before, finished_before = metric(server, failed), metric(server, finished)
    steps_before = metric(server, "hsx_computed_tokens_total")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": [5] * 300, "max_tokens": 3700, "stream": True,
                                                        "ignore_eos": True, "logprobs": 2}),
                 {"Content-Type": "application/json"})
    assert conn.getresponse().status == 200
    for _ in range(100):  # until generation is under way
        if metric(server, "hsx_computed_tokens_total") > steps_before + 300:
            break
        time.sleep(0.05)
    conn.sock.close()
    conn.close()
    assert_idle_soon(server)
    assert metric(server, failed) == failed_before + 1
    assert metric(server, finished) == finished_before
    assert metric(server, "hsx_computed_tokens_total") < steps_before + 300 + 3000


def test_a_non_streaming_client_that_disconnects_is_cancelled(server):
    import socket
    failed = 'hsx_requests_total{status="failed"}'
    finished = 'hsx_requests_total{status="finished"}'
    failed_before, finished_before = metric(server, failed), metric(server, finished)
    steps_before = metric(server, "hsx_computed_tokens_total")
    body = json.dumps({"prompt": [5] * 300, "max_tokens": 3700, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        for _ in range(100):  # until generation is under way
            if metric(server, "hsx_computed_tokens_total") > steps_before + 300:
                break
            time.sleep(0.05)
        assert metric(server, "hsx_running_requests") == 1
    # The client went away mid-request.
    assert_idle_soon(server)
    assert metric(server, failed) == failed_before + 1
    assert metric(server, finished) == finished_before
    # Well short of the 3700 tokens it asked for.
    assert metric(server, "hsx_computed_tokens_total") < steps_before + 300 + 3000


def test_a_kept_alive_client_waiting_for_a_long_answer_gets_it(server, golden):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    for _ in range(2):  # the second request reuses the connection
        conn.request("POST", "/v1/completions", json.dumps({"prompt": golden["prompt_1"].tolist(), "max_tokens": 200,
                                                            "ignore_eos": True, "return_token_ids": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert len(json.loads(resp.read())["choices"][0]["token_ids"]) == 200
    conn.close()


def test_include_output_tokens_saves_prompt_and_generated_but_last(server, golden):
    client = openai.Client(base_url=server.url + "/v1", api_key="unused")
    prompt = golden["prompt_1"].tolist()
    res = client.completions.create(model="qwen3-fixture", prompt=prompt, max_tokens=8, temperature=0,
                                    extra_body={"return_token_ids": True,
                                                "kv_transfer_params": {"include_output_tokens": True}})
    generated = res.choices[0].token_ids
    assert generated == golden["greedy_1"].tolist()
    path = res.kv_transfer_params["hidden_states_path"]
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        data = read_safetensors(path)
    assert data["token_ids"].tolist() == prompt + generated[:-1]
    assert data["hidden_states"].shape == (len(prompt) + 7, len(LAYERS), 64)
    want = expected_states(golden, 1)
    assert np.abs(data["hidden_states"][:len(prompt)] - want).max() / np.abs(want).max() < 8e-3
    # The generated tokens' rows are those a prefill of prompt + generated[:-1] captures.
    status, cold, _ = post(server.url + "/v1/completions", {"prompt": prompt + generated[:-1], "max_tokens": 1})
    assert status == 200
    with open(cold["kv_transfer_params"]["hidden_states_path"] + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        cold_states = read_safetensors(cold["kv_transfer_params"]["hidden_states_path"])["hidden_states"]
    err = np.abs(data["hidden_states"] - cold_states).max() / np.abs(cold_states).max()
    assert err < 1e-2, err
    status, err, _ = post(server.url + "/v1/completions",
                          {"prompt": prompt, "kv_transfer_params": {"include_output_tokens": 1}})
    assert status == 400 and "include_output_tokens" in err["error"]["message"], err
    # max_tokens=1: nothing generated was fed back, so it is the prompt alone either way.
    status, one, _ = post(server.url + "/v1/completions",
                          {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"include_output_tokens": True}})
    assert status == 200
    with open(one["kv_transfer_params"]["hidden_states_path"] + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        assert read_safetensors(one["kv_transfer_params"]["hidden_states_path"])["token_ids"].tolist() == prompt


def test_sampling_is_reproducible_with_a_seed(server, golden):
    body = {"prompt": golden["prompt_1"].tolist(), "max_tokens": 12, "temperature": 1.5, "top_p": 0.95,
            "top_k": 50, "seed": 1234, "return_token_ids": True}
    runs = [post(server.url + "/v1/completions", body)[1]["choices"][0]["token_ids"] for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 12
    greedy = post(server.url + "/v1/completions", {**body, "temperature": 0})[1]["choices"][0]["token_ids"]
    assert greedy[:8] == golden["greedy_1"].tolist()


def test_a_request_without_sampling_parameters_samples_at_temperature_1(server, golden):
    """OpenAI's and vLLM's defaults: temperature 1, top_p 1, no top_k, min_p 0, and a fresh
    random seed per request (and per choice) when none is sent."""
    body = {"prompt": golden["prompt_1"].tolist(), "max_tokens": 8, "ignore_eos": True, "return_token_ids": True}

    def tokens(**extra):
        status, res, _ = post(server.url + "/v1/completions", {**body, **extra})
        assert status == 200, res
        return [c["token_ids"] for c in res["choices"]]

    unseeded = {tuple(tokens()[0]) for _ in range(20)}
    assert len(unseeded) > 1, "20 identical requests without a seed drew the same tokens"
    assert len({tuple(t) for t in tokens(n=4)}) > 1
    # The defaults are those values: a seed draws the same tokens with them sent explicitly.
    for seed in (1, 2, 3):
        default = tokens(seed=seed)
        assert default == tokens(seed=seed, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)
        assert default == tokens(seed=seed)
    assert any(tokens(seed=s)[0] != golden["greedy_1"].tolist() for s in (1, 2, 3))


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    ({"prompt": "text, but this model has no tokenizer"}, "prompt"),
    ({"prompt": [1, 2, 512]}, "prompt"),
    ({"prompt": [1, "x"]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1] * 5000}, "prompt"),
    ({"prompt": [1, 2], "max_tokens": -1}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": "3"}, "max_tokens"),
    ({"prompt": [1, 2], "temperature": "hot"}, "temperature"),
    ({"prompt": [1, 2], "temperature": -1}, "temperature"),
    ({"prompt": [1, 2], "top_p": 1.5}, "top_p"),
    ({"prompt": [1, 2], "top_k": -2}, "top_k"),
    ({"prompt": [1, 2], "seed": "x"}, "seed"),
    ({"prompt": [[1, 2], [3]], "stream": True}, "stream"),
    ({"prompt": [1, 2], "stream": "yes"}, "stream"),
    ({"prompt": [1, 2], "kv_transfer_params": {"hidden_states_path": "x.safetensors"}}, "kv_transfer_params"),
    ({"prompt": [1, 2], "kv_transfer_params": {"include_output_tokens": "yes"}}, "kv_transfer_params"),
    ({}, "prompt"),
])
def test_bad_requests_get_openai_style_400s_and_the_server_stays_up(server, body, param):
    status, err, _ = post(server.url + "/v1/completions", body)
    assert status == 400, err
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["code"] == 400
    assert err["error"]["message"]
    assert err["error"]["param"] == param
    status, _, _ = post(server.url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 1})
    assert status == 200


def test_unknown_model_is_404(server):
    status, err, _ = post(server.url + "/v1/completions", {"model": "gpt-9", "prompt": [1]})
    assert status == 404 and err["error"]["param"] == "model"


def test_metrics_count_requests_and_files(server):
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    for name in ["hsx_requests_total{status=\"finished\"}", "hsx_queue_depth", "hsx_kv_cache_usage_ratio",
                 "hsx_prefix_cache_hit_rate", "hsx_hidden_state_files_total", "hsx_batch_tokens"]:
        assert name in text
    finished = [l for l in text.splitlines() if l.startswith("hsx_requests_total{status=\"finished\"}")][0]
    assert float(finished.split()[-1]) > 0


def test_api_key_and_custom_paths(tmp_path, golden):
    s = Server(tmp_path, "--api-key", "sekret", "--allow-custom-save-path")
    try:
        status, err, _ = post(s.url + "/v1/completions", {"prompt": [1, 2]})
        assert status == 401 and err["error"]["type"] == "authentication_error"
        auth = {"Authorization": "Bearer sekret"}
        status, body, _ = post(s.url + "/v1/completions",
                               {"prompt": golden["prompt_0"].tolist(), "max_tokens": 1,
                                "kv_transfer_params": {"hidden_states_path": "mine.safetensors"}}, auth)
        assert status == 200, body
        path = body["kv_transfer_params"]["hidden_states_path"]
        assert path == str(s.storage / "mine.safetensors")
        for escape in ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"]:
            status, err, _ = post(s.url + "/v1/completions",
                                  {"prompt": [1], "kv_transfer_params": {"hidden_states_path": escape}}, auth)
            assert status == 400 and "inside the shared storage path" in err["error"]["message"], escape
        assert not (tmp_path / "outside.safetensors").exists()
        # Output that cannot be stored fails that request with a clear 500; the server goes on.
        (s.storage / "x.safetensors.lock").mkdir()  # in the way of the lock file
        status, err, _ = post(s.url + "/v1/completions",
                              {"prompt": [1], "kv_transfer_params": {"hidden_states_path": "x.safetensors"}}, auth)
        assert status == 500 and "cannot create lock file" in err["error"]["message"], err
        status, _, _ = post(s.url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 1}, auth)
        assert status == 200
        # SIGTERM drains and exits 0.
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=30) == 0
    finally:
        s.stop()


def test_tensor_parallel_server_gives_the_golden_states_and_tokens(tmp_path, golden):
    """--tensor-parallel-size 2 (cpu ranks): rank 0 writes each file, under the same lock
    protocol, with the golden states; greedy tokens are the goldens'."""
    tp = Server(tmp_path, "--tensor-parallel-size", "2")
    try:
        vllm_client = load_vllm_client()
        client = openai.Client(base_url=tp.url + "/v1", api_key="unused")
        for k in range(3):
            prompt = [int(t) for t in golden[f"prompt_{k}"]]
            path, _ = vllm_client.generate_hidden_states(client, "qwen3-fixture", {"input_ids": prompt})
            vllm_client.wait_for_lock(path + ".lock")
            data = read_safetensors(path)
            want = expected_states(golden, k)
            err = np.abs(data["hidden_states"] - want).max() / np.abs(want).max()
            assert err < 8e-3, f"prompt {k}: bf16 file vs f32 golden: {err}"
        res = client.completions.create(model="qwen3-fixture", prompt=[golden[f"prompt_{k}"].tolist() for k in range(3)],
                                        max_tokens=8, temperature=0, extra_body={"return_token_ids": True})
        assert [c.token_ids for c in res.choices] == [golden[f"greedy_{k}"].tolist() for k in range(3)]
    finally:
        tp.stop()
