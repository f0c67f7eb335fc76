"""hs-connectors' FP8 hidden-state files from `hsx extract` and `hsx serve`
(kv_connector FP8HiddenStatesConnector): codes and scales bit-identical to the reference
rule (hs_connectors.fp8_utils: per-token amax / 448, x / scale rounded to E4M3) applied to
hsx's own bf16 states of the same prompts, with ml_dtypes' E4M3 as the rounding reference;
and hs_connectors' own FP8Transfer reading them, where torch is installed (the device) or in
the torch site of scripts/install_torch.sh (CI)."""
import http.client
import json
import subprocess

import ml_dtypes
import numpy as np
import pytest

from conftest import HSX, LAYERS, MODEL, Server, read_safetensors

FP8 = {"kv_connector": "FP8HiddenStatesConnector", "kv_role": "kv_producer",
       "kv_connector_module_path": "hs_connectors.fp8_hidden_states_connector"}


def post(server, body):
    """One POST /v1/completions: (status, json body); plain http.client, so the device's
    Python (no openai package) runs this file too."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def reference_fp8(states):
    """hs_connectors.fp8_utils.quantize_tensor_to_fp8 in numpy: f32 throughout."""
    x = states.astype(np.float32)
    amax = np.abs(x).max(axis=(1, 2), keepdims=True)
    scale = np.maximum(amax / np.float32(448.0), np.float32(1e-12)).astype(np.float32)
    codes = (x / scale).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return codes, scale


def extract(tmp_path, out, *extra):
    prompts = tmp_path / "p.jsonl"
    rng = np.random.default_rng(3)
    with open(prompts, "w") as f:
        for i in range(6):
            f.write(json.dumps({"id": f"p{i}", "token_ids": rng.integers(1, 500, 5 + 7 * i).tolist()}) + "\n")
    cmd = [HSX, "extract", "--model", str(MODEL), "--layers", ",".join(map(str, LAYERS)), "--input", str(prompts),
           "--output", str(out), "--dtype", "bfloat16", "--max-num-seqs", "1", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return sorted((json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()), key=lambda e: e["id"])


def test_extract_fp8_files_match_the_reference_rule_on_hsxs_bf16_states(tmp_path):
    bf16 = extract(tmp_path, tmp_path / "bf16")
    fp8 = extract(tmp_path, tmp_path / "fp8", "--kv-transfer-config", json.dumps(FP8))
    assert [e["id"] for e in fp8] == [e["id"] for e in bf16]
    for plain, quantized in zip(bf16, fp8):
        states = read_safetensors(plain["path"])
        q = read_safetensors(quantized["path"])
        assert sorted(q) == ["hidden_states", "hidden_states_scales", "token_ids"]
        codes, scale = reference_fp8(states["hidden_states"])
        assert q["hidden_states"].shape == states["hidden_states"].shape
        assert q["hidden_states_scales"].shape == (states["hidden_states"].shape[0], 1, 1)
        np.testing.assert_array_equal(q["hidden_states_scales"], scale)
        mismatched = np.count_nonzero(q["hidden_states"] != codes)
        assert mismatched == 0, f"{quantized['id']}: {mismatched} of {codes.size} codes differ from the reference"
        np.testing.assert_array_equal(q["token_ids"], states["token_ids"])


def test_serve_writes_fp8_files_that_name_their_path(tmp_path):
    s = Server(tmp_path, connector=FP8)
    try:
        status, body = post(s, {"prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 1})
        assert status == 200, body
        path = body["kv_transfer_params"]["hidden_states_path"]
        q = read_safetensors(path)
        assert q["hidden_states"].dtype == np.uint8 and q["hidden_states"].shape == (6, len(LAYERS), 64)
        restored = q["hidden_states"].view(ml_dtypes.float8_e4m3fn).astype(np.float32) * q["hidden_states_scales"]
        assert np.isfinite(restored).all() and np.abs(restored).max() > 0
        np.testing.assert_array_equal(q["token_ids"], [5, 6, 7, 8, 9, 10])
    finally:
        s.stop()


def test_hs_connectors_fp8_transfer_reads_hsxs_files(tmp_path):
    torch = pytest.importorskip("torch", reason="hs_connectors needs torch (run on the device)")
    transfer = pytest.importorskip("hs_connectors.transfer")
    fp8_utils = pytest.importorskip("hs_connectors.fp8_utils")
    bf16 = extract(tmp_path, tmp_path / "bf16")
    fp8 = extract(tmp_path, tmp_path / "fp8", "--kv-transfer-config", json.dumps(FP8))
    reader = transfer.FP8Transfer(tmp_path / "fp8")
    for plain, quantized in zip(bf16, fp8):
        got = reader.get_generated({"hidden_states_path": quantized["path"]})
        states = torch.from_numpy(read_safetensors(plain["path"])["hidden_states"]).to(torch.bfloat16)
        codes, scale = fp8_utils.quantize_tensor_to_fp8(states)
        want = fp8_utils.dequantize_fp8_tensor(codes, scale)
        assert sorted(got) == ["hidden_states", "token_ids"]
        assert torch.equal(got["hidden_states"], want), quantized["id"]


def test_hs_connectors_fp8_transfer_in_the_torch_site():
    """The test above where this Python has no torch but scripts/install_torch.sh's site is
    there (CI): run in a Python with that site on its path (fails there without it)."""
    import importlib.util
    import sys
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch imports here: the test above runs in this process")
    from toy_target import require_speculators_cli, speculators_env
    require_speculators_cli()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"{__file__}::test_hs_connectors_fp8_transfer_reads_hsxs_files"],
                         env=speculators_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-4000:]
