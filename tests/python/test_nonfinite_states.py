"""A checkpoint whose bytes were flipped so that one token's states are inf: the server
fails that request alone with an error naming the layer and position, writes no file for
it, and serves the next request."""
import json
import os
import shutil
import struct

import conftest
from conftest import Server
from test_server_load import post


def poisoned_model(tmp):
    """The qwen3 fixture with token 7's embedding row set to bf16 inf (exponent bits all ones)."""
    model = tmp / "model"
    model.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(conftest.MODEL / name, model / name)
    raw = bytearray((conftest.MODEL / "model.safetensors").read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    meta = json.loads(raw[8:8 + n])["model.embed_tokens.weight"]
    hidden = meta["shape"][1]
    begin = 8 + n + meta["data_offsets"][0] + 7 * hidden * 2
    raw[begin:begin + hidden * 2] = struct.pack("<H", 0x7F80) * hidden
    (model / "model.safetensors").write_bytes(raw)
    return model


def test_a_request_with_non_finite_states_fails_alone(tmp_path):
    s = Server(tmp_path, model=poisoned_model(tmp_path))
    try:
        status, body, _ = post(s, {"prompt": [1, 2, 3, 7, 5], "max_tokens": 1})
        assert 400 <= status < 600, (status, body)
        assert "the hidden state of layer 0 at token position 3 is not finite" in body["error"]["message"], body
        status, body, _ = post(s, {"prompt": [1, 2, 3, 4, 5], "max_tokens": 1})
        assert status == 200, body
        path = body["kv_transfer_params"]["hidden_states_path"]
        assert os.path.exists(path)
        assert [n for n in os.listdir(s.storage) if n.endswith(".safetensors")] == [os.path.basename(path)]
    finally:
        s.stop()
