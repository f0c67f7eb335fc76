"""`hsx serve --device cuda:N` on each GPU named (run by bench/device_run.sh devices on a
machine with several GPUs; CI has none). Each server gets the same greedy request with
hidden-state extraction; the tokens must be identical across devices and the states
within bf16 error of the f32 golden. Exits 1 on any difference. Usage:
    python3 tests/device/serve_on_devices.py HSX_BINARY cuda:0 cuda:1
"""
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from safetensors_numpy import read_safetensors  # noqa: E402

MODEL = ROOT / "tests" / "data" / "models" / "qwen3"
LAYERS = [0, 2, 4]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_once(binary, device, prompt, storage):
    port = free_port()
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": LAYERS}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    log = open(storage.parent / f"server-{device.replace(':', '')}.log", "w")
    proc = subprocess.Popen([binary, "serve", str(MODEL), "--port", str(port), "--device", device,
                             "--served-model-name", "m", "--speculative-config", json.dumps(spec),
                             "--kv-transfer-config", json.dumps(kv)], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 8, "temperature": 0,
                           "return_token_ids": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        response = json.loads(urllib.request.urlopen(req, timeout=120).read())
        path = response["kv_transfer_params"]["hidden_states_path"]
        return response["choices"][0]["token_ids"], read_safetensors(path)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def main():
    binary, devices = sys.argv[1], sys.argv[2:]
    golden = read_safetensors(MODEL / "golden.safetensors")
    prompt = [int(t) for t in golden["prompt_2"]]
    want = golden["hidden_2"][:, LAYERS]
    hf_error = np.abs(golden["hidden_bf16gpu_2"][:, LAYERS] - want).max() / np.abs(want).max()
    ok = True
    tokens_by_device = {}
    with tempfile.TemporaryDirectory() as tmp:
        for device in devices:
            storage = pathlib.Path(tmp) / device.replace(":", "")
            tokens, states = serve_once(binary, device, prompt, storage)
            error = float(np.abs(states["hidden_states"] - want).max() / np.abs(want).max())
            good = error <= 1.5 * hf_error and list(states["token_ids"]) == prompt
            tokens_by_device[device] = tuple(tokens)
            print(json.dumps({"device": device, "token_ids": tokens, "state_error": error, "hf_bf16_error": float(hf_error),
                              "ok": good}))
            ok = ok and good
    same = len(set(tokens_by_device.values())) == 1
    print(json.dumps({"metric": "serve_on_devices", "devices": devices, "same_tokens": same, "ok": ok and same}))
    sys.exit(0 if ok and same else 1)


if __name__ == "__main__":
    main()
